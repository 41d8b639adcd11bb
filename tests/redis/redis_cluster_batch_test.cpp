// Tests of RedisStore's batches (apply_pipelined, apply_batch) on a real Redis Cluster:
// one pipelined write per node, the same decisions as one by one, MOVED and ASK during a
// batch with every decision made once, and a node that does not answer fails its items.
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <thread>
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
using quota::testing::all_ok;
using quota::testing::cluster_ports;
using quota::testing::cluster_store;
using quota::testing::LoadThreads;
using quota::testing::migrate_slot;
using quota::testing::migrate_under_load;
using quota::testing::node_config;
using quota::testing::owner;

namespace {

using Item = RedisStore<TokenBucket>::BatchItem;

// Runs one admin command; its reply as text.
std::string reply_text(Connection& c, std::vector<std::string_view> args) {
  auto r = c.command(args);
  REQUIRE(r.ok());
  INFO(quota::redis::reply_string(**r));
  REQUIRE((*r)->type != REDIS_REPLY_ERROR);
  return std::string(quota::redis::reply_string(**r));
}

// "{<name>-i}<route>" for i < tenants and both routes: keys over many slots.
std::vector<std::string> tenant_keys(const std::string& name, int tenants) {
  std::vector<std::string> keys;
  for (int i = 0; i < tenants; ++i) {
    for (const char* route : {"a", "b"}) {
      keys.push_back("{" + name + "-" + std::to_string(i) + "}" + route);
    }
  }
  return keys;
}

// The port of the node serving each store key's slot (one CLUSTER SLOTS per slot).
std::map<std::string, int> owners(const std::vector<std::string>& keys) {
  std::map<int, int> by_slot;
  std::map<std::string, int> out;
  for (const auto& k : keys) {
    const int slot = key_slot(k);
    if (by_slot.count(slot) == 0) by_slot[slot] = owner(slot);
    out[k] = by_slot[slot];
  }
  return out;
}

// total_reads_processed: read events a node has handled on its client connections.
std::int64_t reads_processed(Connection& admin) {
  const std::string info = reply_text(admin, {"INFO", "stats"});
  const auto at = info.find("total_reads_processed:");
  REQUIRE(at != std::string::npos);
  return std::atoll(info.c_str() + at + std::string("total_reads_processed:").size());
}

}  // namespace

TEST_CASE("a batch over all three nodes decides exactly as the same requests one by one") {
  const std::uint64_t seed = quota::testing::test_seed(20261129);
  INFO("seed " << seed);
  std::mt19937_64 rng(seed);
  auto cluster = std::make_shared<quota::redis::ClusterPool>(node_config(cluster_ports()[2]), 2);
  auto many = cluster_store(cluster, "same-many");
  auto batch = cluster_store(cluster, "same-batch");
  auto one = cluster_store(cluster, "same-one");
  const TokenBucket policy{.rate = {.units = 5, .per = 1s}, .burst = 6};
  const auto keys = tenant_keys("same", 16);
  const auto node_of = owners(keys);
  std::set<int> all_nodes;
  for (const auto& [k, port] : node_of) all_nodes.insert(port);
  REQUIRE(all_nodes.size() == 3);

  Nanos now{1'000'000'000'000};
  int allowed = 0, denied = 0, mismatches = 0;
  for (int round = 0; round < 12; ++round) {
    INFO("round " << round);
    now += std::chrono::milliseconds(rng() % 500);
    const std::size_t size = round % 2 == 0 ? 16 : 64;
    std::vector<Item> items;
    std::set<int> nodes;
    for (std::size_t i = 0; i < size; ++i) {
      const std::string& k = keys[rng() % keys.size()];
      items.push_back({k, static_cast<std::int64_t>(rng() % 9)});  // 0 and > burst too
      nodes.insert(node_of.at(k));
    }
    const auto p0 = cluster->pipelines();
    auto m = many.apply_pipelined(policy, items, now);
    const auto p1 = cluster->pipelines();
    auto b = batch.apply_batch(policy, items, now);
    const auto p2 = cluster->pipelines();
    REQUIRE(m.ok());
    REQUIRE(b.ok());
    REQUIRE(m->size() == size);
    REQUIRE(b->size() == size);
    // One pipelined write per node (a first NOSCRIPT on a node would add one more).
    if (round > 0) {
      CHECK(p1 - p0 == nodes.size());
      CHECK(p2 - p1 == nodes.size());
    }
    for (std::size_t i = 0; i < size; ++i) {
      auto d = one.apply(policy, items[i].key, now, items[i].cost);
      REQUIRE(d.ok());
      REQUIRE((*m)[i].ok());
      REQUIRE((*b)[i].ok());
      if (!((*m)[i].value() == *d && (*b)[i].value() == *d)) {
        ++mismatches;
        INFO("item " << i << " key " << items[i].key << " cost " << items[i].cost);
        CHECK((*m)[i].value() == *d);
        CHECK((*b)[i].value() == *d);
      }
      (d->allowed ? allowed : denied) += 1;
    }
  }
  CHECK(mismatches == 0);
  CHECK(allowed > 50);  // the traces both allow and deny
  CHECK(denied > 50);
}

