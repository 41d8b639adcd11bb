// examples/quota_server/redis_backend.hpp — quota-server's budgets in Redis.
//
// make_redis_store() builds the redis::GatewayStore the --redis* flags describe
// (options.hpp): one server (--redis), a Redis Cluster (--redis-cluster) or a primary
// found through Redis Sentinel (--redis-sentinel, --redis-sentinel-master), each with the
// same connection options — AUTH (--redis-user, --redis-password-file; the sentinels with
// --redis-sentinel-password-file), one deadline per call (--redis-deadline-ms), the
// circuit breaker per node (--redis-breaker-failures, --redis-breaker-cooldown-ms) and the
// in-flight guard (--redis-max-in-flight). An evicting server (maxmemory-policy other than
// noeviction) is refused (redis::EvictionPolicyCheck::kRefuse).
//
// The Checker decides over it through a CountedRedisStore (counted_redis_store.hpp),
// which counts Redis errors by kind.
//
// Thread safety: call once, at start.
//
//   auto store = quota::server::make_redis_store(options);      // null without --redis*
//   quota::server::CountedRedisStore counted(*store, stats.decisions);
//   quota::server::Checker checker(rules, {.redis = &counted});
#pragma once

#include <chrono>
#include <memory>
#include <utility>

#include "counted_redis_store.hpp"
#include "options.hpp"
#include "quota/redis/gateway_store.hpp"

namespace quota::server {

// The GatewayStore of the --redis* options; null when the budgets are in process.
inline std::unique_ptr<redis::GatewayStore> make_redis_store(const Options& o) {
  if (o.redis_mode == RedisMode::kNone) return nullptr;
  redis::ConnectionConfig config{.host = o.redis_host,
                                 .port = o.redis_port,
                                 .deadline = std::chrono::milliseconds(o.redis_deadline_ms)};
  config.username = o.redis_user;
  config.password = o.redis_password;
  config.breaker.failures = static_cast<int>(o.redis_breaker_failures);
  config.breaker.cool_down = std::chrono::milliseconds(o.redis_breaker_cooldown_ms);
  const auto n = static_cast<std::size_t>(o.redis_connections);
  redis::GatewayStoreOptions store_options;
  switch (o.redis_mode) {
    case RedisMode::kCluster:
      store_options.cluster = std::make_shared<redis::ClusterPool>(config, n);
      break;
    case RedisMode::kSentinel: {
      redis::SentinelConfig s{.name = o.redis_sentinel_master,
                              .sentinels = {},
                              .sentinel_username = {},
                              .sentinel_password = o.redis_sentinel_password,
                              .primary = config};
      for (const auto& [host, port] : o.redis_sentinels) s.sentinels.push_back({host, port});
      store_options.sentinel = std::make_shared<redis::SentinelPool>(std::move(s), n);
      break;
    }
    default:
      store_options.pool = std::make_shared<redis::ConnectionPool>(config, n);
      break;
  }
  if (o.redis_max_in_flight > 0) {
    store_options.limits.in_flight =
        std::make_shared<redis::InFlightGuard>(static_cast<int>(o.redis_max_in_flight));
  }
  return std::make_unique<redis::GatewayStore>(std::move(store_options));
}

}  // namespace quota::server
