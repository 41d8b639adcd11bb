// tests/support/exact_token_bucket.hpp — an independent exact model of the token bucket.
//
// It keeps the bucket as ONE rational number, T / per micro-units (T in 128 bits), with
// no carried remainder and no fast path: a different representation from
// quota::TokenBucket, so agreement between the two is evidence, not tautology.
#pragma once

#include <cstdint>

#include "absl/numeric/int128.h"
#include "quota/decision.hpp"
#include "quota/policy/token_bucket.hpp"

namespace quota::testing {

class ExactTokenBucket {
 public:
  explicit ExactTokenBucket(TokenBucket p)
      : p_(p),
        per_(p.rate.per.count()),
        rate_(absl::int128(p.rate.units) * kMicrosPerUnit),
        cap_(absl::int128(p.burst) * kMicrosPerUnit * per_) {}

  Decision apply(std::int64_t now, std::int64_t cost) {
    if (!started_) {
      started_ = true;
      t_ = cap_;
      last_ = now;
    }
    if (now > last_) {
      const absl::int128 gap = cap_ - t_;
      const absl::int128 dt = absl::int128(now) - last_;  // any two int64 times
      // rate·dt could exceed 128 bits only when far beyond full; compare by division.
      t_ = (rate_ == 0 || dt < gap / rate_ + 1) ? (t_ + rate_ * dt < cap_ ? t_ + rate_ * dt : cap_)
                                                : cap_;
      last_ = now;
    }
    Decision d;
    d.remaining = static_cast<std::int64_t>(t_ / (per_ * kMicrosPerUnit));
    d.reset_after = time_to(cap_);
    if (cost < 1 || cost > p_.burst) {
      d.reason = cost < 1 ? Reason::kInvalidCost : Reason::kCostExceedsBurst;
      d.retry_after = kNever;
      return d;
    }
    const absl::int128 need = absl::int128(cost) * kMicrosPerUnit * per_;
    if (need <= t_) {
      t_ -= need;
      d.allowed = true;
      d.reason = Reason::kAllowed;
      d.remaining = static_cast<std::int64_t>(t_ / (per_ * kMicrosPerUnit));
      d.reset_after = time_to(cap_);
      return d;
    }
    d.reason = Reason::kOverLimit;
    d.retry_after = time_to(need);
    return d;
  }

 private:
  Nanos time_to(absl::int128 target) const {
    if (t_ >= target) return Nanos{0};
    if (rate_ == 0) return kNever;
    return Nanos{static_cast<std::int64_t>((target - t_ + rate_ - 1) / rate_)};
  }

  TokenBucket p_;
  absl::int128 per_, rate_, cap_;
  absl::int128 t_ = 0;
  std::int64_t last_ = 0;
  bool started_ = false;
};

}  // namespace quota::testing
