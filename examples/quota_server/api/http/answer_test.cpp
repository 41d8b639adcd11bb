// answer_test — quota-server's answers are whole, over real sockets:
//   - on a route with several limits, every field of an answer (rule, remaining, reset,
//     retry, the RateLimit headers' policy and numbers, gRPC's current_limit and
//     limit_remaining) belongs to one limit, the one that decided (gateway.hpp combine_levels);
//   - a cost on a route whose budgets all have fixed costs is refused (400), not replaced;
//   - rule_version in a check is enforced: another version than the one in force is 409;
//   - one body limit (8 KiB) with one answer, 400 with a message, whatever the Content-Type;
//   - a known path asked with another method is 405 with Allow;
//   - a 503 carries Retry-After.
#include <httplib.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <string>

#include <grpcpp/grpcpp.h>

#include "envoy/service/ratelimit/v3/rls.grpc.pb.h"
#include "testing/scratch.hpp"
#include "testing/server_process.hpp"

namespace {

namespace rls = envoy::service::ratelimit::v3;
using quota::testing::env;

quota::testing::ServerProcess& server() {
  static quota::testing::ServerProcess s;
  if (!s.running()) {
    REQUIRE(s.start({env("QUOTA_SERVER"), "--rules", env("QUOTA_ANSWER_RULES"), "--default-plan",
                     "free", "--grpc-port", "0", "--http-port", "0", "--fresh-budgets-at-start",
                     "--auth-headers", "tenant,route,cost"},
                    {"grpc", "http"}));
  }
  return s;
}

httplib::Client client() {
  httplib::Client c("127.0.0.1", server().port("http"));
  c.set_read_timeout(10);
  return c;
}

httplib::Result post(const std::string& body, const char* type = "application/json") {
  return client().Post("/v1/check", body, type);
}

}  // namespace

