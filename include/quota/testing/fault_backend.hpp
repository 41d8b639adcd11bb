// quota/testing/fault_backend.hpp — a gateway backend that fails on demand, for testing
// what a Gateway does when its store cannot answer (fail modes, leases, regions).
//
// FaultBackend<Inner> wraps any gateway backend (gateway/backend.hpp: a StoreBackend in
// process, a redis::GatewayStore) and, per call, either forwards it or answers with a
// chosen error without reaching it:
//   - fail(status) .. heal(): every call answers `status` (UnavailableError: the store is
//     down or cut off, so the route's fail mode decides; another code is returned to the
//     caller as is);
//   - fail_calls(first, last, status): only calls first..last (counted from 1, every
//     method together) answer `status`, the others are forwarded;
//   - slow(d): every forwarded call first waits d of real time (a store that answers late,
//     for deadline and non-blocking tests).
// calls() counts every call, failed() those answered with an error here.
//
// Thread safety: any thread, as the wrapped backend; the settings may change while
// other threads call.
//
//   quota::gateway::StoreBackend inner(store);
//   quota::testing::FaultBackend faulty(inner);
//   quota::gateway::Gateway g(faulty, registry);
//   faulty.fail(absl::UnavailableError("down"));   // g.decide(...) -> the route's fail mode
//   faulty.heal();
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <optional>
#include <span>
#include <thread>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "quota/gateway/backend.hpp"
#include "quota/units.hpp"

namespace quota::testing {

template <gateway::GatewayBackend Inner>
class FaultBackend final : public gateway::Backend {
 public:
  explicit FaultBackend(Inner& inner) : inner_(inner) {}

  // Every call answers `status` (not OK) until heal().
  void fail(absl::Status status) { set(std::move(status), 1, INT64_MAX); }
  // Calls first..last (1-based, counted over every method) answer `status`.
  void fail_calls(std::int64_t first, std::int64_t last, absl::Status status) {
    set(std::move(status), first, last);
  }
  void heal() { set(absl::OkStatus(), 0, -1); }
  // Every forwarded call waits `delay` of real time first (0: none).
  void slow(Nanos delay) { delay_ns_.store(delay.count(), std::memory_order_release); }

  std::int64_t calls() const { return calls_.load(std::memory_order_relaxed); }
  std::int64_t failed() const { return failed_.load(std::memory_order_relaxed); }

  absl::StatusOr<gateway::LevelsResult> decide(std::span<const gateway::LevelCheck> levels,
                                               std::uint64_t version, Nanos now) override {
    if (auto s = fault(); !s.ok()) return s;
    return inner_.decide(levels, version, now);
  }
  absl::StatusOr<MicroUnits> refund(const gateway::RulePolicy& policy, std::uint64_t version,
                                    gateway::LevelKey key, std::int64_t units, Nanos spent_at,
                                    Nanos now) override {
    if (auto s = fault(); !s.ok()) return s;
    return inner_.refund(policy, version, key, units, spent_at, now);
  }
  absl::StatusOr<MicroUnits> charge(const gateway::RulePolicy& policy, std::uint64_t version,
                                    gateway::LevelKey key, std::int64_t units, Nanos now) override {
    if (auto s = fault(); !s.ok()) return s;
    return inner_.charge(policy, version, key, units, now);
  }

 private:
  void set(absl::Status status, std::int64_t first, std::int64_t last) {
    std::lock_guard<std::mutex> lock(mu_);
    status_ = std::move(status);
    first_ = first;
    last_ = last;
    armed_.store(!status_.ok(), std::memory_order_release);
  }

  // This call's answer: OK to forward it (after the delay), else its error.
  absl::Status fault() {
    const std::int64_t n = calls_.fetch_add(1, std::memory_order_relaxed) + 1;
    if (armed_.load(std::memory_order_acquire)) {
      std::lock_guard<std::mutex> lock(mu_);
      if (!status_.ok() && n >= first_ && n <= last_) {
        failed_.fetch_add(1, std::memory_order_relaxed);
        return status_;
      }
    }
    if (const std::int64_t d = delay_ns_.load(std::memory_order_acquire); d > 0) {
      std::this_thread::sleep_for(Nanos(d));
    }
    return absl::OkStatus();
  }

  Inner& inner_;
  std::mutex mu_;
  absl::Status status_;  // guarded by mu_
  std::int64_t first_ = 0, last_ = -1;
  std::atomic<bool> armed_{false};
  std::atomic<std::int64_t> delay_ns_{0};
  std::atomic<std::int64_t> calls_{0};
  std::atomic<std::int64_t> failed_{0};
};

}  // namespace quota::testing
