// The `fair_share` option of a rule in a rule file (quota/rules/fair_share_field.hpp) into
// the rule set (quota/gateway/fair_share/fair_share_spec.hpp), and its errors: each names the file,
// line, column and field, whether the parser or RuleSet::create finds it; and the example
// examples/rules/fair-share.yaml through a Gateway.
#include <chrono>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <catch2/catch.hpp>

#include "absl/strings/match.h"
#include "quota/gateway/gateway.hpp"
#include "quota/rules/rule_file.hpp"
#include "quota/store/local_store.hpp"

using namespace std::chrono_literals;
using quota::gateway::Level;

namespace {

// A global rule "provider" on limit "tokens" (4,000,000 tokens/min) with `fair` on line 9,
// and a tenant rule; `level` is the provider rule's level.
std::string provider(const std::string& fair, const std::string& level = "global") {
  std::string plan = level == "global" ? "" : "    plan: free\n";
  return "routes:\n  - {name: chat, costs: {tokens: estimate}}\nrules:\n"
         "  - name: provider\n    level: " +
         level + "\n" + plan +
         "    limit: tokens\n    token_bucket: {rate: 4000000/1min, burst: 1000000}\n" + fair +
         "  - {name: free, level: tenant, plan: free, limit: tokens,"
         " token_bucket: {rate: 100000/1min, burst: 100000}}\n";
}

const quota::gateway::Rule* provider_rule(const std::shared_ptr<const quota::gateway::RuleSet>& s) {
  return s->find(Level::kGlobal, {.tenant = "acme", .plan = "free"}, "", "tokens");
}

}  // namespace

