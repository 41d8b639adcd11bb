// quota/policy/token_bucket.hpp — the exact token bucket.
//
// A bucket holds up to `burst` units and refills continuously at `rate`; a request of
// `cost` units is admitted iff `cost` <= the tokens present, and then takes them. Over
// any interval of length T the admitted cost is at most rate·T + burst — exactly, since
// nothing here is rounded:
//
//   - a new key starts full (at its first request);
//   - refill: tokens = min(burst, tokens + rate·(now − last)), computed in micro-units
//     with the fraction of a micro-unit carried as a remainder over `rate.per`: neither
//     rounded up (that would create budget) nor dropped (that would lose it). Refilling
//     in many small steps therefore gives exactly what one large step gives;
//   - a time earlier than the stored one refills nothing and is not stored;
//   - a denial keeps the refilled state and sets retry_after = ceil((cost − tokens)/rate)
//     nanoseconds: the same request is admitted at now + retry_after and denied 1 ns
//     earlier, if nobody else spends meanwhile;
//   - cost > burst → kCostExceedsBurst, retry_after = kNever, nothing deducted;
//     cost < 1 → kInvalidCost, nothing deducted;
//   - rate.units = 0 is a one-off budget of `burst`: denials say kNever.
//
// The policy is a value: thread-safe to share; `apply` needs exclusive access to the
// state, which the stores provide.
//
//   using namespace std::chrono_literals;
//   quota::TokenBucket tb{.rate = {.units = 100, .per = 1s}, .burst = 20};
//   auto s = tb.init(quota::Nanos{0});
//   quota::Decision d = tb.apply(s, quota::Nanos{0}, 5);   // allowed, remaining 15
#pragma once

#include <cstdint>

#include "absl/numeric/int128.h"
#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "quota/decision.hpp"
#include "quota/policy/policy.hpp"
#include "quota/units.hpp"

namespace quota {

// Bounds (checked by validate(), the message names the field): burst and rate.units in
// [1, kMaxUnits] and [0, kMaxUnits] so that micro-units fit in int64; rate.per > 0; the
// time to refill a whole burst, ceil(burst/rate), at most 2^63 − 2 ns (~292 years). It
// is the longest retry_after and reset_after, so every finite wait is below kNever
// (2^63 − 1 ns), which therefore means only "never" (rate 0, cost > burst). Idle time is
// unbounded: refill is formed in 128 bits (rate·Δt < 2^126), and two times 2^63 ns or
// more apart (any two int64 times are allowed) are further apart than the fill time, so
// they simply yield a full bucket at any positive rate.
//
// State: 24 bytes (tokens in micro-units, the carried remainder, last time).
struct TokenBucket {
  Rate rate;
  std::int64_t burst = 1;

  struct State {
    MicroUnits tokens = 0;   // whole micro-units present, in [0, burst·10^6]
    std::int64_t carry = 0;  // refill remainder: carry / rate.per micro-units, < rate.per
    std::int64_t last = 0;   // time of the last refill, ns on the limiter's clock
  };

  absl::Status validate() const {
    if (auto s = validate_rate(rate, "rate"); !s.ok()) return s;
    if (auto s = validate_amount(burst, "burst"); !s.ok()) return s;
    if (rate.units > 0) {
      const absl::int128 fill =
          detail::ceil_div(absl::int128(to_micro(burst)) * rate.per.count(), to_micro(rate.units));
      if (fill >= detail::kInt64Max) {  // kNever (2^63 − 1 ns) is kept for "never"
        return absl::InvalidArgumentError(absl::StrFormat(
            "burst/rate: refilling burst=%d at rate=%s takes longer than the bound of 2^63-2 ns "
            "(~292 years); raise rate.units or lower burst",
            burst, to_string(rate)));
      }
    }
    return absl::OkStatus();
  }

  State init(Nanos now) const {
    return State{.tokens = to_micro(burst), .carry = 0, .last = now.count()};
  }

  // The whole burst spent at `at`: empty, refilling from `at`.
  State exhausted(Nanos at) const { return State{.tokens = 0, .carry = 0, .last = at.count()}; }

