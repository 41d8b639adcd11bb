// Redis Sentinel (transport/sentinel.hpp) against real processes the test starts on
// loopback: a primary, its replica(s) and three redis-sentinel processes with a short
// down-after-milliseconds. The primary is killed with SIGKILL under load from 4 threads
// on 4 keys; decisions must resume on the promoted replica. Printed: the unavailability
// window (the kill to the first decision after it) and, per key, the admissions against
// the token-bucket envelope r·T + B (quota::verify), without `replicas` (a failover may
// lose what the replica had not received: at most one extra burst per key is allowed)
// and with `replicas` = 1 (WAIT: nothing acknowledged is lost, the envelope holds with
// nothing extra). The second case runs with AUTH on the data nodes and on the sentinels.
// docs/redis.md ("Production: AUTH, eviction policy, Sentinel") has the figures.
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "quota/gateway/gateway.hpp"
#include "quota/redis/gateway_store.hpp"
#include "quota/redis/redis_store.hpp"
#include "quota/redis/transport/sentinel.hpp"
#include "quota/verify/envelope.hpp"
#include "support/gateway_rules.hpp"
#include "support/redis_server.hpp"
#include "support/sentinel_deployment.hpp"

using namespace std::chrono_literals;
using quota::Nanos;
using quota::RedisStore;
using quota::RedisStoreOptions;
using quota::TokenBucket;
using quota::redis::ConnectionConfig;
using quota::redis::EvictionPolicyCheck;
using quota::testing::RedisServer;
using quota::testing::eventually;
using quota::testing::redis_ask;
using quota::testing::SentinelCredentials;
using quota::testing::SentinelDeployment;
using quota::verify::AdmittedEvent;

namespace {

constexpr const char* kName = quota::testing::kSentinelMaster;
constexpr int kThreads = 4;
constexpr int kKeys = 4;
const TokenBucket kPolicy{.rate = {.units = 100, .per = 1s}, .burst = 10};

std::int64_t since_epoch_ns(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
}

struct Outcome {
  double window_ms = -1;  // the kill to the first decision after it; -1: none
  std::int64_t decisions = 0, errors = 0, other_errors = 0, errors_before = 0;
  std::vector<std::vector<AdmittedEvent>> admitted;  // per key, server time
};

// Load on the store from kThreads threads; the primary SIGKILLed after 1.5 s; runs until
// 2 s after decisions resumed (at most 40 s after the kill).
Outcome kill_under_load(SentinelDeployment& d, RedisStore<TokenBucket>& store) {
  Outcome out;
  out.admitted.resize(kKeys);
  std::mutex mu;
  std::atomic<bool> stop{false};
  std::atomic<std::int64_t> killed_at{0}, resumed_at{0}, decisions{0}, errors{0}, other{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = t; !stop.load(); ++i) {
        const std::string key = "{k" + std::to_string(i % kKeys) + "}read";
        // The call's start: a call that began before the kill does not end the window.
        const std::int64_t start = since_epoch_ns(std::chrono::steady_clock::now());
        auto r = store.apply_attempt(kPolicy, key, Nanos{0}, 1);
        const std::int64_t now = since_epoch_ns(std::chrono::steady_clock::now());
        if (!r.ok()) {
          if (errors.fetch_add(1) == 0) {
            std::printf("first error: %s\n", r.status().ToString().c_str());
          }
          if (!absl::IsUnavailable(r.status())) {
            other.fetch_add(1);
            std::fprintf(stderr, "unexpected error: %s\n", r.status().ToString().c_str());
          }
        } else {
          decisions.fetch_add(1);
          const std::int64_t k = killed_at.load();
          std::int64_t zero = 0;
          if (k != 0 && start > k) resumed_at.compare_exchange_strong(zero, now);
          if (r->decision.allowed) {
            std::lock_guard<std::mutex> lock(mu);
            out.admitted[static_cast<std::size_t>(i % kKeys)].push_back({r->time.count(), 1});
          }
        }
        std::this_thread::sleep_for(1ms);
      }
    });
  }
  std::this_thread::sleep_for(1500ms);
  const std::int64_t before = decisions.load();
  out.errors_before = errors.load();
  REQUIRE(d.primary->kill(SIGKILL));
  killed_at = since_epoch_ns(std::chrono::steady_clock::now());
  const bool resumed = eventually([&] { return resumed_at.load() != 0; }, 40s);
  if (resumed) std::this_thread::sleep_for(2s);
  stop = true;
  for (auto& th : threads) th.join();
  CHECK(before > 0);  // the load decided before the kill
  if (resumed) out.window_ms = static_cast<double>(resumed_at.load() - killed_at.load()) / 1e6;
  out.decisions = decisions.load();
  out.errors = errors.load();
  out.other_errors = other.load();
  for (auto& log : out.admitted) {
    std::sort(log.begin(), log.end(),
              [](const AdmittedEvent& a, const AdmittedEvent& b) { return a.time_ns < b.time_ns; });
  }
  return out;
}

