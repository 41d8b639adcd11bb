// The gateway over a real Redis Cluster of 3 masters (cmake/redis_cluster.sh): a tenant's
// user and tenant levels share its slot and are decided in one script on its node; the
// global level lives on another node than the tenants below, and its
// denial gives the tenant's deduction back across nodes. Exact counts, server time.
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "quota/gateway/gateway.hpp"
#include "quota/redis/gateway_store.hpp"
#include "support/gateway_rules.hpp"
#include "support/printers.hpp"
#include "support/redis_server.hpp"

using namespace std::chrono_literals;
using quota::Nanos;
using quota::TokenBucket;
using quota::gateway::Gateway;
using quota::gateway::RuleRegistry;
using quota::redis::GatewayStore;
using quota::testing::build;

namespace {

int first_cluster_port() {
  const char* dir = std::getenv("QUOTA_REDIS_CLUSTER_DIR");
  REQUIRE(dir != nullptr);
  std::ifstream in(std::string(dir) + "/ports");
  int port = 0;
  REQUIRE(static_cast<bool>(in >> port));
  return port;
}

constexpr quota::Rate kSlow{.units = 1, .per = std::chrono::hours(1)};

// Tenant level: burst `tenant_burst` per tenant; user level: burst 4 per user; global:
// burst 25.
quota::gateway::RuleSetSpec spec(std::uint64_t version, std::int64_t tenant_burst) {
  return quota::testing::levels_spec(version, TokenBucket{.rate = kSlow, .burst = tenant_burst},
                                     TokenBucket{.rate = kSlow, .burst = 4},
                                     TokenBucket{.rate = kSlow, .burst = 25});
}

}  // namespace

TEST_CASE("redis cluster gateway: levels across nodes, exact counts, rule change") {
  auto cfg = quota::testing::redis_config();
  cfg.port = first_cluster_port();
  auto cluster = std::make_shared<quota::redis::ClusterPool>(cfg, 2);
  GatewayStore store({.pool = nullptr,
                      .prefix = quota::testing::unique_prefix("gw-cluster"),
                      .time = quota::redis::TimeSource::kServer,
                      .ttl_margin = std::chrono::milliseconds(1000),
                      .cluster = cluster});
  RuleRegistry registry(build(spec(1, 10)));
  Gateway gw(store, registry);

  // Tenants served by another node than the global key (so the levels span nodes).
  auto global_node = cluster->for_slot(quota::redis::key_slot("{~global}"));
  REQUIRE(global_node.ok());
  std::vector<std::string> tenants;
  for (int i = 0; tenants.size() < 4 && i < 1000; ++i) {
    const std::string t = "tenant-" + std::to_string(i);
    auto node = cluster->for_slot(quota::redis::key_slot("{" + t + "}"));
    REQUIRE(node.ok());
    if (*node != *global_node) tenants.push_back(t);
  }
  REQUIRE(tenants.size() == 4);
  // 4 tenants × 3 users × 5 requests: the user level (4) and the tenant level (10) and
  // the global level (25) all bind somewhere.
  int admitted = 0;
  std::vector<int> per_tenant(tenants.size(), 0);
  for (std::size_t t = 0; t < tenants.size(); ++t) {
    for (const char* user : {"u1", "u2", "u3"}) {
      for (int i = 0; i < 5; ++i) {
        auto r = gw.decide(
            {.who = {.tenant = tenants[t], .plan = "free", .user = user}, .route = "read"},
            Nanos{0});
        INFO(r.status().ToString());
        REQUIRE(r.ok());
        if (r->decision.allowed) {
          ++admitted;
          ++per_tenant[t];
        }
      }
    }
  }
  // Tenant 0: users 4+4+2 = 10 (tenant bound); tenant 1: 10; tenant 2: 5 left of the
  // global 25; tenant 3: 0.
  CHECK(admitted == 25);
  CHECK(per_tenant[0] == 10);
  CHECK(per_tenant[1] == 10);
  CHECK(per_tenant[2] == 5);
  CHECK(per_tenant[3] == 0);
  // Every denial by the global level gave its tenant's levels back: after a rule change
  // that drops the global rule, tenant 3 still has its whole 10 and tenant 2 its 5.
  auto no_global = spec(2, 10);
  no_global.rules.pop_back();
  REQUIRE(registry.publish(build(no_global)).ok());
  int t2 = 0, t3 = 0;
  for (const char* user : {"v1", "v2", "v3", "v4"}) {
    for (int i = 0; i < 4; ++i) {
      auto a = gw.decide(
          {.who = {.tenant = tenants[2], .plan = "free", .user = user}, .route = "read"}, Nanos{0});
      auto b = gw.decide(
          {.who = {.tenant = tenants[3], .plan = "free", .user = user}, .route = "read"}, Nanos{0});
      REQUIRE(a.ok());
      REQUIRE(b.ok());
      CHECK(a->decision.version == 2);
      t2 += a->decision.allowed ? 1 : 0;
      t3 += b->decision.allowed ? 1 : 0;
    }
  }
  CHECK(t2 == 5);
  CHECK(t3 == 10);
}
