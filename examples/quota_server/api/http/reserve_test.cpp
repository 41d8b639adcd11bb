// reserve_test — the admin API over real HTTP (in process): POST /v1/admin/reserve with
// --admin-token-file's bearer token releases a global fair-share rule's reserve to one
// tenant, who then gets exactly that many units more while the other tenants stay held
// back; the release is logged on stderr and shown on /metrics. Without the token 401,
// without --admin-token-file 404, an unknown rule 404, more than the reserve 409, bad
// bodies 400 — none releasing anything.
#include <httplib.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <fstream>
#include <iterator>
#include <string>
#include <thread>

#include "testing/scratch.hpp"
#include "testing/server_process.hpp"

namespace reserve_test {

using namespace std::chrono_literals;

// 100 units per 10 s period shared by every tenant: a reserve of 10 %, paused at 90 %.
constexpr const char* kRules =
    "routes:\n  - name: call\nrules:\n"
    "  - {name: per-tenant, level: tenant, plan: free, route: call,\n"
    "     token_bucket: {rate: 1/1000s, burst: 1000000}}\n"
    "  - {name: provider, level: global, route: call,\n"
    "     token_bucket: {rate: 1/1000s, burst: 1000000},\n"
    "     fair_share: {budget: 100, period: 10s, reserve: 10%}}\n";

std::pair<int, std::string> post(int port, const char* path, const std::string& body,
                                 const std::string& token = "") {
  httplib::Client c("127.0.0.1", port);
  c.set_read_timeout(10);
  httplib::Headers h;
  if (!token.empty()) h.emplace("Authorization", "Bearer " + token);
  auto r = c.Post(path, h, body, "application/json");
  REQUIRE(r);
  return {r->status, r->body};
}

// Waits, when less than 3 s of the current 10 s period are left, for the next one: the
// server's fair-share periods are multiples of 10 s on the steady clock (in process, no
// offset), so the exact counts below are taken within one period.
void start_of_a_period() {
  const auto now = std::chrono::steady_clock::now().time_since_epoch();
  const auto left = 10s - now % 10s;
  if (left < 3s) std::this_thread::sleep_for(left + 50ms);
}

// 1-unit checks of `tenant` until one is refused (at most 500): how many were admitted.
int admit_all(int port, const std::string& tenant) {
  for (int n = 0; n < 500; ++n) {
    auto [status, body] = post(port, "/v1/check", R"({"tenant":")" + tenant + R"(","cost":1})");
    REQUIRE(status == 200);
    if (body.find("\"allowed\":true") == std::string::npos) return n;
  }
  FAIL("never refused");
  return 0;
}

TEST_CASE("an operator releases a fair-share reserve to one tenant") {
  quota::testing::TempDir dir("reserve");
  const std::string rules = dir.write("rules.yaml", kRules);
  const std::string token_file = dir.write("token", "s3cret-admin\n");
  const std::string err = dir.path + "/stderr";
  quota::testing::ServerProcess s;
  s.set_stderr(err);
  REQUIRE(
      s.start(quota::testing::server_args(rules, {"--default-route", "call", "--admin-token-file",
                                                  token_file, "--fresh-budgets-at-start"}),
              {"grpc", "http"}));
  const int http = s.port("http");
  const std::string release = R"({"rule":"provider","tenant":"acme","units":10,"seconds":60})";

  CHECK(post(http, "/v1/admin/reserve", release).first == 401);
  CHECK(post(http, "/v1/admin/reserve", release, "wrong").first == 401);
  CHECK(post(http, "/v1/admin/reserve",
             R"({"rule":"nope","tenant":"acme","units":10,"seconds":60})", "s3cret-admin")
            .first == 404);
  auto [over, over_body] =
      post(http, "/v1/admin/reserve",
           R"({"rule":"provider","tenant":"acme","units":11,"seconds":60})", "s3cret-admin");
  CHECK(over == 409);
  CHECK_THAT(over_body, Catch::Matchers::Contains("11 units asked, 10 of its reserve of 10 left"));
  CHECK(post(http, "/v1/admin/reserve", R"({"rule":"provider","tenant":"acme","units":1})",
             "s3cret-admin")
            .first == 400);
  CHECK(post(http, "/v1/admin/reserve",
             R"({"rule":"provider","tenant":"acme","units":1,)"
             R"("seconds":1,"extra":1})",
             "s3cret-admin")
            .first == 400);

  // With globex's unit in use, acme draws up to the pause level (89); released, exactly
  // 10 more, the whole budget in use and no more.
  start_of_a_period();
  REQUIRE(
      post(http, "/v1/check", R"({"tenant":"globex","cost":1})").second.find("\"allowed\":true") !=
      std::string::npos);
  CHECK(admit_all(http, "acme") == 89);
  auto [ok, ok_body] = post(http, "/v1/admin/reserve", release, "s3cret-admin");
  CHECK(ok == 200);
  CHECK(ok_body == "{\"rule\":\"provider\",\"tenant\":\"acme\",\"units\":10,\"seconds\":60}\n");
  CHECK(admit_all(http, "acme") == 10);
  CHECK(admit_all(http, "globex") == 0);
  httplib::Client c("127.0.0.1", http);
  auto metrics = c.Get("/metrics");
  REQUIRE(metrics);
  CHECK_THAT(metrics->body,
             Catch::Matchers::Contains("quota_fair_share_reserve_released_units{rule=\"provider\","
                                       "tenant=\"acme\"} 10"));
  CHECK_THAT(metrics->body,
             Catch::Matchers::Contains("quota_fair_share_reserve_in_use_units{rule=\"provider\","
                                       "tenant=\"acme\"} 10"));
  CHECK_THAT(metrics->body,
             Catch::Matchers::Contains("quota_fair_share_reserve_units{rule=\"provider\""));
  CHECK(s.stop() == 0);
  std::ifstream in(err);
  const std::string log((std::istreambuf_iterator<char>(in)), {});
  CHECK_THAT(log, Catch::Matchers::Contains(
                      "admin: reserve of rule \"provider\": 10 units released to tenant \"acme\" "
                      "for 60 s"));
  CHECK_THAT(log, Catch::Matchers::Contains("admin: refused a call without the token"));
}

TEST_CASE("without --admin-token-file the admin API is off") {
  quota::testing::TempDir dir("reserve-off");
  const std::string rules = dir.write("rules.yaml", kRules);
  quota::testing::ServerProcess s;
  REQUIRE(
      s.start(quota::testing::server_args(rules, {"--default-route", "call"}), {"grpc", "http"}));
  auto [status, body] =
      post(s.port("http"), "/v1/admin/reserve",
           R"({"rule":"provider","tenant":"acme","units":1,"seconds":1})", "anything");
  CHECK(status == 404);
  CHECK_THAT(body, Catch::Matchers::Contains("the admin API is off"));
  CHECK(s.stop() == 0);
}

}  // namespace reserve_test
