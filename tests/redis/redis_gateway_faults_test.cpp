// Fault tests of the gateway over Redis (quota/redis/gateway_store.hpp), against a real
// redis-server of their own that they pause (SIGSTOP) and kill (SIGKILL):
//   - fail_open: while Redis is unreachable the route admits from the local emergency
//     bucket, for at most max_duration; the admitted log checked with the envelope
//     verifier stays within r·T + B + the documented outage allowance (and not within
//     r·T + B alone: the test can fail);
//   - fail_closed: unavailable (HTTP 503, never 429) within the deadline, and decisions
//     come back from Redis once it is back.
#include <signal.h>

#include <chrono>
#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "quota/gateway/gateway.hpp"
#include "quota/http.hpp"
#include "quota/redis/gateway_store.hpp"
#include "quota/verify/envelope.hpp"
#include "support/gateway_rules.hpp"
#include "support/printers.hpp"
#include "support/redis_server.hpp"

using namespace std::chrono_literals;
using quota::Nanos;
using quota::Reason;
using quota::TokenBucket;
using quota::gateway::Gateway;
using quota::gateway::RuleRegistry;
using quota::redis::GatewayStore;
using quota::testing::build;
using Clock = std::chrono::steady_clock;

namespace {

constexpr auto kDeadline = 200ms;

const quota::gateway::EmergencyBucket& kEmergency = quota::testing::kTestEmergency;

// read fails open, create fails closed; the tenant budget is 1/s with a burst of 20.
quota::gateway::RuleSetSpec spec() { return quota::testing::fail_open_spec(20); }

const quota::gateway::Request kRead{.who = {.tenant = "acme", .plan = "free"}, .route = "read"};
const quota::gateway::Request kCreate{.who = {.tenant = "acme", .plan = "free"}, .route = "create"};

using quota::testing::ResumeOnExit;
using quota::testing::signal_redis;

}  // namespace

TEST_CASE("redis gateway fail_open: a paused Redis costs at most the documented allowance") {
  // The caller's clock for Redis too (test mode), so that Redis admissions and emergency
  // admissions are on one timeline for the verifier. No breaker: the decisions right after
  // each resume come from Redis, not from a cool-down (the breaker: redis_breaker_test).
  quota::redis::ConnectionConfig config = quota::testing::redis_config(kDeadline);
  config.breaker.failures = 0;
  GatewayStore store({.pool = std::make_shared<quota::redis::ConnectionPool>(config, 2),
                      .prefix = quota::testing::unique_prefix("gw-pause"),
                      .time = quota::redis::TimeSource::kCaller});
  RuleRegistry registry(build(spec()));
  Gateway gw(store, registry);
  ResumeOnExit resume;
  // One client every 100 ms for 7 s; Redis is stopped from 2 s to 4.5 s — longer than
  // max_duration (2 s).
  std::vector<quota::verify::AdmittedEvent> log;
  int fail_open = 0, unavailable = 0, from_redis = 0;
  bool paused = false;
  for (std::int64_t t = 0; t <= Nanos(7s).count(); t += Nanos(100ms).count()) {
    const bool down = t >= Nanos(2s).count() && t < Nanos(4500ms).count();
    if (down != paused) {
      REQUIRE(signal_redis(down ? SIGSTOP : SIGCONT));
      paused = down;
    }
    const auto start = Clock::now();
    auto r = gw.decide(kRead, Nanos{t});
    const auto took = Clock::now() - start;
    REQUIRE(r.ok());
    CHECK(took < kDeadline * 3 + 1s);  // never hangs
    if (r->decision.allowed) log.push_back({.time_ns = t, .cost = 1});
    switch (r->decision.reason) {
      case Reason::kFailOpen:
        ++fail_open;
        CHECK(down);
        break;
      case Reason::kUnavailable:
        ++unavailable;
        break;
      default:
        ++from_redis;
    }
  }
  INFO("fail-open " << fail_open << ", unavailable " << unavailable << ", from Redis "
                    << from_redis);
  CHECK(fail_open > 0);
  CHECK(fail_open <= kEmergency.outage_allowance());
  CHECK(unavailable > 0);  // closed after max_duration
  CHECK(from_redis > 40);  // before and after the pause
  const quota::Rate rate{.units = 1, .per = 1s};
  auto bounded = quota::verify::verify_token_bucket(log, rate, 20, kEmergency.outage_allowance());
  REQUIRE(bounded.ok());
  INFO(quota::verify::to_string(*bounded));
  CHECK(bounded->holds());
  auto plain = quota::verify::verify_token_bucket(log, rate, 20, 0);
  REQUIRE(plain.ok());
  CHECK_FALSE(plain->holds());
}

TEST_CASE("redis gateway fail_closed: a killed Redis answers 503 within the deadline") {
  GatewayStore store({.pool = quota::testing::redis_pool(2, kDeadline),
                      .prefix = quota::testing::unique_prefix("gw-kill")});
  RuleRegistry registry(build(spec()));
  Gateway gw(store, registry);
  auto before = gw.decide(kCreate, Nanos{0});
  REQUIRE(before.ok());
  CHECK(before->decision.allowed);
  REQUIRE(quota::testing::kill_redis());
  auto policy =
      quota::http::describe("free", TokenBucket{.rate = {.units = 1, .per = 1s}, .burst = 20});
  REQUIRE(policy.ok());
  for (int i = 0; i < 3; ++i) {
    const auto start = Clock::now();
    auto r = gw.decide(kCreate, Nanos{0});
    const auto took = Clock::now() - start;
    REQUIRE(r.ok());
    CHECK_FALSE(r->decision.allowed);
    CHECK(r->decision.reason == Reason::kUnavailable);
    CHECK(quota::http::answer(r->decision, *policy).status == 503);
    CHECK(took < kDeadline * 3 + 1s);
  }
  // With an attempt id too: the attempt record cannot be reached either, and the fail
  // mode decides (503), rather than an error.
  quota::gateway::Request with_attempt = kCreate;
  with_attempt.attempt_id = "during-outage";
  auto attempted = gw.decide(with_attempt, Nanos{0});
  REQUIRE(attempted.ok());
  CHECK(attempted->decision.reason == Reason::kUnavailable);
  REQUIRE(quota::testing::redis_script("restart"));
  // The next calls reconnect; the restarted server (no persistence) starts the key anew.
  absl::StatusOr<quota::gateway::Result> back = absl::UnknownError("not tried");
  for (int i = 0; i < 20; ++i) {
    back = gw.decide(kCreate, Nanos{0});
    if (back.ok() && back->decision.reason != Reason::kUnavailable) break;
  }
  REQUIRE(back.ok());
  CHECK(back->decision.allowed);
  CHECK(back->decision.reason == Reason::kAllowed);
}
