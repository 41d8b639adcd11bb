// examples/quota_server/backend/redis_backend.cpp — the definitions of redis_backend.hpp:
// quota-server's budgets in Redis, built from the --redis* flags.
#include "backend/redis_backend.hpp"

#include <utility>

#include "absl/strings/str_cat.h"

namespace quota::server {

redis::RedisSetup redis_setup(const Options& o) {
  redis::RedisSetup s;
  if (o.redis_mode == RedisMode::kSentinel) {
    s.topology = redis::RedisTopology::kSentinel;
    for (const auto& [host, port] : o.redis_sentinels) s.nodes.push_back({host, port});
  } else {
    s.topology = o.redis_mode == RedisMode::kCluster ? redis::RedisTopology::kCluster
                                                     : redis::RedisTopology::kServer;
    s.nodes.push_back({o.redis_host, o.redis_port});
    for (const auto& [host, port] : o.redis_cluster_seeds) s.nodes.push_back({host, port});
  }
  s.sentinel_master = o.redis_sentinel_master;
  s.username = o.redis_user;
  s.password = o.redis_password;
  s.sentinel_password = o.redis_sentinel_password;
  s.deadline = std::chrono::milliseconds(o.redis_deadline_ms);
  s.connections = static_cast<std::size_t>(o.redis_connections);
  s.breaker_failures = static_cast<int>(o.redis_breaker_failures);
  s.breaker_cool_down = std::chrono::milliseconds(o.redis_breaker_cooldown_ms);
  s.allow_evicting = o.redis_allow_evicting;
  s.max_in_flight = static_cast<int>(o.redis_max_in_flight);
  s.failover_safety = o.redis_failover_safety;
  s.clock_guard = std::chrono::milliseconds(o.redis_clock_guard_ms);
  s.replicas = static_cast<int>(o.redis_replicas);
  s.replica_timeout = std::chrono::milliseconds(o.redis_replica_timeout_ms);
  s.coalesce = static_cast<int>(o.redis_coalesce);
  s.coalesce_calls = static_cast<int>(o.redis_coalesce_calls);
  return s;
}

RedisConnections make_redis_connections(const Options& o, std::size_t connections,
                                        std::chrono::milliseconds deadline) {
  if (o.redis_mode == RedisMode::kNone) return {};
  return redis::make_connections(redis_setup(o), connections, deadline);
}

std::unique_ptr<redis::GatewayStore> make_redis_store(const Options& o) {
  if (o.redis_mode == RedisMode::kNone) return nullptr;
  return redis::make_gateway_store(redis_setup(o));
}

absl::StatusOr<RedisBudgets> make_redis_budgets(const Options& o, const EnvoyRules* envoy,
                                                const std::string& origin, DecisionStats& stats) {
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
