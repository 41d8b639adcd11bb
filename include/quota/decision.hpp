// quota/decision.hpp — what a limiter answers.
//
// A Decision is a plain value. A denial is a Decision, not an error: errors
// (`absl::Status`) are reserved for failures of the environment (a store that cannot be
// reached, a malformed reply) and for invalid input such as an oversized key.
//
//   quota::Decision d = ...;
//   if (!d.allowed) reply_429(d.retry_after);   // retry_after is advisory
//
// Fields:
//   allowed     — the cost was deducted (or, for an error reason, nothing was).
//   remaining   — whole units left after this decision, rounded down. An observation,
//                 not a reservation: other callers may spend it at once.
//   retry_after — on a denial, the earliest time from now at which the same request
//                 would pass if nobody else spent (exact, in nanoseconds); kNever when
//                 waiting cannot help. Zero when allowed.
//   reset_after — time from now until the budget is entirely unspent again; kNever
//                 when it never refills.
//   version     — the version of the rule that decided (0 when none is set).
//   reason      — why.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <string_view>

#include "quota/units.hpp"

namespace quota {

enum class Reason : std::uint8_t {
  kAllowed = 0,           // admitted; the cost was deducted
  kOverLimit = 1,         // denied: not enough budget now; see retry_after
  kCostExceedsBurst = 2,  // denied: cost > burst (or limit): a configuration error,
                          // it can never pass; retry_after = kNever
  kInvalidCost = 3,       // denied: cost < 1
  // Gateway layer (quota/gateway/gateway.hpp):
  kUnavailable = 4,      // denied: the store is unreachable and the route fails closed
                         // (HTTP 503, not 429); nothing was deducted
  kShadow = 5,           // admitted: the rule is in shadow mode and would have denied
  kFailOpen = 6,         // admitted by the local emergency bucket while the store is
                         // unreachable and the route fails open
  kRequestTooLarge = 7,  // denied: the request costs more than a per-request cap (a rule's
                         // or route class's max_cost); nothing deducted; retry_after =
                         // kNever (the same request never passes)
  kAttemptExpired = 8,   // denied: the request's deadline (gateway Request::deadline) has
                         // passed; nothing is decided, a decision recorded for its attempt
                         // is not used and the units it spent stay spent (HTTP 504)
  kOverShare = 9,        // denied: a global budget with fair_share is near saturation and the
                   // tenant would pass its fair share (gateway/fair_share/fair_limits.hpp); nothing
                   // deducted; retry_after = to the next allocation (HTTP 429)
  kPaused = 10,  // denied: a global budget with fair_share is in use above its pause
                 // threshold; nothing deducted; retry_after = until units are freed
                 // or the next allocation (HTTP 429)
};

// The stable machine-readable name of a reason ("over_limit", ...).
constexpr std::string_view to_string(Reason reason) {
  switch (reason) {
    case Reason::kAllowed:
      return "allowed";
    case Reason::kOverLimit:
      return "over_limit";
    case Reason::kCostExceedsBurst:
      return "cost_exceeds_burst";
    case Reason::kRequestTooLarge:
      return "request_too_large";
    case Reason::kInvalidCost:
      return "invalid_cost";
    case Reason::kUnavailable:
      return "unavailable";
    case Reason::kShadow:
      return "shadow";
    case Reason::kFailOpen:
      return "fail_open";
    case Reason::kAttemptExpired:
      return "attempt_expired";
    case Reason::kOverShare:
      return "over_share";
    case Reason::kPaused:
      return "paused";
  }
  return "unknown";
}

struct Decision {
  bool allowed = false;
  std::int64_t remaining = 0;
  Nanos retry_after{0};
  Nanos reset_after{0};
  std::uint64_t version = 0;
  Reason reason = Reason::kOverLimit;

  friend constexpr bool operator==(const Decision&, const Decision&) = default;
};

// The decision of an all-or-nothing check over several limits, from each limit's own
// decision in order (`parts`). Every layer that decides several limits for one request
// combines them with this function (RedisStore::apply_all, the gateway's levels).
// `is_shadow(i)`: limit i is only recorded (shadow mode) and never denies. The result is
// allowed iff no enforcing limit denies; `remaining` is the least and `reset_after` the
// largest over all parts; `retry_after` the largest over the enforcing denials (when all
// of them would pass; kNever wins), 0 when allowed; `reason` that of the first enforcing
// denial, else kShadow when a shadow limit would have denied, else kAllowed; `version`
// the highest any part carries. No parts: allowed, remaining INT64_MAX.
//
//   Decision d = quota::combine_all(parts);   // every part enforcing
template <class IsShadow>
constexpr Decision combine_all(std::span<const Decision> parts, const IsShadow& is_shadow) {
  Decision out{.allowed = true,
               .remaining = std::numeric_limits<std::int64_t>::max(),
               .retry_after = Nanos{0},
               .reset_after = Nanos{0},
               .version = 0,
               .reason = Reason::kAllowed};
  bool shadowed = false;
  for (std::size_t i = 0; i < parts.size(); ++i) {
    const Decision& d = parts[i];
    out.remaining = std::min(out.remaining, d.remaining);
    out.reset_after = std::max(out.reset_after, d.reset_after);
    out.version = std::max(out.version, d.version);
    if (d.allowed) continue;
    if (is_shadow(i)) {
      shadowed = true;
      continue;
    }
    out.retry_after = std::max(out.retry_after, d.retry_after);
    if (out.allowed) out.reason = d.reason;
    out.allowed = false;
  }
  if (out.allowed && shadowed) out.reason = Reason::kShadow;
  return out;
}
constexpr Decision combine_all(std::span<const Decision> parts) {
  return combine_all(parts, [](std::size_t) { return false; });
}

}  // namespace quota
