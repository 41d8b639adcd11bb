// quota/policy/sliding_log.hpp — the exact sliding window: a log of admitted events.
//
// A key keeps the (time, cost) of every request it admitted that is still inside the
// window. The window at time t is (t − W, t]: an event admitted at e counts while
// t < e + W and leaves it at exactly e + W. A request of `cost` units is admitted iff
// (sum of counted costs) + cost <= limit, and is then logged at t. So at most `limit`
// units are admitted in *every* window of length W — exactly, not only in aligned ones.
// The price is memory: 16 bytes per live event, at most `limit` of them per key.
//
// The policy is a value: thread-safe to share; `apply` needs exclusive access to the
// state, which the stores provide. State is copyable and movable (a moved-from state is
// empty).
//
//   using namespace std::chrono_literals;
//   quota::SlidingLog log{.limit = 100, .window = 1min};
//   auto s = log.init(quota::Nanos{0});
//   quota::Decision d = log.apply(s, quota::Nanos{0}, 5);   // allowed, remaining 95
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "absl/numeric/int128.h"
#include "absl/status/status.h"
#include "quota/decision.hpp"
#include "quota/policy/fixed_window.hpp"
#include "quota/policy/policy.hpp"
#include "quota/units.hpp"

namespace quota {

// Semantics, exactly (`t` is the time of the decision, see "Time" below):
//   - allowed iff used + cost <= limit, where used = the costs of events with
//     t < e + W; the event (t, cost) is logged, retry_after = 0;
//   - denied (kOverLimit), nothing logged: retry_after = e_j + W − t, where e_j is the
//     oldest logged event whose departure makes room, i.e. the first j (oldest first)
//     with cost_0 + … + cost_j >= used + cost − limit. The same request is admitted at
//     t + retry_after and denied 1 ns earlier, if nobody else spends meanwhile;
//   - cost > limit → kCostExceedsBurst ("burst" is the limit N for window policies),
//     retry_after = kNever; cost < 1 → kInvalidCost; neither logs anything;
//   - remaining = limit − used (whole units, after this decision);
//   - reset_after = newest event + W − t when anything is counted (every event has left
//     then), 0 otherwise.
//
// Time. The state keeps the latest time any decision has seen (`last`, >= the newest
// logged event). A `now` earlier than it is treated as `last`: an event never counts
// again once it has left (no re-count), never leaves early (no un-count), and no event
// is logged at a time earlier than a logged one.
//
// Memory and cost. Events live in a ring buffer of (time, cumulative cost) pairs,
// 16 bytes each, in one heap block per key. Since every cost is >= 1 and the counted
// costs never exceed `limit`, at most `limit` events are live: the ring never grows
// beyond `limit` entries. It starts empty (no allocation for a key that never admitted
// anything), then grows geometrically (4, 8, 16, … capped at `limit`) and never
// shrinks while the key lives; a store frees it when the key is idle. So the hot path
// allocates nothing per event: only O(log limit) times in a key's life. Expired events
// are dropped from the front as time passes — amortized O(1) per decision. The
// cumulative costs make `used` O(1) and let a denial find e_j by a galloping search from
// the oldest event: O(log j), i.e. O(1) when unit costs are denied one at a time.
// State: 56 bytes + 16 bytes per ring slot (see benchmarks/policies_bench.cpp).
//
// Bounds (validate(), the message names the field): limit in [1, kMaxUnits], window in
// [1 ns, kMaxWindow]. idle_at = newest event + W (saturating to kNever), or `last` when
// nothing is logged.
struct SlidingLog {
  std::int64_t limit = 1;                 // N: whole units in any window of length W
  Nanos window{std::chrono::seconds(1)};  // W

  class State {
   public:
    State() = default;
    explicit State(std::int64_t last) : last_(last) {}
    State(const State&) = default;
    State& operator=(const State&) = default;
    State(State&& o) noexcept
        : ring_(std::move(o.ring_)),
          head_(std::exchange(o.head_, 0)),
          size_(std::exchange(o.size_, 0)),
          base_(std::exchange(o.base_, 0)),
          last_(o.last_) {}
    State& operator=(State&& o) noexcept {
      ring_ = std::move(o.ring_);
      head_ = std::exchange(o.head_, 0);
      size_ = std::exchange(o.size_, 0);
      base_ = std::exchange(o.base_, 0);
      last_ = o.last_;
      return *this;
    }

