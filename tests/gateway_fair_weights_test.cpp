// Weighted fair shares of a global budget through the Gateway, in-process: the rule's
// weights (FairShareSpec::weights, fair/tenant_weights.hpp) give constrained tenants shares
// in their ratio, period after period, with Σ shares ≤ budget − reserve at every
// allocation; a lone tenant of any weight still reaches the whole budget; bad weights are
// refused by RuleSet::create and by FairShare, naming the field. Over Redis:
// redis_gateway_fair_shared_test.cpp; in rule files: rule_file_fair_share_test.cpp.
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "quota/fair/fair_share.hpp"
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

// Route "call" (the request's cost): plan "free" has no tenant limit to speak of;
// everyone shares "global" (a bucket that never runs out here) with `fair`.
RuleSetSpec weighted_spec(FairShareSpec fair) {
  return quota::testing::fair_share_spec("global", std::move(fair));
}

// 1,000 units per 1 s period (reserve 10 %: shares of 900); w1 weight 1, w3 weight 3, any
// other tenant weight_default 2.
FairShareSpec weighted(quota::fair::TenantWeights w = {.default_weight = 2,
                                                       .by_tenant = {{"w1", 1}, {"w3", 3}}}) {
  return {.enabled = true, .period = 1s, .budget = 1'000, .weights = std::move(w)};
}

struct WeightedGateway {
  explicit WeightedGateway(RuleSetSpec s)
      : registry(quota::testing::build(std::move(s))), gw(store, registry) {}
  bool admits(const std::string& tenant, std::int64_t units, Nanos t) {
    auto r =
        gw.decide({.who = {.tenant = tenant, .plan = "free"}, .route = "call", .cost = units}, t);
    REQUIRE(r.ok());
    return r->decision.allowed;
  }
  quota::gateway::RuleRegistry registry;
  quota::LocalStore<quota::gateway::KeyPolicy> store;
  quota::gateway::Gateway gw;
};

}  // namespace

TEST_CASE("weights from the rule: constrained tenants get shares in the ratio 1 : 2 : 3") {
  WeightedGateway g(weighted_spec(weighted()));
  // Period 0: w1 alone takes the whole budget; w2 and w3 ask 1,000 each, paused.
  for (int i = 0; i < 10; ++i) CHECK(g.admits("w1", 100, Nanos{0}));
  for (int i = 0; i < 10; ++i) {
    CHECK_FALSE(g.admits("w2", 100, 1ms));
    CHECK_FALSE(g.admits("w3", 100, 1ms));
  }
  // From period 1 every tenant asks 600 per period (60 requests of 10, in turns), more
  // than its share: all three constrained, 900 split 1 : 2 : 3 = 150, 300, 450, in
  // every period (the units of the period before leave as new ones come in).
  const std::vector<std::string> tenants{"w1", "w2", "w3"};
  for (int p = 1; p <= 5; ++p) {
    std::vector<std::int64_t> got(3, 0);
    for (int step = 0; step < 60; ++step) {
      for (std::size_t k = 0; k < tenants.size(); ++k)
        got[k] += g.admits(tenants[k], 10, p * 1s + step * 1ms) ? 10 : 0;
    }
    INFO("period " << p);
    CHECK(got == std::vector<std::int64_t>{150, 300, 450});
    const auto stats = g.gw.fair_shares();
    REQUIRE(stats.size() == 1);
    REQUIRE(stats[0].last.has_value());
    CHECK(stats[0].last->share_sum == 900);  // = budget − reserve, never more
    CHECK(stats[0].last->constrained == 3);
    CHECK(stats[0].max_share_sum <= stats[0].config.share_capacity());
    REQUIRE(stats[0].tenants.size() == 3);
    for (std::size_t k = 0; k < 3; ++k) {
      CHECK(stats[0].tenants[k].tenant == tenants[k]);
      CHECK(stats[0].tenants[k].weight == static_cast<std::int64_t>(k + 1));
      CHECK(stats[0].tenants[k].share == 150 * static_cast<std::int64_t>(k + 1));
    }
  }
  CHECK(g.gw.fair_shares()[0].allocation_errors == 0);
}

TEST_CASE("a lone weighted tenant still reaches the whole budget") {
  for (const char* solo : {"w1", "w3", "anyone"}) {
    INFO(solo);
    WeightedGateway g(weighted_spec(weighted()));
    for (int p = 0; p < 3; ++p) {
      std::int64_t got = 0;
      for (int i = 0; i < 12; ++i) got += g.admits(solo, 100, p * 1s + i * 1ms) ? 100 : 0;
      CHECK(got == 1'000);  // the budget, no cap at its weight's share
    }
  }
}

TEST_CASE("bad weights are refused, naming the field") {
  struct Bad {
    quota::fair::TenantWeights weights;
    std::string error;
  };
  const std::vector<Bad> bad = {
      {{.default_weight = 0},
       "rules[1]: fair_share.weight_default is 0; a weight must be a "
       "whole number in [1, 4294967296]"},
      {{.by_tenant = {{"acme", -3}}}, "rules[1]: fair_share.weights.acme is -3"},
      {{.by_tenant = {{"acme", quota::fair::kMaxWeight + 1}}},
       "rules[1]: fair_share.weights.acme is 4294967297"},
  };
  for (const Bad& b : bad) {
    auto set = quota::gateway::RuleSet::create(weighted_spec(weighted(b.weights)), nullptr);
    REQUIRE_FALSE(set.ok());
    INFO(set.status().message());
    CHECK(set.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK(absl::StartsWith(set.status().message(), b.error));
  }
  // The allocator itself, built with bad weights, refuses every request, naming them.
  quota::fair::FairShare fs(*quota::fair::FairShareConfig{.budget = 100}.checked(),
                            {.by_tenant = {{"acme", 0}}});
  auto d = fs.request("globex", 1);
  REQUIRE_FALSE(d.ok());
  CHECK(absl::StartsWith(d.status().message(), "FairShare.weights.acme is 0"));
  // Good ones are taken as given.
  quota::fair::FairShare ok(*quota::fair::FairShareConfig{.budget = 100}.checked(),
                            {.default_weight = 5, .by_tenant = {{"acme", 2}}});
  REQUIRE(ok.request("acme", 1).ok());
  REQUIRE(ok.request("globex", 1).ok());
  const auto snap = ok.snapshot();
  REQUIRE(snap.size() == 2);
  CHECK(snap[0].weight == 2);
  CHECK(snap[1].weight == 5);
}
