// quota/redis/twin/range.hpp — the range in which each Lua twin decides exactly.
//
// Lua 5.1 numbers are doubles, exact for integers below 2^53, so every twin accepts a
// policy only where no value it forms can reach 2^53; the token bucket's and the
// gateway's micro-units and every twin's times are two limbs, so their capacities and
// spans reach past 2^53 micro-units and ns (kMaxWideCapacity, kMaxWideSpanNs). Each
// policy's range is defined once (its LuaTwin<P>::params, on the bounds here) and used by
// every store: RedisStore with kRedisStoreRange, GatewayStore with kGatewayRange (its
// narrow bounds leave headroom for debt). A policy outside it is
// kInvalidArgument naming the bound. Pure functions: thread-safe.
//
//   auto p = quota::redis::LuaTwin<quota::TokenBucket>::params(tb);   // or the bound
//   auto g = quota::redis::window_grid(1s, quota::redis::kMaxWideSpanNs, "(~1157 days)");
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_format.h"
#include "quota/units.hpp"

namespace quota::redis {

// 2^53: Lua numbers (doubles) hold every integer below it exactly.
inline constexpr std::int64_t kLuaExact = std::int64_t{1} << 53;
// The longest time to fill a bucket, or window, the narrow arithmetic handles (an elapsed
// time as one number): 9·10^6 s (~104 days).
inline constexpr std::int64_t kMaxFillNs = 9'000'000'000'000'000;
// RedisStore's bounds with two-limb tokens and times: a capacity of 10^12 units (a tenant
// at 1,000,000 tokens per minute spends 4.32·10^10 in 30 days) and a span of 10^17 ns
// (~1157 days).
inline constexpr std::int64_t kMaxWideCapacity = 1'000'000'000'000;
inline constexpr std::int64_t kMaxWideSpanNs = 100'000'000'000'000'000;
// Past the narrow bounds a token bucket's reduced rate terms m and p are at most 9·10^9,
// so that m·(10^6 + 1) and p·(10^6 + 1) + 10^9 stay below 2^53 (twin/lua_macros.hpp's
// @refill and @reach form them).
inline constexpr std::int64_t kMaxWideTerm = 9'000'000'000;
static_assert(kMaxWideTerm * (1'000'000 + 1) + 1'000'000'000 < kLuaExact);

// The range a twin decides exactly in, beyond its policy's own checks: the largest
// capacity (burst or limit, units), the longest span (a token bucket's time to fill, a
// window), the narrow bounds within which a token bucket's values stay single numbers
// below 2^53 (past them it is `wide`: LuaTwin<TokenBucket>::params), and, for errors, the
// store it is and what its capacity bound keeps exact. kRedisStoreRange is RedisStore's;
// GatewayStore's is kGatewayRange (below: narrower narrow bounds, for debt).
struct TwinRange {
  std::int64_t max_capacity;
  std::int64_t max_span_ns;
  std::int64_t narrow_capacity;
  std::int64_t narrow_span_ns;
  std::string_view store;
  std::string_view keeps;
};
inline constexpr TwinRange kRedisStoreRange{
    .max_capacity = kMaxWideCapacity,
    .max_span_ns = kMaxWideSpanNs,
    .narrow_capacity = (kLuaExact - 1) / kMicrosPerUnit,
    .narrow_span_ns = kMaxFillNs,
    .store = "the Redis store",
    .keeps = "keeps tokens as two limbs (units, micro-units) in Lua doubles"};
// RedisStore's range for a fixed window: it counts whole units (a count up to limit + a
// cost of limit + 1 stays below 2^53); durations are two limbs (seconds, nanoseconds).
inline constexpr TwinRange kRedisWindowRange{.max_capacity = kLuaExact - 2,
                                             .max_span_ns = kMaxWideSpanNs,
                                             .narrow_capacity = kLuaExact - 2,
                                             .narrow_span_ns = kMaxWideSpanNs,
                                             .store = "the Redis store",
                                             .keeps = "counts in Lua doubles, exact below 2^53"};

// The gateway twin's exact range (twin/gateway.hpp), passed to each policy's own twin
// range check (LuaTwin<TokenBucket>::params, LuaTwin<FixedWindow>::params). Tokens and
// debt are two limbs (units, micro-units) and times two limbs (s, ns), so a level holds
// up to 10^12 units (a capacity of debt, tokens down to −capacity, a refund of up to
// 3·capacity + 2 units) and a span (time to fill, window) up to 10^17 ns (~1157 days; a
// refill from the deepest debt spans two). Within the narrow bounds (capacity <= 2·10^9
// units, time to fill <= 4·10^15 ns) every value in micro-units and ns stays one number
// below 2^53; past them a token bucket's reduced rate terms are at most kMaxWideTerm.
inline constexpr TwinRange kGatewayRange{
    .max_capacity = kMaxWideCapacity,
    .max_span_ns = kMaxWideSpanNs,
    .narrow_capacity = 2'000'000'000,
    .narrow_span_ns = 4'000'000'000'000'000,
    .store = "the Redis gateway store",
    .keeps = "keeps tokens and debt as two limbs (units, micro-units) in Lua doubles"};
static_assert((3 * kGatewayRange.narrow_capacity + 2) * kMicrosPerUnit < kLuaExact);
static_assert(2 * kGatewayRange.narrow_span_ns <= kMaxFillNs);

// kInvalidArgument naming `field` and the bound when `capacity` exceeds range's.
inline absl::Status check_capacity(std::string_view field, std::int64_t capacity,
                                   const TwinRange& range) {
  if (capacity <= range.max_capacity) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrFormat("%s=%d: %s %s, so %s must be at most %d units",
                                                    field, capacity, range.store, range.keeps,
                                                    field, range.max_capacity));
}

// "~N days" for a span of ns, rounded down (a bound's size in errors).
inline std::string span_days(std::int64_t ns) {
  return absl::StrFormat("~%d days", ns / 86'400'000'000'000);
}

// The window grid of the windowed twins (twin/fixed_window.hpp, and the gateway's fixed
// window): mode 1, the window divides 1 s (w = the window, ns); mode 2, it is a whole
// number of seconds, at most max_ns (w = the window, s); any other window is
// kInvalidArgument naming `store` and the bound (`bound` says how far max_ns reaches
// and why).
struct WindowGrid {
  std::int64_t mode = 1, w = 1;
};
inline absl::StatusOr<WindowGrid> window_grid(Nanos window, std::int64_t max_ns,
                                              std::string_view bound,
                                              std::string_view store = "the Redis store") {
  const std::int64_t w = window.count();
  constexpr std::int64_t kSecond = 1'000'000'000;
  if (w > 0 && kSecond % w == 0) return WindowGrid{.mode = 1, .w = w};
  if (w > 0 && w % kSecond == 0 && w <= max_ns) return WindowGrid{.mode = 2, .w = w / kSecond};
  return absl::InvalidArgumentError(absl::StrFormat(
      "window=%d ns: %s needs a window that divides 1 s or is a whole number of seconds up "
      "to %d s %s",
      w, store, max_ns / kSecond, bound));
}

// The cost a windowed twin is sent for a capacity `limit`: clamped to [0, limit + 1],
// as every cost beyond decides the same (and stays exact in Lua).
inline std::int64_t window_cost(std::int64_t limit, std::int64_t cost) {
  return std::clamp<std::int64_t>(cost, 0, limit + 1);
}

}  // namespace quota::redis