    // Logged events (some may have expired since the last decision).
    std::size_t events() const { return size_; }
    // Ring slots allocated (16 bytes each).
    std::size_t capacity() const { return ring_.size(); }
    // Units counted by the logged events.
    std::int64_t used() const { return static_cast<std::int64_t>(total() - base_); }
    // The latest time a decision has seen, ns.
    std::int64_t last() const { return last_; }

   private:
    friend struct SlidingLog;

    struct Event {
      std::int64_t time;  // ns on the limiter's clock
      // Units admitted by this key up to and including this event, modulo 2^64: the
      // difference of two of them is exact since a window never holds 2^63 units.
      std::uint64_t cum;
    };

    const Event& at(std::size_t i) const {  // i-th oldest, i < size_
      std::size_t p = head_ + i;
      if (p >= ring_.size()) p -= ring_.size();
      return ring_[p];
    }
    std::uint64_t total() const { return size_ == 0 ? base_ : at(size_ - 1).cum; }

    void pop_front() {
      base_ = ring_[head_].cum;
      if (++head_ == ring_.size()) head_ = 0;
      --size_;
    }

    void push_back(std::int64_t time, std::uint64_t cum, std::size_t max_slots) {
      if (size_ == ring_.size()) {
        // Geometric growth, capped at the most events that can be live (limit): an
        // admission has used + cost <= limit with every cost >= 1, so size_ < limit
        // here; the size_ + 1 floor is only a guard.
        const std::size_t grown = std::max<std::size_t>(4, ring_.size() * 2);
        std::vector<Event> bigger(std::max(std::min(grown, max_slots), size_ + 1));
        for (std::size_t i = 0; i < size_; ++i) bigger[i] = at(i);
        ring_ = std::move(bigger);
        head_ = 0;
      }
      std::size_t p = head_ + size_;
      if (p >= ring_.size()) p -= ring_.size();
      ring_[p] = Event{time, cum};
      ++size_;
    }

    std::vector<Event> ring_;  // ring_.size() is the capacity
    std::size_t head_ = 0;     // index of the oldest event
    std::size_t size_ = 0;     // events logged
    std::uint64_t base_ = 0;   // cumulative units before the oldest logged event
    std::int64_t last_ = 0;    // latest time seen
  };

  absl::Status validate() const { return detail::validate_window_params(limit, window); }

  State init(Nanos now) const { return State(now.count()); }

  // The whole limit spent at `at`: one logged event of `limit` units, counted until
  // `at` + window.
  State exhausted(Nanos at) const {
    State s = init(at);
    (void)apply(s, at, limit);
    return s;
  }

  Decision apply(State& s, Nanos now, std::int64_t cost) const {
    advance(s, now.count());
    if (cost < 1) return detail::never_decision(Reason::kInvalidCost, remaining(s), reset_after(s));
    if (cost > limit)
      return detail::never_decision(Reason::kCostExceedsBurst, remaining(s), reset_after(s));
    const std::int64_t used = s.used();
    if (cost <= limit - used) {
      // used + cost <= limit and every cost >= 1, so at most `limit` events are live.
      s.push_back(s.last_, s.total() + static_cast<std::uint64_t>(cost),
                  static_cast<std::size_t>(limit));
      return detail::allowed_decision(remaining(s), reset_after(s));
    }
    return detail::over_limit_decision(
        remaining(s), until_room(s, static_cast<std::uint64_t>(used + cost - limit)),
        reset_after(s));
  }

  Nanos idle_at(const State& s) const {
    if (s.size_ == 0) return Nanos{s.last_};
    return detail::saturating_add(Nanos{s.at(s.size_ - 1).time}, window);
  }

