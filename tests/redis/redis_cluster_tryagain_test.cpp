// Tests of -TRYAGAIN on a real Redis Cluster (a call of several keys meeting its slot
// half migrated): retried until the migration ends and charged once, or unavailable after
// its retries and charged nothing; coalesced calls are then decided alone.
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
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

using namespace std::chrono_literals;
using quota::Nanos;
using quota::RedisStore;
using quota::TokenBucket;
using quota::redis::Connection;
using quota::redis::key_slot;
using quota::testing::all_ok;
using quota::testing::cluster_ports;
using quota::testing::cluster_store;
using quota::testing::kOnce;
using quota::testing::lives_on;
using quota::testing::node_config;
using quota::testing::owner;
using quota::testing::slot_report;
using quota::testing::SlotMigration;

namespace {

using Item = RedisStore<TokenBucket>::BatchItem;

// Opens a migration of `key`'s slot to another node and moves only `key` there, so that
// the tenant's keys are split between the two nodes (a call of several keys of the
// tenant gets -TRYAGAIN). The slot is restored when the result is destroyed.
std::unique_ptr<SlotMigration> split_slot(const RedisStore<TokenBucket>& store,
                                          const std::string& key) {
  const auto ports = cluster_ports();
  const int slot = key_slot(key);
  const int from_port = owner(slot);
  auto migration =
      std::make_unique<SlotMigration>(slot, from_port, from_port == ports[0] ? ports[1] : ports[0]);
  REQUIRE(migration->open());
  auto moved = store.redis_key(key);
  REQUIRE(moved.ok());
  REQUIRE(migration->move(*moved));
  return migration;
}

// Waits (up to 10 s) until `cluster` has seen more than `n` -TRYAGAIN replies.
bool wait_tryagains(const quota::redis::ClusterPool& cluster, std::uint64_t n) {
  const auto until = std::chrono::steady_clock::now() + 10s;
  while (cluster.tryagains() <= n) {
    if (std::chrono::steady_clock::now() > until) return false;
    std::this_thread::sleep_for(1ms);
  }
  return true;
}

}  // namespace

// A call of several keys that meets its slot half migrated gets TRYAGAIN.
TEST_CASE("TRYAGAIN (a slot half migrated): retried until the migration ends, charged once") {
  const auto ports = cluster_ports();
  // Retries for up to 1.5 s (the command deadline is 2 s): the migration ends meanwhile.
  auto cluster = std::make_shared<quota::redis::ClusterPool>(
      node_config(ports[0]), 2,
      quota::redis::TryAgainPolicy{
          .retries = 1000, .backoff = 1ms, .max_backoff = 5ms, .budget = 1500ms});
  auto store = cluster_store(cluster, "tryagain");
  const TokenBucket policy{.rate = {.units = 0, .per = 1s}, .burst = 5};  // no refill
  using Req = RedisStore<TokenBucket>::Request;
  // apply_all (one script call through redis::Script) and apply_batch (the cluster
  // batch path), each on a tenant of its own.
  for (const std::string tenant : {"all", "batch"}) {
    INFO("via " << tenant);
    const std::vector<std::string> keys = {
        "{tryagain-" + tenant + "}a", "{tryagain-" + tenant + "}b", "{tryagain-" + tenant + "}c"};
    std::vector<Req> reqs;
    std::vector<Item> items;
    for (const auto& k : keys) {
      reqs.push_back({&policy, k, 1});
      items.push_back({k, 1});
    }
    const auto other = "{tryagain-other-" + tenant + "}x";  // another slot, same batch
    auto call = [&]() -> absl::StatusOr<std::vector<quota::Decision>> {
      if (tenant == "all") {
        auto r = store.apply_all(reqs, Nanos{0});
        if (!r.ok()) return r.status();
        return r->parts;
      }
      std::vector<Item> with_other = items;
      with_other.push_back({other, 1});
      auto r = store.apply_batch(policy, with_other, Nanos{0});
      if (!r.ok()) return r.status();
      std::vector<quota::Decision> out;
      for (const auto& d : *r) {
        if (!d.ok()) return d.status();
        out.push_back(*d);
      }
      return out;
    };
    auto warm = call();  // every key exists on the source, 1 of 5 spent
    INFO(warm.status());
    REQUIRE(warm.ok());
    const int slot = key_slot(keys[0]);
    const auto migration = split_slot(store, keys[0]);  // a on the target, b and c not
    const int from_port = migration->from_port(), to_port = migration->to_port();

    const auto seen = cluster->tryagains();
    std::atomic<bool> finished{false}, waited{false};
    std::thread finisher([&] {
      waited = wait_tryagains(*cluster, seen + 2);  // the call is retrying
      finished = migration->finish();
    });
    auto got = call();
    finisher.join();
    INFO(got.status() << "; TRYAGAIN replies " << cluster->tryagains() - seen);
    REQUIRE(waited.load());
    REQUIRE(finished.load());
    REQUIRE(got.ok());
    CHECK(cluster->tryagains() - seen >= 3);
    for (const auto& d : *got) {
      CHECK(d.allowed);
      CHECK(d.remaining == 3);  // 5 - warm - this call: charged exactly once
    }
    // The state afterwards, read on the target: each bucket charged twice in all.
    for (const auto& k : keys) {
      CHECK(lives_on(store, k, to_port));
      auto look = store.apply(policy, k, Nanos{0}, 0);  // cost 0: a look
      REQUIRE(look.ok());
      CHECK(look->remaining == 3);
    }
    REQUIRE(migration->restore());
    CHECK(owner(slot) == from_port);
  }
}

