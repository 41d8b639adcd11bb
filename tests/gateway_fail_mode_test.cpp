// Tests for the gateway's fail modes (quota/gateway/gateway.hpp): fail_closed answers
// "unavailable" (503, never 429); fail_open admits from a bounded local emergency bucket
// for at most max_duration, and the overshoot during an outage stays within the
// documented EmergencyBucket::outage_allowance(), checked with the envelope verifier.
#include <catch2/catch.hpp>
#include <chrono>
#include <vector>

#include "quota/gateway/gateway.hpp"
#include "quota/http.hpp"
#include "quota/store/sharded_store.hpp"
#include "quota/verify/envelope.hpp"
#include "support/failing_store.hpp"
#include "support/gateway_rules.hpp"

using namespace std::chrono_literals;
using quota::Nanos;
using quota::Reason;
using quota::TokenBucket;
using quota::gateway::FailMode;
using quota::gateway::Gateway;
using quota::gateway::KeyPolicy;
using quota::gateway::Outcome;
using quota::gateway::RuleRegistry;
using quota::testing::build;

namespace {

using Inner = quota::ShardedStore<KeyPolicy>;
using Store = quota::testing::FailingStore<Inner>;

const quota::gateway::EmergencyBucket& kEmergency = quota::testing::kTestEmergency;

// read fails open, create fails closed; the tenant budget is 1/s with a burst of 100.
quota::gateway::RuleSetSpec spec() { return quota::testing::fail_open_spec(100); }

std::uint64_t count(const quota::gateway::Metrics& m, const char* route, Outcome o) {
  for (const auto& c : m.snapshot()) {
    if (c->labels().route == route) return c->count(o);
  }
  return 0;
}

const quota::gateway::Request kRead{.who = {.tenant = "acme", .plan = "free"}, .route = "read"};
const quota::gateway::Request kCreate{.who = {.tenant = "acme", .plan = "free"}, .route = "create"};

}  // namespace

TEST_CASE("the documented outage allowance: burst + ceil(rate * max_duration)") {
  CHECK(kEmergency.outage_allowance() == 15);
  const quota::gateway::EmergencyBucket odd{
      .rate = {.units = 1, .per = 3s}, .burst = 2, .max_duration = 4s};
  CHECK(odd.outage_allowance() == 4);  // 2 + ceil(4/3)
}

TEST_CASE("fail_closed: an unreachable store is 'unavailable' (503), nothing deducted") {
  quota::gateway::Metrics metrics;
  RuleRegistry registry(build(spec(), &metrics));
  Inner inner;
  Store store(inner);
  Gateway gw(store, registry);
  store.set_down(true);
  auto r = gw.decide(kCreate, Nanos{0});
  REQUIRE(r.ok());
  CHECK_FALSE(r->decision.allowed);
  CHECK(r->decision.reason == Reason::kUnavailable);
  CHECK(r->decision.version == 1);
  auto info = quota::http::describe("free", TokenBucket{.rate = {1, 1s}, .burst = 100});
  CHECK(quota::http::answer(r->decision, *info).status == 503);
  CHECK(count(metrics, "create", Outcome::kUnavailable) == 1);
  CHECK(store.failures() == 1);
  store.set_down(false);
  auto back = gw.decide(kCreate, Nanos{0});
  CHECK(back->decision.allowed);
  CHECK(back->decision.remaining == 95);  // the failed call took nothing
}

TEST_CASE("fail_open: bounded by the emergency bucket, then closed after max_duration") {
  quota::gateway::Metrics metrics;
  RuleRegistry registry(build(spec(), &metrics));
  Inner inner;
  Store store(inner);
  Gateway gw(store, registry);
  store.set_down(true);
  // Outage starts at 10 s: the emergency bucket's burst (5) passes at once...
  for (int i = 0; i < 5; ++i) {
    auto r = gw.decide(kRead, 10s);
    REQUIRE(r.ok());
    CHECK(r->decision.allowed);
    CHECK(r->decision.reason == Reason::kFailOpen);
  }
  // ...then it is empty: unavailable (503), not 429.
  auto empty = gw.decide(kRead, 10s);
  CHECK(empty->decision.reason == Reason::kUnavailable);
  // 1 s later (5/s): 5 more.
  int admitted = 0;
  for (int i = 0; i < 10; ++i) admitted += gw.decide(kRead, 11s)->decision.allowed ? 1 : 0;
  CHECK(admitted == 5);
  // At 12 s the outage has lasted max_duration: closed, even with tokens in the bucket.
  CHECK(gw.decide(kRead, 12s)->decision.reason == Reason::kUnavailable);
  CHECK(gw.decide(kRead, 13s)->decision.reason == Reason::kUnavailable);
  CHECK(count(metrics, "read", Outcome::kFailOpenAllowed) == 10);
  CHECK(count(metrics, "read", Outcome::kUnavailable) == 8);
  // The store comes back: normal decisions, and a later outage is a new episode.
  store.set_down(false);
  CHECK(gw.decide(kRead, 14s)->decision.reason == Reason::kAllowed);
  store.set_down(true);
  CHECK(gw.decide(kRead, 20s)->decision.reason == Reason::kFailOpen);
}

TEST_CASE("fail_open overshoot during an outage stays within the documented bound") {
  RuleRegistry registry(build(spec()));
  Inner inner;
  Store store(inner);
  Gateway gw(store, registry);
  // One client asks every 10 ms for 12 s; the store is down from 3 s to 6 s (longer than
  // max_duration = 2 s). The tenant bucket: 1/s, burst 100.
  std::vector<quota::verify::AdmittedEvent> log;
  int fail_open = 0;
  for (std::int64_t t = 0; t <= Nanos(12s).count(); t += Nanos(10ms).count()) {
    store.set_down(t >= Nanos(3s).count() && t < Nanos(6s).count());
    auto r = gw.decide(kRead, Nanos{t});
    REQUIRE(r.ok());
    if (r->decision.allowed) log.push_back({.time_ns = t, .cost = 1});
    if (r->decision.reason == Reason::kFailOpen) ++fail_open;
  }
  INFO("fail-open admissions: " << fail_open);
  CHECK(fail_open > 0);
  CHECK(fail_open <= kEmergency.outage_allowance());
  const quota::Rate rate{.units = 1, .per = 1s};
  // Within the envelope plus the documented allowance...
  auto bounded = quota::verify::verify_token_bucket(log, rate, 100, kEmergency.outage_allowance());
  REQUIRE(bounded.ok());
  INFO(quota::verify::to_string(*bounded));
  CHECK(bounded->holds());
  // ...and the outage really did admit beyond the plain envelope (the test can fail).
  auto plain = quota::verify::verify_token_bucket(log, rate, 100, 0);
  REQUIRE(plain.ok());
  CHECK_FALSE(plain->holds());
}
