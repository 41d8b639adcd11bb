// Cluster failover (redis/transport/cluster.hpp): a Redis Cluster of the test's own, 3
// masters with one replica each (6 redis-server processes, cluster-node-timeout 1 s), a
// master SIGKILLed under load from 4 threads. The client reloads its slot map after the
// node fails (rate-limited, asking the nodes that answer), so the decisions for the dead
// master's slots come back once its replica is promoted — measured, bounded at 30 s.
//   - Envelope: each key's admissions within r·T + B, plus what lost writes can add. The
//     promoted replica holds a state its bucket had at some earlier instant t0; from t0
//     the bucket is replayed, so the writes it lost give back at most what was spent
//     after t0 and no more than one burst: A(T) <= r·T + 2B per key, checked with the
//     verifier (the excess over r·T + B alone is printed).
//   - Nothing charged twice: the library never sends a failed call again (it may have
//     run), so on counter keys (no refill) what Redis charged is at most the calls that
//     were acknowledged plus those that failed, and, on the masters that did not fail, at
//     least those acknowledged.
// The caller's clock (TimeSource::kCaller), so that the verifier and Redis share one
// timeline; each key belongs to one thread, so its times never go back.
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "quota/redis/redis_store.hpp"
#include "quota/verify/envelope.hpp"
#include "support/redis_cluster.hpp"
#include "support/replicated_cluster.hpp"

using namespace std::chrono_literals;
using quota::Nanos;
using quota::TokenBucket;
using quota::redis::key_slot;
using Clock = std::chrono::steady_clock;

namespace {

constexpr int kThreads = 4;
constexpr int kTenants = 24;
const TokenBucket kPolicy{.rate = {.units = 50, .per = 1s}, .burst = 20};
constexpr std::int64_t kCounterBurst = 1'000'000;
const TokenBucket kCounter{.rate = {.units = 0, .per = 1s}, .burst = kCounterBurst};

// What one tenant saw; touched only by the thread that owns the tenant.
struct TenantLog {
  std::vector<quota::verify::AdmittedEvent> admitted;  // of "{tN}read"
  std::int64_t acked = 0, failed = 0;                  // calls on "{tN}count"
  std::int64_t errors = 0;
  std::atomic<std::int64_t> first_ok_after_kill_ns{-1};  // read by the test thread too
};

std::string tenant(int i) { return "t" + std::to_string(i); }

}  // namespace

