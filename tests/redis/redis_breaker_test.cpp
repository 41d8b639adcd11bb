// Fail fast (redis/transport/breaker.hpp), against a real redis-server of the test's own
// paused with SIGSTOP (resumed by a scope guard):
//   - after N consecutive failures the node's breaker opens and a decision fails at once,
//     naming the breaker: 1,000 decisions take far less than 1,000 deadlines;
//   - after SIGCONT, decisions come back within one cool-down, through exactly one probe;
//     a probe that fails opens the breaker for another cool-down; the statuses carry
//     their kinds (transport/error_kind.hpp: kDeadline, kBreakerOpen);
//   - the in-flight guard: many threads against a paused server never have more than its
//     maximum in flight, the others fail at once naming the guard, and a gateway applies
//     the route's fail mode to them.
// Timing bounds are generous (the machine is shared); the measured costs are printed.
#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "quota/gateway/gateway.hpp"
#include "quota/redis/gateway_store.hpp"
#include "quota/redis/redis_store.hpp"
#include "quota/redis/transport/error_kind.hpp"
#include "support/gateway_rules.hpp"
#include "support/paused_server.hpp"

using namespace std::chrono_literals;
using quota::Nanos;
using quota::TokenBucket;
using quota::redis::ConnectionConfig;
using quota::redis::ConnectionPool;
using quota::testing::micros_since;
using quota::testing::PausedServer;
using Clock = std::chrono::steady_clock;

namespace {

const TokenBucket kPolicy{.rate = {.units = 1000, .per = 1s}, .burst = 1000};
constexpr const char* kKey = "{acme}read";

std::shared_ptr<ConnectionPool> pool_for(const PausedServer& s, std::size_t size,
                                         std::chrono::microseconds deadline,
                                         quota::redis::BreakerConfig breaker = {.failures = 0}) {
  return std::make_shared<ConnectionPool>(
      ConnectionConfig{
          .host = "127.0.0.1", .port = s.port(), .deadline = deadline, .breaker = breaker},
      size);
}

bool mentions(const absl::Status& s, const char* what) {
  return absl::IsUnavailable(s) && s.message().find(what) != absl::string_view::npos;
}

// The store's first decision with the server answering (loads the script). A store with
// a 2 s deadline on the same pool connects first (the pool hands out the connection
// released last), so that a loaded machine does not make the store under test miss its
// short deadline three times and open its breaker before the test begins; retried too.
void warm(quota::RedisStore<TokenBucket>& store) {
  quota::RedisStoreOptions slow_options{.pool = store.options().pool, .prefix = "warm:"};
  slow_options.limits.deadline = 2s;
  quota::RedisStore<TokenBucket> slow(slow_options);
  REQUIRE(slow.apply(kPolicy, kKey, Nanos{0}, 1).ok());
  absl::StatusOr<quota::Decision> d = absl::UnknownError("not tried");
  for (int i = 0; i < 50 && !d.ok(); ++i) d = store.apply(kPolicy, kKey, Nanos{0}, 1);
  REQUIRE(d.ok());
}

}  // namespace

TEST_CASE("an open breaker fails decisions at once, not after the deadline") {
  PausedServer server("quota-breaker-open");
  REQUIRE(server.started());
  // A long cool-down: no probe goes out while the 1,000 calls run.
  quota::RedisStore<TokenBucket> store(
      {.pool = pool_for(server, 2, 3ms, {.failures = 3, .cool_down = 30s}), .prefix = "br1:"});
  warm(store);
  CHECK(store.fail_fast_stats().breakers.opened == 0);
  auto paused = server.pause();
  for (int i = 0; i < 3; ++i) {
    auto d = store.apply(kPolicy, kKey, Nanos{0}, 1);
    REQUIRE_FALSE(d.ok());
    INFO(d.status().ToString());
    CHECK(mentions(d.status(), "deadline of 3000 us"));
    CHECK(quota::redis::error_kind(d.status()) == quota::redis::ErrorKind::kDeadline);
  }
  CHECK(store.fail_fast_stats().breakers.opened == 1);
  CHECK(store.fail_fast_stats().open_nodes == 1);
  constexpr int kCalls = 1000;
  int named = 0;
  const auto t0 = Clock::now();
  for (int i = 0; i < kCalls; ++i) {
    auto d = store.apply(kPolicy, kKey, Nanos{0}, 1);
    if (!d.ok() && mentions(d.status(), "circuit breaker open")) ++named;
  }
  const auto us = micros_since(t0);
  std::printf("breaker open: %d decisions in %lld us (%.2f us each; deadline 3000 us)\n", kCalls,
              static_cast<long long>(us), static_cast<double>(us) / kCalls);
  CHECK(named == kCalls);
  // 1,000 deadlines would be 3 s; failing fast is microseconds each (about 1.5 us in a
  // release build, 145 us under TSan). Bound: a third of the 3 s, for a loaded machine.
  CHECK(us < 1'000'000);
  const auto stats = store.fail_fast_stats();
  CHECK(stats.breakers.rejected == kCalls);
  CHECK(stats.breakers.probes == 0);
}

