// quota_server_envoy_readme_test — envoyproxy/ratelimit's documented examples (the
// configuration examples of its README, and the wildcard of issue 34), each decided
// through RateLimitServiceImpl on an in-process Checker, as a table: every row a file and
// the calls made to it, in order, with what each descriptor answers (OK / OVER_LIMIT, the
// limit that applied: requests_per_unit and unit, or none, and limit_remaining). A second
// table holds files envoyproxy/ratelimit reads one way and quota refuses at load, each
// with its file:line:column and field. Time is a manual clock: nothing refills between the
// calls of a row. Counts are quota's exact token buckets (burst = requests_per_unit), so
// the remaining counts below are exact where envoyproxy/ratelimit's windows would vary.
#include <catch2/catch.hpp>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "api/grpc/grpc_service.hpp"
#include "quota/clock.hpp"
#include "rules/envoy_rules.hpp"

namespace {

namespace rls = envoy::service::ratelimit::v3;
using Response = rls::RateLimitResponse;
using Unit = rls::RateLimitResponse::RateLimit;
using Entries = std::vector<std::pair<std::string, std::string>>;

constexpr std::int64_t kNone = -1;  // Expect::requests_per_unit: no current_limit
constexpr std::uint32_t kMax = 4294967295u;

struct Expect {
  Response::Code code = Response::OK;
  std::int64_t requests_per_unit = kNone;
  Unit::Unit unit = Unit::UNKNOWN;
  std::uint32_t remaining = 0;
};

struct Call {
  std::vector<Entries> descriptors;
  std::uint32_t hits = 0;  // the request's hits_addend (0: 1)
  std::vector<Expect> expect;
};

struct Example {
  const char* name;
  const char* yaml;
  std::vector<Call> calls;
};

constexpr auto OK = Response::OK;
constexpr auto OVER = Response::OVER_LIMIT;

// A server's answering part, on a Checker of `yaml`'s rules and a manual clock.
struct Service {
  quota::ManualClock clock{quota::Nanos{1'000'000'000'000}};
  quota::server::ServerStats stats;
  std::unique_ptr<quota::server::Checker> checker;
  std::unique_ptr<quota::server::RateLimitServiceImpl> service;
  std::string domain;

  explicit Service(const std::string& yaml) {
    auto rules = quota::server::parse_envoy_rules(yaml, "rl.yaml", 1);
    REQUIRE(rules.ok());
    domain = (*rules)->domain;
    checker = std::make_unique<quota::server::Checker>(quota::server::LoadedRules{.envoy = *rules},
                                                       quota::server::CheckerOptions{});
    service = std::make_unique<quota::server::RateLimitServiceImpl>(
        *checker, stats, "unused", 1'000'000, [c = clock] { return c.now(); });
  }

