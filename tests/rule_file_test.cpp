// Rule files that parse and load: the spec they give field by field, the scalar syntax
// (integers, durations, rates), reloads and their versions, and the example files.
#include "quota/rules/rule_file.hpp"

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <set>
#include <string>

#include <catch2/catch.hpp>

#include "quota/rules/rule_parser.hpp"
#include "support/rule_files.hpp"

namespace {

using namespace std::chrono_literals;
using quota::Nanos;
using quota::gateway::FailMode;
using quota::gateway::Level;
using quota::rules::parse_rules;
using quota::testing::message;

constexpr const char* kFull = R"(version: 3
shadow_all: false
routes:
  - name: read
    cost: 1
    max_cost: 100
    fail_mode: open
    emergency: {rate: 10/s, burst: 5, max_duration: 30s}
    costs: {units: 1, tokens: estimate, requests: {units: 2, estimate: false}}
  - name: create
    cost: 5
    prompt_factor: 3/2
rules:
  - name: free-units
    level: tenant
    plan: free
    route: read
    limit: units
    token_bucket: {rate: 100/s, burst: 20}
    shadow: true
    enforce_percent: 40
    max_cost: 2
  - name: acme-create
    level: user
    tenant: acme
    route: create
    fixed_window: {limit: 1000, window: 60s}
  - name: everyone
    level: global
    route: read
    token_bucket: {rate: 1_000_000/1min, burst: 20}
  - {name: tokens, level: tenant, plan: free, limit: tokens,
     fixed_window: {limit: 1_000_000, window: 1min}}
  - {name: requests, level: tenant, plan: free, limit: requests,
     token_bucket: {rate: 10/s, burst: 10}}
)";

TEST_CASE("a rule file parses into the spec it describes, field by field") {
  auto spec = parse_rules(kFull, "full.yaml");
  REQUIRE(spec.ok());
  CHECK(spec->version == 3);
  CHECK_FALSE(spec->shadow_all);
  REQUIRE(spec->routes.size() == 2);
  const auto& read = spec->routes[0];
  CHECK(read.name == "read");
  CHECK(read.cost == 1);
  CHECK(read.max_cost == 100);
  CHECK(read.fail_mode == FailMode::kOpen);
  CHECK(read.emergency.rate == quota::Rate{.units = 10, .per = 1s});
  CHECK(read.emergency.burst == 5);
  CHECK(read.emergency.max_duration == 30s);
  REQUIRE(read.costs.size() == 3);
  CHECK((read.costs[0].limit == "units" && read.costs[0].units == 1 && !read.costs[0].estimate));
  CHECK((read.costs[1].limit == "tokens" && read.costs[1].units == 1 && read.costs[1].estimate));
  CHECK((read.costs[2].limit == "requests" && read.costs[2].units == 2 && !read.costs[2].estimate));
  CHECK(spec->routes[1].name == "create");
  CHECK(spec->routes[1].cost == 5);
  CHECK(spec->routes[1].fail_mode == FailMode::kClosed);
  CHECK(spec->routes[1].costs.empty());
  CHECK(spec->routes[1].estimate_formula.numerator == 3);
  CHECK(spec->routes[1].estimate_formula.denominator == 2);
  CHECK_FALSE(read.estimate_formula.enabled());

  REQUIRE(spec->rules.size() == 5);
  const auto& free = spec->rules[0];
  CHECK(free.name == "free-units");
  CHECK(free.level == Level::kTenant);
  CHECK(free.plan == "free");
  CHECK(free.tenant.empty());
  CHECK(free.route == "read");
  CHECK(free.limit == "units");
  const auto* tb = std::get_if<quota::TokenBucket>(&free.policy);
  REQUIRE(tb != nullptr);
  CHECK(tb->rate == quota::Rate{.units = 100, .per = 1s});
  CHECK(tb->burst == 20);
  CHECK(free.shadow);
  CHECK(free.enforce_percent == 40);
  CHECK(free.max_cost == 2);

  const auto& acme = spec->rules[1];
  CHECK(acme.level == Level::kUser);
  CHECK(acme.tenant == "acme");
  CHECK(acme.plan.empty());
  const auto* fw = std::get_if<quota::FixedWindow>(&acme.policy);
  REQUIRE(fw != nullptr);
  CHECK(fw->limit == 1000);
  CHECK(fw->window == 60s);

  CHECK(spec->rules[2].level == Level::kGlobal);
  CHECK(std::get<quota::TokenBucket>(spec->rules[2].policy).rate ==
        quota::Rate{.units = 1'000'000, .per = 1min});

  // Limits shared by the routes whose costs name them: no route of their own.
  CHECK((spec->rules[3].limit == "tokens" && spec->rules[3].route.empty()));
  CHECK(std::get<quota::FixedWindow>(spec->rules[3].policy).limit == 1'000'000);
  CHECK((spec->rules[4].limit == "requests" && spec->rules[4].route.empty()));
}

