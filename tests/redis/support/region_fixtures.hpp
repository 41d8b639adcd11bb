// tests/redis/support/region_fixtures.hpp — the servers and stores of the region tests over
// real Redis (redis_region_lease_test, redis_region_pool_test,
// redis_region_pool_refill_test): a redis-server per region started by the test
// (ScratchServer, free loopback port), and per gateway process its own connections to its
// region's server (tenant levels, prefix "region:") and to the central one (the global
// budget and its grant record, prefix "central:").
//
//   quota::testing::ScratchServer central(quota::testing::scratch_dir("quota-x-central"));
//   quota::testing::PoolRegion eu("x-eu", central.port(), 2s, rules, {.region = 0xe1});
//   auto d = eu.processes[0]->gateway.decide(request, now);
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <catch2/catch.hpp>

#include "quota/gateway/gateway.hpp"
#include "quota/gateway/rules/rule_registry.hpp"
#include "quota/redis/gateway_store.hpp"
#include "quota/redis/grant_ledger.hpp"
#include "quota/region/regional_pool.hpp"
#include "support/redis_server.hpp"

namespace quota::testing {

// Two connections to a loopback redis-server (or a proxy in front of one).
inline std::shared_ptr<redis::ConnectionPool> loopback_connections(
    int port, std::chrono::microseconds deadline) {
  return std::make_shared<redis::ConnectionPool>(
      redis::ConnectionConfig{.host = "127.0.0.1", .port = port, .deadline = deadline}, 2);
}

// A region's redis-server, in scratch_dir(`dir_name`); first base of a region's fixture,
// so that its port is known to the stores after it.
struct RegionServer {
  explicit RegionServer(const std::string& dir_name) : server(scratch_dir(dir_name)) {}
  ScratchServer server;
};

// One gateway process's stores: its region's (through `regional_port`) and the central
// one (through `central_port`: the server's, or a proxy's, with `central_deadline`), with
// the central grant record.
struct RegionStores {
  RegionStores(int regional_port, int central_port, std::chrono::microseconds central_deadline)
      : local({.pool = loopback_connections(regional_port, std::chrono::seconds(2)),
               .prefix = "region:"}),
        central(
            {.pool = loopback_connections(central_port, central_deadline), .prefix = "central:"}),
        ledger(central) {}

  redis::GatewayStore local;
  redis::GatewayStore central;
  redis::RedisGrantLedger ledger;
};

// One gateway process of a region served by the region's pool: its stores, its own pool
// object (connections through `pool_port`: the region's server, or a proxy's), backend
// and gateway.
struct PoolProcess : RegionStores {
  using Backend = region::PooledRegion<>;

  PoolProcess(int regional_port, int pool_port, int central_port,
              std::chrono::microseconds central_deadline,
              std::shared_ptr<const gateway::RuleSet> rules, const region::PoolOptions& options)
      : RegionStores(regional_port, central_port, central_deadline),
        pool(loopback_connections(pool_port, std::chrono::seconds(2)), central, ledger, options),
        backend(local, pool),
        registry(std::move(rules)),
        gateway(backend, registry) {}

  region::RegionalPool<> pool;
  Backend backend;
  gateway::RuleRegistry registry;
  gateway::Gateway gateway;
};

// A region: its redis-server and `processes` gateway processes sharing its pool.
struct PoolRegion : RegionServer {
  PoolRegion(const std::string& name, int central_port, std::chrono::microseconds central_deadline,
             const std::shared_ptr<const gateway::RuleSet>& rules,
             const region::PoolOptions& options, int processes = 2)
      : RegionServer("quota-pool-" + name), options(options) {
    for (int p = 0; p < processes; ++p) {
      this->processes.push_back(std::make_unique<PoolProcess>(
          server.port(), server.port(), central_port, central_deadline, rules, options));
    }
  }
  // Units the region's pool of `key` holds now.
  std::int64_t held(std::string_view key = "{~global}read") {
    auto r = processes[0]->pool.read(key);
    REQUIRE(r.ok());
    return r->total;
  }
  std::int64_t grant_requests() const {
    std::int64_t n = 0;
    for (const auto& p : processes) n += p->pool.grant_requests();
    return n;
  }

  region::PoolOptions options;
  std::vector<std::unique_ptr<PoolProcess>> processes;
};

}  // namespace quota::testing
