// quota/redis/twin/fixed_window.hpp — the Lua twin of quota::FixedWindow.
//
// Bit-identical to FixedWindow::apply (include/quota/policy/fixed_window.hpp): a count
// per aligned window [k·W, (k+1)·W), reset when the window index advances; backwards
// time changes nothing. Shared arguments, reply and attempt handling: twin/common.hpp.
//
// Exactness. Times are two limbs (seconds, nanoseconds), so the window index of a time
// is never formed as one number. The store accepts windows that tile the second grid:
//   mode 1: W divides 1 s (1 ns … 1 s): the window of (sec, ns) is (sec, floor(ns / W)),
//           the time to the next window start W − ns mod W;
//   mode 2: W is a whole number s of seconds, s <= 9·10^6 (~104 days): the window is
//           floor(sec / s), the time to the next start (s − sec mod s)·10^9 − ns.
// Every value stays below 2^53: counts are <= limit < 2^53, durations <= 9·10^15 ns.
//
// State: one string per key, struct-packed little-endian integers: the count, the last
// time's seconds and nanoseconds (the nanoseconds plus 10^9 when the key's TTL is known to
// cover its window, below). 12 bytes ('<I3i5I4') while the count is below 2^24, else 16
// ('<I7i5I4', count < 2^53): 12 bytes keep the value in jemalloc's 32-byte class (an
// embedded string takes 16 + 3 + len + 1 bytes; the earlier 24-byte state of three doubles
// needed 48): MEMORY USAGE 88 instead of 104 bytes with a 19-byte key. Every field is
// checked in range on read. Format version (twin/common.hpp): bit 31 of the nanoseconds
// field (< 2·10^9 < 2^31 with the mark), version 0 = zero; `t > 1999999999` rejects any
// other.
//
// TTL (set in the same script): the time to the next window start (when the count drops
// to 0), rounded up to ms, plus the margin. Once the key has expired past its window's end
// it is the same as a fresh key, so the TTL only has to last until then. A write that
// sets a TTL while the count is above 0 (on the server's clock) marks the state ("TTL
// known": nanoseconds + 10^9); a later write in the same window (the count still above 0)
// keeps that TTL, which ends at the window's end plus the margin of the write that set
// it — what a new TTL would be. It overwrites the state in place (SETRANGE key 0 state:
// the TTL kept as SET ... KEEPTTL would, with no expiry to compute, parse and propagate,
// and also no new value object and an integer reply instead of SET's status table; the
// value becomes a raw string, MEMORY USAGE unchanged) when the new state has the length
// of the one read (a marked state is always 12 or 16 bytes); when the count crosses 2^24
// in the window (12 -> 16 bytes) it writes SET ... KEEPTTL. A new window, a count of 0 or
// an unmarked state (a new key, the 24-byte form) sets the TTL again with SET ... PX. In
// caller-time mode the expiry is not on the caller's clock: every write sets the TTL,
// unmarked.
//
// Cost: as the token bucket's twin (twin/token_bucket.hpp): several windows' states are
// read with one MGET; one pass per window (advance, decide, count, write) for one window
// and for apply_batch's independent decisions, with no per-window function call or
// table; two passes only for the all-or-nothing check over several windows; divisions
// inlined (a corrected `%`); arguments converted only when they differ from the previous
// window's, and a batch of one cost and one parameter set looks at its arguments once.
// (Callgrind: the in-place write and the arguments looked at once took 13 % off a decision
// at 16 per call, the in-place write alone 2 % at one per call.)
//
// A corrupt state (QUOTA_CORRUPT) fails the whole call and charges nothing: a key of
// another type is found before any write; a state of the wrong size or out of range,
// found after some windows of a batch were written, puts those back as they were.
//
// Arguments: twin/common.hpp; the cost clamped to [0, limit+1], the parameter set
// '<i8i8i8': limit, mode, W (mode 1, ns) or s (mode 2, seconds).
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "quota/policy/fixed_window.hpp"
#include "quota/redis/twin/common.hpp"