  Response call(const Call& c) {
    rls::RateLimitRequest req;
    req.set_domain(domain);
    req.set_hits_addend(c.hits);
    for (const Entries& d : c.descriptors) {
      auto* p = req.add_descriptors();
      for (const auto& [k, v] : d) {
        auto* e = p->add_entries();
        e->set_key(k);
        e->set_value(v);
      }
    }
    Response out;
    const grpc::Status s = service->ShouldRateLimit(nullptr, &req, &out);
    REQUIRE(s.ok());
    return out;
  }
};

const std::vector<Example> kExamples = {
    {"README example 1: key and value",
     R"(domain: mongo_cps
descriptors:
  - key: database
    value: users
    rate_limit: {unit: second, requests_per_unit: 500}
  - key: database
    value: default
    rate_limit: {unit: second, requests_per_unit: 500}
)",
     {{{{{"database", "users"}}}, 0, {{OK, 500, Unit::SECOND, 499}}},
      {{{{"database", "default"}}}, 0, {{OK, 500, Unit::SECOND, 499}}},
      {{{{"database", "other"}}}, 0, {{OK, kNone, Unit::UNKNOWN, 0}}},
      {{{{"database", "users"}}}, 499, {{OK, 500, Unit::SECOND, 0}}},
      {{{{"database", "users"}}}, 0, {{OVER, 500, Unit::SECOND, 0}}}}},
    {"README example 2: nested descriptors, several descriptors in one call",
     R"(domain: messaging
descriptors:
  - key: message_type
    value: marketing
    descriptors:
      - key: to_number
        rate_limit: {unit: day, requests_per_unit: 5}
  - key: to_number
    rate_limit: {unit: day, requests_per_unit: 100}
)",
     {{{{{"message_type", "marketing"}, {"to_number", "2061111111"}}}, 5, {{OK, 5, Unit::DAY, 0}}},
      // The README's request: both descriptors, an aggregate (OR) answer.
      {{{{"message_type", "marketing"}, {"to_number", "2061111111"}},
        {{"to_number", "2061111111"}}},
       0,
       {{OVER, 5, Unit::DAY, 0}, {OK, 100, Unit::DAY, 99}}},
      {{{{"message_type", "marketing"}, {"to_number", "2062222222"}}}, 0, {{OK, 5, Unit::DAY, 4}}},
      {{{{"to_number", "2062222222"}}}, 0, {{OK, 100, Unit::DAY, 99}}},
      {{{{"message_type", "marketing"}}}, 0, {{OK, kNone, Unit::UNKNOWN, 0}}}}},
    {"README example 3: the most specific match; requests_per_unit: 0 blocks",
     R"(domain: edge_proxy_per_ip
descriptors:
  - key: remote_address
    rate_limit: {unit: second, requests_per_unit: 10}
  - key: remote_address
    value: 50.0.0.5
    rate_limit: {unit: second, requests_per_unit: 0}
)",
     {{{{{"remote_address", "50.0.0.1"}}}, 0, {{OK, 10, Unit::SECOND, 9}}},
      {{{{"remote_address", "50.0.0.5"}}}, 0, {{OVER, 0, Unit::SECOND, 0}}},
      {{{{"remote_address", "50.0.0.5"}}}, 0, {{OVER, 0, Unit::SECOND, 0}}}}},
    {"README example 4, first file: more entries than levels is no match",
     R"(domain: example4
descriptors:
  - key: key
    value: value
    rate_limit: {requests_per_unit: 300, unit: second}
)",
     {{{{{"key", "value"}, {"subkey", "subvalue"}}}, 0, {{OK, kNone, Unit::UNKNOWN, 0}}},
      {{{{"key", "value"}}}, 0, {{OK, 300, Unit::SECOND, 299}}}}},
    {"README example 4, second file: the limit at the depth of the last entry",
     R"(domain: example4
descriptors:
  - key: key
    value: value
    descriptors:
      - key: subkey
        rate_limit: {requests_per_unit: 300, unit: second}
)",
     {{{{{"key", "value"}, {"subkey", "subvalue"}}}, 0, {{OK, 300, Unit::SECOND, 299}}},
      {{{{"key", "value"}}}, 0, {{OK, kNone, Unit::UNKNOWN, 0}}}}},
    {"README example 5: unlimited",
     R"(domain: internal
descriptors:
  - key: ldap
    rate_limit: {unlimited: true}
  - key: azure
    rate_limit: {unit: minute, requests_per_unit: 100}
)",
     {{{{{"ldap", "x"}}}, 1000, {{OK, kNone, Unit::UNKNOWN, kMax}}},
      {{{{"azure", "x"}}}, 0, {{OK, 100, Unit::MINUTE, 99}}}}},
    {"README example 6: shadow_mode",
     R"(domain: example6
descriptors:
  - key: service
    descriptors:
      - key: user
        value: user-a
        rate_limit:
          requests_per_unit: 10
          unit: second
        shadow_mode: true
      - key: user
        value: user-b
        rate_limit:
          requests_per_unit: 20
          unit: second
)",
     {{{{{"service", "auth-service"}, {"user", "user-a"}}}, 10, {{OK, 10, Unit::SECOND, 0}}},
      {{{{"service", "auth-service"}, {"user", "user-a"}}}, 0, {{OK, 10, Unit::SECOND, 0}}},
      {{{{"service", "auth-service"}, {"user", "user-b"}}}, 20, {{OK, 20, Unit::SECOND, 0}}},
      {{{{"service", "auth-service"}, {"user", "user-b"}}}, 0, {{OVER, 20, Unit::SECOND, 0}}},
      {{{{"service", "auth-service"}, {"user", "user-c"}}}, 0, {{OK, kNone, Unit::UNKNOWN, 0}}}}},
    {"README example 7: replaces",
     R"(domain: example7
descriptors:
  - key: key_1
    value: value_1
    descriptors:
      - key: user
        value: bkthomps
        rate_limit:
          name: specific_limit
          requests_per_unit: 5
          unit: second
  - key: key_2
    value: value_2
    descriptors:
      - key: user
        value: bkthomps
        rate_limit:
          replaces:
            - name: specific_limit
          requests_per_unit: 10
          unit: second
)",
     {{{{{"key_1", "value_1"}, {"user", "bkthomps"}}}, 0, {{OK, 5, Unit::SECOND, 4}}},
      {{{{"key_2", "value_2"}, {"user", "bkthomps"}}}, 0, {{OK, 10, Unit::SECOND, 9}}},
      // Both in one call: 10/s applies, the replaced 5/s is neither applied nor spent.
      {{{{"key_1", "value_1"}, {"user", "bkthomps"}}, {{"key_2", "value_2"}, {"user", "bkthomps"}}},
       0,
       {{OK, kNone, Unit::UNKNOWN, 0}, {OK, 10, Unit::SECOND, 8}}},
      {{{{"key_1", "value_1"}, {"user", "bkthomps"}}}, 0, {{OK, 5, Unit::SECOND, 3}}}}},
    {"README example 8: detailed_metric (metrics only; matching as usual)",
     R"(domain: example8
descriptors:
  - key: key1
    detailed_metric: true
    rate_limit:
      unit: minute
      requests_per_unit: 10
  - key: key1
    value: value1
    rate_limit:
      unit: minute
      requests_per_unit: 20
)",
     {{{{{"key1", "unspecified_value"}}}, 0, {{OK, 10, Unit::MINUTE, 9}}},
      {{{{"key1", "unspecified_value2"}}}, 0, {{OK, 10, Unit::MINUTE, 9}}},
      {{{{"key1", "value1"}}}, 0, {{OK, 20, Unit::MINUTE, 19}}}}},
    {"README example 9: a wildcard value; each value its own budget",
     R"(domain: example9
descriptors:
  - key: key1
    value: value*
    rate_limit:
      unit: minute
      requests_per_unit: 20
)",
     {{{{{"key1", "value1"}}}, 0, {{OK, 20, Unit::MINUTE, 19}}},
      {{{{"key1", "value2"}}}, 0, {{OK, 20, Unit::MINUTE, 19}}},
      {{{{"key1", "value"}}}, 0, {{OK, 20, Unit::MINUTE, 19}}},
      {{{{"key1", "other"}}}, 0, {{OK, kNone, Unit::UNKNOWN, 0}}}}},
    {"issue 34: value \"/api/*\"; exact values first, then wildcards in file order, then the key",
     R"(domain: edge
descriptors:
  - key: path
    value: "/api/*"
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: path
    value: "/api/admin"
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: path
    value: "/api/a*"
    rate_limit: {unit: minute, requests_per_unit: 7}
  - key: path
    rate_limit: {unit: minute, requests_per_unit: 100}
)",
     {{{{{"path", "/api/users"}}}, 2, {{OK, 2, Unit::MINUTE, 0}}},
      {{{{"path", "/api/users"}}}, 0, {{OVER, 2, Unit::MINUTE, 0}}},
      {{{{"path", "/api/orders"}}}, 0, {{OK, 2, Unit::MINUTE, 1}}},
      {{{{"path", "/api/admin"}}}, 0, {{OK, 1, Unit::MINUTE, 0}}},
      {{{{"path", "/api/audit"}}}, 0, {{OK, 2, Unit::MINUTE, 1}}},
      {{{{"path", "/apiary"}}}, 0, {{OK, 100, Unit::MINUTE, 99}}}}},
};