TEST_CASE("a rule file's fair_share reaches the global rule, defaults filled in") {
  auto set = quota::rules::load_rules(
      provider("    fair_share: {reserve: 10%, shares_above: 72.5%, pause_above: 95%, "
               "period: 10s}\n"),
      "fair.yaml", nullptr);
  INFO(set.status().ToString());
  REQUIRE(set.ok());
  const auto* rule = provider_rule(*set);
  REQUIRE(rule != nullptr);
  CHECK(rule->fair_share.enabled);
  CHECK(rule->fair_share.reserve_permille == 100);
  CHECK(rule->fair_share.shares_above_permille == 725);
  CHECK(rule->fair_share.pause_above_permille == 950);
  CHECK(rule->fair_share.period == 10s);
  CHECK(rule->fair_share.budget_for(rule->policy) == 666'666);  // 4,000,000/min × 10 s
  const auto c = rule->fair_share.config(rule->policy, 3);      // three holders
  CHECK(c.budget == 222'222);
  CHECK(c.share_capacity() == 199'999);

  auto defaults = quota::rules::load_rules(provider("    fair_share: {budget: 500000}\n"),
                                           "fair.yaml", nullptr);
  REQUIRE(defaults.ok());
  const auto* d = provider_rule(*defaults);
  REQUIRE(d != nullptr);
  CHECK(d->fair_share.enabled);
  CHECK(d->fair_share.reserve_permille == 100);
  CHECK(d->fair_share.shares_above_permille == 700);
  CHECK(d->fair_share.pause_above_permille == 900);
  CHECK(d->fair_share.period == 10s);
  CHECK(d->fair_share.budget_for(d->policy) == 500'000);

  auto off = quota::rules::load_rules(provider(""), "fair.yaml", nullptr);
  REQUIRE(off.ok());
  CHECK_FALSE(provider_rule(*off)->fair_share.enabled);
}

TEST_CASE(
    "a rule file's fair_share weights reach the rule: named tenants, the rest weight_default") {
  auto set = quota::rules::load_rules(
      provider("    fair_share: {weight_default: 2, weights: {tenant-a: 3, \"tenant b\": 1}}\n"),
      "fair.yaml", nullptr);
  INFO(set.status().ToString());
  REQUIRE(set.ok());
  const auto* rule = provider_rule(*set);
  REQUIRE(rule != nullptr);
  CHECK(rule->fair_share.weights.default_weight == 2);
  CHECK(rule->fair_share.weights.of("tenant-a") == 3);
  CHECK(rule->fair_share.weights.of("tenant b") == 1);
  CHECK(rule->fair_share.weights.of("anyone") == 2);
  auto plain = quota::rules::load_rules(provider("    fair_share: {}\n"), "fair.yaml", nullptr);
  REQUIRE(plain.ok());
  CHECK(provider_rule(*plain)->fair_share.weights == quota::fair::TenantWeights{});
}

TEST_CASE("a bad fair_share weight is an error at its line, column and field") {
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"    fair_share: {weights: {acme: 0}}\n",
       "8:34: rules[0].fair_share.weights.acme: 0 is out of range: it must be in [1, "
       "4294967296]"},
      {"    fair_share: {weights: {acme: -2}}\n",
       "8:34: rules[0].fair_share.weights.acme: -2 is out of range: it must be in [1, "
       "4294967296]"},
      {"    fair_share: {weights: {acme: 4294967297}}\n",
       "8:34: rules[0].fair_share.weights.acme: 4294967297 is out of range"},
      {"    fair_share: {weights: {acme: heavy}}\n",
       "8:34: rules[0].fair_share.weights.acme: expected an integer (whole number), got "
       "\"heavy\""},
      {"    fair_share: {weights: {acme: \"3\"}}\n",
       "8:34: rules[0].fair_share.weights.acme: expected an integer, got the quoted string "
       "\"3\""},
      {"    fair_share: {weights: {acme: 1.5}}\n",
       "8:34: rules[0].fair_share.weights.acme: expected an integer (whole number), got "
       "\"1.5\""},
      {"    fair_share: {weights: [acme, 3]}\n",
       "8:27: rules[0].fair_share.weights: expected a mapping of tenant ids to weights, such as "
       "{acme: 3}, got a sequence"},
      {"    fair_share: {weights: {acme: 3, acme: 2}}\n",
       "8:37: rules[0].fair_share.weights.acme: tenant given twice"},
      {"    fair_share: {weight_default: 0}\n",
       "8:34: rules[0].fair_share.weight_default: 0 is out of range: it must be in [1, "
       "4294967296]"},
      {"    fair_share: {weight_default: [2]}\n",
       "8:34: rules[0].fair_share.weight_default: expected an integer, got a sequence"},
      {"    fair_share: {weight: {acme: 3}}\n",
       "8:18: rules[0].fair_share.weight: unknown field \"weight\"; allowed: reserve, "
       "shares_above, pause_above, period, budget, weight_default, weights"},
  };
  for (const auto& [fair, error] : bad) {
    INFO(fair);
    auto s = quota::rules::load_rules(provider(fair), "bad.yaml", nullptr);
    REQUIRE_FALSE(s.ok());
    INFO(s.status().message());
    CHECK(s.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK(absl::StartsWith(s.status().message(), "bad.yaml:" + error));
  }
}

TEST_CASE("a bad fair_share is an error at its line, column and field") {
  struct Bad {
    const char* what;
    std::string yaml;
    std::string error;  // after "bad.yaml:"; a prefix
  };
  const std::vector<Bad> bad = {
      {"an unknown field", provider("    fair_share: {reserve: 10%, pauses: 90%}\n"),
       "8:32: rules[0].fair_share.pauses: unknown field \"pauses\"; allowed: reserve, "
       "shares_above, pause_above, period, budget"},
      {"a percentage without %", provider("    fair_share: {reserve: 10}\n"),
       "8:27: rules[0].fair_share.reserve: expected a percentage such as 10% or 72.5%"},
      {"a percentage above 100%", provider("    fair_share: {pause_above: 101%}\n"),
       "8:31: rules[0].fair_share.pause_above: expected a percentage"},
      {"two decimals", provider("    fair_share: {shares_above: 70.25%}\n"),
       "8:32: rules[0].fair_share.shares_above: expected a percentage"},
      {"a bad period", provider("    fair_share: {period: 10}\n"),
       "8:26: rules[0].fair_share.period: expected a duration"},
      {"not a mapping", provider("    fair_share: on\n"),
       "8:17: rules[0].fair_share: expected {reserve, shares_above, pause_above, period, "
       "budget, weight_default, weights}, got \"on\""},
      {"on a tenant rule (RuleSet::create)", provider("    fair_share: {}\n", "tenant"),
       "9:17: rules[0].fair_share: fair_share applies only to a budget shared by tenants"},
      {"shares above the pause (RuleSet::create)",
       provider("    fair_share: {shares_above: 95%, pause_above: 90%}\n"),
       "8:50: rules[0].fair_share.pause_above: fair_share.pause_above is 90%; it must be in "
       "[shares_above (95%), 100%]"},
      {"a pause cutting into the shares (RuleSet::create)",
       provider("    fair_share: {reserve: 5%, pause_above: 90%}\n"),
       "8:44: rules[0].fair_share.pause_above: fair_share.pause_above is 90%; it must be >= "
       "100% - reserve (95%)"},
      {"a reserve of 100% (RuleSet::create)", provider("    fair_share: {reserve: 100%}\n"),
       "8:27: rules[0].fair_share.reserve: fair_share.reserve is 100%; it must be in [0%, 100%)"},
      {"a period too short for one unit (RuleSet::create)",
       provider("    fair_share: {period: 1ns}\n"),
       "8:26: rules[0].fair_share.period: fair_share.period gives a budget (the policy's rate "
       "x period) of 0 units"},
      {"a zero period (RuleSet::create)", provider("    fair_share: {period: 0s}\n"),
       "8:26: rules[0].fair_share.period: fair_share.period must be positive"},
  };
  for (const Bad& b : bad) {
    INFO(b.what << "\n" << b.yaml);
    auto s = quota::rules::load_rules(b.yaml, "bad.yaml", nullptr);
    REQUIRE_FALSE(s.ok());
    INFO(s.status().message());
    CHECK(s.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK(absl::StartsWith(s.status().message(), "bad.yaml:" + b.error));
  }
}

TEST_CASE("fair-share.yaml: a lone tenant takes the period's budget, then everyone is paused") {
  auto set =
      quota::rules::load_rule_file(std::string(QUOTA_RULES_EXAMPLES_DIR) + "/fair-share.yaml");
  INFO(set.status().ToString());
  REQUIRE(set.ok());
  quota::gateway::RuleRegistry registry(*set);
  quota::LocalStore<quota::gateway::KeyPolicy> store;
  quota::gateway::Gateway gw(store, registry);
  const auto chat = [&](const char* tenant, std::int64_t tokens, quota::Nanos t) {
    auto r =
        gw.decide({.who = {.tenant = tenant, .plan = "free"}, .route = "chat", .cost = tokens}, t);
    REQUIRE(r.ok());
    return *r;
  };
  // Alone: 666,666 tokens per 10 s period, no cap at 70 % or 90 %.
  for (int i = 0; i < 6; ++i) CHECK(chat("acme", 111'111, quota::Nanos{0}).decision.allowed);
  const auto full = chat("acme", 1, quota::Nanos{0});
  CHECK(full.decision.reason == quota::Reason::kPaused);
  CHECK(full.rule == "provider");
  // Another tenant arrives while the budget is borrowed: paused, 429, until the units
  // leave at 10 s.
  const auto late = chat("globex", 1'000, 5s);
  CHECK(late.decision.reason == quota::Reason::kPaused);
  CHECK(late.decision.retry_after == 5s);
  CHECK(chat("globex", 1'000, 10s).decision.allowed);
}
