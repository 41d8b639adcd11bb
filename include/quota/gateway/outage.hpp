// quota/gateway/outage.hpp — what a request gets while its store cannot answer.
//
// A Gateway sends a store error that means "the authority cannot answer now"
// (is_unavailable(), request.hpp) to the route class's fail mode, through one Outage:
//   - fail_closed → a Decision with reason kUnavailable (HTTP 503, never 429);
//   - fail_open   → the route's local emergency bucket, per process and per tenant key:
//     kFailOpen when it admits, kUnavailable when it is empty or once the outage — since
//     the first failure after the last success — has lasted the bucket's max_duration.
// The emergency buckets live in this process's own ShardedStore, version 0, so a rule
// reload never refills them, and an outage never resets them: the extra admitted per key
// and process is at most EmergencyBucket::outage_allowance() per outage (rule_spec.hpp).
//
// Thread safety: any thread (the outage start is one atomic; the buckets a ShardedStore).
//
//   quota::gateway::Outage outage(options.emergency_store);
//   if (is_unavailable(status)) d = outage.answer(route, "{acme}read", 1, version, now);
//   else outage.note_success();
#pragma once

#include <atomic>
#include <cstdint>
#include <limits>
#include <string_view>

#include "quota/decision.hpp"
#include "quota/gateway/key_state.hpp"
#include "quota/gateway/rules/rule_spec.hpp"
#include "quota/store/sharded_store.hpp"
#include "quota/store/store.hpp"
#include "quota/units.hpp"

namespace quota::gateway {

class Outage {
 public:
  explicit Outage(StoreOptions emergency_store) : emergency_(emergency_store) {}

  // The answer for a request of `route` (costing `cost` on the budget with store key
  // `key`) whose store call failed as unavailable, under rule-set `version`: kUnavailable,
  // or kFailOpen with the emergency bucket's remaining and timings.
  Decision answer(const RouteClass& route, std::string_view key, std::int64_t cost,
                  std::uint64_t version, Nanos now) {
    const Decision unavailable{.allowed = false,
                               .remaining = 0,
                               .retry_after = Nanos{0},
                               .reset_after = Nanos{0},
                               .version = version,
                               .reason = Reason::kUnavailable};
    if (route.fail_mode != FailMode::kOpen) return unavailable;
    if (now.count() - started(now) >= route.emergency.max_duration.count()) return unavailable;
    const RulePolicy emergency =
        TokenBucket{.rate = route.emergency.rate, .burst = route.emergency.burst};
    // Versioned by nothing: version 0 keeps the state across rule reloads.
    const KeyPolicy kp{.policy = &emergency, .version = 0};
    auto d = emergency_.apply(kp, key, now, cost);
    if (!d.ok() || !d->allowed) return unavailable;
    Decision admitted = *d;
    admitted.version = version;
    admitted.reason = Reason::kFailOpen;
    return admitted;
  }

  // A store call succeeded: the outage, if any, is over.
  void note_success() {
    if (since_.load(std::memory_order_relaxed) != kNone) {
      since_.store(kNone, std::memory_order_release);
    }
  }

 private:
  static constexpr std::int64_t kNone = std::numeric_limits<std::int64_t>::min();

  // When the current outage began: the first failure after the last success.
  std::int64_t started(Nanos now) {
    std::int64_t since = since_.load(std::memory_order_acquire);
    if (since != kNone) return since;
    std::int64_t expected = kNone;
    if (since_.compare_exchange_strong(expected, now.count(), std::memory_order_acq_rel)) {
      return now.count();
    }
    return expected;
  }

  ShardedStore<KeyPolicy> emergency_;
  std::atomic<std::int64_t> since_{kNone};
};

}  // namespace quota::gateway
