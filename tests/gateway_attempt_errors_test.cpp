// Tests for attempts that meet an error (quota/gateway/gateway.hpp with the in-process
// AttemptCache, attempts.hpp): when the store cannot decide — unreachable, or full of
// active keys — the route's fail mode answers the request, but nothing is recorded under
// the attempt id, so a retry with the same id decides afresh; the first real decision is
// the one replayed.
#include <catch2/catch.hpp>
#include <chrono>

#include "quota/gateway/gateway.hpp"
#include "quota/store/local_store.hpp"
#include "quota/store/sharded_store.hpp"
#include "support/failing_store.hpp"
#include "support/gateway_rules.hpp"

using namespace std::chrono_literals;
using quota::Nanos;
using quota::Reason;
using quota::gateway::Gateway;
using quota::gateway::KeyPolicy;
using quota::gateway::Request;
using quota::gateway::RuleRegistry;
using quota::testing::build;

namespace {

using Inner = quota::ShardedStore<KeyPolicy>;
using Failing = quota::testing::FailingStore<Inner>;

// read fails open (emergency bucket 5/s, burst 5), create fails closed; 1/s, burst 100.
const quota::gateway::RuleSetSpec kSpec = quota::testing::fail_open_spec(100);

Request with_id(const char* tenant, const char* route, const char* id) {
  return {.who = {.tenant = tenant, .plan = "free"}, .route = route, .attempt_id = id};
}

}  // namespace

TEST_CASE("attempts: a fail-closed answer to an unreachable store is not the attempt's decision") {
  RuleRegistry registry(build(kSpec));
  Inner inner;
  Failing store(inner);
  Gateway gw(store, registry, {.attempt_ttl = 10min});
  store.set_down(true);
  auto down = gw.decide(with_id("acme", "create", "att-1"), Nanos{0});
  REQUIRE(down.ok());
  CHECK_FALSE(down->decision.allowed);
  CHECK(down->decision.reason == Reason::kUnavailable);
  CHECK(gw.attempts().size() == 0);
  // The retry, with the store back, decides: it is not a replay of the 503.
  store.set_down(false);
  auto retry = gw.decide(with_id("acme", "create", "att-1"), 1s);
  REQUIRE(retry.ok());
  CHECK(retry->decision.allowed);
  CHECK(retry->decision.reason == Reason::kAllowed);
  CHECK_FALSE(retry->replayed);
  // That decision is the one kept: a second retry replays it and spends nothing.
  auto replay = gw.decide(with_id("acme", "create", "att-1"), 2s);
  REQUIRE(replay.ok());
  CHECK(replay->replayed);
  CHECK(replay->decision.allowed);
  CHECK(replay->decision.remaining == retry->decision.remaining);
}

TEST_CASE("attempts: a fail-open admission is not the attempt's decision either") {
  RuleRegistry registry(build(kSpec));
  Inner inner;
  Failing store(inner);
  Gateway gw(store, registry, {.attempt_ttl = 10min});
  store.set_down(true);
  auto open = gw.decide(with_id("acme", "read", "att-2"), Nanos{0});
  REQUIRE(open.ok());
  CHECK(open->decision.allowed);
  CHECK(open->decision.reason == Reason::kFailOpen);
  CHECK(gw.attempts().size() == 0);
  store.set_down(false);
  auto retry = gw.decide(with_id("acme", "read", "att-2"), 1s);
  REQUIRE(retry.ok());
  CHECK_FALSE(retry->replayed);
  CHECK(retry->decision.reason == Reason::kAllowed);
  CHECK(retry->decision.remaining == 99);  // decided by the store, not the emergency bucket
}

TEMPLATE_TEST_CASE("attempts: a store full of active keys (ResourceExhausted) is not remembered",
                   "", quota::LocalStore<KeyPolicy>, quota::ShardedStore<KeyPolicy>) {
  RuleRegistry registry(build(kSpec));
  TestType store({.max_keys = 1, .shards = 1});
  Gateway gw(store, registry, {.attempt_ttl = 10min});
  // "busy" holds the only slot: 1 unit spent at 0, full again (idle) at 1 s.
  REQUIRE(gw.decide({.who = {.tenant = "busy", .plan = "free"}, .route = "create"}, Nanos{0})
              ->decision.allowed);
  auto full = gw.decide(with_id("acme", "create", "att-3"), Nanos{0});
  REQUIRE(full.ok());
  CHECK_FALSE(full->decision.allowed);
  CHECK(full->decision.reason == Reason::kUnavailable);
  CHECK(gw.attempts().size() == 0);
  // Once "busy" is idle there is room, and the retry with the same id is decided.
  auto retry = gw.decide(with_id("acme", "create", "att-3"), 10s);
  REQUIRE(retry.ok());
  CHECK_FALSE(retry->replayed);
  CHECK(retry->decision.allowed);
  CHECK(retry->decision.reason == Reason::kAllowed);
  auto replay = gw.decide(with_id("acme", "create", "att-3"), 11s);
  REQUIRE(replay.ok());
  CHECK(replay->replayed);
  CHECK(replay->decision.allowed);
}
