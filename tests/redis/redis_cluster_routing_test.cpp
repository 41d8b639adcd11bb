// Tests of quota/redis/transport/cluster.hpp and RedisStore on a real Redis Cluster of 3
// masters (cmake/redis_cluster.sh): CRC16 slots and hash tags, every tenant routed to its
// slot's node, and live slot moves (ASK, then MOVED) with the budget spent exactly once.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "quota/policy/token_bucket.hpp"
#include "quota/redis/redis_store.hpp"
#include "quota/redis/transport/cluster.hpp"
#include "support/cluster_fixtures.hpp"
#include "support/printers.hpp"
#include "support/redis_cluster.hpp"
#include "support/redis_server.hpp"
#include "support/seed.hpp"

using namespace std::chrono_literals;
using quota::Nanos;
using quota::RedisStore;
using quota::TokenBucket;
using quota::redis::Connection;
using quota::redis::key_slot;
using quota::testing::cluster_ports;
using quota::testing::cluster_store;
using quota::testing::kOnce;
using quota::testing::lives_on;
using quota::testing::LoadThreads;
using quota::testing::migrate_slot;
using quota::testing::migrate_under_load;
using quota::testing::node_config;
using quota::testing::owner;

TEST_CASE("slots are CRC16 of the hash tag, as Redis Cluster computes them") {
  CHECK(quota::redis::crc16("123456789") == 0x31C3);
  Connection c(node_config(cluster_ports()[0]));
  for (const char* key : {"foo", "quota:{acme}read", "{}x", "a{b}c{d}", "{acme}", "x{}y{z}"}) {
    INFO(key);
    auto slot = c.command({"CLUSTER", "KEYSLOT", key});
    REQUIRE(slot.ok());
    REQUIRE((*slot)->type == REDIS_REPLY_INTEGER);
    CHECK((*slot)->integer == key_slot(key));
  }
  auto r = c.command({"CLUSTER", "KEYSLOT", "quota:{acme}read"});
  REQUIRE(r.ok());
  CHECK((*r)->integer == key_slot("quota:{acme}read"));
  CHECK(key_slot("quota:{acme}read") == key_slot("quota:a{acme}attempt-1"));
}

TEST_CASE("a store on the cluster routes every tenant to its slot's node") {
  auto cluster = std::make_shared<quota::redis::ClusterPool>(node_config(cluster_ports()[1]), 2);
  quota::RedisStoreOptions opts;
  opts.prefix = quota::testing::unique_prefix("cluster");
  opts.cluster = cluster;
  RedisStore<TokenBucket> store(opts);
  std::vector<int> nodes_used;
  for (int t = 0; t < 30; ++t) {
    const std::string key = "{tenant-" + std::to_string(t) + "}read";
    int allowed = 0;
    for (int i = 0; i < 5; ++i) {
      auto d = store.apply(kOnce, key, Nanos{0}, 1);
      REQUIRE(d.ok());
      allowed += d->allowed;
    }
    CHECK(allowed == 3);
    auto rk = store.redis_key(key);
    REQUIRE(rk.ok());
    const int port = owner(key_slot(*rk));
    CHECK(lives_on(store, key, port));  // the key lives on the node that serves its slot
    if (std::find(nodes_used.begin(), nodes_used.end(), port) == nodes_used.end()) {
      nodes_used.push_back(port);
    }
  }
  CHECK(nodes_used.size() == 3);
  // A hierarchical check of one tenant's keys is one script on one node.
  using Req = RedisStore<TokenBucket>::Request;
  const std::vector<Req> both = {{&kOnce, "{tenant-0}", 1}, {&kOnce, "{tenant-0}create", 1}};
  auto h = store.apply_all(both, Nanos{0});
  REQUIRE(h.ok());
  CHECK(h->decision.allowed);
}

