// quota_server_envoy_rules_test — the envoyproxy/ratelimit YAML reader (envoy_rules.hpp):
// what a file becomes in quota's model, the matching order, and each refused file with
// its file:line:column and field.
#include <catch2/catch.hpp>
#include <string>
#include <variant>
#include <vector>

#include "rules/envoy_rules.hpp"

namespace {

using quota::server::parse_envoy_rules;
using Entries = std::vector<std::pair<std::string, std::string>>;

std::string error_of(const std::string& yaml) {
  auto r = parse_envoy_rules(yaml, "rl.yaml", 1);
  return r.ok() ? "(accepted)" : std::string(r.status().message());
}

}  // namespace

TEST_CASE(
    "envoy rules: a limit is a token bucket with burst = requests_per_unit, or a fixed "
    "window with quota_policy: fixed_window") {
  const std::string body =
      "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: Minute, requests_per_unit: "
      "60}\n";
  auto tb = parse_envoy_rules(body, "rl.yaml", 4);
  REQUIRE(tb.ok());
  CHECK((*tb)->version == 4);
  CHECK((*tb)->domain == "d");
  const auto* l = (*tb)->match(Entries{{"k", "v"}});
  REQUIRE(l != nullptr);
  const auto* bucket = std::get_if<quota::TokenBucket>(&l->policy);
  REQUIRE(bucket != nullptr);
  CHECK(bucket->burst == 60);
  CHECK(bucket->rate.units == 60);
  CHECK(bucket->rate.per == std::chrono::minutes(1));
  CHECK(l->unit == 2);  // Envoy's MINUTE
  CHECK(l->name == "k");

  auto fw = parse_envoy_rules("quota_policy: fixed_window\n" + body, "rl.yaml", 1);
  REQUIRE(fw.ok());
  const auto* window = std::get_if<quota::FixedWindow>(&(*fw)->match(Entries{{"k", "v"}})->policy);
  REQUIRE(window != nullptr);
  CHECK(window->limit == 60);
  CHECK(window->window == std::chrono::minutes(1));
}

TEST_CASE("envoy rules: key and value before key alone; the limit at the last entry's depth") {
  auto r = parse_envoy_rules(R"(domain: d
descriptors:
  - key: a
    rate_limit: {unit: second, requests_per_unit: 1, name: a-any}
    descriptors:
      - key: b
        value: x
        rate_limit: {unit: second, requests_per_unit: 2, name: b-x}
  - key: a
    value: "1"
    rate_limit: {unit: second, requests_per_unit: 3, name: a-1}
)",
                             "rl.yaml", 1);
  REQUIRE(r.ok());
  const auto name = [&](const Entries& e) {
    const auto* l = (*r)->match(e);
    return l == nullptr ? std::string("(none)") : l->name;
  };
  CHECK(name({{"a", "1"}}) == "a-1");
  CHECK(name({{"a", "2"}}) == "a-any");
  CHECK(name({{"a", "2"}, {"b", "x"}}) == "b-x");
  CHECK(name({{"a", "1"}, {"b", "x"}}) == "(none)");  // a=1 has no children
  CHECK(name({{"a", "2"}, {"b", "y"}}) == "(none)");
  CHECK(name({{"b", "x"}}) == "(none)");
  CHECK(name({}) == "(none)");
}

TEST_CASE("envoy rules: refused files name file:line:column and the field") {
  CHECK(error_of("domain: d\ndescriptors:\n  - key: k\n    rate_limt: {}\n") ==
        "rl.yaml:4:5: descriptors[0].rate_limt: unknown field \"rate_limt\"; allowed: key, value, "
        "rate_limit, descriptors, shadow_mode, detailed_metric");
  CHECK(error_of("domain: d\nextra: 1\n") ==
        "rl.yaml:2:1: extra: unknown field \"extra\"; allowed: domain, descriptors, quota_policy");
  CHECK(error_of("domain: d\ndescriptors:\n  - key: k\n    value: v\n  - key: k\n    value: v\n") ==
        "rl.yaml:5:5: descriptors[1]: duplicate descriptor \"k_v\" at this level (key, or "
        "key_value: envoyproxy/ratelimit's composite key)");
  CHECK(error_of("domain: d\ndescriptors:\n  - key: k\n  - key: k\n") ==
        "rl.yaml:4:5: descriptors[1]: duplicate descriptor \"k\" at this level (key, or "
        "key_value: envoyproxy/ratelimit's composite key)");
  // An empty value is the key alone, as in envoyproxy/ratelimit.
  CHECK(error_of("domain: d\ndescriptors:\n  - key: k\n  - key: k\n    value: \"\"\n") ==
        "rl.yaml:4:5: descriptors[1]: duplicate descriptor \"k\" at this level (key, or "
        "key_value: envoyproxy/ratelimit's composite key)");
  CHECK(error_of("domain: d\ndescriptors:\n  - key: \"\"\n") ==
        "rl.yaml:3:10: descriptors[0].key: the key is empty");
  CHECK(error_of("domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unlimited: true\n"
                 "      unit: second\n") ==
        "rl.yaml:6:7: descriptors[0].rate_limit.unit: unlimited: true cannot have a unit");
  CHECK(error_of("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight, "
                 "requests_per_unit: 1}\n") ==
        "rl.yaml:4:24: descriptors[0].rate_limit.unit: expected second | minute | hour | day | "
        "week | month | year, got \"fortnight\"");
  CHECK(error_of("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second}\n") ==
        "rl.yaml:4:17: descriptors[0].rate_limit.requests_per_unit: required field missing");
  CHECK(error_of("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, "
                 "requests_per_unit: -1}\n") ==
        "rl.yaml:4:51: descriptors[0].rate_limit.requests_per_unit: -1 is out of range: it must "
        "be in [0, 4294967295]");
  CHECK(error_of("descriptors: []\n") == "rl.yaml:1:1: rule file.domain: required field missing");
  CHECK(error_of("domain: d\nquota_policy: sliding\n") ==
        "rl.yaml:2:15: quota_policy: expected token_bucket | fixed_window, got \"sliding\"");
  CHECK(error_of("domain: d\ndescriptors:\n  - key: k\n    shadow_mode: true\n") ==
        "rl.yaml:4:5: descriptors[0].shadow_mode: needs a rate_limit on this descriptor "
        "(envoyproxy/ratelimit ignores it without one)");
  CHECK(error_of("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, "
                 "requests_per_unit: 1, replaces: [{name: \"\"}]}\n") ==
        "rl.yaml:4:72: descriptors[0].rate_limit.replaces[0].name: the name is empty");
  CHECK(error_of("domain: [d\n").rfind("rl.yaml:", 0) == 0);
}