TEST_CASE("a batch reaches each node in one read: the nodes' own counters say so") {
  const auto ports = cluster_ports();
  auto cluster = std::make_shared<quota::redis::ClusterPool>(node_config(ports[0]), 2);
  auto store = cluster_store(cluster, "reads");
  const TokenBucket policy{.rate = {.units = 1000, .per = 1s}, .burst = 1000};
  const auto keys = tenant_keys("reads", 24);  // 48 keys, each once
  const auto node_of = owners(keys);
  std::vector<Item> items;
  std::map<int, std::int64_t> per_node;
  for (const auto& k : keys) {
    items.push_back({k, 1});
    ++per_node[node_of.at(k)];
  }
  REQUIRE(per_node.size() == 3);
  for (const auto& [port, n] : per_node) REQUIRE(n >= 8);
  REQUIRE(store.apply_pipelined(policy, items, Nanos{0}).ok());  // warm: map, scripts, sockets

  std::map<int, std::unique_ptr<Connection>> admin;
  for (int port : ports) admin[port] = std::make_unique<Connection>(node_config(port));
  std::map<int, std::int64_t> before, after_batch, after_one;
  for (auto& [port, c] : admin) before[port] = reads_processed(*c);
  auto r = store.apply_pipelined(policy, items, Nanos{1'000'000});
  REQUIRE(r.ok());
  for (const auto& d : *r) REQUIRE(d.ok());
  for (auto& [port, c] : admin) after_batch[port] = reads_processed(*c);
  for (const auto& item : items) REQUIRE(store.apply(policy, item.key, Nanos{2'000'000}, 1).ok());
  for (auto& [port, c] : admin) after_one[port] = reads_processed(*c);
  for (const auto& [port, n] : per_node) {
    INFO("node " << port << ": " << n << " items; reads for the batch "
                 << after_batch[port] - before[port] << ", one by one "
                 << after_one[port] - after_batch[port] << " (each including our INFO)");
    CHECK(after_batch[port] - before[port] <= 3);    // one write: one read (or two)
    CHECK(after_one[port] - after_batch[port] > n);  // the measure can tell
  }
}

