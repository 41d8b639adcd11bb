// A tenant new at one holder of a fair-share budget shared over several holders
// (gateway/fair_share/fair_limits.hpp with a FairAsksExchange): at the allocation after its first
// asks here it gets a provisional part (fair/holder_split.hpp, newcomer_parts) instead of
// nothing, cut from this holder's other parts, and Σ shares here stays within what the
// view left this holder. The exchange is a fixed view in process; over Redis the same
// path runs in redis_gateway_fair_shared_test.cpp.
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "quota/gateway/gateway.hpp"
#include "quota/store/local_store.hpp"
#include "support/gateway_rules.hpp"

using namespace std::chrono_literals;
using quota::Nanos;
using quota::TokenBucket;
using quota::gateway::FairShareSpec;
using quota::gateway::Level;
using quota::gateway::RuleSetSpec;

namespace {

// Every holder reports "old" asking 3,000, all of it at this holder: the budget (3,000,
// capacity 2,700) is saturated by it.
struct FixedView final : quota::gateway::FairAsksExchange {
  absl::StatusOr<quota::gateway::FairAsksView> exchange(
      std::string_view, Nanos, std::int64_t, std::span<const std::pair<std::string, std::int64_t>>,
      std::int64_t) override {
    return quota::gateway::FairAsksView{
        .tenants = {{.tenant = "old", .total = 3'000, .local = 3'000}}, .late = false};
  }
};

RuleSetSpec newcomer_spec() {
  return quota::testing::fair_share_spec(
      "global", FairShareSpec{.enabled = true, .period = 1s, .budget = 3'000});
}

}  // namespace

TEST_CASE("a tenant new at a holder gets a provisional part at the next allocation") {
  quota::gateway::RuleRegistry registry(quota::testing::build(newcomer_spec()));
  quota::LocalStore<quota::gateway::KeyPolicy> store;
  quota::gateway::Gateway gw(
      store, registry,
      {.fair_share_holders = 3, .fair_share_exchange = std::make_shared<FixedView>()});
  const auto admitted = [&](const std::string& tenant, int requests, Nanos from) {
    std::int64_t got = 0;
    for (int i = 0; i < requests; ++i) {
      auto r = gw.decide({.who = {.tenant = tenant, .plan = "free"}, .route = "call", .cost = 50},
                         from + i * 1ms);
      REQUIRE(r.ok());
      got += r->decision.allowed ? 50 : 0;
    }
    return got;
  };
  // Period 0: "new" is not in the view and has no part: below the water level (old is
  // held to its 2,700 here), it may borrow up to the level, 2,700; it asks 600.
  CHECK(admitted("new", 12, Nanos{0}) == 600);
  // Period 1: new asked 600 here last period and has no local asks in the view: a
  // provisional part of min(600, ⌊900 · 1 / 2⌋) = 450 (F = 1,000 − 100; weights old 1,
  // new 1), cut from old's part here (no slack: old's share is the whole 2,700).
  CHECK(admitted("new", 12, 1s + 100ms) == 450);
  const auto stats = gw.fair_shares();
  REQUIRE(stats.size() == 1);
  REQUIRE(stats[0].last.has_value());
  CHECK(stats[0].last->share_sum == 2'700);  // 2,250 + 450: within budget − reserve
  CHECK(stats[0].last->constrained == 2);
  REQUIRE(stats[0].tenants.size() == 2);
  CHECK(stats[0].tenants[0].tenant == "new");
  CHECK(stats[0].tenants[0].share == 450);
  CHECK(stats[0].tenants[1].tenant == "old");
  CHECK(stats[0].tenants[1].share == 2'250);
  CHECK(stats[0].exchange_failures == 0);
}
