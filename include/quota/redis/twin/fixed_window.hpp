// quota/redis/twin/fixed_window.hpp — the Lua twin of quota::FixedWindow.
//
// kFixedWindowLua decides one or more windows of one tenant in one script call,
// bit-identical to FixedWindow::apply (include/quota/policy/fixed_window.hpp): a count
// per aligned window [k·W, (k+1)·W), reset when the window index advances; backwards time
// changes nothing. LuaTwin<FixedWindow> is its C++ codec: the exact range (params) and
// the arguments (script_cost, pack_params); the call layout, the reply and attempts are
// twin/common.hpp's and twin/call.hpp's.
//
// Guarantees: for every policy params() accepts (it rejects the others, naming the
// bound), every value stays an exact integer below 2^53, so the decisions equal the C++
// policy's; a key's state is 12 bytes (16 once the count reaches 2^24); its TTL lasts to
// the window's end plus the margin; a corrupt state fails the whole call with
// QUOTA_CORRUPT and charges nothing. Thread safety: the constants are immutable text,
// LuaTwin's functions are pure; Redis runs each script call with nothing interleaved.
//
//   const FixedWindow fw{.limit = 100, .window = 1min};
//   const BucketRequest<FixedWindow> req{&fw, "{acme}read", 1};
//   auto call = build_call(CallOptions{}, std::span(&req, 1), Nanos{0}, {});
//   // EVALSHA <sha of kFixedWindowLua> 1 call->keys[0] call->args..., then parse_reply
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
#include "quota/redis/twin/range.hpp"
#include "quota/redis/twin/skeleton.hpp"

namespace quota::redis {

// The script's body: the sections of kLuaLoop (twin/common.hpp), with its macros.
//
// Exactness. Times are two limbs (seconds, nanoseconds), so the window index of a time is
// never formed as one number. params() accepts windows that tile the second grid:
//   mode 1: W divides 1 s (1 ns … 1 s): the window of (sec, ns) is (sec, floor(ns / W)),
//           the time to the next window start W − ns mod W;
//   mode 2: W is a whole number s of seconds, s <= 10^8 (~1157 days): the window is
//           floor(sec / s), the time to the next start (s − sec mod s)·10^9 − ns, formed
//           as two limbs (@to_next) and answered as a number below 2^53 ns, else as its
//           decimal string (@dur).
// Counts are <= limit < 2^53.
//
// State: '<I3i5I4' (12 bytes) while the count is below 2^24, else '<I7i5I4' (16): the
// count, the last time's seconds and nanoseconds, plus 10^9 when the key's TTL is known
// to cover its window. 12 bytes keep the value in jemalloc's 32-byte class (an embedded
// string takes 16 + 3 + len + 1 bytes). Every field is checked in range on read. Format
// version (twin/common.hpp): bit 31 of the nanoseconds field (< 2·10^9 < 2^31 with the
// mark), version 0 = zero; the check `t > 1999999999` rejects any other.
//
// TTL, set in the same script: the time to the next window start (when the count drops to
// 0), rounded up to ms, plus the margin: a key expired past its window's end is the same
// as a fresh one. A write that sets a TTL while the count is above 0 (on the server's
// clock) marks the state ("TTL known"); a later write in the same window keeps that TTL,
// overwriting the state in place (SETRANGE key 0) when its length is unchanged, with SET
// ... KEEPTTL when the count crosses 2^24. A new window, a count of 0 or an unmarked state
// sets the TTL again (SET ... PX). In caller-time mode every write sets the TTL, unmarked.
//
// One pass per window (advance, decide, count, write) for one window and for a batch of
// independent decisions; two for the all-or-nothing check of several. A corrupt state
// found after some windows of a batch were written puts those back (`fail`).
inline constexpr const char* kFixedWindowLuaBody = R"lua(
local state_what, state_bytes, state_long = 'window', 12, 16
-- (sized for one window's reply: a table that grows is resized; put fills 5..9)
local out = {0, sec, ns, 1, 0, 0, 0, 0, 0}
-- `start`: this call's window for the current parameters (mode 1: its first nanosecond
-- within second `sec`; mode 2: its first second).
local limit, mode, w, start
--@@ params
limit, mode, w = sunpack('<i8i8i8', set)
@window_start(start, sec, ns)
--@@ state
local count, lsec, lns
-- the key's TTL is known to cover the end of the window of `lsec, lns`
local known = false
--@@ read
local t
if len == 12 then
  count, lsec, t = sunpack('<I3i5I4', raw)
else
  count, lsec, t = sunpack('<I7i5I4', raw)
end
if count > 9007199254740991 or t > 1999999999 then
  @out_of_range()
end
lns = t
if t >= 1000000000 then known = true; lns = t - 1000000000 end
--@@ fresh
count, lsec, lns = 0, sec, ns
--@@ spent
count, lsec, lns, known = limit, fsec, fns, false
--@@ step
if sec > lsec or (sec == lsec and ns > lns) then
  -- the same window: mode 1, the same second and window start; mode 2, the same start
  @in_window(local same, start, sec, lsec, lns)
  if not same then count = 0; known = false end
  lsec, lns = sec, ns
end
-- the time from the last time to the next window start, ts s + tn ns
local ts, tn
@to_next(ts, tn, lsec, lns)
@decide(limit, cost <= limit - count)
if reason == 1 then
  @dur(retry, ts, tn)
end
--@@ write
if ok == 1 and deduct then count = count + cost end
local reset = 0
if count == 0 then ts, tn = 0, 0 end
@dur(reset, ts, tn)
-- Keep the TTL while it is known to cover this window (the count was above 0 in it and
-- still is); else set it, and mark it known when the count is above 0.
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
  -- the key holds a state of the same length (`known` comes only from a 12- or 16-byte
  -- state): overwritten in place, TTL kept
  rcall('SETRANGE', key, '0', v)
elseif keep then
  -- the count crossed 2^24 in this window (12 -> 16 bytes)
  rcall('SET', key, v, 'KEEPTTL')
else
  @ceil_ms2(local ms, ts, tn)
  rcall('SET', key, v, 'PX', ms + margin)
end
--@@ reply
local rem = limit - count
if rem < 0 then rem = 0 end
put(out, i, ok, reason, rem, retry, reset)
)lua";

