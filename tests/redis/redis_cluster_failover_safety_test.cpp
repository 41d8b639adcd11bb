// Failover safety on a Redis Cluster (transport/node_watch.hpp ReplicationHistory): a
// Cluster of the test's own, 3 masters with one replica each (cluster-node-timeout 1 s).
// The client writes to a master, the master is SIGKILLed, its replica is promoted: the
// client meets the promoted replica for the first time, and knows it as a failover because
// the node's master_replid2 is the id of the primary it wrote to. With failover_safety, a
// bucket whose state predates that first connect is read as spent there; without it, as
// the replica holds it. A slow bucket (1 unit per minute, burst 10) so that the few
// seconds of the failover refill nothing.
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>

#include <catch2/catch.hpp>

#include "quota/policy/token_bucket.hpp"
#include "quota/redis/redis_store.hpp"
#include "support/printers.hpp"
#include "support/redis_cluster.hpp"
#include "support/replicated_cluster.hpp"

using namespace std::chrono_literals;
using quota::Nanos;
using quota::TokenBucket;
using quota::redis::key_slot;

namespace {

const TokenBucket kSlow{.rate = {.units = 1, .per = 60s}, .burst = 10};

quota::RedisStoreOptions options_for(std::shared_ptr<quota::redis::ClusterPool> cluster,
                                     bool failover_safety, int replicas = 0) {
  quota::RedisStoreOptions options{.pool = nullptr, .prefix = "fs:"};
  options.cluster = std::move(cluster);
  options.replicas = replicas;
  options.replica_timeout = 200ms;  // a shared machine; below the calls' 500 ms deadline
  options.failover_safety = failover_safety;
  return options;
}

}  // namespace

TEST_CASE("a promoted replica met for the first time is a failover: older buckets are spent") {
  quota::testing::ReplicatedCluster cluster("quota-fosafe", 1000ms);
  REQUIRE(cluster.ready());
  const auto ports = cluster.ports();
  const int victim = cluster.owner(key_slot("{t0}"));
  REQUIRE(victim != 0);
  const int heir = cluster.replica_of(victim);
  REQUIRE(heir != 0);
  const int seed = ports[0] == victim ? ports[1] : ports[0];
  auto pool = std::make_shared<quota::redis::ClusterPool>(
      quota::redis::ConnectionConfig{.host = "127.0.0.1", .port = seed, .deadline = 500ms}, 2);
  // The writes before the failover wait for the replica (WAIT 1), so it holds them; after
  // it the promoted replica has no replica of its own.
  quota::RedisStore<TokenBucket> writer(options_for(pool, false, 1));
  quota::RedisStore<TokenBucket> plain(options_for(pool, false));
  quota::RedisStore<TokenBucket> safe(options_for(pool, true));

  // 3 units of each bucket spent on the victim master and on its replica.
  for (int i = 0; i < 3; ++i) {
    auto a = writer.apply(kSlow, "{t0}plain", Nanos{0}, 1);
    auto b = writer.apply(kSlow, "{t0}safe", Nanos{0}, 1);
    REQUIRE(a.ok());
    REQUIRE(b.ok());
    REQUIRE(a->allowed);
    REQUIRE(b->allowed);
  }
  CHECK(pool->node("127.0.0.1", victim)->node_watch().stats().failovers == 0);

  REQUIRE(cluster.kill(victim));
  // Until the slot is served again (the replica promoted, the client's map reloaded);
  // at most 30 s. The probe's own bucket is another key.
  absl::StatusOr<quota::Decision> probe = absl::UnknownError("not tried");
  const auto until = std::chrono::steady_clock::now() + 30s;
  while (!probe.ok() && std::chrono::steady_clock::now() < until) {
    probe = plain.apply(kSlow, "{t0}probe", Nanos{0}, 1);
    if (!probe.ok()) std::this_thread::sleep_for(50ms);
  }
  INFO(probe.status().ToString());
  REQUIRE(probe.ok());
  REQUIRE(cluster.owner(key_slot("{t0}"), heir) == heir);

  const auto stats = pool->node("127.0.0.1", heir)->node_watch().stats();
  CHECK(stats.failovers == 1);
  CHECK(stats.failover_at.has_value());

  // Without the mode: the bucket as the replica holds it, 10 - 3 left.
  auto a = plain.apply(kSlow, "{t0}plain", Nanos{0}, 1);
  REQUIRE(a.ok());
  CHECK(a->allowed);
  CHECK(a->remaining == 10 - 3 - 1);
  // With it: spent at the failover, so denied until one unit refills (a minute).
  auto b = safe.apply(kSlow, "{t0}safe", Nanos{0}, 1);
  REQUIRE(b.ok());
  CHECK_FALSE(b->allowed);
  CHECK(b->remaining == 0);
  CHECK(b->retry_after > 50s);
  CHECK(b->retry_after <= 60s);
}
