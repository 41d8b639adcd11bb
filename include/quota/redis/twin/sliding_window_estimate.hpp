// quota/redis/twin/sliding_window_estimate.hpp — the Lua twin of
// quota::SlidingWindowEstimate.
//
// kSlidingWindowEstimateLua decides one or more estimates of one tenant in one script
// call, bit-identical to SlidingWindowEstimate::apply
// (include/quota/policy/sliding_window_estimate.hpp): counters `cur` and `prev` of the
// aligned windows, a request admitted iff (cur + cost)·W + prev·(W − el) <= limit·W, the
// same remaining, retry_after and reset_after. LuaTwin<SlidingWindowEstimate> is its C++
// codec: the exact range (params) and the arguments (script_cost, pack_params); the call
// layout, the reply and attempts are twin/common.hpp's and twin/call.hpp's.
//
// Guarantees: for every policy params() accepts (windows that divide 1 s or are whole
// seconds below 2^52 ns; it rejects the others, naming the bound) the products are
// compared exactly, also beyond 2^53, so the decisions equal the C++ policy's; a key's
// state is 21 bytes; its TTL lasts until both counters are 0 plus the margin; a corrupt
// state fails the whole call with QUOTA_CORRUPT and charges nothing. Thread safety: the
// constants are immutable text, LuaTwin's functions are pure; Redis runs each script call
// with nothing interleaved.
//
//   const SlidingWindowEstimate sw{.limit = 100, .window = 1min};
//   const BucketRequest<SlidingWindowEstimate> req{&sw, "{acme}read", 1};
//   auto call = build_call(CallOptions{}, std::span(&req, 1), Nanos{0}, {});
//   // EVALSHA <sha of kSlidingWindowEstimateLua> 1 call->keys[0] call->args..., then
//   // parse_reply
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "quota/policy/sliding_window_estimate.hpp"
#include "quota/redis/twin/common.hpp"
#include "quota/redis/twin/range.hpp"
#include "quota/redis/twin/skeleton.hpp"

namespace quota::redis {

// The estimate's exact products in Lua doubles, shared with the gateway's twin
// (twin/gateway_windows.hpp); lua_macros.hpp's est_* macros call them. Needs kLuaMath.
inline constexpr const char* kLuaEstimateMath = R"lua(
local T26 = 67108864
local T52 = 4503599627370496
local T53 = 9007199254740992
-- a·b as two limbs H·2^52 + L, for a, b < 2^52
local function mul(a, b)
  local a1, a0 = idiv(a, T26)
  local b1, b0 = idiv(b, T26)
  local m1, m0 = idiv(a1 * b0 + a0 * b1, T26)
  local c, l = idiv(m0 * T26 + a0 * b0, T52)
  return a1 * b1 + m1 + c, l
end
-- a·b <= c·d for a, b, c, d in [0, 2^52). A product whose double is below 2^53 is exact
-- (a true product of 2^53 or more never rounds below it), and below any product whose
-- double is not.
local function le(a, b, c, d)
  local x, y = a * b, c * d
  if x < T53 then return y >= T53 or x <= y end
  if y < T53 then return false end
  local h1, l1 = mul(a, b)
  local h2, l2 = mul(c, d)
  return h1 < h2 or (h1 == h2 and l1 <= l2)
end
-- floor(a·b / c) for a, b in [0, 2^52), c in (0, 2^52)
local function muldiv(a, b, c)
  local x = a * b
  if x < T52 then
    -- exact, and q·c <= x + c < 2^53 is exact: the floating quotient is off by at most one
    local q = floor(x / c)
    local r = x - q * c
    if r < 0 then q = q - 1 elseif r >= c then q = q + 1 end
    return q
  end
  local q = floor(x / c)
  if q < 0 then q = 0 end
  while q > 0 and not le(q, c, a, b) do q = q - 1 end
  while le(q + 1, c, a, b) do q = q + 1 end
  return q
end
)lua";