TEST_CASE("fields left out take the spec's defaults") {
  auto spec = parse_rules(
      "routes: [{name: read}]\nrules:\n"
      "  - {name: r, level: tenant, plan: free, route: read,\n"
      "     fixed_window: {limit: 5, window: 1s}}\n",
      "defaults.yaml");
  REQUIRE(spec.ok());
  CHECK(spec->version == 1);
  CHECK_FALSE(spec->shadow_all);
  CHECK(spec->routes[0].cost == 1);
  CHECK(spec->routes[0].max_cost == 0);
  CHECK(spec->routes[0].fail_mode == FailMode::kClosed);
  CHECK_FALSE(spec->routes[0].estimate_formula.enabled());
  CHECK(parse_rules("routes: [{name: chat, prompt_factor: 4}]\nrules: []\n", "f.yaml")
            ->routes[0]
            .estimate_formula.denominator == 1);
  CHECK(spec->rules[0].limit.empty());
  CHECK_FALSE(spec->rules[0].shadow);
  CHECK(spec->rules[0].enforce_percent == 100);
  CHECK(spec->rules[0].max_cost == 0);
  CHECK(parse_rules("shadow_all: true\nroutes: [{name: read}]\nrules: []\n", "s.yaml")->shadow_all);
}

TEST_CASE("integers: whole numbers with optional _ separators, within int64") {
  using quota::rules::parse_integer;
  CHECK(*parse_integer("0") == 0);
  CHECK(*parse_integer("1_000_000") == 1'000'000);
  CHECK(*parse_integer("-5") == -5);
  CHECK(*parse_integer("+5") == 5);
  CHECK(*parse_integer("9223372036854775807") == INT64_MAX);
  CHECK(*parse_integer("-9223372036854775808") == INT64_MIN);
  CHECK(message(parse_integer("9223372036854775808").status()) ==
        "9223372036854775808 does not fit in a 64-bit integer");
  CHECK(message(parse_integer("99999999999999999999999999999999999999999").status()) ==
        "99999999999999999999999999999999999999999 does not fit in a 64-bit integer");
  CHECK(message(parse_integer("7", 1, 5).status()) == "7 is out of range: it must be in [1, 5]");
  for (const char* bad : {"", "-", "1.5", "1e3", "0x10", "_1", "1_", "1__0", " 1", "1 ", "one"}) {
    INFO(bad);
    CHECK(message(parse_integer(bad).status()) ==
          "expected an integer (whole number), got \"" + std::string(bad) + "\"");
  }
}

TEST_CASE("durations: an integer and a unit, at most 2^63-1 ns") {
  using quota::rules::parse_duration;
  CHECK(*parse_duration("0s") == Nanos{0});
  CHECK(*parse_duration("7ns") == 7ns);
  CHECK(*parse_duration("7us") == 7us);
  CHECK(*parse_duration("250ms") == 250ms);
  CHECK(*parse_duration("30s") == 30s);
  CHECK(*parse_duration("5min") == 5min);
  CHECK(*parse_duration("2h") == 2h);
  CHECK(*parse_duration("30d") == 30 * 24h);
  CHECK(*parse_duration("9223372036854775807ns") == Nanos::max());
  CHECK(message(parse_duration("106752d").status()) ==
        "duration 106752d exceeds 2^63-1 ns (~292 years)");
  for (const char* bad : {"", "10", "s", "-1s", "1.5s", "10 s", "10sec", "10m", "1_s"}) {
    INFO(bad);
    CHECK(message(parse_duration(bad).status()) ==
          "expected a duration <integer><ns|us|ms|s|min|h|d> such as 60s, got \"" +
              std::string(bad) + "\"");
  }
}

TEST_CASE("rates: units per period, the period a unit or a duration") {
  using quota::Rate;
  using quota::rules::parse_rate;
  CHECK(*parse_rate("100/s") == Rate{.units = 100, .per = 1s});
  CHECK(*parse_rate("1000000/1min") == Rate{.units = 1'000'000, .per = 1min});
  CHECK(*parse_rate("20/100ms") == Rate{.units = 20, .per = 100ms});
  CHECK(*parse_rate("300_000_000/30d") == Rate{.units = 300'000'000, .per = 30 * 24h});
  CHECK(*parse_rate("5/h") == Rate{.units = 5, .per = 1h});
  CHECK(*parse_rate("0/s") == Rate{.units = 0, .per = 1s});  // the emergency bucket may
  CHECK(message(parse_rate("-1/s").status()) == "rate -1/s: the units must not be negative");
  CHECK(message(parse_rate("1/0ms").status()) == "rate 1/0ms: the period must be positive");
  for (const char* bad : {"10", "/s", "10/", "10/x", "1.5/s", "10/s/s", "ten/s"}) {
    INFO(bad);
    CHECK(message(parse_rate(bad).status()) ==
          "expected a rate <units>/<period> such as 100/s, 1000000/1min or 20/100ms, got \"" +
              std::string(bad) + "\"");
  }
}

