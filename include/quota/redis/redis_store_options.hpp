// quota/redis/redis_store_options.hpp — how a RedisStore (redis_store.hpp) reaches Redis
// and what it asks of it: the server (a pool, a Cluster or Sentinel), the key prefix, whose
// clock decides, the TTL margin, how long an attempt's result is kept, coalescing,
// durability (WAIT), one deadline per decision and the in-flight guard, and the node
// guards (failover safety, the clock-step guard).
//
// A plain value, checked when the store is built (redis::check_store_options): a bad
// field (no server, a sentinel beside a pool, a prefix with braces, coalesce out of range,
// replica_timeout not below the deadline, a clock guard in caller-time mode) makes every
// call of that store InvalidArgument naming the field; nothing is sent. Thread safety: a
// value; the pools it points to are thread-safe.
//
//   quota::RedisStoreOptions options{.pool = pool, .prefix = "quota:api:"};
//   options.failover_safety = true;
//   quota::RedisStore<quota::TokenBucket> store(std::move(options));
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "quota/redis/keys.hpp"
#include "quota/redis/transport/cluster.hpp"
#include "quota/redis/transport/connection_pool.hpp"
#include "quota/redis/transport/limits.hpp"
#include "quota/redis/transport/node_watch.hpp"
#include "quota/redis/transport/sentinel.hpp"
#include "quota/redis/twin/call.hpp"

namespace quota {

struct RedisStoreOptions {
  // Connections to the server. Required.
  std::shared_ptr<redis::ConnectionPool> pool;
  // Prepended to every Redis key. No braces or control characters.
  std::string prefix = "quota:";
  redis::TimeSource time = redis::TimeSource::kServer;
  // Added to each bucket's time-to-full when setting its TTL.
  std::chrono::milliseconds ttl_margin{1000};
  // How long an attempt's first result is kept (>= the caller's retry window).
  std::chrono::milliseconds attempt_ttl{std::chrono::minutes(10)};
  // Or, instead of `pool`: a Redis Cluster (cluster.hpp). Each call goes to the node of
  // its slot, following MOVED and ASK. (Last and default-initialized, so that designated
  // initializers that skip it stay warning-free.)
  std::shared_ptr<redis::ClusterPool> cluster = nullptr;
  // Coalescing, for a gateway with many threads: while `coalesce_calls` of apply()'s
  // round trips are in flight, further apply() calls wait and are then decided
  // together, up to `coalesce` per round trip (independent decisions, as apply_batch:
  // each deducted when it alone allows). Each caller still gets its own decision; a
  // lone caller goes at once. 0 or 1: off (one script call per apply). See
  // RedisStore::apply. Each round trip in flight holds one of the pool's connections:
  // give the pool at least `coalesce_calls` (plus what other calls use alongside).
  int coalesce = 0;
  int coalesce_calls = 2;
  // Durability across a failover: when > 0, every write of script calls ends with `WAIT
  // replicas replica_timeout` (in the same pipelined write), and a decision is given only
  // when that many replicas acknowledged it; otherwise kUnavailable (the deduction stands
  // on the master, so the caller may have paid, never got more than its budget; but a
  // replica promoted now would not have it). replica_timeout must be below the call's
  // deadline. 0: no WAIT (a failover may forget acknowledged decisions: an extra burst
  // at most, per key).
  int replicas = 0;
  std::chrono::milliseconds replica_timeout{2};
  // Or, instead of `pool` and `cluster`: a primary managed by Redis Sentinel
  // (sentinel.hpp), found through the sentinels and followed across a failover.
  std::shared_ptr<redis::SentinelPool> sentinel = nullptr;
  // One deadline per decision (all its waits together; the connections' 3 ms when 0)
  // and the process's in-flight guard: redis::CallLimits in transport/limits.hpp.
  redis::CallLimits limits{};
  // Failover safety (transport/node_watch.hpp, docs/redis.md): after a connect finds
  // another server (a replica promoted, a restart), a bucket older than that connect's
  // TIME, or missing, is read as spent then (the policy's exhausted(at)). Costs false
  // denials for one time to full after a failover, and about 4,000 server instructions
  // per script call (docs/redis.md "Defaults and their price"). Off by default here
  // (on a GatewayStore it refuses sliding_log levels, which only the caller's rules can
  // rule out); quota-server turns it on.
  bool failover_safety = false;
  // Clock-step guard (node_watch.hpp): a node whose TIME runs ahead of the client's
  // monotonic clock by more than the tolerance is refused (kUnavailable,
  // QUOTA_CLOCK_AHEAD, nothing written) until they agree. Off when empty (the default:
  // it cannot run on the caller's time, and a refusal lasts until the clocks agree or the
  // process restarts, an operator's call; quota-server sets 1 s).
  std::optional<redis::ClockGuard> clock_guard = std::nullopt;
};

namespace redis {

// The most decisions one coalesced round trip takes (RedisStoreOptions::coalesce).
inline constexpr int kMaxCoalesce = 4096;

// With a sentinel and no pool: the sentinel's pool (to the primary) as the pool.
inline RedisStoreOptions with_sentinel_pool(RedisStoreOptions o) {
  if (o.sentinel != nullptr && o.pool == nullptr) o.pool = o.sentinel->pool();
  return o;
}

// OK when `o` (after with_sentinel_pool) is a store's valid configuration; else the first
// bad field, InvalidArgument naming it and its bound. `deadline`: the budget of one call
// (Script::deadline()), which replica_timeout must stay below.
inline absl::Status check_store_options(const RedisStoreOptions& o,
                                        std::chrono::microseconds deadline) {
  if (o.pool == nullptr && o.cluster == nullptr) {
    return absl::InvalidArgumentError("RedisStoreOptions: pool, cluster and sentinel are all null");
  }
  if (o.sentinel != nullptr && (o.cluster != nullptr || o.pool != o.sentinel->pool())) {
    return absl::InvalidArgumentError(
        "RedisStoreOptions: sentinel is set together with pool or cluster; set one");
  }
  if (auto s = quota::detail::check_key_chars(o.prefix, "prefix"); !s.ok()) {
    return s;
  }
  if (o.coalesce < 0 || o.coalesce > kMaxCoalesce) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "RedisStoreOptions: coalesce=%d, must be in [0, %d]", o.coalesce, kMaxCoalesce));
  }
  if (o.coalesce > 1 && o.coalesce_calls < 1) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "RedisStoreOptions: coalesce_calls=%d, must be at least 1", o.coalesce_calls));
  }
  if (auto s = check_durability({.replicas = o.replicas, .timeout = o.replica_timeout}, deadline,
                                "RedisStoreOptions");
      !s.ok()) {
    return s;
  }
  return check_clock_guard(o.clock_guard, o.time == TimeSource::kCaller, "RedisStoreOptions");
}

}  // namespace redis

}  // namespace quota