// The script's body: the sections of kLuaLoop (twin/common.hpp), with its macros.
//
// Exactness. Times are two limbs and windows tile the second grid as in
// twin/fixed_window.hpp (mode 1: W divides 1 s; mode 2: W a whole number of seconds).
// Products of two numbers below 2^52 (counts <= kMaxUnits < 2^44, W and el < 2^52) are
// formed as one number while below 2^53, else exactly as two limbs (`mul`: H·2^52 + L,
// via 26-bit halves) and compared limb by limb (`le`); floor(a·b/c) (`muldiv`) is a
// floating estimate corrected with those exact comparisons. params() rejects W >= 2^52
// ns (mode 2: W <= 4.5·10^6 s, ~52 days), so every duration (at most 2·W) is exact.
//
// State: 21 bytes, '<I6I6i5I4': cur, prev (< 2^48), the last time's seconds and
// nanoseconds, plus 10^9 when the key's TTL is known to cover its counters. 21 bytes keep
// the value in jemalloc's 48-byte class (an embedded string takes 16 + 3 + len + 1
// bytes). Format version (twin/common.hpp): bit 31 of the nanoseconds field (< 2·10^9 <
// 2^31 with the mark), version 0 = zero; the check `t > 1999999999` rejects any other.
//
// TTL, set in the same script: reset_after (until both counters are 0: the end of the
// window after the current one when cur > 0, of the current one when only prev > 0),
// rounded up to ms, plus the margin. With `span` = 2, 1 or 0 as above (the windows,
// from the start of the last time's, that the counters need), a write that sets a TTL
// while span > 0 (on the server's clock) marks the state ("TTL known"); a later write, d
// windows on, keeps that TTL while d + span <= the span marked, overwriting the state in
// place (SETRANGE key 0); else it sets the TTL again (SET ... PX). An idle key is never
// extended. In caller-time mode every write sets the TTL, unmarked.
//
// One pass per window for one window and for a batch of independent decisions; two for
// the all-or-nothing check of several. A corrupt state found after some windows of a
// batch were written puts those back (`fail`).
inline constexpr const char* kSlidingWindowEstimateLuaBody = R"lua(
local state_what, state_bytes, state_long = 'window estimate', 21, 21
-- (sized for one window's reply: a table that grows is resized; put fills 5..9)
local out = {0, sec, ns, 1, 0, 0, 0, 0, 0}
-- `idx`: this call's window for the current parameters (mode 1: its index within second
-- `sec`; mode 2: its index).
local limit, mode, w, W, per, idx
--@@ params
limit, mode, w, W, per = sunpack('<i8i8i8i8i8', set)
@window_start(idx, sec, ns)
idx = idx / w
--@@ state
local cur, prev, lsec, lns
-- the windows the key's TTL is known to cover (from the start of the last time's)
local known = 0
--@@ read
local t
cur, prev, lsec, t = sunpack('<I6I6i5I4', raw)
if t > 1999999999 then
  @out_of_range()
end
lns = t
if t >= 1000000000 then
  lns = t - 1000000000
  if cur > 0 then known = 2 elseif prev > 0 then known = 1 end
end
--@@ fresh
cur, prev, lsec, lns = 0, 0, sec, ns
--@@ spent
cur, prev, lsec, lns, known = limit, 0, fsec, fns, 0
--@@ step
-- d: windows advanced (2 standing for 2 or more)
local d = 0
if sec > lsec or (sec == lsec and ns > lns) then
  @window_gap(d, idx, sec, lsec, lns)
  @est_roll(d, cur, prev)
  lsec, lns = sec, ns
end
-- el: the last time's offset in its window
local el
@offset(el, lsec, lns)
-- (cur + cost)·W + prev·(W − el) <= limit·W
@est_fits(local fits, cur, prev, cost, limit, W, el)
@decide(limit, fits)
if reason == 1 then
  @est_retry(retry, cur, prev, cost, limit, W, el)
end
--@@ write
if ok == 1 and deduct then cur = cur + cost end
@est_reset(local reset, cur, prev, W, el)
local span = 0
if cur > 0 then span = 2 elseif prev > 0 then span = 1 end
-- Keep the TTL while the windows it is known to cover include this span; else set it,
-- and mark it known when the span is not empty.
local t = lns
if server and span > 0 then t = lns + 1000000000 end
local v = pack('<I6I6i5I4', cur, prev, lsec, t)
if server and span > 0 and d + span <= known then
  -- the key holds a 21-byte state (`known` comes only from one): overwritten in place,
  -- TTL kept
  rcall('SETRANGE', key, '0', v)
else
  @ceil_ms(local ms, reset)
  rcall('SET', key, v, 'PX', ms + margin)
end
--@@ reply
-- limit − cur − prev + floor(prev·el / W)
@est_remaining(local rem, cur, prev, limit, W, el)
put(out, i, ok, reason, rem, retry, reset)
)lua";

inline const std::string kSlidingWindowEstimateLua =
    detail::loop_script(std::string(kLuaPut) + kLuaEstimateMath, kSlidingWindowEstimateLuaBody);

template <>
struct LuaTwin<SlidingWindowEstimate> : TwinScript<kSlidingWindowEstimateLua> {
  struct Params {
    // mode 1: w = W ns, per = windows per second; mode 2: w = W in seconds, per = 0
    std::int64_t mode = 1, w = 1, per = 0;
  };

  // The longest window: below 2^52 ns (products of two values below 2^52 are exact).
  static constexpr std::int64_t kMaxWindowNs = 4'500'000'000'000'000;

  static absl::StatusOr<Params> params(const SlidingWindowEstimate& sw) {
    if (auto s = sw.validate(); !s.ok()) return s;
    auto grid = window_grid(sw.window, kMaxWindowNs,
                            "(~52 days, below 2^52 ns), so that the estimate is exact in Lua");
    if (!grid.ok()) return grid.status();
    constexpr std::int64_t kSecond = 1'000'000'000;
    return Params{.mode = grid->mode, .w = grid->w, .per = grid->mode == 1 ? kSecond / grid->w : 0};
  }

  // The cost as sent (window_cost).
  static std::int64_t script_cost(const SlidingWindowEstimate& sw, std::int64_t cost) {
    return window_cost(sw.limit, cost);
  }

  // The parameter set as one argument, '<i8i8i8i8i8': limit, mode, w, W ns, per.
  static std::string pack_params(const SlidingWindowEstimate& sw, const Params& pr) {
    std::string out;
    for (std::int64_t v : {sw.limit, pr.mode, pr.w, sw.window.count(), pr.per}) {
      detail::pack_le(out, v, 8);
    }
    return out;
  }
};

}  // namespace quota::redis