// The largest excess over r·T + B of any key, in units (<= 0: every key within it).
double worst_excess(const Outcome& o) {
  double worst = -1e18;
  for (const auto& log : o.admitted) {
    auto report = quota::verify::verify_token_bucket(log, kPolicy.rate, kPolicy.burst);
    REQUIRE(report.ok());
    INFO(quota::verify::to_string(*report));
    worst = std::max(worst, static_cast<double>(report->excess_micro()) / 1e6);
  }
  return worst;
}

bool holds(const Outcome& o, std::int64_t extra) {
  bool all = true;
  for (const auto& log : o.admitted) {
    auto report = quota::verify::verify_token_bucket(log, kPolicy.rate, kPolicy.burst, extra);
    REQUIRE(report.ok());
    if (!report->holds()) {
      std::printf("  %s\n", quota::verify::to_string(*report).c_str());
      all = false;
    }
  }
  return all;
}

void print(const char* what, const Outcome& o, double excess, std::uint64_t switches) {
  std::printf(
      "sentinel failover, %s: window %.0f ms (SIGKILL to the first decision on the promoted "
      "replica), %lld decisions, %lld errors (%lld before the kill; all kUnavailable: %s), "
      "failovers seen %llu, worst excess over r*T+B per key %+.3f units (B = %lld)\n",
      what, o.window_ms, static_cast<long long>(o.decisions), static_cast<long long>(o.errors),
      static_cast<long long>(o.errors_before), o.other_errors == 0 ? "yes" : "no",
      static_cast<unsigned long long>(switches), excess, static_cast<long long>(kPolicy.burst));
}

}  // namespace

TEST_CASE("sentinel options: set together with a pool or a cluster is InvalidArgument") {
  quota::redis::SentinelConfig c{.name = kName, .sentinels = {{"127.0.0.1", 1}}};
  auto sentinel = std::make_shared<quota::redis::SentinelPool>(c, 1);
  RedisStore<TokenBucket> store(RedisStoreOptions{
      .pool = std::make_shared<quota::redis::ConnectionPool>(ConnectionConfig{}, 1),
      .prefix = "t:",
      .sentinel = sentinel});
  auto r = store.apply(kPolicy, "{k0}read", Nanos{0}, 1);
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(r.status().message().find("sentinel") != absl::string_view::npos);
}

