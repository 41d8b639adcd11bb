// quota/redis/gateway_store_setup.hpp — a GatewayStore built from where Redis is and which
// production guards are on: the one construction quota-server and the C interface share.
//
// RedisSetup names the topology (one server, a Cluster's seed nodes, or Sentinels and the
// primary's name), the credentials, each call's deadline, the connections per node, and
// the guards: the breaker per node, the eviction check, the in-flight guard, failover
// safety, the clock-step guard, WAIT durability and coalescing (gateway_store_options.hpp
// says what each does). Its defaults are the safe ones; a caller turns a guard off by
// setting it off. make_connections() opens the pools alone (quota-server's shared rules
// use their own, with another deadline); make_gateway_store() builds the store on them;
// probe() is one decision that says whether it can decide now.
//
// Thread safety: the functions are pure; the store is thread-safe.
//
//   quota::redis::RedisSetup setup{.nodes = {{"127.0.0.1", 6379}}};
//   setup.deadline = std::chrono::milliseconds(20);
//   std::unique_ptr<quota::redis::GatewayStore> store = quota::redis::make_gateway_store(setup);
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "absl/status/status.h"
#include "quota/redis/gateway_store.hpp"
#include "quota/redis/gateway_store_options.hpp"

namespace quota::redis {

enum class RedisTopology { kServer, kCluster, kSentinel };

struct RedisSetup {
  RedisTopology topology = RedisTopology::kServer;
  // The server (its first entry); the cluster's seed nodes; the sentinels.
  std::vector<Endpoint> nodes{};
  std::string sentinel_master{};  // kSentinel: the name the sentinels monitor
  std::string username{};
  std::string password{};
  std::string sentinel_password{};
  std::chrono::milliseconds deadline{50};  // each call
  std::size_t connections = 4;             // per node
  int breaker_failures = 5;                // in a row, to open the breaker; 0: no breaker
  std::chrono::milliseconds breaker_cool_down{250};
  bool allow_evicting = false;  // decide on a server whose maxmemory-policy may evict
  int max_in_flight = 4;        // calls per connection; 0: no guard
  bool failover_safety = true;
  std::chrono::milliseconds clock_guard{1000};  // tolerance; 0: no clock-step guard
  int replicas = 0;                             // WAIT for this many; 0: no WAIT
  std::chrono::milliseconds replica_timeout{2};
  int coalesce = 0;
  int coalesce_calls = 2;
};

// The bounds of WAIT and coalescing that quota-server's flags and the C interface take
// (the store itself checks the rest: replica_timeout below the deadline, coalesce up to
// kGatewayMaxCoalesce).
inline constexpr int kMaxReplicas = 64;
inline constexpr std::chrono::milliseconds kMaxReplicaTimeout{60'000};
inline constexpr int kMaxCoalesceCalls = 1024;

// The pools of one topology (one of the three set).
struct RedisConnections {
  std::shared_ptr<ConnectionPool> pool{};
  std::shared_ptr<ClusterPool> cluster{};
  std::shared_ptr<SentinelPool> sentinel{};
};

// `connections` per node to what `s` names, each call bounded by `deadline`.
inline RedisConnections make_connections(const RedisSetup& s, std::size_t connections,
                                         std::chrono::milliseconds deadline) {
  RedisConnections out;
  ConnectionConfig config{.host = s.nodes.empty() ? std::string("127.0.0.1") : s.nodes[0].host,
                          .port = s.nodes.empty() ? 6379 : s.nodes[0].port,
                          .deadline = deadline};
  config.username = s.username;
  config.password = s.password;
  config.breaker.failures = s.breaker_failures;
  config.breaker.cool_down = s.breaker_cool_down;
  config.eviction_check =
      s.allow_evicting ? EvictionPolicyCheck::kAllow : EvictionPolicyCheck::kRefuse;
  switch (s.topology) {
    case RedisTopology::kCluster:
      out.cluster = std::make_shared<ClusterPool>(config, connections);
      for (const Endpoint& e : s.nodes) out.cluster->node(e.host, e.port);
      break;
    case RedisTopology::kSentinel:
      out.sentinel =
          std::make_shared<SentinelPool>(SentinelConfig{.name = s.sentinel_master,
                                                        .sentinels = s.nodes,
                                                        .sentinel_username = {},
                                                        .sentinel_password = s.sentinel_password,
                                                        .primary = config},
                                         connections);
      break;
    case RedisTopology::kServer:
      out.pool = std::make_shared<ConnectionPool>(config, connections);
      break;
  }
  return out;
}

// The GatewayStore `s` describes.
inline std::unique_ptr<GatewayStore> make_gateway_store(const RedisSetup& s) {
  RedisConnections c = make_connections(s, s.connections, s.deadline);
  GatewayStoreOptions o;
  o.pool = std::move(c.pool);
  o.cluster = std::move(c.cluster);
  o.sentinel = std::move(c.sentinel);
  if (s.max_in_flight > 0) o.limits.in_flight = std::make_shared<InFlightGuard>(s.max_in_flight);
  o.failover_safety = s.failover_safety;
  if (s.clock_guard.count() > 0) o.clock_guard = ClockGuard{.tolerance = s.clock_guard};
  o.replicas = s.replicas;
  o.replica_timeout = s.replica_timeout;
  o.coalesce = s.coalesce;
  o.coalesce_calls = s.coalesce_calls;
  return std::make_unique<GatewayStore>(std::move(o));
}

// The rule of `rules` a store with failover safety does not take: a sliding_log (after a
// failover its log cannot be read as spent); the smallest such name (the same on every
// run), or null.
inline const gateway::Rule* refused_under_failover_safety(const gateway::RuleSet& rules) {
  const gateway::Rule* refused = nullptr;
  rules.for_each_rule([&](const gateway::Rule& r) {
    if (std::holds_alternative<SlidingLog>(r.policy) &&
        (refused == nullptr || r.name < refused->name)) {
      refused = &r;
    }
  });
  return refused;
}

// One decision of 1 unit on `key` in a bucket that never runs dry, through `store` (a
// GatewayStore, or a decorator of one): OK when it can decide now, else why not (down,
// AUTH refused, an evicting server, a clock ahead). What a readiness check asks.
template <class Store>
absl::Status probe(Store& store, std::string_view key, std::uint64_t version, Nanos now) {
  static const gateway::RulePolicy kProbe =
      TokenBucket{.rate = {1'000'000'000, std::chrono::seconds(1)}, .burst = 1'000'000'000};
  const gateway::LevelCheck level{.policy = &kProbe, .key = key, .shadow = false, .cost = 1};
  auto r = store.decide(std::span(&level, 1), version, now);
  return r.ok() ? absl::OkStatus() : r.status();
}

}  // namespace quota::redis
