// quota_server_http_test — quota-server as a process on free loopback ports, called over
// real HTTP with httplib's client: the JSON check API, the nginx auth_request endpoint,
// bad and oversized JSON, health, readiness and metrics.
//
// The server is the binary in $QUOTA_SERVER with the rules in $QUOTA_SERVER_RULES
// (testdata/rules.yaml, version 7: per-tenant token buckets refilled 1 unit per 100 s, so
// remaining counts are exact while a test runs). One server serves every test case; each
// case uses its own tenants.
#include <httplib.h>

#include <catch2/catch.hpp>
#include <cstdlib>
#include <map>
#include <string>

#include "testing/scratch.hpp"
#include "testing/server_process.hpp"

namespace {

using quota::testing::env;

quota::testing::ServerProcess& server() {
  static quota::testing::ServerProcess s;
  if (!s.running()) {
    REQUIRE(!env("QUOTA_SERVER").empty());
    REQUIRE(s.start({env("QUOTA_SERVER"), "--rules", env("QUOTA_SERVER_RULES"), "--default-plan",
                     "free", "--grpc-port", "0", "--http-port", "0", "--max-cost", "1000",
                     "--fresh-budgets-at-start", "--auth-headers", "tenant,route,cost"},
                    {"grpc", "http"}));
  }
  return s;
}

httplib::Client& client() {
  static httplib::Client c("127.0.0.1", server().port("http"));
  c.set_connection_timeout(10);
  c.set_read_timeout(30);
  return c;
}

httplib::Result check(const std::string& body) {
  return client().Post("/v1/check", body, "application/json");
}

httplib::Result auth(const httplib::Headers& headers) { return client().Get("/v1/auth", headers); }

// The integer after `key` in `body`, or -1.
long long number_after(const std::string& body, const std::string& key) {
  const auto at = body.find(key);
  return at == std::string::npos ? -1 : std::atoll(body.c_str() + at + key.size());
}

std::string body_of(const httplib::Result& r) { return r ? r->body : "(no response)"; }

}  // namespace