TEST_CASE("after the server resumes, one probe closes the breaker within one cool-down") {
  PausedServer server("quota-breaker-probe");
  REQUIRE(server.started());
  constexpr auto kCoolDown = 300ms;
  // A 50 ms deadline: a loaded machine must not make the probe itself miss it.
  quota::RedisStore<TokenBucket> store(
      {.pool = pool_for(server, 2, 50ms, {.failures = 3, .cool_down = kCoolDown}),
       .prefix = "br2:"});
  warm(store);
  Clock::time_point opened;
  {
    auto paused = server.pause();
    for (int i = 0; i < 3; ++i) REQUIRE_FALSE(store.apply(kPolicy, kKey, Nanos{0}, 1).ok());
    opened = Clock::now();
    REQUIRE(store.fail_fast_stats().breakers.opened == 1);
  }  // SIGCONT here
  // Calls every millisecond: they fail at once until the cool-down ends, then the probe
  // goes through and succeeds. Bounded: 5 s.
  int fast_failures = 0, other_failures = 0;
  absl::StatusOr<quota::Decision> d = absl::UnknownError("not tried");
  while (Clock::now() - opened < 5s) {
    d = store.apply(kPolicy, kKey, Nanos{0}, 1);
    if (d.ok()) break;
    (mentions(d.status(), "circuit breaker open") ? fast_failures : other_failures)++;
    std::this_thread::sleep_for(1ms);
  }
  const auto back_after = Clock::now() - opened;
  REQUIRE(d.ok());
  std::printf("breaker: decisions back %lld ms after it opened (cool-down %lld ms)\n",
              static_cast<long long>(
                  std::chrono::duration_cast<std::chrono::milliseconds>(back_after).count()),
              static_cast<long long>(kCoolDown.count()));
  CHECK(back_after >= kCoolDown - 5ms);  // the steady clock: never early
  CHECK(back_after < kCoolDown + 500ms);
  CHECK(fast_failures > 0);
  CHECK(other_failures == 0);
  const auto stats = store.fail_fast_stats();
  CHECK(stats.breakers.probes == 1);
  CHECK(stats.breakers.opened == 1);
  CHECK_FALSE(stats.breakers.open);
  // Closed again: a decision goes straight through.
  CHECK(store.apply(kPolicy, kKey, Nanos{0}, 1).ok());
  CHECK(store.fail_fast_stats().breakers.probes == 1);
}

TEST_CASE("a probe that fails opens the breaker for another cool-down") {
  PausedServer server("quota-breaker-reopen");
  REQUIRE(server.started());
  constexpr auto kCoolDown = 100ms;
  quota::RedisStore<TokenBucket> store(
      {.pool = pool_for(server, 2, 3ms, {.failures = 2, .cool_down = kCoolDown}),
       .prefix = "br3:"});
  warm(store);
  auto paused = server.pause();
  for (int i = 0; i < 2; ++i) REQUIRE_FALSE(store.apply(kPolicy, kKey, Nanos{0}, 1).ok());
  REQUIRE(store.fail_fast_stats().breakers.opened == 1);
  std::this_thread::sleep_for(kCoolDown + 20ms);
  // The probe: it reaches the paused node and waits out its deadline.
  auto probe = store.apply(kPolicy, kKey, Nanos{0}, 1);
  REQUIRE_FALSE(probe.ok());
  INFO(probe.status().ToString());
  CHECK(mentions(probe.status(), "deadline of 3000 us"));
  auto stats = store.fail_fast_stats();
  CHECK(stats.breakers.probes == 1);
  CHECK(stats.breakers.opened == 2);
  // Open again: the next call fails at once.
  auto next = store.apply(kPolicy, kKey, Nanos{0}, 1);
  CHECK(mentions(next.status(), "circuit breaker open"));
  CHECK(quota::redis::error_kind(next.status()) == quota::redis::ErrorKind::kBreakerOpen);
}