struct Refused {
  const char* what;
  const char* yaml;
  const char* error;
};

const std::vector<Refused> kRefused = {
    {"replaces beside key (envoyproxy/ratelimit ignores it there)",
     "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n"
     "    replaces: [{name: x}]\n",
     "rl.yaml:5:5: descriptors[0].replaces: replaces belongs inside rate_limit (rate_limit: "
     "{replaces: [{name: ...}]}); envoyproxy/ratelimit ignores it here"},
    {"a wildcard key without a value (envoyproxy/ratelimit: a prefix of key_value)",
     "domain: d\ndescriptors:\n  - key: k*\n    rate_limit: {unit: second, requests_per_unit: 1}\n",
     "rl.yaml:3:10: descriptors[0].key: a key ending in '*' without a value is not a wildcard "
     "quota matches; give the wildcard as the value (value: \"prefix*\")"},
    {"requests_per_unit missing (envoyproxy/ratelimit reads 0: a block list)",
     "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second}\n",
     "rl.yaml:4:17: descriptors[0].rate_limit.requests_per_unit: required field missing"},
    {"unlimited with a unit (refused by both)",
     "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unlimited: true, unit: second}\n",
     "rl.yaml:4:35: descriptors[0].rate_limit.unit: unlimited: true cannot have a unit"},
    {"a limit replacing its own name (refused by both)",
     "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {name: a, unit: second, "
     "requests_per_unit: 1, replaces: [{name: a}]}\n",
     "rl.yaml:4:73: descriptors[0].rate_limit.replaces: a limit cannot replace its own name "
     "\"a\""},
    {"two descriptors whose key_value coincide (refused by both)",
     "domain: d\ndescriptors:\n  - key: a\n    value: b_c\n  - key: a_b\n    value: c\n",
     "rl.yaml:5:5: descriptors[1]: duplicate descriptor \"a_b_c\" at this level (key, or "
     "key_value: envoyproxy/ratelimit's composite key)"},
    {"detailed_metric without a rate_limit (envoyproxy/ratelimit ignores it)",
     "domain: d\ndescriptors:\n  - key: k\n    detailed_metric: true\n",
     "rl.yaml:4:5: descriptors[0].detailed_metric: needs a rate_limit on this descriptor "
     "(envoyproxy/ratelimit ignores it without one)"},
    {"share_threshold (a later envoyproxy/ratelimit field quota does not implement)",
     "domain: d\ndescriptors:\n  - key: k\n    value: v*\n    share_threshold: true\n",
     "rl.yaml:5:5: descriptors[0].share_threshold: unknown field \"share_threshold\"; allowed: "
     "key, value, rate_limit, descriptors, shadow_mode, detailed_metric"},
};

}  // namespace

