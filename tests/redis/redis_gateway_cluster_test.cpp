// The gateway over a real Redis Cluster of 3 masters (cmake/redis_cluster.sh): a tenant's
// user and tenant levels share its slot and are decided in one script on its node; the
// global level lives on another node than the tenants below, and its
// denial gives the tenant's deduction back across nodes. Exact counts, server time.
// Coalesced calls (GatewayStoreOptions::coalesce) that meet a slot moved under them.
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "quota/gateway/gateway.hpp"
#include "quota/redis/gateway_store.hpp"
#include "support/gateway_rules.hpp"
#include "support/printers.hpp"
#include "support/redis_cluster.hpp"
#include "support/redis_server.hpp"

using namespace std::chrono_literals;
using quota::Nanos;
using quota::SlidingLog;
using quota::SlidingWindowEstimate;
using quota::TokenBucket;
using quota::gateway::Gateway;
using quota::gateway::RuleRegistry;
using quota::redis::GatewayStore;
using quota::testing::build;
using quota::testing::with_cost;

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

TEST_CASE("redis cluster gateway: sliding log and estimate levels across nodes, given back") {
  // Tenant level: a sliding log of 6; user level: an estimate of 4; global: a log of 10
  // (windows of an hour: nothing leaves during the test). A log's events live beside its
  // key in the tenant's slot; a denial by the global level gives the tenant's log and
  // the user's estimate back on their node.
  auto cfg = quota::testing::redis_config();
  cfg.port = first_cluster_port();
  auto cluster = std::make_shared<quota::redis::ClusterPool>(cfg, 2);
  GatewayStore store({.pool = nullptr,
                      .prefix = quota::testing::unique_prefix("gw-cluster-windows"),
                      .time = quota::redis::TimeSource::kServer,
                      .ttl_margin = std::chrono::milliseconds(1000),
                      .cluster = cluster});
  auto windows = [](std::uint64_t version) {
    return quota::testing::levels_spec(version, SlidingLog{.limit = 6, .window = 1h},
                                       SlidingWindowEstimate{.limit = 4, .window = 1h},
                                       SlidingLog{.limit = 10, .window = 1h});
  };
  RuleRegistry registry(build(windows(1)));
  Gateway gw(store, registry);
  auto global_node = cluster->for_slot(quota::redis::key_slot("{~global}"));
  REQUIRE(global_node.ok());
  std::vector<std::string> tenants;
  for (int i = 0; tenants.size() < 3 && i < 1000; ++i) {
    const std::string t = "wtenant-" + std::to_string(i);
    auto node = cluster->for_slot(quota::redis::key_slot("{" + t + "}"));
    REQUIRE(node.ok());
    if (*node != *global_node) tenants.push_back(t);
  }
  REQUIRE(tenants.size() == 3);
  auto decide = [&](const std::string& tenant, const char* user) {
    auto r = gw.decide({.who = {.tenant = tenant, .plan = "free", .user = user}, .route = "read"},
                       Nanos{0});
    INFO(r.status().ToString());
    REQUIRE(r.ok());
    return r->decision.allowed ? 1 : 0;
  };
  std::vector<int> per_tenant(tenants.size(), 0);
  for (std::size_t t = 0; t < tenants.size(); ++t) {
    for (const char* user : {"u1", "u2"}) {
      for (int i = 0; i < 5; ++i) per_tenant[t] += decide(tenants[t], user);
    }
  }
  // Tenant 0: users 4 + 2 (its log of 6); tenant 1: 4 left of the global 10; tenant 2: 0.
  CHECK(per_tenant[0] == 6);
  CHECK(per_tenant[1] == 4);
  CHECK(per_tenant[2] == 0);
  // Without the global rule: tenant 1 has the 2 its log kept, tenant 2 its whole 6.
  auto no_global = windows(2);
  no_global.rules.pop_back();
  REQUIRE(registry.publish(build(no_global)).ok());
  int t1 = 0, t2 = 0;
  for (const char* user : {"v1", "v2", "v3"}) {
    for (int i = 0; i < 3; ++i) {
      t1 += decide(tenants[1], user);
      t2 += decide(tenants[2], user);
    }
  }
  CHECK(t1 == 2);
  CHECK(t2 == 6);
}