TEST_CASE("the in-flight guard bounds the calls waiting on a paused server") {
  PausedServer server("quota-breaker-guard");
  REQUIRE(server.started());
  auto guard = std::make_shared<quota::redis::InFlightGuard>(4);
  // 16 connections, so that the pool does not do the guard's work; a 50 ms deadline, so
  // that calls stay in flight; no breaker.
  quota::RedisStoreOptions options{.pool = pool_for(server, 16, 50ms), .prefix = "br4:"};
  options.limits.in_flight = guard;
  quota::RedisStore<TokenBucket> store(options);
  warm(store);
  std::mutex mu;
  std::vector<std::int64_t> rejected_us;
  int deadline_errors = 0, other = 0;
  {
    auto paused = server.pause();
    std::vector<std::thread> threads;
    for (int t = 0; t < 16; ++t) {
      threads.emplace_back([&, t] {
        const std::string key = "{t" + std::to_string(t) + "}read";
        std::vector<std::int64_t> mine;
        int my_deadline = 0, my_other = 0;
        for (int i = 0; i < 10; ++i) {
          const auto t0 = Clock::now();
          auto d = store.apply(kPolicy, key, Nanos{0}, 1);
          const auto us = micros_since(t0);
          if (!d.ok() && mentions(d.status(), "in-flight guard")) {
            mine.push_back(us);
          } else if (!d.ok() && mentions(d.status(), "deadline of 50000 us")) {
            ++my_deadline;
          } else {
            ++my_other;
          }
        }
        std::lock_guard<std::mutex> lock(mu);
        rejected_us.insert(rejected_us.end(), mine.begin(), mine.end());
        deadline_errors += my_deadline;
        other += my_other;
      });
    }
    for (auto& th : threads) th.join();
  }
  const auto s = quota::testing::spread(rejected_us);
  quota::testing::print_spread("in-flight guard (max 4, 16 threads): failing at once", s);
  const auto stats = store.fail_fast_stats().in_flight;
  CHECK(other == 0);
  CHECK(stats.peak <= 4);
  CHECK(stats.peak >= 1);
  CHECK(stats.in_flight == 0);
  CHECK(deadline_errors > 0);
  CHECK(static_cast<std::uint64_t>(s.n) == stats.rejected);
  CHECK(s.n > 0);
  CHECK(s.p50 < 2000);  // at once: far from the 50 ms a call in flight waits
}

TEST_CASE("a decision beyond the in-flight guard gets the route's fail mode from the gateway") {
  PausedServer server("quota-breaker-gateway");
  REQUIRE(server.started());
  auto guard = std::make_shared<quota::redis::InFlightGuard>(1);
  quota::redis::GatewayStoreOptions options{.pool = pool_for(server, 2, 2s), .prefix = "br5:"};
  options.limits.in_flight = guard;
  quota::redis::GatewayStore store(options);
  quota::gateway::RuleRegistry registry(quota::testing::build(quota::testing::fail_open_spec(20)));
  quota::gateway::Gateway gw(store, registry);
  const quota::gateway::Request read{.who = {.tenant = "acme", .plan = "free"}, .route = "read"};
  const quota::gateway::Request create{.who = {.tenant = "acme", .plan = "free"},
                                       .route = "create"};
  auto before = gw.decide(create, Nanos{0});
  REQUIRE(before.ok());
  CHECK(before->decision.reason == quota::Reason::kAllowed);
  {
    // The one place is taken (as by a call stuck on a paused server).
    auto held = guard->enter();
    REQUIRE(held.ok());
    auto closed = gw.decide(create, Nanos{0});  // fail_closed route
    REQUIRE(closed.ok());
    CHECK(closed->decision.reason == quota::Reason::kUnavailable);
    auto open = gw.decide(read, Nanos{0});  // fail_open route: the emergency bucket
    REQUIRE(open.ok());
    CHECK(open->decision.reason == quota::Reason::kFailOpen);
    CHECK(open->decision.allowed);
    CHECK(store.fail_fast_stats().in_flight.rejected >= 2);
  }
  auto after = gw.decide(create, Nanos{0});
  REQUIRE(after.ok());
  CHECK(after->decision.reason == quota::Reason::kAllowed);
}
