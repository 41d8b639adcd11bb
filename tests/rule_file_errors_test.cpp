// Rule files that do not load: each error names the file, the line and column and the
// field, and a reload of the same file leaves the rules in force (same set, same version).
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "absl/strings/match.h"
#include "quota/rules/rule_file.hpp"
#include "support/rule_files.hpp"

namespace {

using quota::testing::message;

// Two routes (read costs 1, create 5) and then the rules given, from line 6 on.
std::string with_routes(const std::string& rules) {
  return "routes:\n  - name: read\n  - name: create\n    cost: 5\nrules:\n" + rules;
}

std::string free_rule(const std::string& policy, const std::string& extra = "") {
  return with_routes("  - name: free\n    level: tenant\n    plan: free\n    route: read\n    " +
                     policy + "\n" + extra);
}

struct BadFile {
  const char* what;
  std::string yaml;
  std::string error;  // after "<file>:"; for RuleSet::create's errors, its beginning
  bool exact = true;
};

std::vector<BadFile> bad_files() {
  const std::string tb = "token_bucket: {rate: 10/s, burst: 20}";
  return {
      {"unknown field", free_rule(tb, "    burts: 3\n"),
       "11:5: rules[0].burts: unknown field \"burts\"; allowed: name, level, tenant, plan, route, "
       "limit, token_bucket, fixed_window, sliding_log, sliding_window_estimate, shadow, "
       "enforce_percent, max_cost, lease, fair_share"},
      {"unknown policy", free_rule("leaky_bucket: {rate: 10/s, burst: 20}"),
       "10:5: rules[0].leaky_bucket: unknown field \"leaky_bucket\"; allowed: name, level, "
       "tenant, plan, route, limit, token_bucket, fixed_window, sliding_log, "
       "sliding_window_estimate, shadow, enforce_percent, max_cost, lease, fair_share"},
      {"duplicate rule (RuleSet::create)",
       free_rule(tb,
                 "  - name: free-again\n    level: tenant\n    plan: free\n    route: read\n"
                 "    fixed_window: {limit: 100, window: 1min}\n"),
       "11:5: rules[1]: a tenant rule for p:free on route \"read\" is already defined", false},
      {"negative rate", free_rule("token_bucket: {rate: -10/s, burst: 20}"),
       "10:26: rules[0].token_bucket.rate: rate -10/s: the units must not be negative"},
      {"zero rate", free_rule("token_bucket: {rate: 0/s, burst: 20}"),
       "10:26: rules[0].token_bucket.rate: rate 0/s never refills: a rule's rate must be positive"},
      {"zero period", free_rule("token_bucket:\n      rate: 10/0s\n      burst: 20"),
       "11:13: rules[0].token_bucket.rate: rate 10/0s: the period must be positive"},
      {"a route cost above the rule's capacity (RuleSet::create)",
       with_routes("  - name: free\n    level: tenant\n    plan: free\n    route: create\n"
                   "    token_bucket: {rate: 10/s, burst: 2}\n"),
       "9:12: rules[0].route: route \"create\" costs 5 units but the policy holds only 2", false},
      {"zero burst (RuleSet::create)", free_rule("token_bucket: {rate: 10/s, burst: 0}"),
       "10:39: rules[0].token_bucket.burst: burst must be in [1, ", false},
      {"rate units beyond kMaxUnits (RuleSet::create)",
       free_rule("token_bucket: {rate: 9_999_999_999_999/s, burst: 20}"),
       "10:26: rules[0].token_bucket.rate: rate.units must be in [0, ", false},
      {"a burst that takes centuries to refill (RuleSet::create)",
       free_rule("token_bucket: {rate: 1/d, burst: 1_000_000}"),
       "10:38: rules[0].token_bucket.burst: burst/rate: refilling burst=1000000", false},
      {"a route cost of 0 (RuleSet::create)",
       "routes:\n  - name: read\n  - name: create\n    cost: 0\nrules: []\n",
       "4:11: routes[1].cost: cost must be in [1, ", false},
      {"wrong type", free_rule("token_bucket: {rate: 10/s, burst: [20]}"),
       "10:39: rules[0].token_bucket.burst: expected an integer, got a sequence"},
      {"a quoted integer", free_rule("token_bucket: {rate: 10/s, burst: \"20\"}"),
       "10:39: rules[0].token_bucket.burst: expected an integer, got the quoted string \"20\""},
      {"a fraction", free_rule("fixed_window: {limit: 1.5, window: 1s}"),
       "10:27: rules[0].fixed_window.limit: expected an integer (whole number), got \"1.5\""},
      {"int64 overflow", free_rule("fixed_window: {limit: 9223372036854775808, window: 1s}"),
       "10:27: rules[0].fixed_window.limit: 9223372036854775808 does not fit in a 64-bit "
       "integer"},
      {"duration overflow", free_rule("fixed_window: {limit: 10, window: 106752d}"),
       "10:39: rules[0].fixed_window.window: duration 106752d exceeds 2^63-1 ns (~292 years)"},
      {"window of 0 (RuleSet::create)", free_rule("fixed_window: {limit: 100, window: 0s}"),
       "10:40: rules[0].fixed_window.window: window must be in [1, ", false},
      {"bad indentation", with_routes("  - name: free\n    level: tenant\n     plan: free\n"),
       "8:10: YAML syntax: illegal map value"},
      {"a tab for indentation", "routes:\n\t- name: read\n",
       "2:2: YAML syntax: illegal block entry"},
      {"an unclosed flow sequence", "routes: [{name: read}\nrules: []\n",
       "2:1: YAML syntax: end of sequence flow not found"},
      {"two policy keys", free_rule(tb + "\n    fixed_window: {limit: 100, window: 1min}"),
       "11:5: rules[0].fixed_window: a rule has exactly one policy, and this one already has "
       "token_bucket (line 10)"},
      {"no policy", with_routes("  - name: free\n    level: tenant\n    plan: free\n"),
       "6:5: rules[0]: a policy is required: one of token_bucket, fixed_window, sliding_log, "
       "sliding_window_estimate"},
      {"missing name",
       with_routes("  - level: tenant\n    plan: free\n    route: read\n    " + tb + "\n"),
       "6:5: rules[0].name: required field missing"},
      {"an empty name", with_routes("  - name:\n    level: tenant\n    plan: free\n    " + tb),
       "6:5: rules[0].name: expected a string, got nothing"},
      {"missing burst", free_rule("token_bucket: {rate: 10/s}"),
       "10:19: rules[0].token_bucket.burst: required field missing"},
      {"a field given twice",
       with_routes("  - name: free\n    level: tenant\n    plan: free\n    plan: pro\n"),
       "9:5: rules[0].plan: field given twice (first at line 8)"},
      {"tenant and plan (RuleSet::create)",
       with_routes("  - name: free\n    level: tenant\n    tenant: acme\n    plan: free\n"
                   "    route: read\n    " +
                   tb + "\n"),
       "6:5: rules[0]: set exactly one of tenant and plan", false},
      {"an unknown route (RuleSet::create)",
       with_routes("  - name: free\n    level: tenant\n    plan: free\n    route: delete\n    " +
                   tb),
       "9:12: rules[0].route: unknown route class \"delete\"", false},
      {"an unknown level", with_routes("  - name: free\n    level: org\n"),
       "7:12: rules[0].level: expected user | tenant | global, got \"org\""},
      {"shadow: yes", free_rule(tb, "    shadow: yes\n"),
       "11:13: rules[0].shadow: expected true or false, got \"yes\""},
      {"a lease without a mode", free_rule(tb, "    lease: {units: 5}\n"),
       "11:12: rules[0].lease.mode: required field missing"},
      {"an unknown lease mode", free_rule(tb, "    lease: {mode: sometimes}\n"),
       "11:19: rules[0].lease.mode: expected off | on | auto, got \"sometimes\""},
      {"an unknown lease field", free_rule(tb, "    lease: {mode: on, size: 5}\n"),
       "11:23: rules[0].lease.size: unknown field \"size\"; allowed: mode, units, expiry, "
       "low_water, auto_rate, revoke"},
      {"an unknown lease revocation", free_rule(tb, "    lease: {mode: on, revoke: now}\n"),
       "11:31: rules[0].lease.revoke: expected at_expiry | at_once, got \"now\""},
      {"a lease larger than the burst (RuleSet::create)",
       free_rule(tb, "    lease: {mode: on, units: 21}\n"),
       "11:30: rules[0].lease.units: lease.units is 21; it must be in [1, 20]", false},
      {"a low-water mark at the lease size (RuleSet::create)",
       free_rule(tb, "    lease: {mode: on, units: 10, low_water: 10}\n"),
       "11:45: rules[0].lease.low_water: lease.low_water is 10", false},
      {"a zero lease expiry (RuleSet::create)",
       free_rule(tb, "    lease: {mode: on, units: 10, expiry: 0s}\n"),
       "11:42: rules[0].lease.expiry: lease.expiry must be positive", false},
      {"auto without a rate (RuleSet::create)",
       free_rule(tb, "    lease: {mode: auto, units: 10}\n"),
       "11:12: rules[0].lease: lease.auto_rate is 0", false},
      {"enforce_percent above 100", free_rule(tb, "    enforce_percent: 101\n"),
       "11:22: rules[0].enforce_percent: 101 is out of range: it must be in [0, 100]"},
      {"a bad route name (RuleSet::create)", "routes:\n  - name: Read\nrules: []\n",
       "2:11: routes[0].name: route name contains byte 0x52", false},
      {"emergency on a fail-closed route",
       "routes:\n  - name: read\n    emergency: {rate: 10/s, burst: 5, max_duration: 30s}\n"
       "rules: []\n",
       "3:5: routes[0].emergency: applies only to a route with fail_mode: open"},
      {"fail_mode open without emergency",
       "routes:\n  - name: read\n    fail_mode: open\nrules: []\n",
       "2:5: routes[0].emergency: required with fail_mode: open: {rate, burst, max_duration}"},
      {"an emergency burst of 0 (RuleSet::create)",
       "routes:\n  - name: read\n    fail_mode: open\n"
       "    emergency: {rate: 10/s, burst: 0, max_duration: 30s}\nrules: []\n",
       "4:36: routes[0].emergency.burst: burst must be in [1, ", false},
      {"a prompt factor of 0", "routes:\n  - name: chat\n    prompt_factor: 0/2\nrules: []\n",
       "3:20: routes[0].prompt_factor: expected an integer or a ratio such as 3/2, each part in "
       "[1, 1000000], got \"0/2\""},
      {"a prompt factor that is not a ratio",
       "routes:\n  - name: chat\n    prompt_factor: 1.5\nrules: []\n",
       "3:20: routes[0].prompt_factor: expected an integer or a ratio such as 3/2, each part in "
       "[1, 1000000], got \"1.5\""},
      {"an unknown fail mode", "routes:\n  - name: read\n    fail_mode: maybe\nrules: []\n",
       "3:16: routes[0].fail_mode: expected closed | open, got \"maybe\""},
      {"a cost of the wrong type", "routes:\n  - name: read\n    costs: {units: [1]}\nrules: []\n",
       "3:20: routes[0].costs.units: expected whole units, estimate or {units: N, estimate: "
       "true}, got a sequence"},
      {"version 0", "version: 0\nroutes:\n  - name: read\nrules: []\n",
       "1:10: version: 0 is out of range: it must be in [1, 9223372036854775807]"},
      {"an empty file", "",
       "1:1: rule file: expected a mapping with routes and rules, got an "
       "empty file"},
      {"a sequence at the top", "- name: read\n",
       "1:1: rule file: expected a mapping with routes and rules, got a sequence"},
      {"two documents", "routes:\n  - name: read\nrules: []\n---\nroutes: []\n",
       "5:1: rule file: expected one YAML document, found several"},
      {"no routes", "rules: []\n", "1:1: routes: required field missing"},
      {"empty routes", "routes: []\nrules: []\n",
       "1:9: routes: at least one route class is required"},
      {"no rules", "routes:\n  - name: read\n", "1:1: rules: required field missing"},
      {"rules not a sequence", "routes:\n  - name: read\nrules: {name: x}\n",
       "3:8: rules: expected a sequence of rules, got a mapping"},
  };
}

void check_error(const absl::Status& s, const std::string& file, const BadFile& bad) {
  CHECK(s.code() == absl::StatusCode::kInvalidArgument);
  const std::string want = file + ":" + bad.error;
  if (bad.exact) {
    CHECK(message(s) == want);
  } else {
    INFO(message(s));
    CHECK(absl::StartsWith(message(s), want));
  }
}

TEST_CASE("each bad file is an error at its line, column and field") {
  for (const BadFile& bad : bad_files()) {
    INFO(bad.what << "\n" << bad.yaml);
    check_error(quota::rules::load_rules(bad.yaml, "bad.yaml").status(), "bad.yaml", bad);
    auto spec = quota::rules::parse_rules(bad.yaml, "bad.yaml");
    if (bad.exact) {  // errors of syntax and schema: parse_rules already reports them
      check_error(spec.status(), "bad.yaml", bad);
    } else {  // RuleSet::create's: the file parses
      CHECK(spec.ok());
    }
  }
}

TEST_CASE("a reload of each bad file leaves the rules in force") {
  auto registry = quota::testing::registry_at(4);
  const auto before = registry->current();
  for (const BadFile& bad : bad_files()) {
    INFO(bad.what << "\n" << bad.yaml);
    quota::testing::TempRuleFile file(bad.yaml);
    auto v = quota::rules::reload_rule_file(*registry, file.path());
    REQUIRE_FALSE(v.ok());
    check_error(v.status(), file.path(), bad);
    CHECK(registry->current() == before);
    CHECK(registry->current()->version() == 4);
  }
}

}  // namespace