TEST_CASE("envoyproxy/ratelimit's README examples are decided as documented there") {
  for (const Example& ex : kExamples) {
    Service s(ex.yaml);
    for (std::size_t i = 0; i < ex.calls.size(); ++i) {
      INFO(ex.name << ", call " << i);
      const Call& call = ex.calls[i];
      const Response r = s.call(call);
      REQUIRE(r.statuses_size() == static_cast<int>(call.expect.size()));
      bool over = false;
      for (std::size_t j = 0; j < call.expect.size(); ++j) {
        INFO("descriptor " << j);
        const Expect& want = call.expect[j];
        const auto& got = r.statuses(static_cast<int>(j));
        CHECK(got.code() == want.code);
        over |= want.code == OVER;
        if (want.requests_per_unit == kNone) {
          CHECK_FALSE(got.has_current_limit());
        } else {
          REQUIRE(got.has_current_limit());
          CHECK(got.current_limit().requests_per_unit() == want.requests_per_unit);
          CHECK(got.current_limit().unit() == want.unit);
        }
        CHECK(got.limit_remaining() == want.remaining);
      }
      CHECK(r.overall_code() == (over ? OVER : OK));
    }
  }
}

TEST_CASE("envoyproxy/ratelimit files quota refuses at load name file:line:column and field") {
  for (const Refused& row : kRefused) {
    INFO(row.what);
    auto r = quota::server::parse_envoy_rules(row.yaml, "rl.yaml", 1);
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().message() == row.error);
  }
}

TEST_CASE("detailed_metric counts under the request's own key_value path") {
  Service s(kExamples[8].yaml);
  s.call({{{{"key1", "unspecified_value"}}}, 10, {}});
  s.call({{{{"key1", "value1"}}}, 20, {}});
  // Near the limit (less than a tenth left): counted per value with detailed_metric, under
  // the limit's name without it.
  CHECK(s.stats.decisions.near_limit("key1_unspecified_value") == 1);
  CHECK(s.stats.decisions.near_limit("key1") == 0);
  CHECK(s.stats.decisions.near_limit("key1_value1") == 1);
  // At most kMaxDetailedLabels values get a series of their own; the rest count under the
  // limit's name.
  for (std::size_t i = 1; i < quota::server::kMaxDetailedLabels + 5; ++i) {
    s.call({{{{"key1", "v" + std::to_string(i)}}}, 10, {}});
  }
  CHECK(s.stats.decisions.near_limit("key1_v1") == 1);
  CHECK(s.stats.decisions.near_limit("key1_v999") == 1);
  CHECK(s.stats.decisions.near_limit("key1_v1000") == 0);
  CHECK(s.stats.decisions.near_limit("key1") == 5);
}

TEST_CASE("a block-listed descriptor answers 429 without Retry-After; shadow_mode answers OK") {
  Service blocked(kExamples[2].yaml);
  const Response r = blocked.call({{{{"remote_address", "50.0.0.5"}}}, 0, {}});
  bool retry_after = false;
  for (const auto& h : r.response_headers_to_add()) retry_after |= h.key() == "Retry-After";
  CHECK_FALSE(retry_after);
  CHECK_FALSE(r.statuses(0).has_duration_until_reset());
  Service shadow(kExamples[6].yaml);
  shadow.call({{{{"service", "s"}, {"user", "user-a"}}}, 10, {}});
  const Response over = shadow.call({{{{"service", "s"}, {"user", "user-a"}}}, 0, {}});
  CHECK(over.overall_code() == OK);
  for (const auto& h : over.response_headers_to_add()) CHECK(h.key() != "Retry-After");
}
