// quota/policy/fixed_window.hpp — the fixed (aligned) window counter.
//
// Time is cut into windows [k·W, (k+1)·W) aligned at multiples of W on the limiter's
// clock (k = floor(now / W), a true floor also for negative times). A key counts the
// units it was admitted in the current window; a request of `cost` units is admitted
// iff count + cost <= limit, and then counted. When the window index advances the count
// starts again from 0.
//
// The price of a fixed size state: the limit holds per *aligned* window only. A client
// may spend `limit` at the very end of one window and `limit` again at the very start
// of the next, so a true sliding window of length W can see up to 2·limit (shown by
// fixed_window_test "2N burst across a boundary"). Use SlidingLog when that matters.
//
// The policy is a value: thread-safe to share; `apply` needs exclusive access to the
// state, which the stores provide.
//
//   using namespace std::chrono_literals;
//   quota::FixedWindow fw{.limit = 100, .window = 1min};
//   auto s = fw.init(quota::Nanos{0});
//   quota::Decision d = fw.apply(s, quota::Nanos{0}, 5);   // allowed, remaining 95
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>

#include "absl/numeric/int128.h"
#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "quota/decision.hpp"
#include "quota/policy/policy.hpp"
#include "quota/units.hpp"

namespace quota {

// The longest window a window policy accepts: 2^62 − 1 ns (~146 years), so that two
// windows (the longest retry_after and reset_after of SlidingWindowEstimate) are at
// most 2^63 − 2 ns: every finite wait is below kNever (2^63 − 1 ns), which therefore
// means only "never" (cost > limit).
inline constexpr Nanos kMaxWindow{(std::int64_t{1} << 62) - 1};

namespace detail {

// floor(a / b) for b > 0: a true floor, also for negative a.
constexpr std::int64_t floor_div(std::int64_t a, std::int64_t b) {
  const std::int64_t q = a / b;
  return (a % b != 0 && a < 0) ? q - 1 : q;
}

// a mod b in [0, b) for b > 0 (a − floor(a/b)·b).
constexpr std::int64_t floor_mod(std::int64_t a, std::int64_t b) {
  const std::int64_t r = a % b;
  return r < 0 ? r + b : r;
}

// An int128 duration or time as Nanos, saturating to kNever above int64 (a time beyond
// the end of the timeline never comes) and to Nanos::min() below it.
inline Nanos saturate_nanos(absl::int128 v) {
  if (v > kInt64Max) return kNever;
  if (v < absl::int128(std::numeric_limits<std::int64_t>::min())) return Nanos::min();
  return Nanos{static_cast<std::int64_t>(v)};
}

// Checks the (limit, window) pair shared by the window policies.
inline absl::Status validate_window_params(std::int64_t limit, Nanos window) {
  if (auto s = validate_amount(limit, "limit"); !s.ok()) return s;
  if (window.count() <= 0 || window > kMaxWindow) {
    return absl::InvalidArgumentError(
        absl::StrFormat("window must be in [1, %d] ns (2^62-1 ns, ~146 years) (got %d ns)",
                        kMaxWindow.count(), window.count()));
  }
  return absl::OkStatus();
}

}  // namespace detail

// Semantics, exactly (`t` is the time of the decision, see "Time" below):
//   - allowed  iff count + cost <= limit; then count += cost, retry_after = 0;
//   - denied (kOverLimit): retry_after = start of the next window − t = (k+1)·W − t:
//     the same request is admitted at t + retry_after and denied 1 ns earlier, if
//     nobody else spends meanwhile;
//   - cost > limit → kCostExceedsBurst ("burst" is the limit N for window policies),
//     retry_after = kNever, nothing counted; cost < 1 → kInvalidCost, nothing counted;
//   - remaining = limit − count (whole units, after this decision);
//   - reset_after = (k+1)·W − t when count > 0 (the count drops to 0 at the next window
//     start), 0 when count = 0.
//
// Time. The state keeps the latest time it has seen (`last`); any int64 time is allowed.
// A `now` earlier than it is treated as `last`: backwards time neither un-counts (it
// cannot reach an earlier window) nor re-counts, and is never stored. Durations are at
// most one window, so they always fit; only idle_at, a time, saturates to kNever when
// the next window starts past the end of the int64 timeline.
//
// Bounds (validate(), the message names the field): limit in [1, kMaxUnits], window > 0
// and at most kMaxWindow (2^62 − 1 ns, ~146 years).
//
// State: 16 bytes (count, last). idle_at: `last` when count = 0, else the next window
// start.
struct FixedWindow {
  std::int64_t limit = 1;                 // N: whole units per aligned window
  Nanos window{std::chrono::seconds(1)};  // W

  struct State {
    std::int64_t count = 0;  // units admitted in the window of `last`, in [0, limit]
    std::int64_t last = 0;   // latest time seen, ns on the limiter's clock
  };

  absl::Status validate() const { return detail::validate_window_params(limit, window); }

  State init(Nanos now) const { return State{.count = 0, .last = now.count()}; }

  // The whole limit spent at `at`: the window of `at` full.
  State exhausted(Nanos at) const { return State{.count = limit, .last = at.count()}; }

  Decision apply(State& s, Nanos now, std::int64_t cost) const {
    advance(s, now.count());
    if (cost < 1) return detail::never_decision(Reason::kInvalidCost, remaining(s), reset_after(s));
    if (cost > limit)
      return detail::never_decision(Reason::kCostExceedsBurst, remaining(s), reset_after(s));
    if (cost <= limit - s.count) {
      s.count += cost;
      return detail::allowed_decision(remaining(s), reset_after(s));
    }
    return detail::over_limit_decision(remaining(s), to_next_window(s), reset_after(s));
  }

  Nanos idle_at(const State& s) const {
    if (s.count == 0) return Nanos{s.last};
    return detail::saturate_nanos(next_window_start(s.last));
  }

  // Brings `s` to time `now`: a later window index resets the count; a time earlier than
  // `last` changes nothing. Public so that stores can observe a key without spending.
  void advance(State& s, std::int64_t now) const {
    if (now <= s.last) return;
    const std::int64_t w = window.count();
    if (detail::floor_div(now, w) != detail::floor_div(s.last, w)) s.count = 0;
    s.last = now;
  }

 private:
  absl::int128 next_window_start(std::int64_t t) const {
    const std::int64_t w = window.count();
    return (absl::int128(detail::floor_div(t, w)) + 1) * w;
  }

  // Clamped at 0 only for a state built under a larger limit (a rule change).
  std::int64_t remaining(const State& s) const {
    return std::max<std::int64_t>(0, limit - s.count);
  }

  Nanos to_next_window(const State& s) const {
    return detail::saturate_nanos(next_window_start(s.last) - s.last);
  }

  Nanos reset_after(const State& s) const { return s.count == 0 ? Nanos{0} : to_next_window(s); }
};

static_assert(Policy<FixedWindow>);

}  // namespace quota
