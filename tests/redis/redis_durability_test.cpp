// Durability across a failover (RedisStoreOptions::replicas) against two real
// redis-servers of this test's own, a master and its replica: a decision is given only
// once the replica acknowledged its write (WAIT in the same pipelined write). The
// replica is paused (SIGSTOP) and cut off (REPLICAOF NO ONE: a partition, after which it
// is promoted); every decision it acknowledged is still there after the promotion, a
// decision given without WAIT meanwhile is not, and nothing it could not acknowledge was
// given as a decision.
#include <signal.h>

#include <chrono>
#include <cstdint>
#include <fstream>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "quota/policy/token_bucket.hpp"
#include "quota/redis/gateway_store.hpp"
#include "quota/redis/redis_store.hpp"
#include "support/gateway_rules.hpp"
#include "support/printers.hpp"
#include "support/redis_server.hpp"

using namespace std::chrono_literals;
using quota::Nanos;
using quota::RedisStore;
using quota::TokenBucket;
using Clock = std::chrono::steady_clock;
using quota::testing::with_cost;

namespace {

// The replica's directory (its port and pid files): a second fixture server.
std::string replica_dir() {
  const char* dir = std::getenv("QUOTA_REDIS_REPLICA_DIR");
  if (dir == nullptr || *dir == '\0') {
    throw std::runtime_error("QUOTA_REDIS_REPLICA_DIR is not set: run this test through ctest");
  }
  return dir;
}

long read_number(const std::string& path) {
  std::ifstream in(path);
  long v = 0;
  if (!(in >> v) || v <= 0) throw std::runtime_error("nothing in " + path);
  return v;
}

int replica_port() { return static_cast<int>(read_number(replica_dir() + "/port")); }

std::shared_ptr<quota::redis::ConnectionPool> pool_at(int port) {
  auto config = quota::testing::redis_config(2s);
  config.port = port;
  return std::make_shared<quota::redis::ConnectionPool>(config, 2);
}

quota::redis::Reply command(int port, const std::vector<std::string>& argv) {
  auto pool = pool_at(port);
  auto lease = pool->acquire();
  REQUIRE(lease.ok());
  auto r = (*lease)->command(std::vector<std::string_view>(argv.begin(), argv.end()));
  REQUIRE(r.ok());
  return *std::move(r);
}

// Makes the replica follow the master and waits (bounded) until it is in sync.
void follow(int replica, int master) {
  // The master starts the full sync at once (not after the default 5 s wait for more
  // replicas).
  REQUIRE(command(master, {"CONFIG", "SET", "repl-diskless-sync-delay", "0"})->type ==
          REDIS_REPLY_STATUS);
  const auto r = command(replica, {"REPLICAOF", "127.0.0.1", std::to_string(master)});
  REQUIRE(r->type == REDIS_REPLY_STATUS);
  // In sync once it acknowledges a write made after its synchronization: a replica that
  // has just synchronized is streamed the master's writes only after its first
  // acknowledgement, which it sends within a second. (WAIT counts the acknowledgements of
  // its own connection's writes; a write made before the replica attached is not
  // streamed to it, and WAIT then counts any replica.)
  for (int i = 0; i < 400; ++i) {
    const auto info = command(replica, {"INFO", "replication"});
    const std::string text(info->str, info->len);
    if (text.find("master_link_status:up") != std::string::npos &&
        text.find("master_sync_in_progress:0") != std::string::npos) {
      break;
    }
    std::this_thread::sleep_for(25ms);
  }
  auto pool = pool_at(master);
  auto lease = pool->acquire();
  REQUIRE(lease.ok());
  for (int i = 0; i < 40; ++i) {
    const std::string n = std::to_string(i);
    REQUIRE((*lease)->command({"SET", "durability-probe", n}).ok());
    auto acks = (*lease)->command({"WAIT", "1", "250"});
    REQUIRE(acks.ok());
    REQUIRE((*acks)->type == REDIS_REPLY_INTEGER);
    if ((*acks)->integer >= 1) return;
  }
  FAIL("the replica did not acknowledge a write within 10 s");
}

// How long the master waits for the replica's acknowledgement: long enough for a replica
// on a loaded 2-core machine under a sanitizer (the connections' deadline is 2 s).
constexpr auto kReplicaTimeout = 500ms;

// Slow enough that nothing refills during the test.
const TokenBucket kPolicy{.rate = {.units = 1, .per = 24h}, .burst = 100};

}  // namespace

