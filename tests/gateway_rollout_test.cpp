// Tests for the rollout controls of the rule model (quota/gateway/rules/rule_spec.hpp) through
// the Gateway, in-process: a shadow limit beside an enforcing one on the same scope,
// enforce_percent (deterministic by tenant), the global switch (in the set and as a
// call on the registry), and per-request caps (kRequestTooLarge, HTTP 413).
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdint>
#include <string>

#include "quota/gateway/gateway.hpp"
#include "quota/http.hpp"
#include "quota/store/local_store.hpp"
#include "support/gateway_rules.hpp"

using namespace std::chrono_literals;
using quota::Nanos;
using quota::Reason;
using quota::TokenBucket;
using quota::gateway::Gateway;
using quota::gateway::KeyPolicy;
using quota::gateway::Level;
using quota::gateway::Metrics;
using quota::gateway::Outcome;
using quota::gateway::Request;
using quota::gateway::RuleRegistry;
using quota::gateway::RuleSetSpec;
using quota::testing::build;

namespace {

Request read(const std::string& tenant) {
  return {.who = {.tenant = tenant, .plan = "free"}, .route = "read"};
}

// "read" pays 1 on the tenant's "requests" limit (burst `burst`, no refill) and, when
// `candidate` is set, 1 on a second limit "candidate" of burst 2 on the same scope.
RuleSetSpec spec(std::int64_t burst, bool candidate_shadow, int candidate_percent = 100) {
  RuleSetSpec s{.version = 1,
                .routes = {{.name = "read",
                            .costs = {{.limit = "requests", .units = 1},
                                      {.limit = "candidate", .units = 1}}}},
                .rules = {}};
  s.rules.push_back({.level = Level::kTenant,
                     .plan = "free",
                     .name = "requests",
                     .policy = TokenBucket{.rate = {0, 1s}, .burst = burst},
                     .limit = "requests"});
  s.rules.push_back({.level = Level::kTenant,
                     .plan = "free",
                     .name = "candidate",
                     .policy = TokenBucket{.rate = {0, 1s}, .burst = 2},
                     .shadow = candidate_shadow,
                     .limit = "candidate",
                     .enforce_percent = candidate_percent});
  return s;
}

}  // namespace

TEST_CASE("a shadow limit beside an enforcing one: decided and counted, never denies") {
  Metrics metrics;
  RuleRegistry registry(build(spec(5, /*candidate_shadow=*/true), &metrics));
  quota::LocalStore<KeyPolicy> store;
  Gateway gw(store, registry);
  // The candidate (burst 2) would deny the 3rd request; the enforcing limit (5) decides.
  for (int i = 0; i < 5; ++i) {
    auto r = gw.decide(read("acme"), Nanos{0});
    REQUIRE(r.ok());
    CHECK(r->decision.allowed);
    CHECK(r->decision.reason == (i < 2 ? Reason::kAllowed : Reason::kShadow));
  }
  auto sixth = gw.decide(read("acme"), Nanos{0});
  CHECK_FALSE(sixth->decision.allowed);
  CHECK(sixth->rule == "requests");
  std::uint64_t would_deny = 0, candidate_allowed = 0;
  for (const auto& c : metrics.snapshot()) {
    if (c->labels().rule != "candidate") continue;
    would_deny += c->count(Outcome::kShadowWouldDeny);
    candidate_allowed += c->count(Outcome::kAllowed);
  }
  CHECK(candidate_allowed == 2);
  CHECK(would_deny == 3);  // requests 3..5 (the 6th was denied before the candidate)
}

TEST_CASE("enforce_percent enforces on a fixed share of tenants, the same ones every time") {
  constexpr int kTenants = 400;
  for (const int percent : {0, 25, 100}) {
    INFO("enforce_percent " << percent);
    RuleRegistry registry(build(spec(10, /*candidate_shadow=*/false, percent)));
    quota::LocalStore<KeyPolicy> store;
    Gateway gw(store, registry);
    int enforced = 0;
    for (int t = 0; t < kTenants; ++t) {
      const std::string tenant = "tenant-" + std::to_string(t);
      for (int i = 0; i < 2; ++i) REQUIRE(gw.decide(read(tenant), Nanos{0})->decision.allowed);
      auto third = gw.decide(read(tenant), Nanos{0});
      REQUIRE(third.ok());
      // In: the candidate denies the third request. Out: it is shadow and lets it pass.
      const bool in = quota::gateway::rollout_bucket(tenant) < percent;
      CHECK(third->decision.allowed == !in);
      CHECK(third->decision.reason == (in ? Reason::kOverLimit : Reason::kShadow));
      enforced += in ? 1 : 0;
    }
    if (percent == 0) CHECK(enforced == 0);
    if (percent == 100) CHECK(enforced == kTenants);
    if (percent == 25) {
      CHECK(enforced > kTenants * 15 / 100);
      CHECK(enforced < kTenants * 35 / 100);
    }
  }
  // The bucket is a fixed function of the tenant id: raising the percentage keeps every
  // tenant already in.
  CHECK(quota::gateway::rollout_bucket("acme") == quota::gateway::rollout_bucket("acme"));
  CHECK(quota::gateway::rollout_bucket("acme") >= 0);
  CHECK(quota::gateway::rollout_bucket("acme") < 100);
}