TEST_CASE("a live slot migration under load: ASK, then MOVED, and the budget spent exactly once") {
  const auto ports = cluster_ports();
  auto cluster = std::make_shared<quota::redis::ClusterPool>(node_config(ports[0]), 4);
  const std::string prefix = quota::testing::unique_prefix("migrate");
  quota::RedisStoreOptions opts;
  opts.prefix = prefix;
  opts.cluster = cluster;
  RedisStore<TokenBucket> store(opts);
  const TokenBucket budget{.rate = {.units = 0, .per = 1s}, .burst = 400};
  // Several tenants in ONE slot would be ideal; one tenant's keys are one slot anyway.
  const std::vector<std::string> keys = {"{mover}a", "{mover}b", "{mover}c", "{mover}d"};
  auto rk = store.redis_key(keys[0]);
  REQUIRE(rk.ok());
  const int slot = key_slot(*rk);
  const int from_port = owner(slot);
  const int to_port = ports[0] == from_port ? ports[1] : ports[0];
  // Warm: every key exists on the source before the migration starts.
  for (const auto& k : keys) REQUIRE(store.apply(budget, k, Nanos{0}, 1).ok());

  LoadThreads load(4, [&](int t) {
    load.tally(store.apply(budget, keys[static_cast<std::size_t>(t)], Nanos{0}, 1));
  });
  const auto migration = migrate_under_load(load, slot, from_port, to_port);
  const std::int64_t allowed = load.allowed(), errors = load.errors(), calls = load.calls();

  // Every key now lives on the target, and the store still decides there.
  int verify_allowed = 0;
  for (const auto& k : keys) {
    CHECK(lives_on(store, k, to_port));
    auto d = store.apply(budget, k, Nanos{0}, 1);
    REQUIRE(d.ok());
    verify_allowed += d->allowed;
  }
  // Exactly the budget: 4 keys x 400 units, 4 of them spent while warming.
  int remaining_total = 0;
  for (const auto& k : keys) {
    auto d = store.apply(budget, k, Nanos{0}, 1);
    REQUIRE(d.ok());
    remaining_total += static_cast<int>(d->remaining) + (d->allowed ? 1 : 0);
  }
  INFO("calls " << calls << " allowed " << allowed << " errors " << errors << " ASK "
                << cluster->asks() << " MOVED " << cluster->moves());
  CHECK(cluster->asks() > 0);
  CHECK(cluster->moves() > 0);
  CHECK(calls > 100);
  // warm (4) + allowed during the load + allowed while verifying + what is left = 1600,
  // exactly: the migration neither lost nor duplicated any bucket state.
  CHECK(errors == 0);
  CHECK(4 + allowed + verify_allowed + remaining_total == 4 * 400);
}

TEST_CASE("MOVED with one connection per node: the map refresh does not wait for our own") {
  const auto ports = cluster_ports();
  // The refresh asks the nodes in name order; the old owner first is the case that waited.
  std::vector<std::string> names;
  for (int p : ports) names.push_back("127.0.0.1:" + std::to_string(p));
  const int first = std::stoi(std::min(names.front(), std::min(names[1], names[2])).substr(10));
  std::string key;
  for (int i = 0; key.empty(); ++i) {
    const std::string k = "{lonely-" + std::to_string(i) + "}a";
    if (owner(key_slot(k)) == first) key = k;
  }
  auto cfg = node_config(first);
  cfg.deadline = 3s;
  auto cluster = std::make_shared<quota::redis::ClusterPool>(
      cfg, 1, quota::redis::TryAgainPolicy{}, quota::redis::RefreshPolicy{.periodic = 0ms});
  auto store = cluster_store(cluster, "lonely");
  REQUIRE(store.apply(kOnce, key, Nanos{0}, 1).ok());  // map loaded: the slot on `first`
  const auto moved = migrate_slot(key_slot(key), first == ports[0] ? ports[1] : ports[0]);
  const auto t0 = std::chrono::steady_clock::now();
  auto d = store.apply(kOnce, key, Nanos{0}, 1);
  const auto took = std::chrono::steady_clock::now() - t0;
  REQUIRE(d.ok());
  CHECK(d->remaining == 1);
  CHECK(cluster->moves() == 1);
  CHECK(took < 1s);
}

TEST_CASE("a slot map reload that meets a node that does not answer leaves the call its time") {
  const auto ports = cluster_ports();
  // The reload asks the known nodes in the order of their names: pause the first, and
  // decide for a tenant of another node, with the map due for its periodic reload.
  std::vector<int> by_name = ports;
  std::sort(by_name.begin(), by_name.end(),
            [](int a, int b) { return std::to_string(a) < std::to_string(b); });
  const int paused_port = by_name[0];
  auto cfg = node_config(ports[0]);
  cfg.deadline = 300ms;
  auto cluster = std::make_shared<quota::redis::ClusterPool>(
      cfg, 2, quota::redis::TryAgainPolicy{}, quota::redis::RefreshPolicy{.periodic = 20ms});
  auto store = cluster_store(cluster, "reload-paused");
  std::string key;
  for (int i = 0; i < 1000 && key.empty(); ++i) {
    const std::string k = "reload-" + std::to_string(i) + ":read";
    auto rk = store.redis_key(k);
    REQUIRE(rk.ok());
    if (owner(key_slot(*rk)) != paused_port) key = k;
  }
  REQUIRE_FALSE(key.empty());
  REQUIRE(store.apply(kOnce, key, Nanos{0}, 1).ok());  // the map loaded, every node known
  REQUIRE(cluster->refresh().ok());
  const auto refreshes = cluster->refreshes();
  Connection admin(node_config(paused_port));
  REQUIRE(admin.command({"CLIENT", "PAUSE", "1500", "ALL"}).ok());
  std::this_thread::sleep_for(60ms);  // the map is old: this call reloads it first
  auto d = store.apply(kOnce, key, Nanos{0}, 1);
  INFO(d.status());
  // The reload gave up on the paused node within its share of the time and asked the
  // next; the call still had time for its own node.
  REQUIRE(d.ok());
  CHECK(d->allowed);
  CHECK(d->remaining == 1);
  CHECK(cluster->refreshes() == refreshes + 1);
  std::this_thread::sleep_for(1600ms);  // the pause over, for the tests that follow
}
