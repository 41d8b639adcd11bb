// The `lease` option of a rule in a rule file (quota/rules/rule_parser.hpp) into the
// rule set (quota/gateway/leases/lease_spec.hpp). Its errors are in rule_file_errors_test.cpp.
#include <chrono>
#include <string>

#include <catch2/catch.hpp>

#include "quota/rules/rule_file.hpp"

using namespace std::chrono_literals;
using quota::gateway::LeaseMode;
using quota::gateway::Level;

TEST_CASE("a rule file's lease options reach the rules") {
  const std::string text = R"(version: 3
routes: [{name: read}]
rules:
  - name: global
    level: global
    route: read
    token_bucket: {rate: 10000/s, burst: 2000}
    lease: {mode: on, units: 500, expiry: 2s, low_water: 100, revoke: at_once}
  - name: free
    level: tenant
    plan: free
    route: read
    token_bucket: {rate: 100/s, burst: 100}
    lease: {mode: auto, units: 20, auto_rate: 50}
  - name: user
    level: user
    plan: free
    route: read
    token_bucket: {rate: 10/s, burst: 10}
)";
  auto set = quota::rules::load_rules(text, "lease.yaml");
  INFO(set.status().ToString());
  REQUIRE(set.ok());
  const quota::gateway::Identity who{.tenant = "acme", .plan = "free", .user = "u1"};
  const auto* global = (*set)->find(Level::kGlobal, who, "read");
  const auto* tenant = (*set)->find(Level::kTenant, who, "read");
  const auto* user = (*set)->find(Level::kUser, who, "read");
  REQUIRE(global != nullptr);
  REQUIRE(tenant != nullptr);
  REQUIRE(user != nullptr);
  CHECK(global->lease.mode == LeaseMode::kOn);
  CHECK(global->lease.units == 500);
  CHECK(global->lease.expiry == 2s);
  CHECK(global->lease.low_water == 100);
  CHECK(global->lease.max_held() == 600);
  CHECK(global->lease.revoke == quota::gateway::LeaseRevoke::kAtOnce);
  CHECK(tenant->lease.revoke == quota::gateway::LeaseRevoke::kAtExpiry);  // the default
  CHECK(tenant->lease.mode == LeaseMode::kAuto);
  CHECK(tenant->lease.auto_rate == 50);
  CHECK(tenant->lease.expiry == 1s);   // the default
  CHECK_FALSE(user->lease.enabled());  // off by default
}