TEST_CASE(
    "replicas = 1: what the replica acknowledged survives its promotion; what it could "
    "not acknowledge is unavailable, never a decision") {
  const int master = quota::testing::redis_port();
  const int replica = replica_port();
  follow(replica, master);
  const std::string prefix = quota::testing::unique_prefix("durable");
  RedisStore<TokenBucket> durable({.pool = pool_at(master),
                                   .prefix = prefix,
                                   .replicas = 1,
                                   .replica_timeout = kReplicaTimeout});
  RedisStore<TokenBucket> plain({.pool = pool_at(master), .prefix = prefix});
  const std::string key = "{acme}read";

  // In sync: each decision is given, and the replica has it.
  std::int64_t remaining = kPolicy.burst;
  for (int i = 0; i < 3; ++i) {
    auto d = durable.apply(kPolicy, key, Nanos{0}, 1);
    INFO(d.status());
    REQUIRE(d.ok());
    REQUIRE(d->allowed);
    CHECK(d->remaining == --remaining);
  }

  // The replica paused: it cannot acknowledge, so no decision is given — within the
  // replica timeout plus slack — though the master has spent the unit.
  {
    REQUIRE(quota::testing::signal_redis(SIGSTOP, replica_dir()));
    quota::testing::ResumeOnExit resume{replica_dir()};
    const auto t0 = Clock::now();
    auto d = durable.apply(kPolicy, key, Nanos{0}, 1);
    const auto took = Clock::now() - t0;
    REQUIRE_FALSE(d.ok());
    INFO(d.status());
    CHECK(absl::IsUnavailable(d.status()));
    CHECK(d.status().message().find("acknowledged by 0 of the 1 replicas") != std::string::npos);
    CHECK(took >= kReplicaTimeout);
    CHECK(took < kReplicaTimeout + 1500ms);
    --remaining;
  }
  // Resumed: decisions are given again once it has caught up (each refused try also
  // spent a unit on the master; the decision's `remaining` says where it stands).
  std::int64_t acknowledged = -1;
  for (int i = 0; i < 40 && acknowledged < 0; ++i) {
    auto d = durable.apply(kPolicy, key, Nanos{0}, 1);
    if (d.ok()) {
      REQUIRE(d->allowed);
      CHECK(d->remaining < remaining);
      acknowledged = d->remaining;
    } else {
      REQUIRE(absl::IsUnavailable(d.status()));
      std::this_thread::sleep_for(25ms);
    }
  }
  REQUIRE(acknowledged >= 0);

  // A partition: the replica stops following (and will be promoted).
  REQUIRE(command(replica, {"REPLICAOF", "NO", "ONE"})->type == REDIS_REPLY_STATUS);
  auto refused = durable.apply(kPolicy, key, Nanos{0}, 1);
  REQUIRE_FALSE(refused.ok());
  CHECK(absl::IsUnavailable(refused.status()));
  // Without WAIT the master's decision is given (the unit refused above is spent too).
  auto given = plain.apply(kPolicy, key, Nanos{0}, 1);
  REQUIRE(given.ok());
  REQUIRE(given->allowed);
  CHECK(given->remaining == acknowledged - 2);

  // The failover: the promoted replica has every decision it acknowledged and nothing
  // after — the one given without WAIT is forgotten (one unit of extra burst).
  RedisStore<TokenBucket> promoted({.pool = pool_at(replica), .prefix = prefix});
  auto after = promoted.apply(kPolicy, key, Nanos{0}, 1);
  REQUIRE(after.ok());
  REQUIRE(after->allowed);
  CHECK(after->remaining == acknowledged - 1);
}

TEST_CASE("gateway store, replicas = 1: a decision the replica cannot acknowledge is unavailable") {
  const int master = quota::testing::redis_port();
  const int replica = replica_port();
  follow(replica, master);
  quota::redis::GatewayStore store({.pool = pool_at(master),
                                    .prefix = quota::testing::unique_prefix("durable-gw"),
                                    .replicas = 1,
                                    .replica_timeout = kReplicaTimeout});
  const quota::gateway::RulePolicy tb =
      TokenBucket{.rate = {.units = 1, .per = 1h}, .burst = 100};  // within the gateway's bound
  const quota::gateway::LevelCheck level[] = {
      {.policy = &tb, .key = "{acme}read", .shadow = false}};
  auto first = store.decide(with_cost(level, 1), 1, Nanos{0});
  INFO(first.status());
  REQUIRE(first.ok());
  REQUIRE(first->parts.size() == 1);
  CHECK(first->parts[0].allowed);
  {
    REQUIRE(quota::testing::signal_redis(SIGSTOP, replica_dir()));
    quota::testing::ResumeOnExit resume{replica_dir()};
    auto paused = store.decide(with_cost(level, 1), 1, Nanos{0});
    REQUIRE_FALSE(paused.ok());
    INFO(paused.status());
    CHECK(absl::IsUnavailable(paused.status()));
    CHECK(paused.status().message().find("acknowledged by 0 of the 1 replicas") !=
          std::string::npos);
  }
  bool recovered = false;
  for (int i = 0; i < 40 && !recovered; ++i) {
    auto d = store.decide(with_cost(level, 1), 1, Nanos{0});
    recovered = d.ok();
    if (!recovered) std::this_thread::sleep_for(25ms);
  }
  CHECK(recovered);
  // A bad setting is named.
  quota::redis::GatewayStore bad({.pool = pool_at(master),
                                  .prefix = quota::testing::unique_prefix("durable-gw-bad"),
                                  .replicas = -1});
  auto rejected = bad.decide(with_cost(level, 1), 1, Nanos{0});
  REQUIRE_FALSE(rejected.ok());
  CHECK(absl::IsInvalidArgument(rejected.status()));
  CHECK(rejected.status().message().find("GatewayStoreOptions: replicas=-1") != std::string::npos);
}

TEST_CASE("replicas: settings the store cannot keep are rejected, naming the field") {
  const auto pool = pool_at(quota::testing::redis_port());  // deadline 2 s
  const std::string prefix = quota::testing::unique_prefix("durable-config");
  struct Case {
    int replicas;
    std::chrono::milliseconds timeout;
    const char* names;
  };
  for (const Case& c : {Case{-1, 2ms, "replicas=-1"}, Case{1, 0ms, "replica_timeout=0"},
                        Case{1, 2000ms, "replica_timeout=2000"}}) {
    RedisStore<TokenBucket> store(
        {.pool = pool, .prefix = prefix, .replicas = c.replicas, .replica_timeout = c.timeout});
    auto d = store.apply(kPolicy, "{acme}read", Nanos{0}, 1);
    REQUIRE_FALSE(d.ok());
    INFO(d.status());
    CHECK(absl::IsInvalidArgument(d.status()));
    CHECK(d.status().message().find(c.names) != std::string::npos);
  }
}