TEST_CASE(
    "sentinel: the primary SIGKILLed under load; decisions resume on the promoted replica; "
    "without WAIT at most one extra burst per key") {
  SentinelDeployment d("sentinel-async", {.replicas = 1});
  auto sentinel = std::make_shared<quota::redis::SentinelPool>(d.sentinel_config(""), kThreads);
  auto first = sentinel->primary();
  REQUIRE(first.ok());
  CHECK(first->port == d.primary->port());
  RedisStore<TokenBucket> store(
      RedisStoreOptions{.pool = nullptr,
                        .prefix = quota::testing::unique_prefix("sentinel-async"),
                        .sentinel = sentinel});
  {
    // The gateway store takes the sentinel the same way.
    quota::redis::GatewayStore gw_store({.pool = nullptr,
                                         .prefix = quota::testing::unique_prefix("sentinel-gw"),
                                         .sentinel = sentinel});
    quota::gateway::RuleRegistry registry(
        quota::testing::build(quota::testing::levels_spec(1, kPolicy)));
    quota::gateway::Gateway gw(gw_store, registry);
    auto r = gw.decide({.who = {.tenant = "acme", .plan = "free"}, .route = "read"}, Nanos{0});
    INFO(r.status().ToString());
    REQUIRE(r.ok());
    CHECK(r->decision.allowed);
  }
  const Outcome o = kill_under_load(d, store);
  const double excess = worst_excess(o);
  print("replicas=0", o, excess, sentinel->switches());
  REQUIRE(o.window_ms >= 0);
  CHECK(o.other_errors == 0);
  auto now = sentinel->primary();
  REQUIRE(now.ok());
  CHECK(now->port == d.replicas[0]->port());
  CHECK(sentinel->switches() >= 1);
  // What the replica had not received is lost with the primary: one burst per key.
  CHECK(holds(o, kPolicy.burst));
}

TEST_CASE(
    "sentinel with AUTH on data nodes and sentinels, and replicas=1 (WAIT): decisions "
    "resume and the envelope holds with nothing extra") {
  const SentinelCredentials creds{.data = "data-pw", .sentinel = "sentinel-pw"};
  SentinelDeployment d("sentinel-wait", {.replicas = 2, .creds = creds});

  SECTION("a wrong sentinel password is kUnauthenticated") {
    auto bad = std::make_shared<quota::redis::SentinelPool>(d.sentinel_config("wrong"), 1);
    RedisStore<TokenBucket> store(
        RedisStoreOptions{.pool = nullptr,
                          .prefix = quota::testing::unique_prefix("sentinel-badauth"),
                          .sentinel = bad});
    auto r = store.apply(kPolicy, "{k0}read", Nanos{0}, 1);
    INFO(r.status().ToString());
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().code() == absl::StatusCode::kUnauthenticated);
  }
  SECTION("the failover") {
    auto sentinel =
        std::make_shared<quota::redis::SentinelPool>(d.sentinel_config(creds.sentinel), kThreads);
    RedisStore<TokenBucket> store(
        RedisStoreOptions{.pool = nullptr,
                          .prefix = quota::testing::unique_prefix("sentinel-wait"),
                          .replicas = 1,
                          .replica_timeout = 100ms,
                          .sentinel = sentinel});
    const Outcome o = kill_under_load(d, store);
    const double excess = worst_excess(o);
    print("replicas=1 (WAIT), AUTH", o, excess, sentinel->switches());
    REQUIRE(o.window_ms >= 0);
    CHECK(o.other_errors == 0);
    CHECK(sentinel->switches() >= 1);
    CHECK(holds(o, 0));
  }
}

