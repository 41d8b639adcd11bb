// Gateway attempts over a real Redis Cluster of 3 masters (cmake/redis_cluster.sh): the
// attempt's record lives in the tenant's slot, on the tenant's node, and is written by
// the tenant's script call; the global level is on another node. Two gateway processes
// (two GatewayStores, two Gateways): a retry through the second replays the first's
// decision — an admission or the global level's denial — and nothing is deducted twice.
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <span>
#include <string>

#include <catch2/catch.hpp>

#include "quota/gateway/gateway.hpp"
#include "quota/redis/gateway_store.hpp"
#include "support/gateway_rules.hpp"
#include "support/printers.hpp"
#include "support/redis_cluster.hpp"
#include "support/redis_server.hpp"

using quota::Nanos;
using quota::Reason;
using quota::TokenBucket;
using quota::gateway::Gateway;
using quota::gateway::Request;
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

Request read(const std::string& tenant, const char* id = "") {
  return {.who = {.tenant = tenant, .plan = "free"}, .route = "read", .attempt_id = id};
}

}  // namespace

TEST_CASE("redis cluster attempts: replayed by another process across nodes, deducted once") {
  auto cfg = quota::testing::redis_config();
  cfg.port = first_cluster_port();
  auto cluster_a = std::make_shared<quota::redis::ClusterPool>(cfg, 2);
  auto cluster_b = std::make_shared<quota::redis::ClusterPool>(cfg, 2);
  const std::string prefix = quota::testing::unique_prefix("gw-cluster-attempts");
  GatewayStore store_a({.pool = nullptr, .prefix = prefix, .cluster = cluster_a});
  GatewayStore store_b({.pool = nullptr, .prefix = prefix, .cluster = cluster_b});
  // Tenant: burst 10; global: burst 3 (it binds first).
  const auto spec =
      quota::testing::levels_spec(1, TokenBucket{.rate = kSlow, .burst = 10}, std::nullopt,
                                  TokenBucket{.rate = kSlow, .burst = 3});
  RuleRegistry registry_a(build(spec));
  RuleRegistry registry_b(build(spec));
  Gateway a(store_a, registry_a);
  Gateway b(store_b, registry_b);

  // A tenant served by another node than the global key.
  auto global_node = cluster_a->for_slot(quota::redis::key_slot("{~global}"));
  REQUIRE(global_node.ok());
  std::string tenant;
  for (int i = 0; tenant.empty() && i < 1000; ++i) {
    const std::string t = "tenant-" + std::to_string(i);
    auto node = cluster_a->for_slot(quota::redis::key_slot("{" + t + "}"));
    REQUIRE(node.ok());
    if (*node != *global_node) tenant = t;
  }
  REQUIRE_FALSE(tenant.empty());

  // Three admissions, each with its id, each retried through the other process.
  for (int i = 0; i < 3; ++i) {
    const std::string id = "ok-" + std::to_string(i);
    Request req = read(tenant, id.c_str());
    auto first = a.decide(req, Nanos{0});
    REQUIRE(first.ok());
    CHECK(first->decision.allowed);
    CHECK_FALSE(first->replayed);
    auto retry = b.decide(req, Nanos{0});
    REQUIRE(retry.ok());
    CHECK(retry->replayed);
    CHECK(retry->decision == first->decision);
  }
  // The global level is spent (3): a denial, recorded and replayed as that denial; the
  // tenant's deduction given back.
  Request denied_req = read(tenant, "denied-1");
  auto denied = a.decide(denied_req, Nanos{0});
  REQUIRE(denied.ok());
  CHECK_FALSE(denied->decision.allowed);
  CHECK(denied->rule == "global");
  auto denied_retry = b.decide(denied_req, Nanos{0});
  REQUIRE(denied_retry.ok());
  CHECK(denied_retry->replayed);
  CHECK(denied_retry->decision == denied->decision);
  CHECK(denied_retry->decision.reason == Reason::kOverLimit);

  // Exact counts: the tenant spent 3 (one per attempt, the denial given back).
  const quota::gateway::RulePolicy tenant_policy = TokenBucket{.rate = kSlow, .burst = 10};
  const std::string tenant_key = "{" + tenant + "}read";
  const quota::gateway::LevelCheck tenant_level{
      .policy = &tenant_policy, .key = tenant_key, .shadow = false, .cost = 1};
  auto probe = store_b.decide(std::span(&tenant_level, 1), 1, Nanos{0});
  REQUIRE(probe.ok());
  REQUIRE(probe->parts.size() == 1);
  CHECK(probe->parts[0].remaining == 10 - 3 - 1);
}