TEST_CASE("the global switch turns every limit to shadow and back, in the set or as a call") {
  SECTION("as a call on the registry") {
    RuleRegistry registry(build(spec(2, /*candidate_shadow=*/false)));
    quota::LocalStore<KeyPolicy> store;
    Gateway gw(store, registry);
    for (int i = 0; i < 2; ++i) REQUIRE(gw.decide(read("acme"), Nanos{0})->decision.allowed);
    CHECK_FALSE(gw.decide(read("acme"), Nanos{0})->decision.allowed);
    registry.set_shadow_all(true);
    auto shadowed = gw.decide(read("acme"), Nanos{0});
    CHECK(shadowed->decision.allowed);
    CHECK(shadowed->decision.reason == Reason::kShadow);
    registry.set_shadow_all(false);
    CHECK_FALSE(gw.decide(read("acme"), Nanos{0})->decision.allowed);
  }
  SECTION("in the rule set") {
    RuleSetSpec s = spec(2, /*candidate_shadow=*/false);
    s.shadow_all = true;
    RuleRegistry registry(build(s));
    quota::LocalStore<KeyPolicy> store;
    Gateway gw(store, registry);
    for (int i = 0; i < 4; ++i) {
      auto r = gw.decide(read("acme"), Nanos{0});
      CHECK(r->decision.allowed);
      CHECK(r->decision.reason == (i < 2 ? Reason::kAllowed : Reason::kShadow));
    }
    // Shadow deducts nothing where it would deny: back to enforcing, the budget is as the
    // two admitted requests left it.
    s.shadow_all = false;
    s.version = 2;
    REQUIRE(registry.publish(build(s)).ok());
    CHECK_FALSE(gw.decide(read("acme"), Nanos{0})->decision.allowed);
  }
}

TEST_CASE("a request over its cap is request_too_large (413), nothing deducted") {
  RuleSetSpec s{.version = 1,
                .routes = {{.name = "complete",
                            .costs = {{.limit = "tokens", .units = 1, .estimate = true}},
                            .max_cost = 0}},
                .rules = {}};
  s.rules.push_back({.level = Level::kTenant,
                     .plan = "free",
                     .name = "tokens",
                     .policy = TokenBucket{.rate = {0, 1s}, .burst = 1'000},
                     .limit = "tokens",
                     .max_cost = 100});  // 10 % of the budget per request
  RuleRegistry registry(build(s));
  quota::LocalStore<KeyPolicy> store;
  Gateway gw(store, registry);
  const Request req{.who = {.tenant = "acme", .plan = "free"}, .route = "complete"};
  auto big = gw.acquire_estimate(req, 101, Nanos{0});
  REQUIRE(big.ok());
  CHECK_FALSE(big->decision.allowed);
  CHECK(big->decision.reason == Reason::kRequestTooLarge);
  CHECK(big->decision.retry_after == quota::kNever);
  CHECK(big->request_cap == 100);
  CHECK(big->rule == "tokens");
  CHECK_FALSE(big->ticket.has_value());
  auto policy = quota::http::describe("tokens", TokenBucket{.rate = {0, 1s}, .burst = 1'000});
  REQUIRE(policy.ok());
  const quota::http::Answer a = quota::http::answer(big->decision, *policy);
  CHECK(a.status == 413);
  CHECK(a.reason == "request_too_large");
  // Nothing was deducted: ten requests of exactly the cap empty the budget.
  for (int i = 0; i < 10; ++i) REQUIRE(gw.acquire_estimate(req, 100, Nanos{0})->decision.allowed);
  CHECK_FALSE(gw.acquire_estimate(req, 1, Nanos{0})->decision.allowed);

  SECTION("a route class's cap applies to every budget it pays") {
    RuleSetSpec r = s;
    r.version = 2;
    r.rules[0].max_cost = 0;
    r.routes[0].max_cost = 50;
    RuleRegistry routed(build(r));
    quota::LocalStore<KeyPolicy> fresh;
    Gateway g2(fresh, routed);
    auto over = g2.acquire_estimate(req, 51, Nanos{0});
    CHECK(over->decision.reason == Reason::kRequestTooLarge);
    CHECK(over->request_cap == 50);
    CHECK(over->rule == "complete");
    CHECK(g2.acquire_estimate(req, 50, Nanos{0})->decision.allowed);
  }
}
