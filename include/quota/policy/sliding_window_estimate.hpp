// quota/policy/sliding_window_estimate.hpp — the two-window sliding estimate.
//
// AN APPROXIMATION. It keeps two counters per key — the units admitted in the current
// aligned window (`cur`) and in the one before (`prev`) — and estimates the units in the
// true sliding window (t − W, t] by assuming the previous window's events were spread
// evenly over it. With el = t mod W (a true mod, in [0, W), also for negative t) a
// request of `cost` units is admitted iff
//
//     (cur + cost)·W + prev·(W − el) <= limit·W
//
// computed exactly in 128-bit integers (nothing rounded). Windows are aligned at
// multiples of W like FixedWindow's, and the counters roll like its count: when the
// window index floor(t / W) advances by one, prev = cur and cur = 0; when it advances
// by more, both become 0. Worst case, one true sliding window of length W can hold
// 2·N − 1 units (see below); use SlidingLog when N must hold in every window.
//
// The policy is a value: thread-safe to share; `apply` needs exclusive access to the
// state, which the stores provide.
//
//   using namespace std::chrono_literals;
//   quota::SlidingWindowEstimate sw{.limit = 100, .window = 1min};
//   auto s = sw.init(quota::Nanos{0});
//   quota::Decision d = sw.apply(s, quota::Nanos{0}, 5);   // allowed, remaining 95
#pragma once

#include <cstdint>

#include "absl/numeric/int128.h"
#include "absl/status/status.h"
#include "quota/decision.hpp"
#include "quota/policy/fixed_window.hpp"
#include "quota/policy/policy.hpp"
#include "quota/units.hpp"

namespace quota {

namespace detail {

// floor(a·b / d) for a, b >= 0 and d > 0, exactly: one 64-bit multiply and divide when
// a·b fits in int64 (the common case), 128-bit arithmetic otherwise.
inline absl::int128 mul_div_floor(std::int64_t a, std::int64_t b, std::int64_t d) {
  std::int64_t product;
  if (!__builtin_mul_overflow(a, b, &product)) return product / d;
  return absl::int128(a) * b / d;
}

}  // namespace detail

// Worst-case overshoot. Since the estimate assumes evenly spread events, traffic that
// puts all of the previous window's units at its very end defeats it: N units in the
// last nanosecond of window k, then unit requests in window k+1 as early as the limiter
// admits them. On that adversary the most units in one true sliding window of length W
// is 2·N − ceil(2·N / W) (W in ns, W >= 2), i.e. 2·N − 1 once W >= 2·N
// (sliding_window_estimate_test, "overshoot in a true sliding window", checks it with
// verify_window and a brute-force window maximum). No traffic can exceed 2·N − 1 (each
// aligned window holds at most N, and the previous window's events count with weight
// >= 1/W). Against 2·N for FixedWindow that is barely better in the worst case; its merit
// is ordinary traffic, which it follows closely in 24 bytes.
//
// Semantics, exactly (`t` is the time of the decision, see "Time" below):
//   - allowed iff the inequality above holds; then cur += cost, retry_after = 0;
//   - denied (kOverLimit): retry_after = the least d > 0 such that the same request
//     passes at t + d if nobody else spends (the estimate only decreases with time, so
//     it is admitted at t + d and denied 1 ns earlier); at most two windows;
//   - cost > limit → kCostExceedsBurst ("burst" is the limit N for window policies),
//     retry_after = kNever; cost < 1 → kInvalidCost; neither counts anything;
//   - remaining = the largest c >= 0 with (cur + c)·W + prev·(W − el) <= limit·W, i.e.
//     floor((limit·W − prev·(W − el)) / W) − cur, clamped at 0 (after this decision);
//   - reset_after = time until both counters are 0: the start of window k+2 − t when
//     cur > 0, of window k+1 − t when only prev > 0, else 0.
//
// Time. The state keeps the latest time it has seen (`last`) and derives the window
// index from it; any int64 time is allowed. A `now` earlier than it is treated as
// `last`: backwards time neither un-counts nor re-counts (the previous window's weight
// never grows back). Durations are at most two windows, 2^63 − 2 ns, so a finite wait
// is never kNever; only idle_at, a time, saturates to kNever when both counters drop
// to 0 past the end of the int64 timeline.
//
// Bounds (validate(), the message names the field): limit in [1, kMaxUnits], window in
// [1 ns, kMaxWindow] (2^62 − 1 ns). Products (cur + cost)·W < 2^44·2^62 fit int128.
// State: 24 bytes. idle_at: `last` when both counters are 0, else when they will be.
struct SlidingWindowEstimate {
  std::int64_t limit = 1;                 // N
  Nanos window{std::chrono::seconds(1)};  // W

  struct State {
    std::int64_t cur = 0;   // units admitted in the window of `last`
    std::int64_t prev = 0;  // units admitted in the window before it
    std::int64_t last = 0;  // latest time seen, ns on the limiter's clock
  };