namespace quota::redis {

inline constexpr const char* kFixedWindowLuaBody = R"lua(
local pack, sunpack = struct.pack, struct.unpack
local out = {0, sec, ns, 1}
-- The states, read at once (read_states, twin/common.hpp).
local raws, corrupt = read_states('window', 12)
if not raws then return corrupt end
seen = raws
-- One pass (advance, decide, count, write) for one window or a batch of independent ones,
-- each counted when it alone allows. All-or-nothing over several windows takes two: the
-- first decides every window and writes none (out[4]: all allowed), the second decides
-- each again from the same state and time (the same outcome), counting only when all
-- allow, and writes.
local deduct = true
local first = 2
if not batch and n > 1 then first = 1 end
local rcall = redis.call
-- Arguments of window i > 1 are looked at only when they may differ from window 1's.
local varying = pstep ~= 0 or cstep ~= 0
-- `start`: this call's window for the current parameters (mode 1: its first nanosecond
-- within second `sec`; mode 2: its first second).
local sc, sset, limit, mode, w, start
local cost = cost1
for pass = first, 2 do
  local write = pass == 2
  for i = 1, n do
    if varying or i == 1 then
      -- Arguments are unpacked only when their strings differ from the previous window's.
      if cstep ~= 0 then
        local a0 = ARGV[cbase + i - 1]
        if a0 ~= sc then sc = a0; cost = a0 + 0 end
      end
      local set = ARGV[2 + pstep * (i - 1)]
      if set ~= sset then
        sset = set
        limit, mode, w = sunpack('<i8i8i8', set)
        -- x % w is x - floor(x / w) * w, off by at most w; corrected in one step
        local x = ns
        if mode ~= 1 then x = sec end
        local r = x % w
        if r < 0 then r = r + w elseif r >= w then r = r - w end
        start = x - r
      end
    end
    local key = KEYS[i]
    local raw = raws[i]
    local count, lsec, lns
    -- the key's TTL is known to cover the end of the window of `lsec, lns`
    local known = false
    if raw then
      -- (read_state, inlined: an error reply is a table, whose # is 0)
      local len = #raw
      if len == 12 or len == 16 then
        local t
        if len == 12 then
          count, lsec, t = sunpack('<I3i5I4', raw)
        else
          count, lsec, t = sunpack('<I7i5I4', raw)
        end
        if count > 9007199254740991 or t > 1999999999 then
          return fail(redis.error_reply('QUOTA_CORRUPT key ' .. key .. ': field out of range'))
        end
        lns = t
        if t >= 1000000000 then known = true; lns = t - 1000000000 end
      else
        local _, corrupt = read_state(key, 'window', 12)
        return fail(corrupt or redis.error_reply('QUOTA_CORRUPT key ' .. key .. ' changed'))
      end
    else
      count, lsec, lns = 0, sec, ns
    end
    if sec > lsec or (sec == lsec and ns > lns) then
      local same
      if mode == 1 then
        if sec == lsec then
          local r = lns % w
          if r < 0 then r = r + w elseif r >= w then r = r - w end
          same = lns - r == start
        end
      else
        local r = lsec % w
        if r < 0 then r = r + w elseif r >= w then r = r - w end
        same = lsec - r == start
      end
      if not same then count = 0; known = false end
      lsec, lns = sec, ns
    end
    -- the time from the last time to the next window start
    local to_next
    if mode == 1 then
      local r = lns % w
      if r < 0 then r = r + w elseif r >= w then r = r - w end
      to_next = w - r
    else
      local r = lsec % w
      if r < 0 then r = r + w elseif r >= w then r = r - w end
      to_next = (w - r) * 1000000000 - lns
    end
    local ok, reason, retry = 0, 1, 0
    if cost < 1 then
      reason = 3; retry = -1
    elseif cost > limit then
      reason = 2; retry = -1
    elseif cost <= limit - count then
      ok = 1; reason = 0
    else
      retry = to_next
    end
    if ok == 0 then out[4] = 0 end
    if write then
      if ok == 1 and deduct then count = count + cost end
      local reset = 0
      if count > 0 then reset = to_next end
      -- Keep the TTL while it is known to cover this window (the count was above 0 in it
      -- and still is); else set it, and mark it known when the count is above 0.
      local keep = server and known and count > 0
      local t = lns
      if server and count > 0 then t = lns + 1000000000 end
      local v
      if count < 16777216 then
        v = pack('<I3i5I4', count, lsec, t)
      else
        v = pack('<I7i5I4', count, lsec, t)
      end
      if keep and #v == #raw then
        -- the key holds a state of the same length (`known` comes only from a 12- or
        -- 16-byte state): overwritten in place, TTL kept
        rcall('SETRANGE', key, '0', v)
      elseif keep then
        -- the count crossed 2^24 in this window (12 -> 16 bytes)
        rcall('SET', key, v, 'KEEPTTL')
      else
        -- ceil(reset / 10^6) ms, the remainder corrected as above
        local x = reset + 999999
        local r = x % 1000000
        if r < 0 then r = r + 1000000 elseif r >= 1000000 then r = r - 1000000 end
        rcall('SET', key, v, 'PX', (x - r) / 1000000 + margin)
      end
      nwritten = i
      local rem = limit - count
      if rem < 0 then rem = 0 end
      put(out, i, ok, reason, rem, retry, reset)
    end
  end
  deduct = out[4] == 1
end
)lua";

// The whole script.
inline const std::string kFixedWindowLua =
    std::string(kLuaMath) + kLuaHead + kFixedWindowLuaBody + kLuaTail;

template <>
struct LuaTwin<FixedWindow> {
  static const std::string& script() { return kFixedWindowLua; }

  struct Params {
    std::int64_t mode = 1, w = 1;  // see twin/fixed_window.hpp
  };

  static absl::StatusOr<Params> params(const FixedWindow& fw) {
    if (auto s = fw.validate(); !s.ok()) return s;
    if (fw.limit > kLuaExact - 2) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "limit=%d: the Redis store counts in Lua doubles, exact below 2^53, so limit must be "
          "at most %d",
          fw.limit, kLuaExact - 2));
    }
    const std::int64_t w = fw.window.count();
    constexpr std::int64_t kSecond = 1'000'000'000;
    if (kSecond % w == 0) return Params{.mode = 1, .w = w};
    if (w % kSecond == 0 && w <= kMaxFillNs) return Params{.mode = 2, .w = w / kSecond};
    return absl::InvalidArgumentError(absl::StrFormat(
        "window=%d ns: the Redis store needs a window that divides 1 s or is a whole number "
        "of seconds up to %d s (~104 days), so that window starts are exact in Lua",
        w, kMaxFillNs / kSecond));
  }

  // The cost as sent, clamped to [0, limit + 1] (every cost beyond decides the same).
  static std::int64_t script_cost(const FixedWindow& fw, std::int64_t cost) {
    return std::clamp<std::int64_t>(cost, 0, fw.limit + 1);
  }

  // The parameter set as one argument, '<i8i8i8': limit, mode, w.
  static std::string pack_params(const FixedWindow& fw, const Params& pr) {
    std::string out;
    for (std::int64_t v : {fw.limit, pr.mode, pr.w}) detail::pack_le(out, v, 8);
    return out;
  }
};

}  // namespace quota::redis