TEST_CASE("TRYAGAIN (a slot half migrated): unavailable after its retries, nothing charged") {
  const auto ports = cluster_ports();
  auto cluster = std::make_shared<quota::redis::ClusterPool>(
      node_config(ports[0]), 2, quota::redis::TryAgainPolicy{.retries = 3, .backoff = 2ms});
  auto store = cluster_store(cluster, "half");
  using Req = RedisStore<TokenBucket>::Request;
  const std::vector<std::string> keys = {"{half}a", "{half}b"};
  const std::vector<Req> reqs = {{&kOnce, keys[0], 1}, {&kOnce, keys[1], 1}};
  // A batch with the half-migrated tenant and one elsewhere: only the former fails.
  const std::vector<Item> items = {{keys[0], 1}, {"{half-elsewhere}x", 1}, {keys[1], 1}};
  const auto first = all_ok(store.apply_batch(kOnce, items, Nanos{0}));
  const int slot = key_slot(keys[0]);
  REQUIRE(key_slot("{half-elsewhere}x") != slot);
  const auto migration = split_slot(store, keys[0]);
  const int from_port = migration->from_port();

  auto seen = cluster->tryagains();
  const auto t0 = std::chrono::steady_clock::now();
  auto all = store.apply_all(reqs, Nanos{0});
  const auto took = std::chrono::steady_clock::now() - t0;
  INFO(all.status());
  REQUIRE_FALSE(all.ok());
  CHECK(absl::IsUnavailable(all.status()));
  CHECK(all.status().message().find("TRYAGAIN") != absl::string_view::npos);
  CHECK(cluster->tryagains() - seen == 4);  // the first reply and 3 retries
  CHECK(took >= 2ms + 4ms + 8ms);           // the backoffs were waited
  CHECK(took < 1s);

  seen = cluster->tryagains();
  auto batch = store.apply_batch(kOnce, items, Nanos{0});
  REQUIRE(batch.ok());
  REQUIRE(batch->size() == items.size());
  for (std::size_t i : {std::size_t{0}, std::size_t{2}}) {
    INFO("item " << i << ": " << (*batch)[i].status());
    REQUIRE_FALSE((*batch)[i].ok());
    CHECK(absl::IsUnavailable((*batch)[i].status()));
    CHECK((*batch)[i].status().message().find("TRYAGAIN") != absl::string_view::npos);
  }
  REQUIRE((*batch)[1].ok());  // the other tenant's item is decided
  CHECK((*batch)[1]->remaining == first[1].remaining - 1);
  CHECK(cluster->tryagains() - seen == 4);

  // Finish the migration: nothing was charged by the refused calls.
  REQUIRE(migration->finish());
  for (std::size_t i : {std::size_t{0}, std::size_t{2}}) {
    auto look = store.apply(kOnce, items[i].key, Nanos{0}, 0);  // cost 0: a look
    // (A one-key call cannot get -TRYAGAIN; once, in CI, this look did: the report shows
    // the nodes' view of the slot if it happens again.)
    INFO(items[i].key << ": " << look.status() << "; slot " << slot << slot_report(slot));
    REQUIRE(look.ok());
    CHECK(look->remaining == first[i].remaining);
  }
  REQUIRE(migration->restore());
  CHECK(owner(slot) == from_port);
}

