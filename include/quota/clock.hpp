// quota/clock.hpp — the time a limiter decides with.
//
// A Clock gives nanoseconds (`quota::Nanos`) on one monotone timeline: the values are
// only ever compared with each other, never with wall-clock time. Policies are written
// so that a clock that goes backwards refills nothing and never moves stored time back,
// but a production clock should not do it.
//
//   SteadyClock — std::chrono::steady_clock (CLOCK_MONOTONIC on Linux). It keeps counting
//                 while the process is stopped or descheduled, but not while the machine
//                 is suspended (Linux stops CLOCK_MONOTONIC then): a time measured on
//                 it across a suspend is short by the suspension. Thread-safe.
//   ManualClock — for tests: set, advanced, even moved backwards by hand. Copies share
//                 one time, so a test can keep a copy and move the limiter's clock.
//                 Thread-safe (an atomic).
//
//   quota::ManualClock clock;            // starts at 0 ns
//   clock.advance(std::chrono::seconds(1));
//   quota::Nanos t = clock.now();        // 1,000,000,000 ns
#pragma once

#include <atomic>
#include <chrono>
#include <concepts>
#include <memory>

#include "quota/units.hpp"

namespace quota {

// A Clock returns the current time as nanoseconds since the clock's own epoch.
// Contract: `now()` is safe to call from any thread; successive calls on one thread do
// not go backwards (ManualClock is the documented exception, for tests).
template <class C>
concept Clock = requires(const C& clock) {
  { clock.now() } -> std::same_as<Nanos>;
};

// The process's monotonic clock.
struct SteadyClock {
  Nanos now() const {
    return std::chrono::duration_cast<Nanos>(std::chrono::steady_clock::now().time_since_epoch());
  }
};

// A clock moved by hand. Copies share the same time.
class ManualClock {
 public:
  ManualClock() : ManualClock(Nanos{0}) {}
  explicit ManualClock(Nanos start)
      : now_(std::make_shared<std::atomic<std::int64_t>>(start.count())) {}

  Nanos now() const { return Nanos{now_->load(std::memory_order_acquire)}; }

  // Sets the time; may move it backwards.
  void set(Nanos t) { now_->store(t.count(), std::memory_order_release); }

  // Moves the time by `d`, which may be negative.
  void advance(Nanos d) { now_->fetch_add(d.count(), std::memory_order_acq_rel); }

 private:
  std::shared_ptr<std::atomic<std::int64_t>> now_;
};

static_assert(Clock<SteadyClock>);
static_assert(Clock<ManualClock>);

}  // namespace quota