TEST_CASE("POST /v1/check decides and answers JSON") {
  auto r =
      check(R"({"tenant":"http-a","route":"read","cost":4,"attempt_id":"a-1","rule_version":7})");
  REQUIRE(r);
  CHECK(r->status == 200);
  CHECK(r->get_header_value("Content-Type") == "application/json");
  CHECK(r->body ==
        "{\"allowed\":true,\"remaining\":6,\"retry_after_ms\":0,\"reset_after_ms\":400000,"
        "\"rule\":\"free-read\",\"applied_rule_version\":7,\"reason\":\"allowed\"}\n");
  // The same attempt again replays the first decision: nothing more is spent.
  r = check(R"({"tenant":"http-a","route":"read","cost":4,"attempt_id":"a-1"})");
  REQUIRE(r);
  CHECK_THAT(r->body, Catch::Matchers::Contains("\"remaining\":6,"));
  // Over the budget: 200 with allowed false and the wait for the missing units.
  r = check(R"({"tenant":"http-a","route":"read","cost":8})");
  REQUIRE(r);
  CHECK(r->status == 200);
  CHECK_THAT(r->body,
             Catch::Matchers::StartsWith("{\"allowed\":false,\"remaining\":6,\"retry_after_ms\":"));
  // 2 units missing at 1 unit per 100 s: 200 s, less the time since the first check.
  const long long retry_ms = number_after(r->body, "\"retry_after_ms\":");
  CHECK(retry_ms > 150'000);
  CHECK(retry_ms <= 200'000);
  CHECK_THAT(r->body, Catch::Matchers::Contains("\"reason\":\"over_limit\""));
  // Without a cost the rule file's cost (1) is paid.
  r = check(R"({"tenant":"http-a","route":"read"})");
  REQUIRE(r);
  CHECK_THAT(r->body, Catch::Matchers::Contains("\"remaining\":5,"));
}

TEST_CASE("bad, malformed and oversized JSON is 400 with a clear error, nothing deducted") {
  const std::pair<std::string, std::string> cases[] = {
      {"", "expected '{'"},
      {R"({"tenant":"http-bad","route":"read",})", "expected a member name"},
      {R"({"tenant":"http-bad","route":"read","cost":1.5})", "expected a whole number"},
      {R"({"tenant":"http-bad","route":"read","cost":"3"})",
       "member \\\"cost\\\": expected an integer"},
      {R"({"tenant":"http-bad","route":"read","cost":0})", "cost 0 is outside [1, 1000]"},
      {R"({"tenant":"http-bad","route":"read","cost":1001})", "cost 1001 is outside [1, 1000]"},
      {R"({"tenant":"http-bad","route":"read","cost":99999999999999999999})", "out of range"},
      {R"({"tenant":"http-bad","route":"nope"})", "unknown route class \\\"nope\\\""},
      {R"({"route":"read"})", "tenant is missing"},
      {R"({"tenant":"http-bad","route":"read","extra":1})", "unknown member \\\"extra\\\""},
      {R"({"tenant":"http-bad","route":"read","tenant":"x"})", "given twice"},
      {R"({"tenant":{"id":"x"},"route":"read"})", "nested objects and arrays are not accepted"},
      {"{\"tenant\":\"http-bad\",\"route\":\"read\",\"attempt_id\":\"" + std::string(9000, 'x') +
           "\"}",
       "at most 8192 are accepted"},
  };
  for (const auto& [body, message] : cases) {
    INFO(body.substr(0, 200));
    auto r = check(body);
    REQUIRE(r);
    CHECK(r->status == 400);
    CHECK_THAT(r->body,
               Catch::Matchers::StartsWith("{\"error\":\"invalid_argument\",\"message\":"));
    CHECK_THAT(r->body, Catch::Matchers::Contains(message));
  }
  auto r = check(R"({"tenant":"http-bad","route":"read"})");
  REQUIRE(r);
  CHECK_THAT(r->body, Catch::Matchers::Contains("\"remaining\":9,"));
  // No tenant rule: 404.
  r = check(R"({"tenant":"http-bad","plan":"pro","route":"read"})");
  REQUIRE(r);
  CHECK(r->status == 404);
  CHECK_THAT(r->body, Catch::Matchers::Contains("no tenant rule"));
}

TEST_CASE(
    "GET /v1/auth: 204 within budget, 403 with Retry-After and RateLimit over it, "
    "X-Quota-Status the client's answer") {
  const httplib::Headers h = {
      {"X-Quota-Tenant", "http-auth"}, {"X-Quota-Route", "read"}, {"X-Quota-Cost", "6"}};
  auto r = auth(h);
  REQUIRE(r);
  CHECK(r->status == 204);
  CHECK(r->get_header_value("RateLimit-Policy") == "\"free-read\";q=10;w=1000");
  CHECK(r->get_header_value("RateLimit") == "\"free-read\";r=4;t=600");
  CHECK_FALSE(r->has_header("Retry-After"));
  r = auth(h);
  REQUIRE(r);
  CHECK(r->status == 403);
  CHECK(r->get_header_value("X-Quota-Status") == "429");
  // Whole seconds rounded up: exact unless a second passed since the first call.
  CHECK_THAT(r->get_header_value("Retry-After"), Catch::Matchers::Matches("200|199"));
  CHECK_THAT(r->get_header_value("RateLimit"),
             Catch::Matchers::Matches("\"free-read\";r=4;t=(600|599)"));
  // Bad input: 403 with X-Quota-Status 400 (auth_request passes only 401 and 403 on to
  // the client), nothing deducted.
  r = auth({{"X-Quota-Route", "read"}});
  REQUIRE(r);
  CHECK(r->status == 403);
  CHECK(r->get_header_value("X-Quota-Status") == "400");
  CHECK_THAT(body_of(r), Catch::Matchers::Contains("X-Quota-Tenant is missing"));
  r = auth({{"X-Quota-Tenant", "http-auth"}, {"X-Quota-Route", "read"}, {"X-Quota-Cost", "x"}});
  REQUIRE(r);
  CHECK(r->status == 403);
  CHECK(r->get_header_value("X-Quota-Status") == "400");
  CHECK_THAT(body_of(r), Catch::Matchers::Contains("X-Quota-Cost: expected an integer"));
  r = auth({{"X-Quota-Tenant", "http-auth"}, {"X-Quota-Route", "nope"}});
  REQUIRE(r);
  CHECK(r->status == 403);
  CHECK(r->get_header_value("X-Quota-Status") == "400");
  r = auth({{"X-Quota-Tenant", "http-auth"}, {"X-Quota-Route", "read"}});
  REQUIRE(r);
  CHECK(r->status == 204);
  CHECK_THAT(r->get_header_value("RateLimit"),
             Catch::Matchers::Matches("\"free-read\";r=3;t=(700|699|698)"));
  // X-Quota-Plan is not read (--auth-headers does not name it): plan "x", which has no
  // rule, is not the plan decided with; the default plan's budget pays.
  r = auth({{"X-Quota-Tenant", "http-auth"}, {"X-Quota-Route", "read"}, {"X-Quota-Plan", "x"}});
  REQUIRE(r);
  CHECK(r->status == 204);
  CHECK_THAT(r->get_header_value("RateLimit"), Catch::Matchers::StartsWith("\"free-read\";r=2;"));
}

TEST_CASE("health, readiness and metrics") {
  auto r = client().Get("/healthz");
  REQUIRE(r);
  CHECK(r->status == 200);
  r = client().Get("/readyz");
  REQUIRE(r);
  CHECK(r->status == 200);
  REQUIRE(check(R"({"tenant":"http-metrics","route":"create"})"));
  REQUIRE(check(R"({"tenant":"http-metrics","route":"create","cost":100})"));
  r = client().Get("/metrics");
  REQUIRE(r);
  CHECK(r->status == 200);
  CHECK_THAT(r->body, Catch::Matchers::Contains("quota_rule_version 7\n"));
  CHECK_THAT(r->body, Catch::Matchers::Contains(
                          "quota_decisions_total{rule=\"free-create\",route=\"create\","
                          "level=\"tenant\",outcome=\"allowed\"} "));
  CHECK_THAT(r->body, Catch::Matchers::Contains(
                          "quota_decisions_total{rule=\"free-create\",route=\"create\","
                          "level=\"tenant\",outcome=\"denied\"} "));
  CHECK_THAT(r->body, Catch::Matchers::Contains(
                          "quota_server_requests_total{api=\"check\",answer=\"over_limit\"} "));
  // Tenant ids are labels of the top-K families only (units, denied units, budget in use),
  // at most 20 series each.
  std::map<std::string, std::size_t> tenant_labels;  // family → series
  for (std::size_t at = r->body.find("tenant=\""); at != std::string::npos;
       at = r->body.find("tenant=\"", at + 1)) {
    const std::size_t line = r->body.rfind('\n', at) + 1;
    const std::string family = r->body.substr(line, r->body.find('{', line) - line);
    CHECK_THAT(family, Catch::Matchers::Equals("quota_top_tenant_units") ||
                           Catch::Matchers::Equals("quota_top_tenant_denied_units") ||
                           Catch::Matchers::Equals("quota_top_tenant_budget_used_ratio"));
    ++tenant_labels[family];
  }
  CHECK(tenant_labels["quota_top_tenant_units"] >= 1);
  for (const auto& [family, series] : tenant_labels) CHECK(series <= 20);
}

TEST_CASE("SIGTERM stops the server with exit status 0") {
  REQUIRE(server().running());
  const int status = server().stop();
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
}
