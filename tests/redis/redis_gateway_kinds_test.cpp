// Tests for the policy kinds GatewayStore does not decide yet (quota/redis/twin/
// gateway_codec.hpp): a sliding-log or estimator rule on Redis is a clear InvalidArgument
// on every operation, never a decision, and the key is left untouched.
#include <catch2/catch.hpp>
#include <chrono>
#include <string>

#include "quota/gateway/gateway.hpp"
#include "quota/redis/gateway_store.hpp"
#include "support/gateway_fixtures.hpp"
#include "support/gateway_rules.hpp"
#include "support/redis_server.hpp"

using namespace std::chrono_literals;
using quota::Nanos;
using quota::SlidingLog;
using quota::SlidingWindowEstimate;
using quota::TokenBucket;
using quota::gateway::LevelCheck;
using quota::gateway::RulePolicy;
using quota::redis::GatewayStore;
using quota::testing::make_store;
using quota::testing::with_cost;

TEST_CASE("redis gateway: sliding_log and sliding_window_estimate are refused by name") {
  GatewayStore store = make_store("gw-kinds");
  const RulePolicy log = SlidingLog{.limit = 10, .window = 60s};
  const RulePolicy est = SlidingWindowEstimate{.limit = 10, .window = 60s};
  const RulePolicy tb = TokenBucket{.rate = quota::testing::kSlow, .burst = 10};
  for (const auto& [policy, name] :
       {std::pair{&log, "sliding_log"}, std::pair{&est, "sliding_window_estimate"}}) {
    INFO(name);
    const absl::Status expected = absl::InvalidArgumentError(
        std::string(name) + " is not yet a gateway policy on Redis (in-process only)");
    CHECK(GatewayStore::check(*policy) == expected);
    const LevelCheck levels[] = {{.policy = policy, .key = "{acme}read", .shadow = false}};
    CHECK(store.decide(with_cost(levels, 1), 1, Nanos{0}).status() == expected);
    CHECK(store.refund(*policy, 1, "{acme}read", 1, Nanos{0}, Nanos{0}).status() == expected);
    CHECK(store.charge(*policy, 1, "{acme}read", 1, Nanos{0}).status() == expected);
    // Beside a token bucket of the same tenant: the whole decision is refused, nothing
    // deducted from the bucket.
    const LevelCheck both[] = {{.policy = &tb, .key = "{acme}read/u", .shadow = false},
                               {.policy = policy, .key = "{acme}read", .shadow = false}};
    CHECK(store.decide(with_cost(both, 1), 1, Nanos{0}).status() == expected);
  }
  const LevelCheck alone[] = {{.policy = &tb, .key = "{acme}read/u", .shadow = false}};
  auto d = store.decide(with_cost(alone, 1), 1, Nanos{0});
  REQUIRE(d.ok());
  CHECK(d->parts.back().remaining == 9);
}

TEST_CASE("redis gateway: a Gateway with a sliding-log rule answers InvalidArgument") {
  GatewayStore store = make_store("gw-kinds-gateway");
  quota::gateway::RuleRegistry registry(
      quota::testing::build(quota::testing::levels_spec(1, SlidingLog{.limit = 3, .window = 60s})));
  quota::gateway::Gateway gw(store, registry);
  auto r = gw.decide(quota::testing::read("acme"), Nanos{0});
  CHECK(r.status().code() == absl::StatusCode::kInvalidArgument);
}
