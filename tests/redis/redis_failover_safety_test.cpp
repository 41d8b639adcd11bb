// Failover safety (RedisStoreOptions / GatewayStoreOptions::failover_safety,
// transport/node_watch.hpp) with real servers: a primary and its replica of the test's own;
// the replica is cut off (REPLICAOF NO ONE: promoted, so it misses every later write), the
// bucket is drained on the primary, the primary is killed and the client follows its
// address to the promoted replica (an AddressResolver, as SentinelPool's). Without the
// option the promoted replica hands out the drained units again and the verifier
// (quota::verify, server time, exact) finds the excess over r·T + B; with it the handshake
// sees another server (run id, replication id), every older state is read as spent at the
// failover and the envelope holds.
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <catch2/catch.hpp>

#include "quota/policy/token_bucket.hpp"
#include "quota/redis/gateway_store.hpp"
#include "quota/redis/redis_store.hpp"
#include "quota/verify/envelope.hpp"
#include "support/printers.hpp"
#include "support/redis_server.hpp"

using namespace std::chrono_literals;
using quota::Nanos;
using quota::TokenBucket;
using quota::testing::RedisServer;
using quota::verify::AdmittedEvent;

namespace {

// 1 unit per second, burst 10: the test's few seconds refill a few units at most.
const TokenBucket kPolicy{.rate = {.units = 1, .per = 1s}, .burst = 10};

// The address the client connects to, switched by the test (what Sentinel answers); an
// answer may take `delay` (a slow sentinel).
class SwitchedAddress final : public quota::redis::AddressResolver {
 public:
  explicit SwitchedAddress(int port) : port_(port) {}
  absl::StatusOr<quota::redis::Endpoint> resolve() override {
    std::this_thread::sleep_for(std::chrono::microseconds(delay_us_.load()));
    return quota::redis::Endpoint{"127.0.0.1", port_.load()};
  }
  void stale(const quota::redis::Endpoint&) override {}
  void set(int port) { port_ = port; }
  void set_delay(std::chrono::microseconds d) { delay_us_ = d.count(); }

 private:
  std::atomic<int> port_;
  std::atomic<std::int64_t> delay_us_{0};
};

quota::redis::Reply command(int port, const std::vector<std::string>& argv) {
  quota::redis::Connection c({.host = "127.0.0.1", .port = port, .deadline = 2s});
  auto r = c.command(std::vector<std::string_view>(argv.begin(), argv.end()));
  REQUIRE(r.ok());
  return *std::move(r);
}

// Waits (bounded) until the replica on `replica` has every write made on `primary` so far.
void await_sync(int primary, int replica) {
  for (int i = 0; i < 400; ++i) {
    const auto info = command(replica, {"INFO", "replication"});
    const std::string text(info->str, info->len);
    if (text.find("master_link_status:up") != std::string::npos) break;
    std::this_thread::sleep_for(25ms);
  }
  quota::redis::Connection c({.host = "127.0.0.1", .port = primary, .deadline = 2s});
  for (int i = 0; i < 40; ++i) {
    REQUIRE(c.command({"SET", "sync-probe", std::to_string(i)}).ok());
    auto acks = c.command({"WAIT", "1", "250"});
    REQUIRE(acks.ok());
    if ((*acks)->type == REDIS_REPLY_INTEGER && (*acks)->integer >= 1) return;
  }
  FAIL("the replica never acknowledged");
}

// One decision of one unit: admitted or not and the server time, or the error.
using Decide = std::function<absl::StatusOr<std::pair<bool, std::int64_t>>()>;

// Decides until `n` denials in a row (bounded), logging what is admitted; errors
// (kUnavailable while the client finds the new primary) are retried.
void drain(const Decide& decide, std::vector<AdmittedEvent>& log, int n) {
  int denied = 0;
  for (int i = 0; i < 400 && denied < n; ++i) {
    auto r = decide();
    if (!r.ok()) {
      REQUIRE(absl::IsUnavailable(r.status()));
      std::this_thread::sleep_for(10ms);
      continue;
    }
    if (r->first) {
      log.push_back({r->second, 1});
      denied = 0;
    } else {
      ++denied;
    }
  }
  REQUIRE(denied >= n);
}

// The scenario, with the store `make(pool)` makes; the verifier's report.
quota::verify::TokenBucketReport promote_stale_replica(
    const std::function<Decide(std::shared_ptr<quota::redis::ConnectionPool>)>& make,
    std::uint64_t& failovers) {
  RedisServer primary("failover-primary", {});
  REQUIRE(primary.started());
  RedisServer replica("failover-replica",
                           {"replicaof 127.0.0.1 " + std::to_string(primary.port())});
  REQUIRE(replica.started());
  await_sync(primary.port(), replica.port());
  auto address = std::make_shared<SwitchedAddress>(primary.port());
  quota::redis::ConnectionConfig config{.host = "127.0.0.1", .port = 0, .deadline = 1s};
  config.resolver = address;
  auto pool = std::make_shared<quota::redis::ConnectionPool>(config, 1);
  const Decide decide = make(pool);
  std::vector<AdmittedEvent> log;
  // 3 units spent and replicated; then the replica is cut off and misses the rest.
  for (int i = 0; i < 3; ++i) {
    auto r = decide();
    REQUIRE(r.ok());
    REQUIRE(r->first);
    log.push_back({r->second, 1});
  }
  await_sync(primary.port(), replica.port());
  REQUIRE(command(replica.port(), {"REPLICAOF", "NO", "ONE"})->type == REDIS_REPLY_STATUS);
  drain(decide, log, 3);
  // The promoted replica has both stores' scripts already (an operator's SCRIPT LOAD, or
  // a server that ran them before): the client's first call there is an EVALSHA that runs,
  // not a NOSCRIPT answered in a second round, so that call itself must carry the failover
  // its own connect found.
  for (const std::string& text :
       {quota::redis::LuaTwin<TokenBucket>::script(), quota::redis::kGatewayLua}) {
    REQUIRE(command(replica.port(), {"SCRIPT", "LOAD", text})->type == REDIS_REPLY_STRING);
  }
  // The primary dies; the client's next connect goes to the promoted replica.
  REQUIRE(primary.kill(SIGKILL));
  address->set(replica.port());
  drain(decide, log, 3);
  failovers = pool->node_watch().stats().failovers;
  std::printf("%zu units admitted\n", log.size());
  auto report = quota::verify::verify_token_bucket(log, kPolicy.rate, kPolicy.burst);
  REQUIRE(report.ok());
  std::printf("%s\n", quota::verify::to_string(*report).c_str());
  return *report;
}

Decide redis_store(std::shared_ptr<quota::redis::ConnectionPool> pool, bool safety) {
  auto store = std::make_shared<quota::RedisStore<TokenBucket>>(quota::RedisStoreOptions{
      .pool = std::move(pool), .prefix = "fo:", .failover_safety = safety});
  return [store]() -> absl::StatusOr<std::pair<bool, std::int64_t>> {
    auto r = store->apply_attempt(kPolicy, "{acme}read", Nanos{0}, 1);
    if (!r.ok()) return r.status();
    return std::make_pair(r->decision.allowed, r->time.count());
  };
}

Decide gateway_store(std::shared_ptr<quota::redis::ConnectionPool> pool, bool safety) {
  auto store = std::make_shared<quota::redis::GatewayStore>(quota::redis::GatewayStoreOptions{
      .pool = std::move(pool), .prefix = "fo:gw:", .failover_safety = safety});
  auto policy = std::make_shared<quota::gateway::RulePolicy>(kPolicy);
  return [store, policy]() -> absl::StatusOr<std::pair<bool, std::int64_t>> {
    const quota::gateway::LevelCheck level{.policy = policy.get(), .key = "{acme}read"};
    auto r = store->decide(std::span(&level, 1), 1, Nanos{0});
    if (!r.ok()) return r.status();
    return std::make_pair(r->parts.front().allowed, r->time.count());
  };
}

}  // namespace

