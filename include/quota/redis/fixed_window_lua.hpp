// quota/redis/fixed_window_lua.hpp — the Lua twin of quota::FixedWindow.
//
// Bit-identical to FixedWindow::apply (include/quota/policy/fixed_window.hpp): a count
// per aligned window [k·W, (k+1)·W), reset when the window index advances; backwards
// time changes nothing. Shared arguments, reply and attempt handling: lua_common.hpp.
//
// Exactness. Times are two limbs (seconds, nanoseconds), so the window index of a time
// is never formed as one number. The store accepts windows that tile the second grid:
//   mode 1: W divides 1 s (1 ns … 1 s): the window of (sec, ns) is (sec, floor(ns / W)),
//           the time to the next window start W − ns mod W;
//   mode 2: W is a whole number s of seconds, s <= 9·10^6 (~104 days): the window is
//           floor(sec / s), the time to the next start (s − sec mod s)·10^9 − ns.
// Every value stays below 2^53: counts are <= limit < 2^53, durations <= 9·10^15 ns.
//
// State: one 24-byte string per key, struct-packed doubles (count, last seconds, last
// nanoseconds). TTL: the time to the next window start (when the count drops to 0) plus
// the margin.
//
// Per-bucket ARGV: the cost (clamped to [0, limit+1]); parameter set (5): limit, mode, W
// (mode 1, ns) or s (mode 2, seconds), 0, 0.
#pragma once

#include <string>

#include "quota/redis/lua_common.hpp"

namespace quota::redis {

inline constexpr const char* kFixedWindowLuaBody = R"lua(
local function same_window(mode, w, s1, n1, s2, n2)
  if mode == 1 then return s1 == s2 and idiv(n1, w) == idiv(n2, w) end
  return idiv(s1, w) == idiv(s2, w)
end
local function to_next(mode, w, s1, n1)
  if mode == 1 then
    local _, r = idiv(n1, w)
    return w - r
  end
  local _, r = idiv(s1, w)
  return (w - r) * 1000000000 - n1
end
local out = {0, sec, ns, 1}
-- (Only a batch of several writes a window before a later one is read.)
if batch and n > 1 then seen = {} end
-- Writes window i's state (after any charge) and its part of the reply.
local function finish(i, key, count, lsec, lns, ok, reason, retry, limit, mode, w)
  local reset = 0
  if count > 0 then reset = to_next(mode, w, lsec, lns) end
  local ms = idiv(reset + 999999, 1000000)
  redis.call('SET', key, struct.pack('<ddd', count, lsec, lns), 'PX', ms + margin)
  local rem = limit - count
  if rem < 0 then rem = 0 end
  put(out, i, ok, reason, rem, retry, reset)
end
-- One pass for one window or a batch of independent ones; two for all-or-nothing.
local single = batch or n == 1
local st -- all-or-nothing: each window's decision, until all are known
if not single then st = {} end
local sc, sl, smode, sw, cost, limit, mode, w
for i = 1, n do
  local q = pbase + pstep * (i - 1)
  -- Arguments are parsed only when their strings differ from the previous window's.
  local a0, a1, a2, a3 = ARGV[8 + cstep * (i - 1)], ARGV[q], ARGV[q + 1], ARGV[q + 2]
  if a0 ~= sc then sc = a0; cost = a0 + 0 end
  if a1 ~= sl or a2 ~= smode or a3 ~= sw then
    sl, smode, sw = a1, a2, a3
    limit, mode, w = a1 + 0, a2 + 0, a3 + 0
  end
  local key = KEYS[i]
  local raw, corrupt = read_state(key, 'window', 24)
  if corrupt then return fail(corrupt) end
  if seen then seen[i] = raw or false end
  local count, lsec, lns
  if raw then
    count, lsec, lns = struct.unpack('<ddd', raw)
    if not (int_in(count, 0, 9007199254740991) and int_in(lsec, -1e12, 1e12) and
            int_in(lns, 0, 999999999)) then
      return fail(redis.error_reply('QUOTA_CORRUPT key ' .. key .. ': field out of range'))
    end
  else
    count, lsec, lns = 0, sec, ns
  end
  if sec > lsec or (sec == lsec and ns > lns) then
    if not same_window(mode, w, sec, ns, lsec, lns) then count = 0 end
    lsec, lns = sec, ns
  end
  local ok, reason, retry = 0, 1, 0
  if cost < 1 then
    reason = 3; retry = -1
  elseif cost > limit then
    reason = 2; retry = -1
  elseif cost <= limit - count then
    ok = 1; reason = 0
  else
    retry = to_next(mode, w, lsec, lns)
  end
  if ok == 0 then out[4] = 0 end
  if single then
    if ok == 1 then count = count + cost end
    finish(i, key, count, lsec, lns, ok, reason, retry, limit, mode, w)
    nwritten = i
  else
    st[i] = {key, count, lsec, lns, cost, ok, reason, retry, limit, mode, w}
  end
end
if not single then
  local charge = out[4] == 1
  for i = 1, n do
    local s = st[i]
    local count = s[2]
    if charge then count = count + s[5] end
    finish(i, s[1], count, s[3], s[4], s[6], s[7], s[8], s[9], s[10], s[11])
  end
end
)lua";

// The whole script.
inline const std::string kFixedWindowLua =
    std::string(kLuaMath) + kLuaHead + kFixedWindowLuaBody + kLuaTail;

}  // namespace quota::redis