  absl::Status validate() const { return detail::validate_window_params(limit, window); }

  State init(Nanos now) const { return State{.cur = 0, .prev = 0, .last = now.count()}; }

  // The whole limit spent at `at`: the window of `at` full (then the previous window of
  // the next one).
  State exhausted(Nanos at) const { return State{.cur = limit, .prev = 0, .last = at.count()}; }

  Decision apply(State& s, Nanos now, std::int64_t cost) const {
    advance(s, now.count());
    if (cost < 1) return detail::never_decision(Reason::kInvalidCost, remaining(s), reset_after(s));
    if (cost > limit)
      return detail::never_decision(Reason::kCostExceedsBurst, remaining(s), reset_after(s));
    const absl::int128 w = window.count();
    const absl::int128 el = detail::floor_mod(s.last, window.count());
    if ((absl::int128(s.cur) + cost) * w + absl::int128(s.prev) * (w - el) <=
        absl::int128(limit) * w) {
      s.cur += cost;
      return detail::allowed_decision(remaining(s), reset_after(s));
    }
    return detail::over_limit_decision(remaining(s), retry_after(s, cost), reset_after(s));
  }

  Nanos idle_at(const State& s) const {
    if (s.cur == 0 && s.prev == 0) return Nanos{s.last};
    const std::int64_t w = window.count();
    const absl::int128 start = absl::int128(detail::floor_div(s.last, w)) * w;
    return detail::saturate_nanos(start + (s.cur > 0 ? 2 : 1) * absl::int128(w));
  }

  // Brings `s` to time `now`, rolling the counters when the window index advances; a
  // time earlier than `last` changes nothing. Public so that stores can observe a key.
  void advance(State& s, std::int64_t now) const {
    if (now <= s.last) return;
    const std::int64_t w = window.count();
    const std::int64_t k_last = detail::floor_div(s.last, w);
    const std::int64_t k_now = detail::floor_div(now, w);
    if (k_now == k_last + 1) {  // k_now > k_last here, so k_last + 1 cannot overflow
      s.prev = s.cur;
      s.cur = 0;
    } else if (k_now != k_last) {
      s.prev = 0;
      s.cur = 0;
    }
    s.last = now;
  }

  // The units a request could take at the state's time: the largest c >= 0 with
  // (cur + c)·W + prev·(W − el) <= N·W, by the exact identity
  // floor(N − cur − prev·(W − el)/W) = N − cur − prev + floor(prev·el / W). Call it on a
  // state brought to its time by advance(). Public so that the gateway (rule changes,
  // debt) reads the budget through the policy's own arithmetic.
  std::int64_t remaining(const State& s) const {
    const std::int64_t el = detail::floor_mod(s.last, window.count());
    const absl::int128 r =
        absl::int128(limit) - s.cur - s.prev + detail::mul_div_floor(s.prev, el, window.count());
    return r < 0 ? 0 : static_cast<std::int64_t>(r);
  }

 private:
  Nanos reset_after(const State& s) const {
    if (s.cur == 0 && s.prev == 0) return Nanos{0};
    const absl::int128 w = window.count();
    const absl::int128 to_next = w - detail::floor_mod(s.last, window.count());
    return detail::saturate_nanos(s.cur > 0 ? to_next + w : to_next);
  }

  // The least d > 0 at which a request of `cost` (<= limit) passes, for a denied one.
  Nanos retry_after(const State& s, std::int64_t cost) const {
    const std::int64_t w = window.count();
    const std::int64_t el = detail::floor_mod(s.last, w);
    // In this window, at offset e > el: prev·(W − e) <= (N − cur − cost)·W.
    const std::int64_t spare = limit - s.cur - cost;  // > -2^63: all terms in [0, kMaxUnits]
    if (spare >= 0 && s.prev > 0) {
      const absl::int128 max_weight = detail::mul_div_floor(spare, w, s.prev);  // W − e
      if (max_weight >= 1) return detail::saturate_nanos(w - max_weight - el);
    }
    // In the next window (prev' = cur, cur' = 0), at offset e >= 0:
    // cur·(W − e) <= (N − cost)·W.
    const absl::int128 to_next = absl::int128(w) - el;
    if (s.cur == 0) return detail::saturate_nanos(to_next);
    const absl::int128 max_weight = detail::mul_div_floor(limit - cost, w, s.cur);
    if (max_weight >= 1) {
      const absl::int128 e = max_weight >= w ? absl::int128(0) : w - max_weight;
      return detail::saturate_nanos(to_next + e);
    }
    // The window after that: both counters are 0 and cost <= limit passes at its start.
    return detail::saturate_nanos(to_next + w);
  }
};

static_assert(Policy<SlidingWindowEstimate>);

}  // namespace quota
