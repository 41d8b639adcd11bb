// Tests for quota/redis/cluster.hpp and RedisStore on a real Redis Cluster of 3 masters
// started on loopback by the test fixture (cmake/redis_cluster.sh): CRC16 slots and hash
// tags, tenants spread over the nodes, and a live slot migration under load (ASK during
// the migration, MOVED after it) with the budget spent exactly once.
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "quota/policy/token_bucket.hpp"
#include "quota/redis/cluster.hpp"
#include "quota/redis/redis_store.hpp"
#include "support/printers.hpp"
#include "support/redis_server.hpp"

using namespace std::chrono_literals;
using quota::Nanos;
using quota::RedisStore;
using quota::TokenBucket;
using quota::redis::Connection;
using quota::redis::key_slot;

namespace {

std::vector<int> cluster_ports() {
  const char* dir = std::getenv("QUOTA_REDIS_CLUSTER_DIR");
  REQUIRE(dir != nullptr);
  std::ifstream in(std::string(dir) + "/ports");
  std::vector<int> ports;
  int p = 0;
  while (in >> p) ports.push_back(p);
  REQUIRE(ports.size() == 3);
  return ports;
}

quota::redis::ConnectionConfig node_config(int port) {
  auto cfg = quota::testing::redis_config();
  cfg.port = port;
  return cfg;
}

std::string reply_text(Connection& c, std::vector<std::string_view> args) {
  auto r = c.command(args);
  REQUIRE(r.ok());
  INFO(quota::redis::reply_string(**r));
  REQUIRE((*r)->type != REDIS_REPLY_ERROR);
  return std::string(quota::redis::reply_string(**r));
}

// The port of the node serving `slot` (CLUSTER SLOTS from the first node).
int owner(int slot) {
  Connection c(node_config(cluster_ports()[0]));
  auto r = c.command({"CLUSTER", "SLOTS"});
  REQUIRE(r.ok());
  for (std::size_t i = 0; i < (*r)->elements; ++i) {
    const redisReply* range = (*r)->element[i];
    if (range->element[0]->integer <= slot && slot <= range->element[1]->integer) {
      return static_cast<int>(range->element[2]->element[1]->integer);
    }
  }
  FAIL("slot not served");
  return 0;
}

const TokenBucket kOnce{.rate = {.units = 0, .per = 1s}, .burst = 3};

}  // namespace

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
    Connection c(node_config(port));
    auto exists = c.command({"EXISTS", *rk});
    REQUIRE(exists.ok());
    CHECK((*exists)->integer == 1);  // the key lives on the node that serves its slot
    if (std::find(nodes_used.begin(), nodes_used.end(), port) == nodes_used.end()) {
      nodes_used.push_back(port);
    }
  }
  CHECK(nodes_used.size() == 3);
  // A hierarchical check of one tenant's keys is one script on one node.
  using Req = RedisStore<TokenBucket>::Request;
  const std::vector<Req> both = {{&kOnce, "{tenant-0}", 1}, {&kOnce, "{tenant-0}create", 1}};
  auto h = store.acquire_all(both, Nanos{0});
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
  int to_port = ports[0] == from_port ? ports[1] : ports[0];
  Connection from(node_config(from_port)), to(node_config(to_port));
  const std::string from_id = reply_text(from, {"CLUSTER", "MYID"});
  const std::string to_id = reply_text(to, {"CLUSTER", "MYID"});
  // Warm: every key exists on the source before the migration starts.
  for (const auto& k : keys) REQUIRE(store.apply(budget, k, Nanos{0}, 1).ok());

  std::atomic<bool> stop{false};
  std::atomic<int> allowed{0}, errors{0}, calls{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      while (!stop.load()) {
        auto d = store.apply(budget, keys[static_cast<std::size_t>(t)], Nanos{0}, 1);
        ++calls;
        if (!d.ok()) {
          ++errors;
        } else {
          allowed += d->allowed;
        }
      }
    });
  }
  std::this_thread::sleep_for(50ms);
  const std::string slot_s = std::to_string(slot);
  reply_text(to, {"CLUSTER", "SETSLOT", slot_s, "IMPORTING", from_id});
  reply_text(from, {"CLUSTER", "SETSLOT", slot_s, "MIGRATING", to_id});
  // Move the keys one at a time, so that calls meet a half-migrated slot (ASK).
  for (;;) {
    auto got = from.command({"CLUSTER", "GETKEYSINSLOT", slot_s, "1"});
    REQUIRE(got.ok());
    if ((*got)->elements == 0) break;
    const std::string key(quota::redis::reply_string(*(*got)->element[0]));
    reply_text(from, {"MIGRATE", "127.0.0.1", std::to_string(to_port), key, "0", "5000"});
    std::this_thread::sleep_for(20ms);
  }
  reply_text(to, {"CLUSTER", "SETSLOT", slot_s, "NODE", to_id});
  reply_text(from, {"CLUSTER", "SETSLOT", slot_s, "NODE", to_id});
  std::this_thread::sleep_for(100ms);  // calls after the migration: MOVED, map refreshed
  stop = true;
  for (auto& th : threads) th.join();

  // Every key now lives on the target, and the store still decides there.
  int verify_allowed = 0;
  for (const auto& k : keys) {
    auto key = store.redis_key(k);
    REQUIRE(key.ok());
    auto exists = to.command({"EXISTS", *key});
    REQUIRE(exists.ok());
    CHECK((*exists)->integer == 1);
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
