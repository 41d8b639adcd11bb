// Tests of the gateway over Redis (quota/redis/gateway_store.hpp) across rule changes:
// downgrade, upgrade and switching kind converted in Redis without a burst and versioned,
// a process on older rules never rolls a key back, and thousands of distinct policies.
#include <chrono>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "quota/gateway/gateway.hpp"
#include "quota/redis/gateway_store.hpp"
#include "support/gateway_fixtures.hpp"
#include "support/gateway_rules.hpp"
#include "support/printers.hpp"
#include "support/redis_server.hpp"

using namespace std::chrono_literals;
using quota::FixedWindow;
using quota::MicroUnits;
using quota::Nanos;
using quota::Reason;
using quota::TokenBucket;
using quota::gateway::Gateway;
using quota::gateway::Level;
using quota::gateway::LevelCheck;
using quota::gateway::Request;
using quota::gateway::RuleRegistry;
using quota::gateway::RuleSetSpec;
using quota::redis::GatewayStore;
using quota::testing::admit;
using quota::testing::build;
using quota::testing::kSlow;
using quota::testing::make_store;
using quota::testing::read;
using quota::testing::spec;
using quota::testing::with_cost;

TEST_CASE("redis gateway: a downgrade clamps to the new burst and carries the new version") {
  GatewayStore store = make_store("gw-down");
  RuleRegistry registry(build(spec(1, TokenBucket{.rate = kSlow, .burst = 100})));
  Gateway gw(store, registry);
  REQUIRE(admit(gw, read("acme"), 30) == 30);  // 70 left under v1
  REQUIRE(registry.publish(build(spec(2, TokenBucket{.rate = kSlow, .burst = 20}))).ok());
  auto r = gw.decide(read("acme"), Nanos{0});
  REQUIRE(r.ok());
  CHECK(r->decision.allowed);
  CHECK(r->decision.version == 2);
  CHECK(r->decision.remaining == 19);  // min(70, 20) − 1
  CHECK(admit(gw, read("acme"), 40) == 19);
}

TEST_CASE("redis gateway: an upgrade hands out no fresh burst") {
  GatewayStore store = make_store("gw-up");
  RuleRegistry registry(build(spec(1, TokenBucket{.rate = kSlow, .burst = 10})));
  Gateway gw(store, registry);
  REQUIRE(admit(gw, read("acme"), 10) == 10);  // empty under v1
  REQUIRE(registry.publish(build(spec(2, TokenBucket{.rate = kSlow, .burst = 1000}))).ok());
  auto r = gw.decide(read("acme"), Nanos{0});
  REQUIRE(r.ok());
  CHECK_FALSE(r->decision.allowed);
  CHECK(r->decision.version == 2);
  CHECK(r->decision.reason == Reason::kOverLimit);
  // A tenant never seen before gets the new burst.
  CHECK(admit(gw, read("newcomer"), 1000) == 1000);
}

TEST_CASE("redis gateway: switching kind keeps what was left, never more") {
  GatewayStore store = make_store("gw-kind");
  RuleRegistry registry(build(spec(1, TokenBucket{.rate = kSlow, .burst = 50})));
  Gateway gw(store, registry);
  REQUIRE(admit(gw, read("acme"), 45) == 45);  // 5 tokens left
  REQUIRE(registry.publish(build(spec(2, FixedWindow{.limit = 30, .window = 1h}))).ok());
  auto r = gw.decide(read("acme"), Nanos{0});
  REQUIRE(r.ok());
  CHECK(r->decision.version == 2);
  CHECK(r->decision.remaining == 4);  // the window's count leaves min(30, 5) − 1
  CHECK(admit(gw, read("acme"), 10) == 4);
  // And back to a bucket: what the window still allowed (0), not the burst.
  REQUIRE(registry.publish(build(spec(3, TokenBucket{.rate = kSlow, .burst = 50}))).ok());
  auto back = gw.decide(read("acme"), Nanos{0});
  REQUIRE(back.ok());
  CHECK_FALSE(back->decision.allowed);
  CHECK(back->decision.version == 3);
}

TEST_CASE("redis gateway: a process still on older rules is decided by the newer rule") {
  GatewayStore store_a = make_store("gw-rollout");
  // Another process: its own registry and store object, the same Redis and prefix.
  GatewayStore store_b({.pool = quota::testing::redis_pool(2), .prefix = store_a.options().prefix});
  RuleRegistry new_rules(build(spec(2, TokenBucket{.rate = kSlow, .burst = 5})));
  RuleRegistry old_rules(build(spec(1, TokenBucket{.rate = kSlow, .burst = 100})));
  Gateway rolled_out(store_a, new_rules);
  Gateway lagging(store_b, old_rules);
  REQUIRE(admit(rolled_out, read("acme"), 2) == 2);  // 3 left under v2
  auto r = lagging.decide(read("acme"), Nanos{0});
  REQUIRE(r.ok());
  CHECK(r->decision.allowed);
  CHECK(r->decision.version == 2);    // the rule that decided
  CHECK(r->decision.remaining == 2);  // not 100 − 1
  CHECK(admit(lagging, read("acme"), 10) == 2);
}

TEST_CASE("redis gateway: each of thousands of distinct policies gets its own arguments") {
  // More distinct policies than the store keeps formatted (4096): the first ones come
  // from its cache when used again, the last ones are formatted per call; either way a
  // fresh key's first decision leaves burst - 1.
  GatewayStore store = make_store("gw-policies");
  constexpr int kPolicies = 4200;
  std::vector<quota::gateway::RulePolicy> policies;
  for (int i = 0; i < kPolicies; ++i) {
    if (i % 2 == 0) {
      policies.push_back(TokenBucket{.rate = {.units = 1, .per = 1s}, .burst = 10 + i});
    } else {
      policies.push_back(FixedWindow{.limit = 10 + i, .window = std::chrono::hours(1)});
    }
  }
  int wrong = 0;
  auto first_decision = [&](int i, const std::string& key) {
    const LevelCheck level[] = {{.policy = &policies[i], .key = key, .shadow = false}};
    auto d = store.decide(with_cost(level, 1), 1, Nanos{0});
    if (!d.ok() || d->parts.size() != 1 || !d->parts[0].allowed ||
        d->parts[0].remaining != 10 + i - 1) {
      ++wrong;
    }
  };
  for (int i = 0; i < kPolicies; ++i) first_decision(i, "{p}" + std::to_string(i));
  CHECK(wrong == 0);
  for (int i : {0, 1, 2, kPolicies - 2, kPolicies - 1}) {
    first_decision(i, "{q}" + std::to_string(i));
  }
  CHECK(wrong == 0);
}
