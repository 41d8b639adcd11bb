// examples/quota_server/backend/redis_backend.hpp — quota-server's budgets in Redis.
//
// make_redis_connections() opens the connections the --redis* flags describe (the
// budgets' and, with --rules-from-redis, the shared rules' own: shared_rules.hpp), and
// make_redis_store() builds on them the redis::GatewayStore
// (options.hpp): one server (--redis), a Redis Cluster (--redis-cluster) or a primary
// found through Redis Sentinel (--redis-sentinel, --redis-sentinel-master), each with the
// same connection options — AUTH (--redis-user, --redis-password-file; the sentinels with
// --redis-sentinel-password-file), one deadline per call (--redis-deadline-ms), the
// circuit breaker per node (--redis-breaker-failures, --redis-breaker-cooldown-ms) and the
// in-flight guard (--redis-max-in-flight). An evicting server (maxmemory-policy other than
// noeviction, read at connect and once a second after) is refused
// (redis::EvictionPolicyCheck::kRefuse) unless --redis-allow-evicting (kAllow: warned
// once). The store's production options come from redis_flags.hpp too: failover safety
// (--redis-failover-safety), the clock-step guard (--redis-clock-guard-ms), WAIT
// (--redis-replicas, --redis-replica-timeout-ms) and coalescing (--redis-coalesce,
// --redis-coalesce-calls). Failover safety, the clock guard, the breaker and the in-flight
// guard are on unless their flags turn them off (redis_flags.hpp).
//
// The Checker decides over it through a CountedRedisStore (counted_redis_store.hpp),
// which counts Redis errors by kind; make_redis_budgets() builds both.
//
// Thread safety: call once, at start.
//
//   auto store = quota::server::make_redis_store(options);      // null without --redis*
//   quota::server::CountedRedisStore counted(*store, stats.decisions);
//   quota::server::Checker checker(rules, {.redis = &counted});
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "backend/counted_redis_store.hpp"
#include "backend/envoy_redis.hpp"
#include "config/options.hpp"
#include "config/redis_flags.hpp"
#include "quota/redis/gateway_store.hpp"
#include "quota/redis/gateway_store_setup.hpp"

namespace quota::server {

// What the --redis* options describe, as the library builds it (quota/redis/
// gateway_store_setup.hpp): the topology, credentials, deadline, connections and guards.
redis::RedisSetup redis_setup(const Options& o);

// The connections the --redis* options describe (all null without --redis*):
// `connections` per server (per node on a cluster), each call bounded by `deadline` (the
// store's --redis-deadline-ms; the shared rules' own, shared_rules.hpp).
using RedisConnections = redis::RedisConnections;
RedisConnections make_redis_connections(const Options& o, std::size_t connections,
                                        std::chrono::milliseconds deadline);

// The GatewayStore of the --redis* options; null when the budgets are in process.
std::unique_ptr<redis::GatewayStore> make_redis_store(const Options& o);

// The budgets in Redis the --redis* options name, counting Redis errors into `stats`:
// both parts null without --redis*. An envoyproxy/ratelimit rule file whose limits Redis
// cannot keep (`envoy`, null in quota's format) is refused, naming `origin`.
struct RedisBudgets {
  std::unique_ptr<redis::GatewayStore> store;
  std::unique_ptr<CountedRedisStore> counted;  // over `store`: what the Checker decides on
};
absl::StatusOr<RedisBudgets> make_redis_budgets(const Options& o, const EnvoyRules* envoy,
                                                const std::string& origin, DecisionStats& stats);

}  // namespace quota::server