TEST_CASE("MOVED during a batch (a stale slot map): every decision made exactly once") {
  const std::uint64_t seed = quota::testing::test_seed(7);
  INFO("seed " << seed);
  std::mt19937_64 rng(seed);
  const auto ports = cluster_ports();
  // No reload for age: the map is meant to stay stale.
  auto stale = std::make_shared<quota::redis::ClusterPool>(
      node_config(ports[1]), 2, quota::redis::TryAgainPolicy{},
      quota::redis::RefreshPolicy{.periodic = 0ms});
  auto fresh = std::make_shared<quota::redis::ClusterPool>(node_config(ports[0]), 2);
  auto batched = cluster_store(stale, "stale-batched");
  auto one = cluster_store(fresh, "stale-one");
  // No refill: a call applied twice would show in every later remaining.
  const TokenBucket policy{.rate = {.units = 0, .per = 1s}, .burst = 40};
  const auto keys = tenant_keys("stale", 12);
  auto make_items = [&] {
    std::vector<Item> items;
    for (int i = 0; i < 48; ++i) {
      items.push_back({keys[rng() % keys.size()], static_cast<std::int64_t>(1 + rng() % 3)});
    }
    return items;
  };
  auto compare = [&](const std::vector<Item>& items, const std::vector<quota::Decision>& got) {
    REQUIRE(got.size() == items.size());
    int mismatches = 0;
    for (std::size_t i = 0; i < items.size(); ++i) {
      auto d = one.apply(policy, items[i].key, Nanos{0}, items[i].cost);
      REQUIRE(d.ok());
      if (!(got[i] == *d)) {
        ++mismatches;
        INFO("item " << i << " key " << items[i].key);
        CHECK(got[i] == *d);
      }
    }
    CHECK(mismatches == 0);
  };
  auto many = [&](const std::vector<Item>& items) {
    return all_ok(batched.apply_pipelined(policy, items, Nanos{0}));
  };
  // Round 1 loads the map; then two slots move behind the stale pool's back, one before
  // apply_pipelined and one before apply_batch.
  auto items = make_items();
  compare(items, many(items));
  auto slot_of = [&](const std::string& key) { return key_slot(key); };
  const int slot_a = slot_of(keys[0]), slot_b = slot_of(keys[2]);
  REQUIRE(slot_a != slot_b);
  auto elsewhere = [&](int slot) {
    const int from = owner(slot);
    return from == ports[0] ? ports[1] : ports[0];
  };
  items = make_items();
  items.push_back({keys[0], 1});  // the moved slot is surely in the batch
  const auto moves0 = stale->moves();
  const auto moved_a = migrate_slot(slot_a, elsewhere(slot_a));
  compare(items, many(items));
  const auto moves1 = stale->moves();
  CHECK(moves1 > moves0);

  items = make_items();
  items.push_back({keys[2], 1});
  const auto moved_b = migrate_slot(slot_b, elsewhere(slot_b));
  compare(items, all_ok(batched.apply_batch(policy, items, Nanos{0})));
  CHECK(stale->moves() > moves1);

  // And what is left in every bucket is the same: nothing was charged twice.
  for (const auto& k : keys) {
    auto x = batched.apply(policy, k, Nanos{0}, 1);
    auto y = one.apply(policy, k, Nanos{0}, 1);
    REQUIRE(x.ok());
    REQUIRE(y.ok());
    CHECK(*x == *y);
  }
}

TEST_CASE("a live slot migration under batch load: ASK and MOVED, every decision exactly once") {
  const auto ports = cluster_ports();
  auto cluster = std::make_shared<quota::redis::ClusterPool>(node_config(ports[2]), 4);
  auto store = cluster_store(cluster, "batch-migrate");
  const TokenBucket budget{.rate = {.units = 0, .per = 1s}, .burst = 300};
  const std::vector<std::string> movers = {"{bmover}a", "{bmover}b", "{bmover}c", "{bmover}d"};
  const auto others = tenant_keys("bload", 4);  // 8 keys elsewhere
  std::vector<std::string> all = movers;
  all.insert(all.end(), others.begin(), others.end());
  for (const auto& k : all) REQUIRE(store.apply(budget, k, Nanos{0}, 1).ok());  // warm
  const int slot = key_slot(movers[0]);
  const int from_port = owner(slot);
  const int to_port = from_port == ports[0] ? ports[1] : ports[0];

  std::vector<std::vector<Item>> items(3);  // each thread's batch: every key, rotated
  for (std::size_t t = 0; t < items.size(); ++t) {
    for (std::size_t i = 0; i < all.size(); ++i) items[t].push_back({all[(i + t) % all.size()], 1});
  }
  LoadThreads load(3, [&](int t) {
    const auto& batch = items[static_cast<std::size_t>(t)];
    auto r = store.apply_pipelined(budget, batch, Nanos{0});
    if (!r.ok()) {
      load.tally_errors(static_cast<std::int64_t>(batch.size()));
      return;
    }
    for (const auto& d : *r) load.tally(d);
  });
  const auto migration = migrate_under_load(load, slot, from_port, to_port);
  const std::int64_t allowed = load.allowed(), errors = load.errors(), batches = load.calls();

  // What is left, with a fresh map: warm (1 per key) + allowed + left = the budget.
  std::int64_t left = 0;
  for (const auto& k : all) {
    auto d = store.apply(budget, k, Nanos{0}, 0);  // cost 0: a look, nothing deducted
    REQUIRE(d.ok());
    left += d->remaining;
  }
  INFO("batches " << batches << " allowed " << allowed << " errors " << errors << " ASK "
                  << cluster->asks() << " MOVED " << cluster->moves() << " writes "
                  << cluster->pipelines());
  CHECK(cluster->asks() > 0);
  CHECK(cluster->moves() > 0);
  CHECK(batches > 20);
  CHECK(errors == 0);
  CHECK(static_cast<std::int64_t>(all.size()) + allowed + left ==
        static_cast<std::int64_t>(all.size()) * 300);
}