TEST_CASE(
    "sentinel: a graceful failover (the old primary stays up, demoted): the store follows the "
    "promoted replica") {
  SentinelDeployment d("sentinel-demote", {.replicas = 1});
  auto sentinel = std::make_shared<quota::redis::SentinelPool>(d.sentinel_config(""), 2);
  RedisStore<TokenBucket> store(
      RedisStoreOptions{.pool = nullptr,
                        .prefix = quota::testing::unique_prefix("sentinel-demote"),
                        .sentinel = sentinel});
  // Open connections to the primary.
  auto r = store.apply(kPolicy, "{k0}read", Nanos{0}, 1);
  INFO(r.status().ToString());
  REQUIRE(r.ok());
  const int promoted = d.replicas[0]->port();
  // The old primary stays up and becomes a replica of the new one (the sentinels close
  // its clients' connections; a connection they miss gets READONLY, tested below).
  REQUIRE(redis_ask(d.sentinels[0]->port(), "", {"SENTINEL", "FAILOVER", kName}) == "OK");
  bool resumed = eventually(
      [&] {
        auto got = store.apply(kPolicy, "{k0}read", Nanos{0}, 1);
        if (got.ok()) {
          auto now = sentinel->primary();
          return now.ok() && now->port == promoted;
        }
        CHECK(absl::IsUnavailable(got.status()));
        return false;
      },
      30s);
  CHECK(resumed);
  CHECK(redis_ask(promoted, "", {"INFO", "replication"}).find("role:master") != std::string::npos);
  CHECK(redis_ask(d.primary->port(), "", {"INFO", "replication"}).find("role:slave") !=
        std::string::npos);
}

namespace {

// An AddressResolver of the test: `first` until told it is stale, then `second`.
class SwitchingResolver final : public quota::redis::AddressResolver {
 public:
  SwitchingResolver(int first, int second) : first_(first), second_(second) {}
  absl::StatusOr<quota::redis::Endpoint> resolve() override {
    return quota::redis::Endpoint{"127.0.0.1", stale_.load() > 0 ? second_ : first_};
  }
  void stale(const quota::redis::Endpoint& at) override {
    if (at.port == first_) stale_.fetch_add(1);
  }
  int stales() const { return stale_.load(); }

 private:
  const int first_, second_;
  std::atomic<int> stale_{0};
};

}  // namespace

TEST_CASE(
    "a resolved address is dropped on READONLY (a primary demoted under an open "
    "connection) and when ROLE says replica") {
  RedisServer a("resolve-a", {}), b("resolve-b", {});
  REQUIRE(a.started());
  REQUIRE(b.started());
  auto resolver = std::make_shared<SwitchingResolver>(a.port(), b.port());
  ConnectionConfig c = quota::testing::sentinel_data_config({});
  c.resolver = resolver;
  auto pool = std::make_shared<quota::redis::ConnectionPool>(c, 1);
  RedisStore<TokenBucket> store(
      RedisStoreOptions{.pool = pool, .prefix = quota::testing::unique_prefix("resolve")});
  SECTION("READONLY on an open connection") {
    REQUIRE(store.apply(kPolicy, "{k0}read", Nanos{0}, 1).ok());  // connected to a
    REQUIRE(redis_ask(a.port(), "", {"REPLICAOF", "127.0.0.1", std::to_string(b.port())}) == "OK");
    // The write that meets READONLY fails (kUnavailable); the next goes to b.
    auto r = store.apply(kPolicy, "{k0}read", Nanos{0}, 1);
    INFO(r.status().ToString());
    REQUIRE_FALSE(r.ok());
    CHECK(absl::IsUnavailable(r.status()));
    CHECK(r.status().message().find("READONLY") != absl::string_view::npos);
    CHECK(resolver->stales() == 1);
    auto next = store.apply(kPolicy, "{k0}read", Nanos{0}, 1);
    INFO(next.status().ToString());
    CHECK(next.ok());
  }
  SECTION("ROLE says replica at connect") {
    REQUIRE(redis_ask(a.port(), "", {"REPLICAOF", "127.0.0.1", std::to_string(b.port())}) == "OK");
    auto r = store.apply(kPolicy, "{k0}read", Nanos{0}, 1);
    INFO(r.status().ToString());
    REQUIRE_FALSE(r.ok());
    CHECK(absl::IsUnavailable(r.status()));
    CHECK(r.status().message().find("not the primary") != absl::string_view::npos);
    CHECK(resolver->stales() == 1);
    CHECK(store.apply(kPolicy, "{k0}read", Nanos{0}, 1).ok());
  }
}
