// examples/quota_server/backend/counted_redis_store.hpp — the Redis backend quota-server's Gateway
// decides with, counting Redis errors by kind.
//
// CountedRedisStore forwards every call (decide, decide_attempt, refund, charge) to a
// redis::GatewayStore (redis_backend.hpp builds it from the flags) and counts each failed
// one by kind in DecisionStats (decision_stats.hpp: quota_redis_errors_total{kind}: a
// breaker open, the in-flight guard, a passed deadline, AUTH refused, any other
// unavailability). It writes the first error of each kind, and then at most one every
// 10 s per kind, to stderr: "quota-server: redis error (unauthenticated): ...". It changes
// no status: a kUnauthenticated reaches the Checker, which answers it as "cannot decide"
// (checker.hpp), never with the route's fail-open answer. Bad input (kInvalidArgument,
// the request's fault) is not counted.
//
// Guarantees: a decision is exactly the GatewayStore's; the Gateway sees the same backend
// contract (gateway::Backend, quota/gateway/backend.hpp), the store's shared attempts included.
//
// Thread safety: that of GatewayStore (thread-safe); the counters are atomics.
//
//   auto store = quota::server::make_redis_store(options);
//   quota::server::CountedRedisStore counted(*store, stats.decisions);
//   quota::gateway::Gateway gw(counted, registry);
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <span>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "quota/redis/gateway_store.hpp"
#include "stats/decision_stats.hpp"

namespace quota::server {

class CountedRedisStore final : public gateway::Backend {
 public:
  CountedRedisStore(redis::GatewayStore& store, DecisionStats& stats)
      : store_(store), stats_(stats) {}

  // The store it forwards to (the lease record, redis_leases.hpp, writes beside it).
  const redis::GatewayStore& store() const { return store_; }

  static absl::Status check(const gateway::RulePolicy& policy) {
    return redis::GatewayStore::check(policy);
  }

  absl::StatusOr<gateway::LevelsResult> decide(std::span<const gateway::LevelCheck> levels,
                                               std::uint64_t version, Nanos now) override {
    return counted(store_.decide(levels, version, now));
  }
  bool shares_attempts() const override { return store_.shares_attempts(); }
  absl::StatusOr<gateway::AttemptResult> decide_attempt(
      std::span<const gateway::LevelCheck> levels, std::uint64_t version, Nanos now,
      const gateway::AttemptRequest& attempt) override {
    return counted(store_.decide_attempt(levels, version, now, attempt));
  }
  absl::StatusOr<MicroUnits> refund(const gateway::RulePolicy& policy, std::uint64_t version,
                                    gateway::LevelKey key, std::int64_t units, Nanos spent_at,
                                    Nanos now) override {
    return counted(store_.refund(policy, version, key, units, spent_at, now));
  }
  absl::StatusOr<MicroUnits> charge(const gateway::RulePolicy& policy, std::uint64_t version,
                                    gateway::LevelKey key, std::int64_t units, Nanos now) override {
    return counted(store_.charge(policy, version, key, units, now));
  }

 private:
  template <class T>
  absl::StatusOr<T> counted(absl::StatusOr<T> r) {
    if (r.ok()) return r;
    const absl::Status& s = r.status();
    // Bad input is the request's, not Redis's.
    if (s.code() == absl::StatusCode::kInvalidArgument) return r;
    stats_.count_redis_error(s);
    const auto kind = static_cast<std::size_t>(redis::error_kind(s));
    const std::int64_t now_s = std::chrono::duration_cast<std::chrono::seconds>(
                                   std::chrono::steady_clock::now().time_since_epoch())
                                   .count();
    std::int64_t last = last_log_s_[kind].load(std::memory_order_relaxed);
    if ((last == 0 || now_s - last >= 10) &&
        last_log_s_[kind].compare_exchange_strong(last, now_s == 0 ? 1 : now_s)) {
      std::fprintf(stderr, "quota-server: redis error (%s): %s\n", kRedisErrorNames[kind],
                   std::string(s.message()).c_str());
    }
    return r;
  }

  redis::GatewayStore& store_;
  DecisionStats& stats_;
  std::array<std::atomic<std::int64_t>, kRedisErrorKinds> last_log_s_{};
};

}  // namespace quota::server