inline const std::string kFixedWindowLua = detail::loop_script(kLuaPut, kFixedWindowLuaBody);

template <>
struct LuaTwin<FixedWindow> : TwinScript<kFixedWindowLua> {
  struct Params {
    std::int64_t mode = 1, w = 1;  // mode 1: w = W ns; mode 2: w = W in seconds
  };

  // The window grid of `fw` (window_grid), or kInvalidArgument naming the bound when the
  // twin cannot decide it exactly within `range` (the store's: RedisStore's by default;
  // GatewayStore passes kGatewayRange): limit at most range.max_capacity, a
  // window that divides 1 s or is a whole number of seconds up to range.max_span_ns.
  static absl::StatusOr<Params> params(const FixedWindow& fw,
                                       const TwinRange& range = kRedisWindowRange) {
    if (auto s = fw.validate(); !s.ok()) return s;
    if (auto s = check_capacity("limit", fw.limit, range); !s.ok()) return s;
    auto grid = window_grid(fw.window, range.max_span_ns,
                            absl::StrFormat("(%s), so that window starts are exact in Lua",
                                            span_days(range.max_span_ns)),
                            range.store);
    if (!grid.ok()) return grid.status();
    return Params{.mode = grid->mode, .w = grid->w};
  }

  // The cost as sent (window_cost).
  static std::int64_t script_cost(const FixedWindow& fw, std::int64_t cost) {
    return window_cost(fw.limit, cost);
  }

  // The parameter set as one argument, '<i8i8i8': limit, mode, w.
  static std::string pack_params(const FixedWindow& fw, const Params& pr) {
    std::string out;
    for (std::int64_t v : {fw.limit, pr.mode, pr.w}) detail::pack_le(out, v, 8);
    return out;
  }
};

}  // namespace quota::redis