// Coalescing on a cluster: a coalesced call is apply_batch's (one script call per
// slot); two keys of a slot half migrated in one call get -TRYAGAIN, and once it is given
// up on (nothing ran) each caller is decided alone, which -ASK serves.
TEST_CASE("coalesced calls on a slot half migrated are decided alone after TRYAGAIN") {
  const auto ports = cluster_ports();
  auto cluster = std::make_shared<quota::redis::ClusterPool>(
      node_config(ports[0]), 2, quota::redis::TryAgainPolicy{.retries = 0});
  quota::RedisStoreOptions opts;
  opts.prefix = quota::testing::unique_prefix("coalesce-half");
  opts.time = quota::redis::TimeSource::kCaller;
  opts.cluster = cluster;
  opts.coalesce = 16;
  opts.coalesce_calls = 1;
  RedisStore<TokenBucket> store(opts);
  const std::vector<std::string> keys = {"{co-half}a", "{co-half}b", "{co-half}c"};
  for (const auto& k : keys) {  // one at a time: each alone, all on the slot's owner
    auto d = store.apply(kOnce, k, Nanos{0}, 1);
    REQUIRE(d.ok());
    CHECK(d->remaining == 2);
  }
  const int slot = key_slot(keys[0]);
  const auto migration = split_slot(store, keys[0]);  // a on the target, b and c not
  // c's call is held by a pause of the source node until a's and b's wait; then they go
  // together, in one script call with a split slot.
  Connection admin(node_config(migration->from_port()));
  // (WRITE: scripts wait, CLIENT UNPAUSE does not.)
  REQUIRE(admin.command({"CLIENT", "PAUSE", "1500", "WRITE"}).ok());
  const auto tryagains = cluster->tryagains();
  std::vector<absl::StatusOr<quota::Decision>> got(keys.size(), absl::UnknownError("not run"));
  std::vector<std::thread> threads;
  // c's call is the one in flight (a round trip beyond the three above) before the
  // others start.
  const auto before = store.coalesce_stats().round_trips;
  threads.emplace_back([&] { got[2] = store.apply(kOnce, keys[2], Nanos{0}, 1); });
  while (store.coalesce_stats().round_trips == before) std::this_thread::yield();
  for (std::size_t i : {std::size_t{0}, std::size_t{1}}) {
    threads.emplace_back([&, i] { got[i] = store.apply(kOnce, keys[i], Nanos{0}, 1); });
  }
  const auto until = std::chrono::steady_clock::now() + 1s;
  while (store.coalesce_stats().waiting < 2 && std::chrono::steady_clock::now() < until) {
    std::this_thread::yield();
  }
  const bool both_waited = store.coalesce_stats().waiting == 2;
  REQUIRE(admin.command({"CLIENT", "UNPAUSE"}).ok());
  for (auto& th : threads) th.join();
  REQUIRE(both_waited);  // (else the pause ended before they both waited)
  const auto stats = store.coalesce_stats();
  INFO("round trips " << stats.round_trips << ", decisions " << stats.decisions << "; slot " << slot
                      << slot_report(slot));
  CHECK(stats.round_trips == 3 + 2);  // three alone, then c alone, then a and b together
  CHECK(cluster->tryagains() - tryagains == 1);
  for (std::size_t i = 0; i < keys.size(); ++i) {
    INFO(keys[i] << ": " << got[i].status());
    REQUIRE(got[i].ok());
    CHECK(got[i]->allowed);
    CHECK(got[i]->remaining == 1);  // charged once more each
  }
  REQUIRE(migration->finish());
  for (const auto& k : keys) {
    auto look = store.apply(kOnce, k, Nanos{0}, 0);  // cost 0: a look
    REQUIRE(look.ok());
    CHECK(look->remaining == 1);
  }
  REQUIRE(migration->restore());
}
