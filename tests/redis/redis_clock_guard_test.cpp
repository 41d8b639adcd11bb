// The clock-step guard (RedisStoreOptions / GatewayStoreOptions::clock_guard,
// transport/node_watch.hpp) against the test server. Its test hook is the client's
// monotonic clock: a ManualClock that stands still while real time passes makes the
// server's TIME look like a forward step. The node is then refused (kUnavailable naming
// QUOTA_CLOCK_AHEAD) with the bucket's stored state unchanged byte for byte — nothing
// refills from the step — and decides again once the clocks agree.
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include <catch2/catch.hpp>

#include "quota/clock.hpp"
#include "quota/policy/token_bucket.hpp"
#include "quota/redis/gateway_store.hpp"
#include "quota/redis/redis_store.hpp"
#include "quota/redis/transport/error_kind.hpp"
#include "support/printers.hpp"
#include "support/redis_server.hpp"

using namespace std::chrono_literals;
using quota::Nanos;
using quota::TokenBucket;

namespace {

// 10 units per second, burst 5: 600 ms of real time would refill all of it.
const TokenBucket kPolicy{.rate = {.units = 10, .per = 1s}, .burst = 5};
constexpr auto kTolerance = 200ms;
constexpr auto kStep = 600ms;  // real time that passes while the manual clock stands still

std::string raw_state(quota::redis::ConnectionPool& pool, const std::string& key) {
  auto lease = pool.acquire();
  REQUIRE(lease.ok());
  auto r = (*lease)->command({"GET", key});
  REQUIRE(r.ok());
  REQUIRE((*r)->type == REDIS_REPLY_STRING);
  return std::string((*r)->str, (*r)->len);
}

// One decision of one unit: admitted or not, or the error.
using Decide = std::function<absl::StatusOr<bool>()>;

// The test's monotonic clock: it follows real time (SteadyClock) while `follow()` is
// called, and stands still between calls.
struct TestClock {
  quota::ManualClock manual{Nanos{1'000'000'000}};
  const Nanos start = quota::SteadyClock{}.now();
  void follow() { manual.set(Nanos{1'000'000'000} + (quota::SteadyClock{}.now() - start)); }
};

// Drains the bucket, steps, checks the refusal and the recovery.
void step_and_recover(TestClock& mono, const Decide& decide, quota::redis::ConnectionPool& pool,
                      const std::string& redis_key) {
  int admitted = 0;
  for (int i = 0; i < 20; ++i) {
    mono.follow();  // the clocks agree
    auto r = decide();
    INFO(r.status().ToString());
    REQUIRE(r.ok());
    admitted += *r;
  }
  CHECK(admitted >= kPolicy.burst);
  const std::string before = raw_state(pool, redis_key);
  // Real time passes; the client's monotonic clock does not: the server's TIME is ahead
  // of the bound by at least kStep - kTolerance.
  std::this_thread::sleep_for(kStep);
  for (int i = 0; i < 3; ++i) {
    auto r = decide();
    REQUIRE_FALSE(r.ok());
    INFO(r.status().ToString());
    CHECK(absl::IsUnavailable(r.status()));
    CHECK(r.status().message().find("QUOTA_CLOCK_AHEAD") != std::string::npos);
    CHECK(quota::redis::error_kind(r.status()) == quota::redis::ErrorKind::kClockAhead);
  }
  // Nothing read or written: the state is the drained one, not refilled.
  CHECK(raw_state(pool, redis_key) == before);
  CHECK(pool.node_watch().stats().clock_refusals >= 3);
  // The clocks agree again: decisions resume, and the bucket refills by the real time.
  mono.follow();
  auto r = decide();
  INFO(r.status().ToString());
  REQUIRE(r.ok());
  CHECK(*r);
}

}  // namespace

TEST_CASE("clock guard: a forward TIME step refuses the node, refills nothing, then recovers") {
  TestClock mono;
  const quota::redis::ClockGuard guard{.tolerance = kTolerance,
                                       .monotonic = [m = mono.manual] { return m.now(); }};
  auto pool = quota::testing::redis_pool(1);
  const std::string prefix = quota::testing::unique_prefix("clock-guard");
  SECTION("RedisStore") {
    quota::RedisStore<TokenBucket> store(
        quota::RedisStoreOptions{.pool = pool, .prefix = prefix, .clock_guard = guard});
    step_and_recover(
        mono,
        [&]() -> absl::StatusOr<bool> {
          auto d = store.apply(kPolicy, "{acme}read", Nanos{0}, 1);
          if (!d.ok()) return d.status();
          return d->allowed;
        },
        *pool, prefix + "{acme}read");
  }
  SECTION("GatewayStore") {
    quota::redis::GatewayStore store(quota::redis::GatewayStoreOptions{
        .pool = pool, .prefix = prefix + "gw:", .clock_guard = guard});
    const quota::gateway::RulePolicy policy = kPolicy;
    step_and_recover(
        mono,
        [&]() -> absl::StatusOr<bool> {
          const quota::gateway::LevelCheck level{.policy = &policy, .key = "{acme}read"};
          auto r = store.decide(std::span(&level, 1), 1, Nanos{0});
          if (!r.ok()) return r.status();
          return r->parts.front().allowed;
        },
        *pool, prefix + "gw:{acme}read");
  }
}

TEST_CASE("clock guard: time passing on both clocks alike is never refused") {
  TestClock mono;
  auto pool = quota::testing::redis_pool(1);
  quota::RedisStore<TokenBucket> store(quota::RedisStoreOptions{
      .pool = pool,
      .prefix = quota::testing::unique_prefix("clock-guard-agree"),
      .clock_guard = quota::redis::ClockGuard{.tolerance = kTolerance,
                                              .monotonic = [m = mono.manual] { return m.now(); }}});
  for (int i = 0; i < 10; ++i) {
    std::this_thread::sleep_for(50ms);
    mono.follow();
    auto d = store.apply(kPolicy, "{acme}read", Nanos{0}, 1);
    INFO(d.status().ToString());
    REQUIRE(d.ok());
  }
  CHECK(pool->node_watch().stats().clock_refusals == 0);
}

TEST_CASE("clock guard: a tolerance below 1 ns or caller time is a configuration error") {
  auto pool = quota::testing::redis_pool(1);
  quota::RedisStore<TokenBucket> zero(quota::RedisStoreOptions{
      .pool = pool, .clock_guard = quota::redis::ClockGuard{.tolerance = Nanos{0}}});
  auto d = zero.apply(kPolicy, "{acme}read", Nanos{0}, 1);
  REQUIRE_FALSE(d.ok());
  CHECK(absl::IsInvalidArgument(d.status()));
  CHECK(d.status().message().find("clock_guard.tolerance") != std::string::npos);
  quota::redis::GatewayStore caller(
      quota::redis::GatewayStoreOptions{.pool = pool,
                                        .time = quota::redis::TimeSource::kCaller,
                                        .clock_guard = quota::redis::ClockGuard{}});
  const quota::gateway::RulePolicy policy = kPolicy;
  const quota::gateway::LevelCheck level{.policy = &policy, .key = "{acme}read"};
  auto r = caller.decide(std::span(&level, 1), 1, Nanos{0});
  REQUIRE_FALSE(r.ok());
  CHECK(absl::IsInvalidArgument(r.status()));
  CHECK(r.status().message().find("TimeSource::kCaller") != std::string::npos);
}