TEST_CASE("envoy rules: the file's shape selects the format") {
  CHECK(quota::server::looks_like_envoy_rules("domain: d\ndescriptors: []\n"));
  CHECK_FALSE(quota::server::looks_like_envoy_rules("routes: []\nrules: []\n"));
  CHECK_FALSE(quota::server::looks_like_envoy_rules("[unclosed\n"));
}

TEST_CASE(
    "envoy rules: a wildcard value matches by prefix, after the exact value and before the "
    "key alone; requests_per_unit: 0 blocks; replaces and names") {
  auto r = parse_envoy_rules(R"(domain: d
descriptors:
  - key: p
    value: "/api/*"
    rate_limit: {unit: second, requests_per_unit: 1, name: api}
    descriptors:
      - key: m
        value: "*"
        rate_limit: {unit: second, requests_per_unit: 0}
  - key: p
    value: "/api/v1"
    rate_limit: {unit: second, requests_per_unit: 2, replaces: [{name: api}, {name: other}]}
  - key: p
    rate_limit: {unit: second, requests_per_unit: 3}
)",
                             "rl.yaml", 1);
  REQUIRE(r.ok());
  const auto rpu = [&](const Entries& e) {
    const auto* l = (*r)->match(e);
    return l == nullptr ? std::int64_t{-1} : l->requests_per_unit;
  };
  CHECK(rpu({{"p", "/api/users"}}) == 1);
  CHECK(rpu({{"p", "/api/"}}) == 1);
  CHECK(rpu({{"p", "/api/v1"}}) == 2);
  CHECK(rpu({{"p", "/apix"}}) == 3);
  CHECK(rpu({{"p", "/api/x"}, {"m", "GET"}}) == 0);  // "*": any value, the empty one too
  CHECK(rpu({{"p", "/api/x"}, {"m", ""}}) == 0);
  CHECK((*r)->match(Entries{{"p", "/api/x"}, {"m", "GET"}})->blocks());
  CHECK_FALSE((*r)->match(Entries{{"p", "/api/x"}})->blocks());
  const auto* api = (*r)->match(Entries{{"p", "/api/x"}});
  CHECK(api->named);
  const auto* v1 = (*r)->match(Entries{{"p", "/api/v1"}});
  CHECK_FALSE(v1->named);
  CHECK(v1->name == "p_/api/v1");
  CHECK(v1->replaces == std::vector<std::string>{"api", "other"});
  CHECK((*r)->match(Entries{{"p", "/api/x"}, {"m", "GET"}})->name == "p_/api/*.m_*");
}

TEST_CASE("envoy rules: detailed_metric names the request's values in the metric label") {
  auto r = parse_envoy_rules(
      "domain: d\ndescriptors:\n  - key: a\n    descriptors:\n      - key: b\n"
      "        detailed_metric: true\n        rate_limit: {unit: second, requests_per_unit: 1}\n"
      "  - key: c\n    rate_limit: {unit: second, requests_per_unit: 1}\n",
      "rl.yaml", 1);
  REQUIRE(r.ok());
  const Entries detailed{{"a", "1"}, {"b", "x"}};
  const auto* l = (*r)->match(detailed);
  REQUIRE(l != nullptr);
  CHECK(l->detailed_metric);
  CHECK(quota::server::EnvoyRules::metric_name(*l, detailed) == "a_1.b_x");
  const Entries plain{{"c", "9"}};
  CHECK(quota::server::EnvoyRules::metric_name(*(*r)->match(plain), plain) == "c");
}