TEST_CASE("a killed master's slots come back once its replica is promoted") {
  quota::testing::ReplicatedCluster cluster("quota-failover", 1000ms);
  REQUIRE(cluster.ready());
  const auto ports = cluster.ports();
  const int victim = cluster.owner(key_slot("{" + tenant(0) + "}"));
  REQUIRE(victim != 0);
  const int heir = cluster.replica_of(victim);
  REQUIRE(heir != 0);
  std::vector<bool> on_victim(kTenants);
  int victims = 0;
  for (int i = 0; i < kTenants; ++i) {
    on_victim[i] = cluster.owner(key_slot("{" + tenant(i) + "}")) == victim;
    victims += on_victim[i] ? 1 : 0;
  }
  INFO("victim master " << victim << ", its replica " << heir << ", tenants on it " << victims);
  // Seeded at another master; a generous deadline (the machine is shared: the test is
  // about the map, not the deadline).
  int seed = ports[0] == victim ? ports[1] : ports[0];
  auto pool = std::make_shared<quota::redis::ClusterPool>(
      quota::redis::ConnectionConfig{.host = "127.0.0.1", .port = seed, .deadline = 200ms}, 2);
  quota::RedisStoreOptions options{
      .pool = nullptr, .prefix = "fo:", .time = quota::redis::TimeSource::kCaller};
  options.cluster = pool;
  quota::RedisStore<TokenBucket> store(options);

  const auto t0 = Clock::now();
  auto now_ns = [&] {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0).count();
  };
  std::vector<TenantLog> logs(kTenants);
  std::atomic<bool> stop{false};
  std::atomic<std::int64_t> killed_at{-1};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      const auto until = Clock::now() + 60s;  // bounded even if the test thread stalls
      while (!stop.load() && Clock::now() < until) {
        for (int i = t; i < kTenants; i += kThreads) {
          TenantLog& log = logs[i];
          const std::string tag = "{" + tenant(i) + "}";
          const std::int64_t now = now_ns();
          auto d = store.apply(kPolicy, tag + "read", Nanos{now}, 1);
          if (d.ok() && d->allowed) log.admitted.push_back({now, 1});
          if (!d.ok()) ++log.errors;
          const std::int64_t k = killed_at.load();
          if (d.ok() && k >= 0 && now > k && log.first_ok_after_kill_ns < 0) {
            log.first_ok_after_kill_ns = now - k;
          }
          auto c = store.apply(kCounter, tag + "count", Nanos{now_ns()}, 1);
          if (c.ok() && c->allowed) ++log.acked;
          if (!c.ok()) ++log.failed;
        }
        std::this_thread::sleep_for(1ms);
      }
    });
  }
  std::this_thread::sleep_for(1s);
  killed_at = now_ns();
  REQUIRE(cluster.kill(victim));
  // Until every tenant of the dead master decides again; at most 30 s.
  const auto deadline = Clock::now() + 30s;
  auto all_back = [&] {
    for (int i = 0; i < kTenants; ++i) {
      if (on_victim[i] && logs[i].first_ok_after_kill_ns < 0) return false;
    }
    return true;
  };
  // Meanwhile: when the replica says it serves the slot (promoted), polled every 20 ms.
  std::int64_t promoted_ns = -1;
  while (Clock::now() < deadline) {
    if (promoted_ns < 0 && cluster.owner(key_slot("{" + tenant(0) + "}"), heir) == heir) {
      promoted_ns = now_ns() - killed_at.load();
    }
    if (promoted_ns >= 0 && all_back()) break;
    std::this_thread::sleep_for(20ms);
  }
  std::this_thread::sleep_for(1s);  // load on the promoted replica
  stop = true;
  for (auto& th : threads) th.join();
  REQUIRE(all_back());
  REQUIRE(promoted_ns >= 0);

  std::int64_t window_min = INT64_MAX, window_max = 0, errors = 0;
  for (int i = 0; i < kTenants; ++i) {
    errors += logs[i].errors + logs[i].failed;
    if (!on_victim[i]) continue;
    window_min = std::min<std::int64_t>(window_min, logs[i].first_ok_after_kill_ns);
    window_max = std::max<std::int64_t>(window_max, logs[i].first_ok_after_kill_ns);
  }
  std::printf(
      "failover: decisions for the killed master's slots back %lld-%lld ms after SIGKILL "
      "(replica seen promoted at %lld ms; node timeout 1000 ms); %lld calls failed meanwhile; "
      "%llu slot map loads, %llu CLUSTERDOWN replies\n",
      static_cast<long long>(window_min / 1'000'000),
      static_cast<long long>(window_max / 1'000'000),
      static_cast<long long>(promoted_ns / 1'000'000), static_cast<long long>(errors),
      static_cast<unsigned long long>(pool->refreshes()),
      static_cast<unsigned long long>(pool->clusterdowns()));

  // Envelope: r·T + 2B holds for every key; the excess over r·T + B alone is printed.
  std::int64_t worst_excess_micro = 0;
  for (int i = 0; i < kTenants; ++i) {
    INFO("tenant " << tenant(i));
    auto bounded = quota::verify::verify_token_bucket(logs[i].admitted, kPolicy.rate, kPolicy.burst,
                                                      kPolicy.burst);
    REQUIRE(bounded.ok());
    INFO(quota::verify::to_string(*bounded));
    CHECK(bounded->holds());
    auto plain = quota::verify::verify_token_bucket(logs[i].admitted, kPolicy.rate, kPolicy.burst);
    REQUIRE(plain.ok());
    worst_excess_micro = std::max<std::int64_t>(worst_excess_micro, plain->excess_micro());
    if (!on_victim[i]) CHECK(plain->holds());  // its master never failed
  }
  std::printf(
      "failover: largest excess over r*T + B of one key: %lld micro-units (bound: B = %lld "
      "units)\n",
      static_cast<long long>(worst_excess_micro), static_cast<long long>(kPolicy.burst));

  // Nothing charged twice: what each counter key was charged, from one more decision.
  std::int64_t lost = 0;
  for (int i = 0; i < kTenants; ++i) {
    INFO("tenant " << tenant(i) << (on_victim[i] ? " (on the killed master)" : ""));
    absl::StatusOr<quota::Decision> last = absl::UnknownError("not tried");
    for (int k = 0; k < 20 && !last.ok(); ++k) {
      last = store.apply(kCounter, "{" + tenant(i) + "}count", Nanos{now_ns()}, 1);
    }
    REQUIRE(last.ok());
    REQUIRE(last->allowed);
    const std::int64_t charged = kCounterBurst - last->remaining - 1;
    CHECK(charged <= logs[i].acked + logs[i].failed);
    if (on_victim[i]) {
      lost += std::max<std::int64_t>(0, logs[i].acked - charged);
    } else {
      CHECK(charged >= logs[i].acked);
    }
  }
  std::printf("failover: acknowledged charges lost with the killed master: %lld\n",
              static_cast<long long>(lost));
}
