// tests/redis/support/cluster_fixtures.hpp — what the RedisStore tests on the Redis
// Cluster share: a store on the cluster, where a key lives, slot moves (each moved back
// when its SlotMigration is destroyed) and the decisions of a batch.
//
// Unlike support/redis_cluster.hpp these helpers use Catch2 assertions: call them on the
// test's own thread only.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <catch2/catch.hpp>

#include "quota/policy/token_bucket.hpp"
#include "quota/redis/redis_store.hpp"
#include "quota/redis/transport/cluster.hpp"
#include "support/redis_cluster.hpp"
#include "support/redis_server.hpp"

namespace quota::testing {

// The port of the node serving `slot`.
inline int owner(int slot) {
  const int port = slot_owner(slot);
  REQUIRE(port != 0);
  return port;
}

// True when the node at `port` holds the Redis key of `store`'s key `key`.
inline bool lives_on(const RedisStore<TokenBucket>& store, const std::string& key, int port) {
  auto rk = store.redis_key(key);
  REQUIRE(rk.ok());
  redis::Connection c(node_config(port));
  auto exists = c.command({"EXISTS", *rk});
  REQUIRE(exists.ok());
  return (*exists)->integer == 1;
}

// With `load` running for 50 ms: migrates `slot` key by key, 20 ms apart (so that calls
// meet the slot half migrated: ASK), lets the load run 100 ms more (MOVED, the map
// refreshed) and stops it. The slot moves back when the result is destroyed.
inline std::unique_ptr<SlotMigration> migrate_under_load(LoadThreads& load, int slot, int from_port,
                                                         int to_port) {
  using namespace std::chrono_literals;
  std::this_thread::sleep_for(50ms);
  auto migration = std::make_unique<SlotMigration>(slot, from_port, to_port);
  REQUIRE(migration->open());
  while (migration->move_one()) std::this_thread::sleep_for(20ms);
  REQUIRE(migration->finish());
  std::this_thread::sleep_for(100ms);
  load.stop();
  return migration;
}

// Moves `slot` with all its keys to the node at `to_port`, and tells every node. The
// slot moves back when the returned migration is destroyed.
inline std::unique_ptr<SlotMigration> migrate_slot(int slot, int to_port) {
  const int from_port = owner(slot);
  REQUIRE(from_port != to_port);
  auto migration = std::make_unique<SlotMigration>(slot, from_port, to_port);
  REQUIRE(migration->open());
  REQUIRE(migration->finish());
  REQUIRE(owner(slot) == to_port);
  return migration;
}

// A one-off budget of 3 units (no refill).
inline const TokenBucket kOnce{.rate = {.units = 0, .per = std::chrono::seconds(1)}, .burst = 3};

// A store on `cluster` under a key prefix of its own, on the caller's time.
inline RedisStore<TokenBucket> cluster_store(std::shared_ptr<redis::ClusterPool> cluster,
                                             const std::string& name) {
  RedisStoreOptions opts;
  opts.prefix = unique_prefix(name);
  opts.time = redis::TimeSource::kCaller;  // decisions reproducible across stores
  opts.cluster = std::move(cluster);
  return RedisStore<TokenBucket>(opts);
}

// The decisions of a batch whose every item must have been decided.
inline std::vector<Decision> all_ok(
    const absl::StatusOr<std::vector<absl::StatusOr<Decision>>>& r) {
  INFO(r.status());
  REQUIRE(r.ok());
  std::vector<Decision> out;
  for (const auto& d : *r) {
    INFO(d.status());
    REQUIRE(d.ok());
    out.push_back(*d);
  }
  return out;
}

}  // namespace quota::testing
