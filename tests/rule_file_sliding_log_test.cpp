// Tests for examples/rules/sliding-log.yaml loaded with quota::rules::load_rule_file: the
// rule file's "at most 100 searches in any 60 seconds" holds as written, through Gateway.
#include <catch2/catch.hpp>
#include <chrono>
#include <string>
#include <variant>

#include "quota/gateway/gateway.hpp"
#include "quota/rules/rule_file.hpp"
#include "quota/store/local_store.hpp"
#include "quota/store/sharded_store.hpp"
#include "support/rule_files.hpp"

using namespace std::chrono_literals;
using quota::Nanos;
using quota::gateway::KeyPolicy;

TEMPLATE_TEST_CASE("sliding-log.yaml: at most 100 searches per tenant in any 60 s", "",
                   quota::LocalStore<KeyPolicy>, quota::ShardedStore<KeyPolicy>) {
  auto set =
      quota::rules::load_rule_file(std::string(QUOTA_RULES_EXAMPLES_DIR) + "/sliding-log.yaml");
  if (!set.ok()) FAIL(quota::testing::message(set.status()));
  const auto* rule =
      (*set)->find(quota::gateway::Level::kTenant, {.tenant = "acme", .plan = "free"}, "search");
  REQUIRE(rule != nullptr);
  CHECK(std::holds_alternative<quota::SlidingLog>(rule->policy));
  quota::gateway::RuleRegistry registry(*set);
  TestType store;
  quota::gateway::Gateway gw(store, registry);
  const quota::gateway::Request search{.who = {.tenant = "acme", .plan = "free"},
                                       .route = "search"};
  const quota::gateway::Request other{.who = {.tenant = "globex", .plan = "free"},
                                      .route = "search"};
  auto run = [&](const quota::gateway::Request& req, Nanos t, int n) {
    int allowed = 0;
    for (int i = 0; i < n; ++i) {
      auto r = gw.decide(req, t);
      REQUIRE(r.ok());
      allowed += r->decision.allowed;
    }
    return allowed;
  };
  CHECK(run(search, 0s, 50) == 50);
  CHECK(run(search, 59s, 60) == 50);  // 100 in (−1 s, 59 s]
  auto d = gw.decide(search, 59'999ms);
  REQUIRE(d.ok());
  CHECK_FALSE(d->decision.allowed);
  CHECK(d->decision.retry_after == 1ms);  // the 50 of 0 s leave at exactly 60 s
  CHECK(d->rule == "search-any-minute");
  // A fixed window of 60 s would start afresh at 60 s with 100; the log frees only the 50
  // of 0 s, and the 50 of 59 s count until 119 s.
  CHECK(run(search, 60s, 100) == 50);
  CHECK(run(search, 119s - 1ns, 10) == 0);
  CHECK(run(search, 119s, 100) == 50);
  // Per tenant: another tenant of the plan has its own 100.
  CHECK(run(other, 60s, 150) == 100);
}
