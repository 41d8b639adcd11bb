// tests/support/cut_backend.hpp — a gateway backend that can be cut off, on demand.
//
// Wraps a gateway backend (backend.hpp) and, while `cut` is set, answers every call with
// absl::UnavailableError without reaching it: what a region sees of the central authority
// across a partition. Counts the calls it refused. Thread-safe when the wrapped backend is.
#pragma once

#include <atomic>
#include <cstdint>
#include <span>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "quota/gateway/backend.hpp"
#include "quota/units.hpp"

namespace quota::testing {

template <gateway::GatewayBackend Inner>
class CutBackend final : public gateway::Backend {
 public:
  explicit CutBackend(Inner& inner) : inner_(inner) {}

  void set_cut(bool cut) { cut_.store(cut, std::memory_order_release); }
  bool cut() const { return cut_.load(std::memory_order_acquire); }
  std::int64_t refused() const { return refused_.load(std::memory_order_relaxed); }
  std::int64_t calls() const { return calls_.load(std::memory_order_relaxed); }

  absl::StatusOr<gateway::LevelsResult> decide(std::span<const gateway::LevelCheck> levels,
                                               std::uint64_t version, Nanos now) override {
    calls_.fetch_add(1, std::memory_order_relaxed);
    if (cut()) return refuse();
    return inner_.decide(levels, version, now);
  }
  absl::StatusOr<MicroUnits> refund(const gateway::RulePolicy& policy, std::uint64_t version,
                                    gateway::LevelKey key, std::int64_t units, Nanos spent_at,
                                    Nanos now) override {
    calls_.fetch_add(1, std::memory_order_relaxed);
    if (cut()) return refuse();
    return inner_.refund(policy, version, key, units, spent_at, now);
  }
  absl::StatusOr<MicroUnits> charge(const gateway::RulePolicy& policy, std::uint64_t version,
                                    gateway::LevelKey key, std::int64_t units, Nanos now) override {
    calls_.fetch_add(1, std::memory_order_relaxed);
    if (cut()) return refuse();
    return inner_.charge(policy, version, key, units, now);
  }

 private:
  absl::Status refuse() {
    refused_.fetch_add(1, std::memory_order_relaxed);
    return absl::UnavailableError("cut off from the central authority");
  }

  Inner& inner_;
  std::atomic<bool> cut_{false};
  std::atomic<std::int64_t> refused_{0};
  std::atomic<std::int64_t> calls_{0};
};

}  // namespace quota::testing
