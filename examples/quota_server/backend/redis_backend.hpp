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
#include <memory>
#include <string_view>
#include <utility>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "backend/counted_redis_store.hpp"
#include "backend/envoy_redis.hpp"
#include "config/options.hpp"
#include "config/redis_flags.hpp"
#include "quota/redis/gateway_store.hpp"

namespace quota::server {

// The connections the --redis* options describe, one of the three set (all null
// without --redis*): `connections` per server (per node on a cluster), each call bounded
// by `deadline` (the store's --redis-deadline-ms; the shared rules' own, shared_rules.hpp).
struct RedisConnections {
  std::shared_ptr<redis::ConnectionPool> pool{};
  std::shared_ptr<redis::ClusterPool> cluster{};
  std::shared_ptr<redis::SentinelPool> sentinel{};
};

inline RedisConnections make_redis_connections(const Options& o, std::size_t connections,
                                               std::chrono::milliseconds deadline) {
  RedisConnections out;
  if (o.redis_mode == RedisMode::kNone) return out;
  redis::ConnectionConfig config{.host = o.redis_host, .port = o.redis_port, .deadline = deadline};
  config.username = o.redis_user;
  config.password = o.redis_password;
  config.breaker.failures = static_cast<int>(o.redis_breaker_failures);
  config.breaker.cool_down = std::chrono::milliseconds(o.redis_breaker_cooldown_ms);
  config.eviction_check = o.redis_allow_evicting ? redis::EvictionPolicyCheck::kAllow
                                                 : redis::EvictionPolicyCheck::kRefuse;
  switch (o.redis_mode) {
    case RedisMode::kCluster:
      out.cluster = std::make_shared<redis::ClusterPool>(config, connections);
      for (const auto& [host, port] : o.redis_cluster_seeds) out.cluster->node(host, port);
      break;
    case RedisMode::kSentinel: {
      redis::SentinelConfig s{.name = o.redis_sentinel_master,
                              .sentinels = {},
                              .sentinel_username = {},
                              .sentinel_password = o.redis_sentinel_password,
                              .primary = config};
      for (const auto& [host, port] : o.redis_sentinels) s.sentinels.push_back({host, port});
      out.sentinel = std::make_shared<redis::SentinelPool>(std::move(s), connections);
      break;
    }
    default:
      out.pool = std::make_shared<redis::ConnectionPool>(config, connections);
      break;
  }
  return out;
}

// The GatewayStore of the --redis* options; null when the budgets are in process.
inline std::unique_ptr<redis::GatewayStore> make_redis_store(const Options& o) {
  if (o.redis_mode == RedisMode::kNone) return nullptr;
  RedisConnections c = make_redis_connections(o, static_cast<std::size_t>(o.redis_connections),
                                              std::chrono::milliseconds(o.redis_deadline_ms));
  redis::GatewayStoreOptions store_options;
  store_options.pool = std::move(c.pool);
  store_options.cluster = std::move(c.cluster);
  store_options.sentinel = std::move(c.sentinel);
  if (o.redis_max_in_flight > 0) {
    store_options.limits.in_flight =
        std::make_shared<redis::InFlightGuard>(static_cast<int>(o.redis_max_in_flight));
  }
  store_options.failover_safety = o.redis_failover_safety;
  if (o.redis_clock_guard_ms > 0) {
    store_options.clock_guard =
        redis::ClockGuard{.tolerance = std::chrono::milliseconds(o.redis_clock_guard_ms)};
  }
  store_options.replicas = static_cast<int>(o.redis_replicas);
  store_options.replica_timeout = std::chrono::milliseconds(o.redis_replica_timeout_ms);
  store_options.coalesce = static_cast<int>(o.redis_coalesce);
  store_options.coalesce_calls = static_cast<int>(o.redis_coalesce_calls);
  return std::make_unique<redis::GatewayStore>(std::move(store_options));
}

// The budgets in Redis the --redis* options name, counting Redis errors into `stats`:
// both parts null without --redis*. An envoyproxy/ratelimit rule file whose limits Redis
// cannot keep (`envoy`, null in quota's format) is refused, naming `origin`.
struct RedisBudgets {
  std::unique_ptr<redis::GatewayStore> store;
  std::unique_ptr<CountedRedisStore> counted;  // over `store`: what the Checker decides on
};
inline absl::StatusOr<RedisBudgets> make_redis_budgets(const Options& o, const EnvoyRules* envoy,
                                                       const std::string& origin,
                                                       DecisionStats& stats) {
  RedisBudgets out{.store = make_redis_store(o), .counted = nullptr};
  if (out.store == nullptr) return out;
  if (envoy != nullptr) {
    if (auto s = check_envoy_for_redis(*envoy); !s.ok()) {
      return absl::Status(s.code(), absl::StrCat(origin, ": ", s.message()));
    }
  }
  out.counted = std::make_unique<CountedRedisStore>(*out.store, stats);
  return out;
}

}  // namespace quota::server
