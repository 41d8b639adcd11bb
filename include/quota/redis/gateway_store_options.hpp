// quota/redis/gateway_store_options.hpp — how a GatewayStore (gateway_store.hpp) reaches
// Redis and what it asks of it: the server (a pool, a Cluster or Sentinel), the key prefix,
// whose clock decides, the TTL margin, attempts, coalescing, durability (WAIT), one deadline
// per call and the in-flight guard, and the node guards (failover safety, the clock-step
// guard).
//
// A plain value, checked when the store is built (GatewayStore then answers every call
// with InvalidArgument naming the bad field). Thread safety: a value; the pools it points
// to are thread-safe.
//
//   quota::redis::GatewayStoreOptions options{.pool = pool, .prefix = "quota:gw:"};
//   options.failover_safety = true;
//   quota::redis::GatewayStore store(std::move(options));
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>

#include "quota/redis/transport/cluster.hpp"
#include "quota/redis/transport/connection_pool.hpp"
#include "quota/redis/transport/limits.hpp"
#include "quota/redis/transport/node_watch.hpp"
#include "quota/redis/transport/sentinel.hpp"
#include "quota/redis/twin/call.hpp"

namespace quota::redis {

struct GatewayStoreOptions {
  // Connections to the server (or set `cluster`).
  std::shared_ptr<ConnectionPool> pool;
  // Prepended to every Redis key. No braces or control characters.
  std::string prefix = "quota:gw:";
  TimeSource time = TimeSource::kServer;
  // Added to each key's time until idle when setting its TTL.
  std::chrono::milliseconds ttl_margin{1000};
  // Or, instead of `pool`: a Redis Cluster (cluster.hpp).
  std::shared_ptr<ClusterPool> cluster = nullptr;
  // A request with a global level: how long the process that recorded its attempt
  // "pending" has to complete it before a retry takes it over (twin/gateway_attempts.hpp).
  std::chrono::milliseconds attempt_pending{std::chrono::seconds(5)};
  // Coalescing, for a gateway with many threads: while `coalesce_calls` round trips of
  // this store's script calls are in flight, further calls wait and then go together, up
  // to `coalesce` in one pipelined write (per node, on a cluster). Each call is still its
  // own script call, atomic and decided exactly as alone; what they share is the round
  // trip (the system calls on both sides and the client's wait). A lone call goes at
  // once. 0 or 1: off. Each round trip in flight holds one of the pool's connections:
  // give the pool at least `coalesce_calls` (plus what attempts use alongside).
  int coalesce = 0;
  int coalesce_calls = 2;
  // Durability across a failover, as RedisStoreOptions::replicas: when > 0, every write of
  // script calls (decisions, settlements, attempt records) ends with `WAIT replicas
  // replica_timeout`, and a result is given only when that many replicas acknowledged
  // it; otherwise kUnavailable (the route's fail mode applies). replica_timeout must be
  // below the call's deadline.
  int replicas = 0;
  std::chrono::milliseconds replica_timeout{2};
  // Or, instead of `pool` and `cluster`: a primary managed by Redis Sentinel
  // (sentinel.hpp), found through the sentinels and followed across a failover.
  std::shared_ptr<SentinelPool> sentinel = nullptr;
  // One deadline per call and the in-flight guard: CallLimits (transport/limits.hpp).
  CallLimits limits{};
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
  std::optional<ClockGuard> clock_guard = std::nullopt;
};

// The pool a store on `o` calls through: `pool`, else the sentinel's (to the primary it
// follows); null with a cluster.
inline std::shared_ptr<ConnectionPool> pool_of(const GatewayStoreOptions& o) {
  if (o.pool == nullptr && o.sentinel != nullptr) return o.sentinel->pool();
  return o.pool;
}

}  // namespace quota::redis
