// estimate_test — an LLM route's estimate over real HTTP: a check with prompt_tokens and
// max_output on a route with a prompt_factor deducts ceil(prompt × factor) + max_output
// (quota/gateway/rules/estimate_formula.hpp); a check lacking either, giving them beside
// a cost, or giving them on a route without a factor is 400 naming why, nothing deducted.
#include <httplib.h>

#include <catch2/catch.hpp>
#include <string>

#include "testing/scratch.hpp"
#include "testing/server_process.hpp"

namespace {

// The answer of POST /v1/check with `body`: its status and body.
std::pair<int, std::string> check(int port, const std::string& body) {
  httplib::Client c("127.0.0.1", port);
  c.set_read_timeout(10);
  auto r = c.Post("/v1/check", body, "application/json");
  REQUIRE(r);
  return {r->status, r->body};
}

}  // namespace

TEST_CASE("a route's prompt_factor makes an LLM call's cost; what it lacks is refused") {
  quota::testing::TempDir dir("estimate");
  const std::string rules =
      dir.write("rules.yaml",
                "routes:\n  - name: chat\n    prompt_factor: 3/2\n  - name: read\nrules:\n"
                "  - {name: tokens, level: tenant, plan: free, route: chat,\n"
                "     fixed_window: {limit: 100000, window: 1d}}\n"
                "  - {name: reads, level: tenant, plan: free, route: read,\n"
                "     token_bucket: {rate: 1/s, burst: 10}}\n");
  quota::testing::ServerProcess s;
  REQUIRE(
      s.start(quota::testing::server_args(rules, {"--fresh-budgets-at-start"}), {"grpc", "http"}));
  const int http = s.port("http");

  // 1001 × 3/2 = 1501.5, rounded up, + 256.
  auto [status, body] =
      check(http, R"({"tenant":"acme","route":"chat","prompt_tokens":1001,"max_output":256})");
  CHECK(status == 200);
  CHECK_THAT(body, Catch::Matchers::Contains("\"allowed\":true"));
  CHECK_THAT(body, Catch::Matchers::Contains("\"remaining\":98242"));  // 100000 - 1758

  const auto refused = [&](const std::string& request, const std::string& why) {
    INFO(request);
    auto [code, text] = check(http, request);
    CHECK(code == 400);
    CHECK_THAT(text, Catch::Matchers::Contains(why));
  };
  refused(R"({"tenant":"acme","route":"chat","prompt_tokens":10})",
          "route \\\"chat\\\" estimates prompt_tokens * 3/2 + max_output: max_output is missing");
  refused(R"({"tenant":"acme","route":"chat"})", "prompt_tokens is missing");
  refused(R"({"tenant":"acme","route":"chat","prompt_tokens":-1,"max_output":5})",
          "prompt_tokens -1 is negative");
  refused(R"({"tenant":"acme","route":"chat","prompt_tokens":1,"max_output":1,"cost":7})",
          "cost and prompt_tokens/max_output are exclusive");
  refused(R"({"tenant":"acme","route":"read","prompt_tokens":1,"max_output":1})",
          "route \\\"read\\\" has no estimate formula (prompt_factor)");
  refused(R"({"tenant":"acme","route":"chat","prompt_tokens":"12","max_output":1})",
          "member \\\"prompt_tokens\\\": expected an integer");

  // Nothing refused was deducted: the next call sees 98242 - 2 left (1 × 3/2 → 2, + 0).
  auto [after, after_body] =
      check(http, R"({"tenant":"acme","route":"chat","prompt_tokens":1,"max_output":0})");
  CHECK(after == 200);
  CHECK_THAT(after_body, Catch::Matchers::Contains("\"remaining\":98240"));
  // A route without a factor still takes a cost, or none.
  CHECK(check(http, R"({"tenant":"acme","route":"read"})").first == 200);
  CHECK(s.stop() == 0);
}
