// quota_server_metrics_test — /metrics of a real quota-server process (in-process store),
// over real HTTP and gRPC on loopback: the decision-latency histogram counts every check
// call, near-limit counts the admission that leaves a rule under 10 % of its burst, and the
// top-K lists the heaviest tenant first with its units, bounded to at most 20 series
// however many tenants call; a global rule with `fair_share` is served as one
// quota_fair_share_* series per budget (no tenant label), its use moving with the calls;
// a retried attempt counts as replayed; each scrape passes `promtool check metrics`.
#include <httplib.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "envoy/service/ratelimit/v3/rls.grpc.pb.h"
#include "testing/metrics_text.hpp"
#include "testing/scratch.hpp"
#include "testing/server_process.hpp"

namespace {

namespace rls = envoy::service::ratelimit::v3;
using quota::testing::fair_sample;
using quota::testing::metric_value;

using quota::testing::env;

std::string metrics(int port) {
  httplib::Client c("127.0.0.1", port);
  c.set_read_timeout(10);
  auto r = c.Get("/metrics");
  REQUIRE(r);
  REQUIRE(r->status == 200);
  return r->body;
}

bool check(int port, const std::string& tenant, int cost) {
  httplib::Client c("127.0.0.1", port);
  c.set_read_timeout(10);
  auto r =
      c.Post("/v1/check", R"({"tenant":")" + tenant + R"(","cost":)" + std::to_string(cost) + "}",
             "application/json");
  REQUIRE(r);
  REQUIRE(r->status == 200);
  return r->body.find("\"allowed\":true") != std::string::npos;
}

// A rule file: tenants of plan free read under "per-tenant", `burst` units refilled at 1
// per 100 s; more rules may follow.
std::string per_tenant_rules(int burst) {
  return "routes:\n  - name: read\nrules:\n  - name: per-tenant\n    level: tenant\n"
         "    plan: free\n    route: read\n    token_bucket: {rate: 1/100s, burst: " +
         std::to_string(burst) + "}\n";
}

// quota-server on `rules` with fresh budgets (the test counts from a full burst).
std::vector<std::string> server_args(const std::string& rules) {
  return quota::testing::server_args(rules, {"--fresh-budgets-at-start"});
}

// `promtool check metrics` (Debian's prometheus, QUOTA_PROMTOOL) on a scrape: the text
// is valid exposition format and lints clean (names, HELP, TYPE, units). Without promtool
// the check is skipped with a warning.
void check_with_promtool(const std::string& scrape, const std::string& dir) {
  const char* promtool = std::getenv("QUOTA_PROMTOOL");
  if (promtool == nullptr || *promtool == '\0') {
    WARN("QUOTA_PROMTOOL is not set: promtool check metrics skipped");
    return;
  }
  const std::string file = dir + "/scrape.txt";
  const std::string out = dir + "/promtool.out";
  std::ofstream(file) << scrape;
  const int rc = std::system(
      (std::string("'") + promtool + "' check metrics < '" + file + "' > '" + out + "' 2>&1")
          .c_str());
  std::ifstream in(out);
  const std::string said((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  INFO("promtool check metrics: " << said);
  CHECK(rc == 0);
  std::remove(file.c_str());
  std::remove(out.c_str());
}

}  // namespace

TEST_CASE("metrics: latency histogram, near-limit and top tenants move with real calls") {
  quota::testing::TempDir dir("metrics");
  quota::testing::ServerProcess s;
  REQUIRE(s.start(server_args(dir.write("rules.yaml", per_tenant_rules(10))), {"grpc", "http"}));
  const int http = s.port("http");

  const std::string before = metrics(http);
  CHECK(before.find("# TYPE quota_decision_duration_seconds histogram") != std::string::npos);
  CHECK(metric_value(before, "quota_decision_duration_seconds_count") == 0);
  CHECK(metric_value(before, "quota_near_limit_total{rule=\"per-tenant\"}") == -1);
  CHECK(metric_value(before, "quota_redis_errors_total{kind=\"unavailable\"}") == 0);

  // "heavy": 8 + 1 leaves 1 of 10 (not under 10 %), the next 1 leaves 0 (near), then denied.
  CHECK(check(http, "heavy", 8));
  CHECK(check(http, "heavy", 1));
  const std::string mid = metrics(http);
  CHECK(metric_value(mid, "quota_near_limit_total{rule=\"per-tenant\"}") == -1);
  CHECK(check(http, "heavy", 1));
  CHECK_FALSE(check(http, "heavy", 1));
  // 30 light tenants, 1 unit each: more tenants than the sketch's 20 counters.
  for (int i = 0; i < 30; ++i) CHECK(check(http, "light-" + std::to_string(i), 1));
  // One gRPC call (1 unit for "heavy", denied): timed too.
  {
    auto stub = rls::RateLimitService::NewStub(grpc::CreateChannel(
        "127.0.0.1:" + std::to_string(s.port("grpc")), grpc::InsecureChannelCredentials()));
    rls::RateLimitRequest req;
    req.set_domain("quota");
    auto* e = req.add_descriptors()->add_entries();
    e->set_key("tenant");
    e->set_value("heavy");
    rls::RateLimitResponse resp;
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    REQUIRE(stub->ShouldRateLimit(&ctx, req, &resp).ok());
    CHECK(resp.overall_code() == rls::RateLimitResponse::OVER_LIMIT);
  }

  const std::string after = metrics(http);
  INFO(after);
  const double calls = 4 + 30 + 1;
  CHECK(metric_value(after, "quota_decision_duration_seconds_count") == calls);
  CHECK(metric_value(after, "quota_decision_duration_seconds_bucket{le=\"+Inf\"}") == calls);
  const double under_100ms =
      metric_value(after, "quota_decision_duration_seconds_bucket{le=\"0.1\"}");
  CHECK(under_100ms >= 0);
  CHECK(under_100ms <= calls);
  CHECK(metric_value(after, "quota_decision_duration_seconds_sum") > 0);
  CHECK(metric_value(after, "quota_near_limit_total{rule=\"per-tenant\"}") == 1);
  // heavy asked for 8+1+1+1 units over HTTP and 1 over gRPC (the rule file's cost): 12, the
  // most of all (a light tenant's count is over by at most N/K = 42/20).
  CHECK(metric_value(after, "quota_top_tenant_units{rank=\"1\",tenant=\"heavy\"}") == 12);
  // Of them, 1 refused over HTTP and 1 over gRPC; its budget all in use after the last.
  CHECK(metric_value(after, "quota_top_tenant_denied_units{rank=\"1\",tenant=\"heavy\"}") == 2);
  CHECK(metric_value(after, "quota_top_tenant_budget_used_ratio{rank=\"1\",tenant=\"heavy\"}") ==
        1.0);
  std::size_t series = 0;
  for (std::size_t at = after.find("\nquota_top_tenant_units{"); at != std::string::npos;
       at = after.find("\nquota_top_tenant_units{", at + 1)) {
    ++series;
  }
  CHECK(series == 20);
  CHECK(after.find("rank=\"21\"") == std::string::npos);
  check_with_promtool(after, dir.path);
  CHECK(s.stop() == 0);
}

TEST_CASE("metrics: a retried attempt is counted as replayed") {
  quota::testing::TempDir dir("attempts");
  quota::testing::ServerProcess s;
  REQUIRE(s.start(server_args(dir.write("rules.yaml", per_tenant_rules(10))), {"grpc", "http"}));
  const int http = s.port("http");
  CHECK(metric_value(metrics(http), "quota_attempts_total{outcome=\"replayed\"}") == 0);
  httplib::Client c("127.0.0.1", http);
  c.set_read_timeout(10);
  for (int i = 0; i < 3; ++i) {  // the first decides, the two retries replay it
    auto r = c.Post("/v1/check", R"({"tenant":"acme","attempt_id":"req-1"})", "application/json");
    REQUIRE(r);
    CHECK(r->status == 200);
  }
  auto other = c.Post("/v1/check", R"({"tenant":"acme","attempt_id":"req-2"})", "application/json");
  REQUIRE(other);
  const std::string m = metrics(http);
  INFO(m);
  CHECK(metric_value(m, "quota_attempts_total{outcome=\"replayed\"}") == 2);
  CHECK(metric_value(m, "quota_attempts_total{outcome=\"expired\"}") == 0);
  check_with_promtool(m, dir.path);
  CHECK(s.stop() == 0);
}

TEST_CASE("metrics: a fair-share budget is one quota_fair_share_* series, its use moving") {
  quota::testing::TempDir dir("fair_metrics");
  quota::testing::ServerProcess s;
  REQUIRE(s.start(server_args(dir.write(
                      "rules.yaml", per_tenant_rules(100) +
                                        "  - name: provider\n    level: global\n    route: read\n"
                                        "    token_bucket: {rate: 1/100s, burst: 100}\n"
                                        "    fair_share: {reserve: 10%, shares_above: 70%, "
                                        "pause_above: 90%, period: 10s,\n"
                                        "                 budget: 100}\n")),
                  {"grpc", "http"}));
  const int http = s.port("http");
  // Three tenants spend 30 of the 100 units: below the 70 % threshold, all admitted.
  for (int i = 0; i < 30; ++i) CHECK(check(http, "t" + std::to_string(i % 3), 1));
  const std::string m = metrics(http);
  INFO(m);
  CHECK(m.find("# TYPE quota_fair_share_budget_units gauge") != std::string::npos);
  CHECK(fair_sample(m, "quota_fair_share_budget_units") > 0);
  CHECK(fair_sample(m, "quota_fair_share_units_in_use") >= 30);
  CHECK(fair_sample(m, "quota_fair_share_denials_total", "reason=\"over_share\"") == 0);
  CHECK(fair_sample(m, "quota_fair_share_denials_total", "reason=\"paused\"") == 0);
  CHECK(fair_sample(m, "quota_fair_share_fallback_periods_total") == 0);
  // No tenant is ever a label.
  CHECK(m.find("quota_fair_share_budget_units{rule=\"provider\",budget=\"t0") == std::string::npos);
  check_with_promtool(m, dir.path);
  CHECK(s.stop() == 0);
}
