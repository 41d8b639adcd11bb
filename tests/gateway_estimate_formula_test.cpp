// A route's estimate formula (quota/gateway/rules/estimate_formula.hpp): prompt tokens ×
// factor + max output, computed exactly on the edges — a factor that does not divide
// rounded up, max output 0, prompts so large the product needs 128 bits — and refused,
// naming the route and the field, when a request lacks what its route needs; then an
// estimate from a route's formula deducted and settled through a Gateway.
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdint>
#include <limits>
#include <string>

#include "quota/gateway/gateway.hpp"
#include "quota/gateway/rules/estimate_formula.hpp"
#include "quota/store/local_store.hpp"

using quota::gateway::estimate_of;
using quota::gateway::EstimateFormula;

namespace {

constexpr EstimateFormula kThreeHalves{.numerator = 3, .denominator = 2};

std::string error_of(const absl::StatusOr<std::int64_t>& r) {
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().code() == absl::StatusCode::kInvalidArgument);
  return std::string(r.status().message());
}

}  // namespace

TEST_CASE("an estimate is prompt tokens × factor, rounded up, + max output, exactly") {
  CHECK(*estimate_of("chat", kThreeHalves, 1000, 256) == 1500 + 256);
  CHECK(*estimate_of("chat", kThreeHalves, 1001, 256) == 1502 + 256);          // 1501.5 rounded up
  CHECK(*estimate_of("chat", kThreeHalves, 1, 0) == 2);                        // max output 0
  CHECK(*estimate_of("chat", kThreeHalves, 0, 7) == 7);                        // no prompt
  CHECK(*estimate_of("chat", {.numerator = 1, .denominator = 3}, 2, 0) == 1);  // 2/3 → 1
  CHECK(*estimate_of("chat", {.numerator = 4, .denominator = 1}, 5, 1) == 21);
  // A factor below 1 that does not divide: 999,999 × 1/1,000,000 rounds up to 1.
  CHECK(*estimate_of("chat", {.numerator = 1, .denominator = 1'000'000}, 999'999, 0) == 1);
  // The largest cost exactly: kMaxUnits from the prompt alone, and from max output alone.
  CHECK(*estimate_of("chat", {.numerator = 1, .denominator = 1}, quota::kMaxUnits, 0) ==
        quota::kMaxUnits);
  CHECK(*estimate_of("chat", kThreeHalves, 0, quota::kMaxUnits) == quota::kMaxUnits);
}

TEST_CASE(
    "huge prompts: the product is exact in 128 bits, an estimate over the largest cost refused") {
  const std::int64_t huge = std::numeric_limits<std::int64_t>::max();
  const EstimateFormula big{.numerator = quota::gateway::kMaxFactorPart,
                            .denominator = quota::gateway::kMaxFactorPart};
  // INT64_MAX × 10^6 / 10^6 overflows 64 bits on the way and is INT64_MAX exactly: still
  // more than the largest cost.
  CHECK(error_of(estimate_of("chat", big, huge, 0)) ==
        "route \"chat\" estimates prompt_tokens * 1000000/1000000 + max_output: the estimate "
        "exceeds the largest cost, " +
            std::to_string(quota::kMaxUnits) + " units");
  // A huge prompt × a tiny factor: the largest cost exactly, rounded up from just below it;
  // INT64_MAX × 1/10^6 is one unit over.
  const EstimateFormula tiny{.numerator = 1, .denominator = quota::gateway::kMaxFactorPart};
  CHECK(*estimate_of("chat", tiny, quota::kMaxUnits * 1'000'000 - 1, 0) == quota::kMaxUnits);
  CHECK_FALSE(estimate_of("chat", tiny, huge, 0).ok());
  CHECK_FALSE(estimate_of("chat", kThreeHalves, quota::kMaxUnits, 1).ok());
  CHECK_FALSE(estimate_of("chat", kThreeHalves, 0, huge).ok());
}

TEST_CASE("a request without what its route's formula needs is refused, naming the field") {
  CHECK(error_of(estimate_of("chat", kThreeHalves, std::nullopt, 10)) ==
        "route \"chat\" estimates prompt_tokens * 3/2 + max_output: prompt_tokens is missing");
  CHECK(error_of(estimate_of("chat", kThreeHalves, 10, std::nullopt)) ==
        "route \"chat\" estimates prompt_tokens * 3/2 + max_output: max_output is missing");
  CHECK(error_of(estimate_of("chat", kThreeHalves, -1, 10)) ==
        "route \"chat\" estimates prompt_tokens * 3/2 + max_output: prompt_tokens -1 is negative");
  CHECK(error_of(estimate_of("chat", kThreeHalves, 1, -5)) ==
        "route \"chat\" estimates prompt_tokens * 3/2 + max_output: max_output -5 is negative");
  CHECK(error_of(estimate_of("chat", kThreeHalves, 0, 0)) ==
        "route \"chat\" estimates prompt_tokens * 3/2 + max_output: the estimate is 0 units; a "
        "request costs at least 1");
  CHECK(error_of(estimate_of("read", EstimateFormula{}, 10, 10)) ==
        "route \"read\" has no estimate formula (prompt_factor)");
  CHECK(error_of(estimate_of("chat", {.numerator = 4, .denominator = 1}, std::nullopt, 1)) ==
        "route \"chat\" estimates prompt_tokens * 4 + max_output: prompt_tokens is missing");
}

TEST_CASE("a factor outside [1, 10^6] is refused when the rule set is built") {
  CHECK_FALSE((EstimateFormula{.numerator = 0, .denominator = 2}.validate().ok()));
  CHECK_FALSE((EstimateFormula{.numerator = 3, .denominator = 0}.validate().ok()));
  CHECK_FALSE((EstimateFormula{.numerator = 1'000'001, .denominator = 1}.validate().ok()));
  CHECK(EstimateFormula{}.validate().ok());
  quota::gateway::RuleSetSpec spec;
  spec.routes = {{.name = "chat", .estimate_formula = {.numerator = 3, .denominator = 0}}};
  auto set = quota::gateway::RuleSet::create(spec);
  REQUIRE_FALSE(set.ok());
  CHECK(set.status().message() ==
        "routes[0]: prompt_factor 3/0: each part must be in [1, 1000000]");
}

TEST_CASE("a route's formula gives the estimate a Gateway deducts and settles") {
  quota::gateway::RuleSetSpec spec;  // prompt_factor: 3/2 in a rule file (rule_file_test.cpp)
  spec.routes = {{.name = "chat", .estimate_formula = kThreeHalves}};
  spec.rules.push_back(
      {.level = quota::gateway::Level::kTenant,
       .plan = "pro",
       .route = "chat",
       .name = "tokens",
       .policy = quota::FixedWindow{.limit = 10000, .window = std::chrono::minutes(1)}});
  auto rules = quota::gateway::RuleSet::create(spec);
  REQUIRE(rules.ok());
  quota::LocalStore<quota::gateway::KeyPolicy> store;
  quota::gateway::RuleRegistry registry(*rules);
  quota::gateway::Gateway gateway(store, registry);
  const quota::gateway::Request req{.who = {.tenant = "acme", .plan = "pro"}, .route = "chat"};
  auto route = (*rules)->route("chat");
  REQUIRE(route.ok());
  auto estimate = estimate_of("chat", (*route)->estimate_formula, 3001, 1000);
  REQUIRE(estimate.ok());
  CHECK(*estimate == 4502 + 1000);
  auto acquired = gateway.acquire_estimate(req, *estimate, quota::Nanos{0});
  REQUIRE(acquired.ok());
  CHECK(acquired->decision.allowed);
  CHECK(acquired->decision.remaining == 10000 - 5502);
  REQUIRE(acquired->ticket.has_value());
  auto settled = gateway.settle("acme", *acquired->ticket, 4000, quota::Nanos{1});
  REQUIRE(settled.ok());
  CHECK(settled->surplus == 1502);
  // The surplus is back: a second estimate of 5502 fits (10000 - 4000 = 6000 left).
  auto again = gateway.acquire_estimate(req, *estimate, quota::Nanos{2});
  REQUIRE(again.ok());
  CHECK(again->decision.allowed);
  CHECK(again->decision.remaining == 6000 - 5502);
}