  Decision apply(State& s, Nanos now, std::int64_t cost) const {
    refill(s, now.count());
    if (cost < 1) return detail::never_decision(Reason::kInvalidCost, remaining(s), reset_after(s));
    if (cost > burst)
      return detail::never_decision(Reason::kCostExceedsBurst, remaining(s), reset_after(s));
    const MicroUnits need = to_micro(cost);
    if (need <= s.tokens) {
      s.tokens -= need;
      return detail::allowed_decision(remaining(s), reset_after(s));
    }
    return detail::over_limit_decision(remaining(s), time_to_reach(s, need), reset_after(s));
  }

  Nanos idle_at(const State& s) const {
    if (s.tokens >= to_micro(burst)) return Nanos{s.last};
    return detail::saturating_add(Nanos{s.last}, reset_after(s));
  }

  // Brings `s` to time `now` (no-op for now <= s.last). Public so that stores and the
  // gateway layer can observe a bucket without spending from it.
  void refill(State& s, std::int64_t now) const {
    if (now <= s.last) return;  // backwards (or same) time: nothing to add, keep `last`
    const MicroUnits cap = to_micro(burst);
    std::int64_t dt;
    const bool far = __builtin_sub_overflow(now, s.last, &dt);
    s.last = now;
    if (s.tokens >= cap) return;  // full stays full; carry is 0 whenever full
    if (far) [[unlikely]] {
      // now − last >= 2^63 ns: longer than the time to fill the whole burst (validate()
      // keeps it below 2^63 − 1 ns), so any positive rate has filled the bucket.
      if (rate.units > 0) {
        s.tokens = cap;
        s.carry = 0;
      }
      return;
    }
    const std::int64_t per = rate.per.count();
    const std::int64_t micros_per_period = to_micro(rate.units);
    std::int64_t added;
    // Fast path in 64 bits: on a busy key dt is small and this is one multiply and one
    // divide. The 128-bit path handles long idle gaps exactly.
    if (!__builtin_mul_overflow(micros_per_period, dt, &added) &&
        !__builtin_add_overflow(added, s.carry, &added)) {
      const std::int64_t whole = added / per;
      if (whole >= cap - s.tokens) {
        s.tokens = cap;
        s.carry = 0;
      } else {
        s.tokens += whole;
        s.carry = added % per;
      }
      return;
    }
    // Long idle gap: decide "full" by multiplying, not dividing (128-bit division is the
    // slowest operation here), and divide only for a partial refill.
    const absl::int128 wide = absl::int128(micros_per_period) * dt + s.carry;
    if (wide >= absl::int128(cap - s.tokens) * per) {
      s.tokens = cap;
      s.carry = 0;
      return;
    }
    s.tokens += static_cast<std::int64_t>(wide / per);
    s.carry = static_cast<std::int64_t>(wide % per);
  }

  // Exact time until the bucket holds `need` micro-units (kNever at rate 0): the least d
  // with floor((rate_micro·d + carry) / per) >= need − tokens. Public so that the Redis
  // twin's reply, which carries the state, is turned into the same decision.
  Nanos time_to_reach(const State& s, MicroUnits need) const {
    if (s.tokens >= need) return Nanos{0};
    if (rate.units == 0) return kNever;
    const std::int64_t micros_per_period = to_micro(rate.units);
    std::int64_t numer;
    if (!__builtin_mul_overflow(need - s.tokens, rate.per.count(), &numer)) {
      numer -= s.carry;  // carry < per <= numer, so numer stays positive
      return Nanos{numer / micros_per_period + (numer % micros_per_period != 0)};
    }
    const absl::int128 wide = absl::int128(need - s.tokens) * rate.per.count() - s.carry;
    // Bounded by burst/rate, which validate() keeps below 2^63 − 1 ns (kNever).
    return Nanos{static_cast<std::int64_t>(detail::ceil_div(wide, micros_per_period))};
  }

  Nanos reset_after(const State& s) const { return time_to_reach(s, to_micro(burst)); }

 private:
  static std::int64_t remaining(const State& s) { return s.tokens / kMicrosPerUnit; }
};

static_assert(Policy<TokenBucket>);

}  // namespace quota
