// quota/redis/sliding_window_estimate_lua.hpp — the Lua twin of
// quota::SlidingWindowEstimate.
//
// Bit-identical to SlidingWindowEstimate::apply (include/quota/policy/
// sliding_window_estimate.hpp): counters `cur` and `prev` of the aligned windows, a
// request admitted iff (cur + cost)·W + prev·(W − el) <= limit·W, the same remaining,
// retry_after and reset_after. Shared arguments, reply and attempts: lua_common.hpp.
//
// Exactness. Times are two limbs (seconds, nanoseconds) and windows tile the second
// grid exactly as in fixed_window_lua.hpp (mode 1: W divides 1 s; mode 2: W a whole
// number of seconds). Products of two numbers below 2^52 (counts <= kMaxUnits < 2^44,
// W and el < 2^52) are formed exactly as two limbs (`mul`: H·2^52 + L, via 26-bit
// halves) and compared limb by limb (`le`); floor(a·b/c) (`muldiv`) is a floating
// estimate corrected with those exact comparisons. The store rejects W >= 2^52 ns
// (mode 2: W <= 4.5·10^6 s, ~52 days), so every duration (at most 2·W) is exact.
//
// State: one 32-byte string per key, struct-packed doubles (cur, prev, last seconds,
// last nanoseconds). TTL: reset_after (both counters 0) plus the margin.
//
// Per-bucket ARGV: the cost (clamped to [0, limit+1]); parameter set (5): limit, mode, w
// (mode 1: W ns; mode 2: W in seconds), W in ns, windows per second (mode 1) or 0.
#pragma once

#include <string>

#include "quota/redis/lua_common.hpp"

namespace quota::redis {

inline constexpr const char* kSlidingWindowEstimateLuaBody = R"lua(
local T26 = 67108864
local T52 = 4503599627370496
local function mul(a, b)
  local a1, a0 = idiv(a, T26)
  local b1, b0 = idiv(b, T26)
  local m1, m0 = idiv(a1 * b0 + a0 * b1, T26)
  local c, l = idiv(m0 * T26 + a0 * b0, T52)
  return a1 * b1 + m1 + c, l
end
local function le(a, b, c, d)
  local h1, l1 = mul(a, b)
  local h2, l2 = mul(c, d)
  return h1 < h2 or (h1 == h2 and l1 <= l2)
end
local function muldiv(a, b, c)
  local q = math.floor(a * b / c)
  if q < 0 then q = 0 end
  while q > 0 and not le(q, c, a, b) do q = q - 1 end
  while le(q + 1, c, a, b) do q = q + 1 end
  return q
end
local out = {0, sec, ns, 1}
-- (Only a batch of several writes a window before a later one is read.)
if batch and n > 1 then seen = {} end
-- Writes window i's state (after any charge) and its part of the reply.
local function finish(i, key, cur, prev, lsec, lns, ok, reason, retry, limit, W, el)
  local reset = 0
  if cur > 0 then reset = W - el + W elseif prev > 0 then reset = W - el end
  local ms = idiv(reset + 999999, 1000000)
  redis.call('SET', key, struct.pack('<dddd', cur, prev, lsec, lns), 'PX', ms + margin)
  local rem = limit - cur - prev + muldiv(prev, el, W)
  if rem < 0 then rem = 0 end
  put(out, i, ok, reason, rem, retry, reset)
end
-- One pass for one window or a batch of independent ones; two for all-or-nothing.
local single = batch or n == 1
local st -- all-or-nothing: each window's decision, until all are known
if not single then st = {} end
local sc, sl, smode, sw, sW, sper, cost, limit, mode, w, W, per
for i = 1, n do
  local q = pbase + pstep * (i - 1)
  -- Arguments are parsed only when their strings differ from the previous window's.
  local a0 = ARGV[8 + cstep * (i - 1)]
  local a1, a2, a3, a4, a5 = ARGV[q], ARGV[q + 1], ARGV[q + 2], ARGV[q + 3], ARGV[q + 4]
  if a0 ~= sc then sc = a0; cost = a0 + 0 end
  if a1 ~= sl or a2 ~= smode or a3 ~= sw or a4 ~= sW or a5 ~= sper then
    sl, smode, sw, sW, sper = a1, a2, a3, a4, a5
    limit, mode, w, W, per = a1 + 0, a2 + 0, a3 + 0, a4 + 0, a5 + 0
  end
  local key = KEYS[i]
  local raw, corrupt = read_state(key, 'window estimate', 32)
  if corrupt then return fail(corrupt) end
  if seen then seen[i] = raw or false end
  local cur, prev, lsec, lns
  if raw then
    cur, prev, lsec, lns = struct.unpack('<dddd', raw)
    if not (int_in(cur, 0, 4503599627370495) and int_in(prev, 0, 4503599627370495) and
            int_in(lsec, -1e12, 1e12) and int_in(lns, 0, 999999999)) then
      return fail(redis.error_reply('QUOTA_CORRUPT key ' .. key .. ': field out of range'))
    end
  else
    cur, prev, lsec, lns = 0, 0, sec, ns
  end
  if sec > lsec or (sec == lsec and ns > lns) then
    local d
    if mode == 1 then
      local dsec = sec - lsec
      if dsec >= 2 then d = 2 else d = dsec * per + (idiv(ns, w) - idiv(lns, w)) end
    else
      d = idiv(sec, w) - idiv(lsec, w)
    end
    if d == 1 then
      prev = cur; cur = 0
    elseif d ~= 0 then
      prev = 0; cur = 0
    end
    lsec, lns = sec, ns
  end
  local el
  if mode == 1 then
    local _, r = idiv(lns, w)
    el = r
  else
    local _, r = idiv(lsec, w)
    el = r * 1000000000 + lns
  end
  local ok, reason, retry = 0, 1, 0
  if cost < 1 then
    reason = 3; retry = -1
  elseif cost > limit then
    reason = 2; retry = -1
  elseif cur + cost <= limit and le(prev, W - el, limit - cur - cost, W) then
    ok = 1; reason = 0
  else
    local spare = limit - cur - cost
    local to_next = W - el
    retry = nil
    if spare >= 0 and prev > 0 then
      local mw = muldiv(spare, W, prev)
      if mw >= 1 then retry = W - mw - el end
    end
    if retry == nil then
      if cur == 0 then
        retry = to_next
      elseif limit - cost >= cur then
        retry = to_next
      else
        local mw = muldiv(limit - cost, W, cur)
        if mw >= 1 then retry = to_next + (W - mw) else retry = to_next + W end
      end
    end
  end
  if ok == 0 then out[4] = 0 end
  if single then
    if ok == 1 then cur = cur + cost end
    finish(i, key, cur, prev, lsec, lns, ok, reason, retry, limit, W, el)
    nwritten = i
  else
    st[i] = {key, cur, prev, lsec, lns, cost, ok, reason, retry, limit, W, el}
  end
end
if not single then
  local charge = out[4] == 1
  for i = 1, n do
    local s = st[i]
    local cur = s[2]
    if charge then cur = cur + s[6] end
    finish(i, s[1], cur, s[3], s[4], s[5], s[7], s[8], s[9], s[10], s[11], s[12])
  end
end
)lua";

// The whole script.
inline const std::string kSlidingWindowEstimateLua =
    std::string(kLuaMath) + kLuaHead + kSlidingWindowEstimateLuaBody + kLuaTail;

}  // namespace quota::redis