TEST_CASE("several limits: the answer's fields belong to the limit that decided") {
  // 900 tokens: tokens-minute has 100 left and room for no second such request — the
  // most restrictive; requests has 59 left, tokens-month 999,100.
  auto r = post(R"({"tenant":"whole-json","route":"complete","cost":900})");
  REQUIRE(r);
  INFO(r->body);
  CHECK(r->status == 200);
  CHECK_THAT(r->body, Catch::Matchers::Contains("\"allowed\":true"));
  CHECK_THAT(r->body, Catch::Matchers::Contains("\"rule\":\"tokens-minute\""));
  CHECK_THAT(r->body, Catch::Matchers::Contains("\"remaining\":100,"));
  // The minute's window (≤ 60 s), never the month's.
  const auto at = r->body.find("\"reset_after_ms\":");
  REQUIRE(at != std::string::npos);
  const long long reset = std::stoll(r->body.substr(at + 17));
  CHECK(reset > 0);
  CHECK(reset <= 60'000);
  // 200 more do not fit the minute: the denial is tokens-minute's, its numbers.
  r = post(R"({"tenant":"whole-json","route":"complete","cost":200})");
  REQUIRE(r);
  CHECK_THAT(r->body, Catch::Matchers::Contains("\"allowed\":false"));
  CHECK_THAT(r->body, Catch::Matchers::Contains("\"rule\":\"tokens-minute\""));
  CHECK_THAT(r->body, Catch::Matchers::Contains("\"remaining\":100,"));
}

TEST_CASE("several limits: the RateLimit headers describe one limit") {
  auto r = client().Get(
      "/v1/auth",
      {{"X-Quota-Tenant", "whole-auth"}, {"X-Quota-Route", "complete"}, {"X-Quota-Cost", "900"}});
  REQUIRE(r);
  CHECK(r->status == 204);
  CHECK(r->get_header_value("RateLimit-Policy") == "\"tokens-minute\";q=1000;w=60");
  CHECK_THAT(r->get_header_value("RateLimit"),
             Catch::Matchers::Matches("\"tokens-minute\";r=100;t=([1-5]?[0-9]|60)"));
}

TEST_CASE("several limits: gRPC's current_limit and limit_remaining describe one limit") {
  auto stub = rls::RateLimitService::NewStub(grpc::CreateChannel(
      "127.0.0.1:" + std::to_string(server().port("grpc")), grpc::InsecureChannelCredentials()));
  rls::RateLimitRequest req;
  req.set_domain("quota");
  req.set_hits_addend(900);
  auto* d = req.add_descriptors();
  for (auto [k, v] : {std::pair{"tenant", "whole-grpc"}, std::pair{"route", "complete"}}) {
    auto* e = d->add_entries();
    e->set_key(k);
    e->set_value(v);
  }
  rls::RateLimitResponse resp;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  REQUIRE(stub->ShouldRateLimit(&ctx, req, &resp).ok());
  REQUIRE(resp.statuses_size() == 1);
  const auto& s = resp.statuses(0);
  CHECK(s.code() == rls::RateLimitResponse::OK);
  CHECK(s.current_limit().name() == "tokens-minute");
  CHECK(s.limit_remaining() == 100);
  CHECK(s.duration_until_reset().seconds() <= 60);
}

TEST_CASE("a cost on a route whose budgets all have fixed costs is refused, nothing deducted") {
  auto r = post(R"({"tenant":"fixed","route":"create","cost":25})");
  REQUIRE(r);
  CHECK(r->status == 400);
  CHECK_THAT(r->body, Catch::Matchers::Contains("fixed costs"));
  r = post(R"({"tenant":"fixed","route":"create"})");
  REQUIRE(r);
  CHECK_THAT(r->body, Catch::Matchers::Contains("\"remaining\":15,"));  // 20 - 5: one charge
}

TEST_CASE("rule_version in a check is enforced") {
  auto r = post(R"({"tenant":"versioned","route":"create","rule_version":2})");
  REQUIRE(r);
  CHECK(r->status == 409);
  CHECK_THAT(r->body, Catch::Matchers::Contains("version 1 is in force"));
  r = post(R"({"tenant":"versioned","route":"create","rule_version":1})");
  REQUIRE(r);
  CHECK(r->status == 200);
  CHECK_THAT(r->body, Catch::Matchers::Contains("\"remaining\":15,"));  // the 409 spent nothing
}

TEST_CASE("one body limit, one answer: 400 with a message whatever the Content-Type") {
  const std::string big = R"({"tenant":")" + std::string(9000, 'x') + R"("})";
  for (const char* type : {"application/json", "text/plain", "application/octet-stream"}) {
    auto r = post(big, type);
    REQUIRE(r);
    INFO(type);
    CHECK(r->status == 400);
    CHECK_THAT(r->body, Catch::Matchers::Contains("at most 8192 are accepted"));
  }
}

TEST_CASE("a known path with another method is 405 naming the method it takes") {
  auto r = client().Get("/v1/check");
  REQUIRE(r);
  CHECK(r->status == 405);
  CHECK(r->get_header_value("Allow") == "POST");
  r = client().Post("/v1/auth", "", "text/plain");
  REQUIRE(r);
  CHECK(r->status == 405);
  CHECK(r->get_header_value("Allow") == "GET");
  r = client().Get("/json");  // envoyproxy/ratelimit's JSON API takes POST
  REQUIRE(r);
  CHECK(r->status == 405);
  CHECK(r->get_header_value("Allow") == "POST");
  r = client().Get("/v1/nothing");
  REQUIRE(r);
  CHECK(r->status == 404);
}

TEST_CASE("a 503 carries Retry-After") {
  // A Redis nobody listens on: the store cannot decide; the route fails closed.
  quota::testing::ServerProcess s;
  REQUIRE(s.start({env("QUOTA_SERVER"), "--rules", env("QUOTA_ANSWER_RULES"), "--default-plan",
                   "free", "--grpc-port", "0", "--http-port", "0", "--redis", "127.0.0.1:1",
                   "--redis-deadline-ms", "200"},
                  {"grpc", "http"}));
  httplib::Client c("127.0.0.1", s.port("http"));
  c.set_read_timeout(10);
  auto r = c.Post("/v1/check", R"({"tenant":"down","route":"create"})", "application/json");
  REQUIRE(r);
  CHECK(r->status == 503);
  CHECK(r->get_header_value("Retry-After") == "1");
}
