// Tests for eviction in a full in-process store under the gateway (quota/store/
// local_store.hpp, sharded_store.hpp, quota/detail/keyed_states.hpp): every state change
// that moves a key's idle time earlier — a settle's refund, a rule downgrade — leaves
// the store able to evict that key, so a full store admits a new key whenever an idle
// one exists, and still refuses one (ResourceExhausted, the fail mode) when none is.
#include <catch2/catch.hpp>
#include <chrono>

#include "quota/gateway/gateway.hpp"
#include "quota/store/local_store.hpp"
#include "quota/store/sharded_store.hpp"
#include "support/gateway_rules.hpp"

using namespace std::chrono_literals;
using quota::Nanos;
using quota::Reason;
using quota::TokenBucket;
using quota::gateway::Gateway;
using quota::gateway::KeyPolicy;
using quota::gateway::Request;
using quota::gateway::RuleRegistry;
using quota::testing::build;

namespace {

// One unit per hour: nothing refills measurably within a test.
quota::gateway::RuleSetSpec spec(std::uint64_t version, std::int64_t burst) {
  return quota::testing::levels_spec(
      version, TokenBucket{.rate = {.units = 1, .per = std::chrono::hours(1)}, .burst = burst});
}

Request read(const char* tenant) {
  return {.who = {.tenant = tenant, .plan = "free"}, .route = "read"};
}

}  // namespace

TEMPLATE_TEST_CASE("a full store evicts a key a settle's refund made idle", "",
                   quota::LocalStore<KeyPolicy>, quota::ShardedStore<KeyPolicy>) {
  RuleRegistry registry(build(spec(1, 100)));
  TestType store({.max_keys = 2, .shards = 1});
  Gateway gw(store, registry);
  // Two keys, 50 units each spent at 0: idle at 50 h.
  auto a = gw.acquire_estimate(read("a"), 50, Nanos{0});
  REQUIRE(a.ok());
  REQUIRE(a->ticket.has_value());
  REQUIRE(gw.acquire_estimate(read("b"), 50, Nanos{0})->decision.allowed);
  // Full, nothing idle: a third key is refused (the route fails closed: unavailable).
  auto refused = gw.decide(read("c"), 1s);
  REQUIRE(refused.ok());
  CHECK(refused->decision.reason == Reason::kUnavailable);
  // "a" used nothing of its estimate: the refund makes it whole again, idle now.
  auto settled = gw.settle("a", *a->ticket, 0, 2s);
  REQUIRE(settled.ok());
  auto admitted = gw.decide(read("c"), 3s);
  REQUIRE(admitted.ok());
  CHECK(admitted->decision.allowed);
  CHECK(admitted->decision.reason == Reason::kAllowed);
  CHECK(admitted->decision.remaining == 99);
  // "b" is still active: nothing more is evicted for a fourth key.
  auto fourth = gw.decide(read("d"), 4s);
  REQUIRE(fourth.ok());
  CHECK(fourth->decision.reason == Reason::kUnavailable);
}

TEMPLATE_TEST_CASE("a full store evicts a key a rule downgrade made idle sooner", "",
                   quota::LocalStore<KeyPolicy>, quota::ShardedStore<KeyPolicy>) {
  RuleRegistry registry(build(spec(1, 100)));
  TestType store({.max_keys = 2, .shards = 1});
  Gateway gw(store, registry);
  // 50 units spent from each of two keys at 0: idle at 50 h under burst 100.
  REQUIRE(gw.acquire_estimate(read("a"), 50, Nanos{0})->decision.allowed);
  REQUIRE(gw.acquire_estimate(read("b"), 50, Nanos{0})->decision.allowed);
  REQUIRE(gw.decide(read("c"), 1s)->decision.reason == Reason::kUnavailable);
  // Downgrade to burst 10: "a" keeps min(50, 10) = 10 and spends 1, so it is full again
  // one hour later instead of 50 hours.
  REQUIRE(registry.publish(build(spec(2, 10))).ok());
  auto a = gw.decide(read("a"), 2s);
  REQUIRE(a.ok());
  CHECK(a->decision.allowed);
  CHECK(a->decision.remaining == 9);
  // Two hours on, "a" is idle and "b" (40 of 100 left before the downgrade, never
  // converted) is not: "c" takes "a"'s place.
  const Nanos later = 2s + 2h;
  auto c = gw.decide(read("c"), later);
  REQUIRE(c.ok());
  CHECK(c->decision.allowed);
  CHECK(c->decision.reason == Reason::kAllowed);
  auto again = gw.decide(read("a"), later);
  REQUIRE(again.ok());
  CHECK(again->decision.reason == Reason::kUnavailable);  // "a" was evicted; "b" holds on
}