  // Brings `s` to time `now`: drops the events that have left the window (e + W <= now).
  // A time earlier than `last` changes nothing. Public so that stores can observe a key
  // without spending.
  void advance(State& s, std::int64_t now) const {
    if (now > s.last_) s.last_ = now;
    const std::uint64_t w = static_cast<std::uint64_t>(window.count());
    // last − e >= 0 for every logged e; formed in uint64 so any two int64 times work.
    while (s.size_ > 0 && static_cast<std::uint64_t>(s.last_) -
                                  static_cast<std::uint64_t>(s.ring_[s.head_].time) >=
                              w) {
      s.pop_front();
    }
  }

  // Un-logs up to `units` units, taken from the most recent events logged at or before
  // `spent_at` (newest first), as if they had never been admitted; events logged after
  // `spent_at` are another request's and stay. Returns the units removed (<= the counted
  // units at or before `spent_at`). Call it on a state brought to its time by advance(),
  // so that only events still counted are taken back. An event left with no units is
  // dropped, so the ring keeps at most `limit` events; its capacity does not change.
  // O(events), no allocation. Public for the gateway's refunds (gateway/rules/rule_kinds.hpp).
  std::int64_t take_back(State& s, std::int64_t units, std::int64_t spent_at) const {
    // k: the newest event at or before spent_at (events are in time order).
    std::size_t k = s.size_;
    while (k > 0 && s.at(k - 1).time > spent_at) --k;
    if (k == 0 || units <= 0) return 0;
    const std::uint64_t cum_k = s.at(k - 1).cum;
    const std::uint64_t back = std::min(static_cast<std::uint64_t>(units), cum_k - s.base_);
    // Event i (< k) loses clamp(back − (cum_k − cum_i), 0, cost_i): the newest first.
    std::uint64_t prev_cum = s.base_;  // original cum of the event before i
    std::uint64_t running = s.base_;   // rewritten cum
    std::size_t write = 0;
    const std::size_t n = s.size_;
    for (std::size_t i = 0; i < n; ++i) {
      const State::Event e = s.at(i);
      const std::uint64_t cost = e.cum - prev_cum;
      prev_cum = e.cum;
      std::uint64_t removed = 0;
      if (i < k) {
        const std::uint64_t after = cum_k - e.cum;  // units of events in (i, k]
        if (back > after) removed = std::min(cost, back - after);
      }
      if (cost == removed) continue;
      running += cost - removed;
      std::size_t p = s.head_ + write;
      if (p >= s.ring_.size()) p -= s.ring_.size();
      s.ring_[p] = State::Event{e.time, running};
      ++write;
    }
    s.size_ = write;
    return static_cast<std::int64_t>(back);
  }

 private:
  // Clamped at 0 only for a state built under a larger limit (a rule change).
  std::int64_t remaining(const State& s) const {
    return std::max<std::int64_t>(0, limit - s.used());
  }

  // W − (last − e): time until an event at e leaves, for a live event (last − e < W).
  Nanos until_leaves(const State& s, std::int64_t e) const {
    return Nanos{window.count() - static_cast<std::int64_t>(static_cast<std::uint64_t>(s.last_) -
                                                            static_cast<std::uint64_t>(e))};
  }

  Nanos reset_after(const State& s) const {
    return s.size_ == 0 ? Nanos{0} : until_leaves(s, s.at(s.size_ - 1).time);
  }

  // The time until the oldest events holding at least `excess` units (0 < excess <=
  // used) have left: galloping search for the first j with cum_j − base >= excess.
  Nanos until_room(const State& s, std::uint64_t excess) const {
    auto enough = [&](std::size_t j) { return s.at(j).cum - s.base_ >= excess; };
    std::size_t lo = 0;  // every index < lo is not enough
    std::size_t hi = 0;  // candidate that is enough
    std::size_t step = 1;
    for (;;) {
      if (hi >= s.size_ - 1 || enough(hi)) {
        hi = std::min(hi, s.size_ - 1);
        break;
      }
      lo = hi + 1;
      hi += step;
      step *= 2;
    }
    while (lo < hi) {  // first enough in [lo, hi]; hi is enough
      const std::size_t mid = lo + (hi - lo) / 2;
      if (enough(mid)) {
        hi = mid;
      } else {
        lo = mid + 1;
      }
    }
    return until_leaves(s, s.at(hi).time);
  }
};

static_assert(Policy<SlidingLog>);

}  // namespace quota