TEST_CASE("a node that does not answer fails only its own items of a batch, as unavailable") {
  const auto ports = cluster_ports();
  auto cfg = node_config(ports[0]);
  cfg.deadline = 200ms;
  auto cluster = std::make_shared<quota::redis::ClusterPool>(cfg, 2);
  // Separate stores (prefixes), so that what each call charged can be told apart.
  auto many_store = cluster_store(cluster, "paused-many");
  auto batch_store = cluster_store(cluster, "paused-batch");
  const TokenBucket policy{.rate = {.units = 0, .per = 1s}, .burst = 10};  // no refill
  const auto keys = tenant_keys("paused", 12);
  const auto node_of = owners(keys);
  std::vector<Item> items;
  for (const auto& k : keys) items.push_back({k, 1});
  all_ok(many_store.apply_pipelined(policy, items, Nanos{0}));  // warm: map, scripts, sockets
  all_ok(batch_store.apply_batch(policy, items, Nanos{0}));
  const int paused_port = ports[1];
  Connection admin(node_config(paused_port));
  reply_text(admin, {"CLIENT", "PAUSE", "1000", "ALL"});
  const auto t0 = std::chrono::steady_clock::now();
  auto r = many_store.apply_pipelined(policy, items, Nanos{0});
  const auto took = std::chrono::steady_clock::now() - t0;
  auto b = batch_store.apply_batch(policy, items, Nanos{0});
  const auto took_both = std::chrono::steady_clock::now() - t0;
  REQUIRE(r.ok());
  REQUIRE(b.ok());  // one node down fails its items, not the batch
  REQUIRE(r->size() == items.size());
  REQUIRE(b->size() == items.size());
  int failed = 0, decided = 0;
  for (std::size_t i = 0; i < items.size(); ++i) {
    const bool paused = node_of.at(std::string(items[i].key)) == paused_port;
    for (const auto* d : {&(*r)[i], &(*b)[i]}) {
      INFO(items[i].key << " on " << node_of.at(std::string(items[i].key)) << ": " << d->status());
      if (paused) {
        REQUIRE_FALSE(d->ok());
        CHECK(absl::IsUnavailable(d->status()));
        CHECK(d->status().message().find(std::to_string(paused_port)) != absl::string_view::npos);
        ++failed;
      } else {
        REQUIRE(d->ok());
        CHECK(d->value().allowed);
        CHECK(d->value().remaining == 8);  // warm 1 + this 1 of 10
        ++decided;
      }
    }
  }
  CHECK(failed > 0);
  CHECK(decided > 0);
  CHECK(took < 900ms);       // the deadline, not the pause
  CHECK(took_both < 900ms);  // both calls within the pause
  // After the pause, the same stores decide everything again (they reconnect). The
  // paused node's items were not charged: the commands waited in the paused node and
  // were dropped with their closed connections; the live nodes' items were charged once.
  std::this_thread::sleep_for(1000ms - (std::chrono::steady_clock::now() - t0) + 100ms);
  for (auto* store : {&many_store, &batch_store}) {
    std::vector<Item> looks;
    for (const auto& k : keys) looks.push_back({k, 0});  // cost 0: a look
    const auto left = all_ok(store->apply_batch(policy, looks, Nanos{0}));
    for (std::size_t i = 0; i < keys.size(); ++i) {
      INFO(keys[i] << " on " << node_of.at(keys[i]));
      CHECK(left[i].remaining == (node_of.at(keys[i]) == paused_port ? 9 : 8));
    }
  }
}