TEST_CASE("redis cluster gateway: coalesced calls follow a slot moved under them, charged once") {
  using quota::testing::cluster_ports;
  using quota::testing::node_config;
  const auto ports = cluster_ports();
  // No reload for age: the test counts the MOVED replies of a stale map.
  auto cluster = std::make_shared<quota::redis::ClusterPool>(
      node_config(ports[0]), 2, quota::redis::TryAgainPolicy{},
      quota::redis::RefreshPolicy{.periodic = std::chrono::milliseconds(0)});
  quota::redis::GatewayStoreOptions opts{.pool = nullptr,
                                         .prefix = quota::testing::unique_prefix("gw-co-moved"),
                                         .time = quota::redis::TimeSource::kServer,
                                         .ttl_margin = std::chrono::milliseconds(1000),
                                         .cluster = cluster};
  opts.coalesce = 16;
  opts.coalesce_calls = 1;
  GatewayStore store(opts);
  const quota::gateway::RulePolicy ten = TokenBucket{.rate = kSlow, .burst = 10};
  auto decide = [&](const std::string& key, std::int64_t cost) {
    const quota::gateway::LevelCheck level[] = {{.policy = &ten, .key = key, .shadow = false}};
    return store.decide(with_cost(level, cost), 1, Nanos{0});
  };
  // The tenant whose slot moves (from its owner to a second node), and one on the third
  // node, whose call holds the others back while that node is paused.
  const std::string moving = "co-moved";
  const int slot = quota::redis::key_slot("{" + moving + "}");
  const int from = quota::testing::slot_owner(slot);
  const int to = from == ports[0] ? ports[1] : ports[0];
  std::string holder;
  for (int i = 0; holder.empty() && i < 1000; ++i) {
    const std::string t = "holder-" + std::to_string(i);
    const int owner = quota::testing::slot_owner(quota::redis::key_slot("{" + t + "}"));
    if (owner != from && owner != to) holder = t;
  }
  REQUIRE_FALSE(holder.empty());
  const std::vector<std::string> keys = {"{" + holder + "}h", "{" + moving + "}a",
                                         "{" + moving + "}b", "{" + moving + "}c",
                                         "{" + moving + "}d"};
  for (const auto& k : keys) {  // each once, alone: the store's slot map is now cached
    auto d = decide(k, 1);
    REQUIRE(d.ok());
    CHECK(d->parts[0].remaining == 9);
  }
  quota::testing::SlotMigration migration(slot, from, to);
  REQUIRE(migration.open());
  REQUIRE(migration.finish());  // the slot is on `to`; the store still thinks `from`

  quota::redis::Connection admin(
      node_config(quota::testing::slot_owner(quota::redis::key_slot("{" + holder + "}"))));
  // (WRITE: scripts wait, CLIENT UNPAUSE does not.)
  REQUIRE(admin.command({"CLIENT", "PAUSE", "1500", "WRITE"}).ok());
  const auto moves = cluster->moves();
  const auto writes = cluster->pipelines();
  const auto before = store.coalesce_stats().round_trips;
  std::vector<absl::StatusOr<quota::gateway::LevelsResult>> got(keys.size(),
                                                                absl::UnknownError("not run"));
  std::vector<std::thread> threads;
  threads.emplace_back([&] { got[0] = decide(keys[0], 2); });
  while (store.coalesce_stats().round_trips == before) std::this_thread::yield();
  for (std::size_t i = 1; i < keys.size(); ++i) {
    threads.emplace_back([&, i] { got[i] = decide(keys[i], 2); });
  }
  const auto until = std::chrono::steady_clock::now() + 1s;
  while (store.coalesce_stats().waiting < keys.size() - 1 &&
         std::chrono::steady_clock::now() < until) {
    std::this_thread::yield();
  }
  const bool all_waited = store.coalesce_stats().waiting == keys.size() - 1;
  REQUIRE(admin.command({"CLIENT", "UNPAUSE"}).ok());
  for (auto& th : threads) th.join();
  REQUIRE(all_waited);  // (else the pause ended before they all waited)
  const auto stats = store.coalesce_stats();
  INFO("round trips " << stats.round_trips - before << ", MOVED " << cluster->moves() - moves
                      << ", writes " << cluster->pipelines() - writes << "; slot " << slot
                      << quota::testing::slot_report(slot));
  // The holder alone, then the four together: one write to the old owner, four MOVED
  // (the map refreshed once), then one write of the four to the new owner.
  CHECK(stats.round_trips - before == 2);
  CHECK(cluster->moves() - moves == 4);
  CHECK(cluster->pipelines() - writes == 3);
  for (std::size_t i = 0; i < keys.size(); ++i) {
    INFO(keys[i] << ": " << got[i].status());
    REQUIRE(got[i].ok());
    CHECK(got[i]->parts[0].allowed);
    CHECK(got[i]->parts[0].remaining == 7);
    auto look = decide(keys[i], 11);  // over the burst: shows what is left, charges nothing
    REQUIRE(look.ok());
    CHECK(look->parts[0].remaining == 7);
  }
}