TEST_CASE("failover safety: a promoted replica that missed deductions overshoots only without it") {
  for (const bool gateway : {false, true}) {
    for (const bool safety : {false, true}) {
      INFO((gateway ? "GatewayStore" : "RedisStore<TokenBucket>")
           << (safety ? " with" : " without") << " failover_safety");
      std::printf("%s, failover_safety %s:\n", gateway ? "GatewayStore" : "RedisStore",
                  safety ? "on" : "off");
      std::uint64_t failovers = 0;
      const auto report = promote_stale_replica(
          [&](auto pool) {
            return gateway ? gateway_store(pool, safety) : redis_store(pool, safety);
          },
          failovers);
      // The handshake saw another server either way; only the option acts on it.
      CHECK(failovers == 1);
      if (safety) {
        CHECK(report.holds());
      } else {
        // the 7 units drained on the primary come back on the promoted replica
        CHECK_FALSE(report.holds());
        CHECK(report.excess_micro() >= quota::to_micro(5));
      }
    }
  }
}

// A connect whose call runs out of time between the TCP connect and the handshake's
// write (here a slow address lookup) must not leave the connection open without the
// handshake: the next call would use a server whose role and identity were never read,
// and failover safety would decide on a promoted replica as if no failover had happened.
TEST_CASE(
    "a connect that runs out of time before its handshake is dropped; the next one sees the "
    "failover") {
  RedisServer first("handshake-first", {});
  RedisServer second("handshake-second", {});
  REQUIRE(first.started());
  REQUIRE(second.started());
  auto address = std::make_shared<SwitchedAddress>(first.port());
  auto watch = std::make_shared<quota::redis::NodeWatch>();
  quota::redis::ConnectionConfig config{.host = "127.0.0.1", .port = 0, .deadline = 1s};
  config.resolver = address;
  config.node_watch = watch;
  quota::redis::Connection c(config);
  REQUIRE(c.command({"PING"}).ok());  // the first server's identity, the baseline
  c.disconnect();
  address->set(second.port());
  address->set_delay(20ms);  // the lookup outlasts the call: connected after its deadline
  const auto late = c.command({"PING"}, quota::redis::Deadline::after(5ms));
  INFO(late.status());
  CHECK_FALSE(late.ok());
  CHECK_FALSE(c.connected());
  address->set_delay(0us);
  REQUIRE(c.command({"PING"}).ok());
  CHECK(watch->stats().failovers == 1);
}
