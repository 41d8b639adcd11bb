// tests/support/exact_windows.hpp — brute-force reference models of the three window
// policies (FixedWindow, SlidingLog, SlidingWindowEstimate).
//
// Each model keeps the plain list of admitted (time, cost) events and recomputes every
// quantity from it by definition, in 128-bit time: the count of an aligned window is a
// sum over the events whose window index matches, the sliding count a sum over the
// events in (t − W, t]. retry_after and reset_after are found by binary search over the
// model's own predicates (each is monotone in time), remaining by search over the cost.
// No counters, no ring, no closed-form retry: agreement with the policies is evidence,
// not tautology. Slow (O(events) per query), for tests only.
#pragma once

#include <cstdint>
#include <limits>
#include <vector>

#include "absl/numeric/int128.h"
#include "quota/decision.hpp"
#include "quota/policy/fixed_window.hpp"
#include "quota/policy/sliding_log.hpp"
#include "quota/policy/sliding_window_estimate.hpp"

namespace quota::testing {

class ExactWindowModel {
 public:
  enum class Kind { kFixed, kLog, kEstimate };

  explicit ExactWindowModel(const FixedWindow& p)
      : ExactWindowModel(Kind::kFixed, p.limit, p.window) {}
  explicit ExactWindowModel(const SlidingLog& p)
      : ExactWindowModel(Kind::kLog, p.limit, p.window) {}
  explicit ExactWindowModel(const SlidingWindowEstimate& p)
      : ExactWindowModel(Kind::kEstimate, p.limit, p.window) {}

  Decision apply(std::int64_t now, std::int64_t cost) {
    if (!started_ || now > last_) last_ = now;  // backwards time counts as the latest seen
    started_ = true;
    const absl::int128 t = last_;
    // Events two windows old can count for no policy any more: forget them (speed only).
    std::vector<Ev> keep;
    for (const Ev& e : events_) {
      if (e.time > t - 2 * w_) keep.push_back(e);
    }
    events_.swap(keep);

    Decision d;
    if (cost < 1 || cost > n_) {
      d.reason = cost < 1 ? Reason::kInvalidCost : Reason::kCostExceedsBurst;
      d.retry_after = kNever;
      d.remaining = remaining(t);
      d.reset_after = reset_after(t);
      return d;
    }
    if (fits(t, cost)) {
      events_.push_back(Ev{t, cost});
      d.allowed = true;
      d.reason = Reason::kAllowed;
      d.retry_after = Nanos{0};
    } else {
      d.reason = Reason::kOverLimit;
      // The least d > 0 with fits(t + d): fits is monotone in time, true by t + 2W + 1.
      absl::int128 lo = 1, hi = 2 * w_ + 1;
      while (lo < hi) {
        const absl::int128 mid = lo + (hi - lo) / 2;
        if (fits(t + mid, cost)) {
          hi = mid;
        } else {
          lo = mid + 1;
        }
      }
      d.retry_after = to_nanos(lo);
    }
    d.remaining = remaining(t);
    d.reset_after = reset_after(t);
    return d;
  }

  // Admitted units in the sliding window (t − W, t] — the quantity a true sliding
  // window bounds; for inspection in tests.
  absl::int128 in_sliding_window(absl::int128 t) const {
    absl::int128 sum = 0;
    for (const Ev& e : events_) {
      if (e.time > t - w_ && e.time <= t) sum += e.cost;
    }
    return sum;
  }

 private:
  struct Ev {
    absl::int128 time;
    std::int64_t cost;
  };

  ExactWindowModel(Kind kind, std::int64_t limit, Nanos window)
      : kind_(kind), n_(limit), w_(window.count()) {}

  // The aligned window index of t, by repeated correction rather than a floor formula.
  absl::int128 index(absl::int128 t) const {
    absl::int128 k = t / w_;
    while (k * w_ > t) k -= 1;
    while ((k + 1) * w_ <= t) k += 1;
    return k;
  }

  absl::int128 sum_in_index(absl::int128 k) const {
    absl::int128 sum = 0;
    for (const Ev& e : events_) {
      if (index(e.time) == k) sum += e.cost;
    }
    return sum;
  }

  // Would a request of `cost` pass at time t >= every event time?
  bool fits(absl::int128 t, absl::int128 cost) const {
    switch (kind_) {
      case Kind::kFixed:
        return sum_in_index(index(t)) + cost <= n_;
      case Kind::kLog:
        return in_sliding_window(t) + cost <= n_;
      case Kind::kEstimate: {
        const absl::int128 k = index(t);
        const absl::int128 el = t - k * w_;
        return (sum_in_index(k) + cost) * w_ + sum_in_index(k - 1) * (w_ - el) <= n_ * w_;
      }
    }
    return false;
  }

  // Nothing counted at time t any more.
  bool unspent(absl::int128 t) const {
    switch (kind_) {
      case Kind::kFixed:
        return sum_in_index(index(t)) == 0;
      case Kind::kLog:
        return in_sliding_window(t) == 0;
      case Kind::kEstimate:
        return sum_in_index(index(t)) == 0 && sum_in_index(index(t) - 1) == 0;
    }
    return false;
  }

  std::int64_t remaining(absl::int128 t) const {
    // The largest c in [0, N] that fits (fits is monotone in c); 0 when none does.
    std::int64_t lo = 0, hi = n_;
    while (lo < hi) {
      const std::int64_t mid = lo + (hi - lo + 1) / 2;
      if (fits(t, mid)) {
        lo = mid;
      } else {
        hi = mid - 1;
      }
    }
    return lo;
  }

  Nanos reset_after(absl::int128 t) const {
    absl::int128 lo = 0, hi = 2 * w_;
    while (lo < hi) {
      const absl::int128 mid = lo + (hi - lo) / 2;
      if (unspent(t + mid)) {
        hi = mid;
      } else {
        lo = mid + 1;
      }
    }
    return to_nanos(lo);
  }

  static Nanos to_nanos(absl::int128 d) {
    if (d > absl::int128(std::numeric_limits<std::int64_t>::max())) return kNever;
    return Nanos{static_cast<std::int64_t>(d)};
  }

  Kind kind_;
  std::int64_t n_;
  absl::int128 w_;
  bool started_ = false;
  std::int64_t last_ = 0;
  std::vector<Ev> events_;
};

}  // namespace quota::testing