TEST_CASE("the sliding log and the estimator parse into their policies") {
  for (const char* kind : {"sliding_log", "sliding_window_estimate"}) {
    INFO(kind);
    auto spec = parse_rules(std::string("routes: [{name: read}]\nrules:\n"
                                        "  - {name: r, level: tenant, plan: free, route: read,\n"
                                        "     ") +
                                kind + ": {limit: 100, window: 60s}}\n",
                            "w.yaml");
    REQUIRE(spec.ok());
    const auto& policy = spec->rules[0].policy;
    if (std::string(kind) == "sliding_log") {
      const auto* log = std::get_if<quota::SlidingLog>(&policy);
      REQUIRE(log != nullptr);
      CHECK((log->limit == 100 && log->window == 60s));
    } else {
      const auto* est = std::get_if<quota::SlidingWindowEstimate>(&policy);
      REQUIRE(est != nullptr);
      CHECK((est->limit == 100 && est->window == 60s));
    }
  }
}

TEST_CASE("load_rules builds the RuleSet, with the file's version or 1") {
  auto set = quota::rules::load_rules(kFull, "full.yaml");
  INFO(set.status().ToString());
  REQUIRE(set.ok());
  CHECK((*set)->version() == 3);
  CHECK((*set)->route("create").ok());
  auto unversioned = quota::rules::load_rules("routes: [{name: read}]\nrules: []\n", "u.yaml");
  REQUIRE(unversioned.ok());
  CHECK((*unversioned)->version() == 1);
}

TEST_CASE("a file that cannot be read is an error naming it") {
  const std::string missing = "/nonexistent-dir/rules.yaml";
  auto set = quota::rules::load_rule_file(missing);
  CHECK(set.status().code() == absl::StatusCode::kNotFound);
  CHECK(message(set.status()) ==
        "cannot read rule file \"/nonexistent-dir/rules.yaml\": No such file or directory");
  auto registry = quota::testing::registry_at(4);
  const auto before = registry->current();
  auto v = quota::rules::reload_rule_file(*registry, missing);
  CHECK(v.status().code() == absl::StatusCode::kNotFound);
  CHECK(registry->current() == before);
  auto dir = quota::rules::load_rule_file(std::filesystem::temp_directory_path().string());
  CHECK(message(dir.status()).find("Is a directory") != std::string::npos);
}

constexpr const char* kNext = R"(routes: [{name: read}, {name: create, cost: 5}]
rules:
  - {name: free, level: tenant, plan: free, route: read, token_bucket: {rate: 20/s, burst: 40}}
)";

TEST_CASE("a reload publishes the new set: its version, else the version in force + 1") {
  auto registry = quota::testing::registry_at(4);
  quota::testing::TempRuleFile file(std::string("version: 9\n") + kNext);
  auto v = quota::rules::reload_rule_file(*registry, file.path());
  REQUIRE(v.ok());
  CHECK(*v == 9);
  CHECK(registry->current()->version() == 9);
  const auto* rule =
      registry->current()->find(Level::kTenant, {.tenant = "a", .plan = "free"}, "read");
  REQUIRE(rule != nullptr);
  CHECK(std::get<quota::TokenBucket>(rule->policy).burst == 40);

  file.write(kNext);  // no version: the one in force + 1
  v = quota::rules::reload_rule_file(*registry, file.path());
  REQUIRE(v.ok());
  CHECK(*v == 10);
  CHECK(registry->current()->version() == 10);
}

TEST_CASE("a reload whose version is not above the one in force is refused, nothing changes") {
  auto registry = quota::testing::registry_at(4);
  const auto before = registry->current();
  for (int version : {4, 3, 1}) {
    INFO(version);
    quota::testing::TempRuleFile file("version: " + std::to_string(version) + "\n" + kNext);
    auto v = quota::rules::reload_rule_file(*registry, file.path());
    CHECK(v.status().code() == absl::StatusCode::kFailedPrecondition);
    CHECK(message(v.status()) == file.path() + ":1:10: version: version " +
                                     std::to_string(version) +
                                     " is not greater than the version in force, 4 (omit "
                                     "version: to use 5)");
    CHECK(registry->current() == before);
    CHECK(registry->current()->version() == 4);
  }
}

// Decision assertions for the examples are the gateway's tests; here each must load.
TEST_CASE("every example rule file loads") {
  const std::set<std::string> kExpected{
      "enforce-percent.yaml",       "fair-share.yaml",           "global-switch.yaml",
      "llm-gateway.yaml",           "llm-tokens.yaml",           "request-cap.yaml",
      "shadow-beside-enforce.yaml", "shared-tenant-budget.yaml", "sliding-log.yaml",
      "user-beside-tenant.yaml"};
  std::set<std::string> seen;
  for (const auto& entry : std::filesystem::directory_iterator(QUOTA_RULES_EXAMPLES_DIR)) {
    if (entry.path().extension() != ".yaml") continue;
    const std::string name = entry.path().filename().string();
    INFO(name);
    seen.insert(name);
    auto set = quota::rules::load_rule_file(entry.path().string());
    CHECK(set.ok());
    if (!set.ok()) FAIL_CHECK(message(set.status()));
  }
  CHECK(seen == kExpected);
}

}  // namespace
