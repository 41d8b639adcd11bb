// settle_test — estimate and settle over HTTP through two quota-server processes on one
// real redis-server (a ScratchServer of this test): a check with an estimate at one server
// returns a ticket that the other settles (the ticket lives in Redis, quota/redis/
// tickets.hpp), once; a repeated settle, another tenant's, an unknown or malformed ticket
// and a negative actual are refused and change nothing, an expired one is 410 with its
// estimate spent. Under load from both sides — each
// estimate checked at one server and settled at the other, then settled again there — the
// actual units admitted pass the envelope verifier for the bound docs/llm-budgets.md
// states: over any interval, r·T + B + the surplus given back in it for estimates admitted
// before it (at most one outstanding estimate per client) + the deficits admitted in it.
#include <httplib.h>

#include <algorithm>
#include <atomic>
#include <catch2/catch.hpp>
#include <fstream>
#include <iterator>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/strings/numbers.h"
#include "quota/v1/budget.grpc.pb.h"
#include "quota/verify/envelope.hpp"
#include "redis/support/redis_server.hpp"
#include "testing/load_clients.hpp"
#include "testing/scratch.hpp"
#include "testing/server_process.hpp"

namespace settle_test {

using quota::testing::now_ns;

// POST `path` with `body` to `port`: the status and body (a call without an answer fails).
std::pair<int, std::string> post(int port, const char* path, const std::string& body) {
  httplib::Client c("127.0.0.1", port);
  c.set_read_timeout(10);
  auto r = c.Post(path, body, "application/json");
  REQUIRE(r);
  return {r->status, r->body};
}

// The ticket of a check's answer ("ticket":"<digits>"), or "" when it has none.
std::string ticket_of(const std::string& body) {
  const std::string tag = "\"ticket\":\"";
  const auto at = body.find(tag);
  if (at == std::string::npos) return "";
  return body.substr(at + tag.size(), body.find('"', at + tag.size()) - at - tag.size());
}

std::string settle_body(const std::string& tenant, const std::string& ticket, long long actual) {
  return R"({"tenant":")" + tenant + R"(","ticket":")" + ticket + R"(","actual":)" +
         std::to_string(actual) + "}";
}

// Two servers on one fresh Redis, with `rules` (route "chat") and `more` flags.
struct TwoServers {
  explicit TwoServers(const std::string& rules_text, std::vector<std::string> more = {})
      : redis(quota::testing::scratch_dir("quota-server-settle")), dir("settle") {
    REQUIRE(redis.started());
    const std::string rules = dir.write("rules.yaml", rules_text);
    std::vector<std::string> args = {
        "--default-route",     "chat", "--redis", "127.0.0.1:" + std::to_string(redis.port()),
        "--redis-deadline-ms", "2000"};
    args.insert(args.end(), more.begin(), more.end());
    for (auto* s : {&a, &b}) {
      REQUIRE(s->start(quota::testing::server_args(rules, args), {"grpc", "http"}));
    }
  }
  quota::testing::ScratchServer redis;
  quota::testing::TempDir dir;
  quota::testing::ServerProcess a, b;
};

TEST_CASE("an estimate checked at one server settles at the other, once") {
  // 1000 tokens that do not come back by themselves within the test.
  TwoServers s(
      "routes:\n  - name: chat\nrules:\n"
      "  - {name: tokens, level: tenant, plan: free, route: chat,\n"
      "     token_bucket: {rate: 1/1000s, burst: 1000}}\n");
  const int a = s.a.port("http"), b = s.b.port("http");
  auto [status, body] = post(a, "/v1/check", R"({"tenant":"acme","estimate":600})");
  REQUIRE(status == 200);
  CHECK_THAT(body, Catch::Matchers::Contains("\"remaining\":400"));
  const std::string ticket = ticket_of(body);
  REQUIRE_FALSE(ticket.empty());

  const auto refused = [&](int port, const std::string& request, int want, const char* why) {
    INFO(request);
    auto [code, text] = post(port, "/v1/settle", request);
    CHECK(code == want);
    CHECK_THAT(text, Catch::Matchers::Contains(why));
  };
  refused(b, settle_body("globex", ticket, 0), 404, "no such ticket of tenant \\\"globex\\\"");
  refused(b, settle_body("acme", "12345", 0), 404, "no such ticket of tenant");
  refused(b, settle_body("acme", ticket, -1), 400, "actual -1 is outside");
  refused(b, settle_body("acme", "x1", 0), 400, "member \\\"ticket\\\"");
  refused(b, R"({"tenant":"acme","ticket":")" + ticket + R"("})", 400, "actual is missing");
  refused(b, R"({"tenant":"acme","actual":1})", 400, "ticket is missing");
  refused(b, R"({"tenant":"acme","ticket":")" + ticket + R"(","actual":1,"x":2})", 400,
          "unknown member \\\"x\\\"");
  // None of those gave anything back: 1 more unit leaves 399.
  CHECK_THAT(post(a, "/v1/check", R"({"tenant":"acme","cost":1})").second,
             Catch::Matchers::Contains("\"remaining\":399"));

  auto [settled, text] = post(b, "/v1/settle", settle_body("acme", ticket, 150));
  CHECK(settled == 200);
  CHECK(text == "{\"estimate\":600,\"actual\":150,\"surplus\":450,\"deficit\":0}\n");
  refused(a, settle_body("acme", ticket, 150), 409, "already settled");
  refused(b, settle_body("acme", ticket, 150), 409, "already settled");
  CHECK_THAT(post(b, "/v1/check", R"({"tenant":"acme","cost":1})").second,
             Catch::Matchers::Contains("\"remaining\":848"));  // 1000 - 600 - 1 + 450 - 1

  // A cost is decided now and has no ticket; an estimate with a cost is refused.
  CHECK(ticket_of(post(a, "/v1/check", R"({"tenant":"acme","cost":1})").second).empty());
  CHECK(post(a, "/v1/check", R"({"tenant":"acme","cost":1,"estimate":2})").first == 400);

  // Counted on /metrics, by outcome.
  httplib::Client c("127.0.0.1", b);
  auto metrics = c.Get("/metrics");
  REQUIRE(metrics);
  CHECK_THAT(metrics->body,
             Catch::Matchers::Contains("quota_settles_total{outcome=\"applied\"} 1"));
  CHECK_THAT(metrics->body,
             Catch::Matchers::Contains("quota_settles_total{outcome=\"unknown\"} 2"));
  CHECK_THAT(metrics->body, Catch::Matchers::Contains("quota_settle_surplus_units_total 450"));
  // (and how full the Redis is, for QuotaRedisMemoryNearLimit: examples/alerts/)
  const std::string node = "{node=\"127.0.0.1:" + std::to_string(s.redis.port()) + "\"} ";
  CHECK_THAT(metrics->body, Catch::Matchers::Contains("quota_redis_used_memory_bytes" + node));
  CHECK_THAT(metrics->body,
             !Catch::Matchers::Contains("quota_redis_used_memory_bytes" + node + "0\n"));
  CHECK_THAT(metrics->body, Catch::Matchers::Contains("quota_redis_maxmemory_bytes" + node));
  CHECK(s.a.stop() == 0);
  CHECK(s.b.stop() == 0);
}

TEST_CASE("a ticket past --ticket-ttl-s is 410 at either server, its estimate spent") {
  TwoServers s(
      "routes:\n  - name: chat\nrules:\n"
      "  - {name: tokens, level: tenant, plan: free, route: chat,\n"
      "     token_bucket: {rate: 1/1000s, burst: 1000}}\n",
      {"--ticket-ttl-s", "1"});
  const int a = s.a.port("http"), b = s.b.port("http");
  const std::string ticket =
      ticket_of(post(a, "/v1/check", R"({"tenant":"acme","estimate":300})").second);
  REQUIRE_FALSE(ticket.empty());
  std::this_thread::sleep_for(std::chrono::milliseconds(1200));
  for (int port : {b, a}) {
    auto [status, body] = post(port, "/v1/settle", settle_body("acme", ticket, 0));
    CHECK(status == 410);
    CHECK_THAT(body, Catch::Matchers::Contains("the estimate stays spent"));
  }
  CHECK_THAT(post(b, "/v1/check", R"({"tenant":"acme","cost":1})").second,
             Catch::Matchers::Contains("\"remaining\":699"));
  CHECK(s.a.stop() == 0);
  CHECK(s.b.stop() == 0);
}

TEST_CASE("estimates checked at one server and settled at the other stay in the envelope") {
  constexpr std::int64_t kRate = 100, kBurst = 50, kMaxEstimate = 20;
  TwoServers s(
      "routes:\n  - name: chat\nrules:\n"
      "  - {name: tokens, level: tenant, plan: free, route: chat,\n"
      "     token_bucket: {rate: 100/1s, burst: 50}}\n");
  const int ports[2] = {s.a.port("http"), s.b.port("http")};
  struct Used {
    std::int64_t at = 0;
    std::int64_t units = 0;
  };
  std::mutex mu;
  std::vector<Used> used;
  std::int64_t deficits = 0, longest = 0, settled = 0, repeated = 0, denied = 0;
  std::string error;
  const std::int64_t until = now_ns() + 1'500'000'000;
  std::vector<std::thread> clients;
  constexpr int kClients = 4;
  for (int k = 0; k < kClients; ++k) {
    clients.emplace_back([&, k] {
      std::mt19937_64 rng(20261207 + k);  // fixed seeds
      httplib::Client check("127.0.0.1", ports[k % 2]), settle("127.0.0.1", ports[1 - k % 2]);
      for (int n = 0; n < 5'000 && now_ns() < until; ++n) {
        const std::int64_t estimate = 1 + static_cast<std::int64_t>(rng() % kMaxEstimate);
        const std::int64_t sent = now_ns();
        auto r = check.Post("/v1/check",
                            R"({"tenant":"acme","estimate":)" + std::to_string(estimate) + "}",
                            "application/json");
        const std::int64_t answered = now_ns();
        std::lock_guard lock(mu);
        if (!r || r->status != 200) {
          error = r ? r->body : "no answer";
          return;
        }
        const std::string ticket = ticket_of(r->body);
        if (ticket.empty()) {
          ++denied;
          continue;
        }
        // Mostly at or under the estimate; one in ten over it by 1..5.
        const std::int64_t actual = rng() % 10 == 0
                                        ? estimate + 1 + static_cast<std::int64_t>(rng() % 5)
                                        : static_cast<std::int64_t>(rng() % (estimate + 1));
        longest = std::max(longest, answered - sent);
        if (actual > 0) used.push_back({answered, actual});
        deficits += std::max<std::int64_t>(0, actual - estimate);
        for (int again = 0; again < 2; ++again) {
          auto st =
              settle.Post("/v1/settle", settle_body("acme", ticket, actual), "application/json");
          if (!st || st->status != (again == 0 ? 200 : 409)) {
            error = st ? st->body : "no answer to a settle";
            return;
          }
          (again == 0 ? settled : repeated) += 1;
        }
      }
    });
  }
  for (auto& t : clients) t.join();
  INFO(error);
  REQUIRE(error.empty());
  std::sort(used.begin(), used.end(), [](const Used& l, const Used& r) { return l.at < r.at; });
  std::vector<quota::verify::AdmittedEvent> events;
  for (const Used& u : used) events.push_back({.time_ns = u.at, .cost = u.units});
  // The stated bound's extra: one outstanding estimate per client, the deficits, and the
  // time between Redis's decision and the answer (⌈longest call · r⌉ + 1).
  const std::int64_t extra =
      kClients * kMaxEstimate + deficits + (longest * kRate + 999'999'999) / 1'000'000'000 + 1;
  auto report = quota::verify::verify_token_bucket(
      events, quota::Rate{.units = kRate, .per = std::chrono::seconds(1)}, kBurst, extra);
  REQUIRE(report.ok());
  INFO("settled " << settled << ", repeats refused " << repeated << ", denied " << denied
                  << ", deficits " << deficits << ", extra " << extra << ", required burst "
                  << report->required_burst());
  CHECK(report->holds());
  CHECK(settled > 20);
  CHECK(repeated == settled);
  CHECK(denied > 0);
  CHECK(s.a.stop() == 0);
  CHECK(s.b.stop() == 0);
}

TEST_CASE("docs/llm-budgets.md: an LLM call estimated at one server, settled at the other") {
  std::ifstream in(quota::testing::source_dir() + "/examples/rules/llm-gateway.yaml");
  REQUIRE(in);
  quota::testing::TempDir admin("settle-admin");
  TwoServers s(std::string(std::istreambuf_iterator<char>(in), {}),
               {"--admin-token-file", admin.write("token", "t0ken\n")});
  const int a = s.a.port("http"), b = s.b.port("http");
  // The gateway counted 1,200 prompt tokens; the caller asked for at most 800 more.
  auto [status, body] = post(a, "/v1/check",
                             R"({"tenant":"acme","plan":"pro","route":"completion",)"
                             R"("prompt_tokens":1200,"max_output":800})");
  REQUIRE(status == 200);
  CHECK_THAT(body, Catch::Matchers::Contains("\"allowed\":true"));
  const std::string ticket = ticket_of(body);
  REQUIRE_FALSE(ticket.empty());
  // The provider reported 1,350 tokens: 650 of the 2,000 estimated come back.
  CHECK(post(b, "/v1/settle", settle_body("acme", ticket, 1350)) ==
        std::pair<int, std::string>{
            200, "{\"estimate\":2000,\"actual\":1350,\"surplus\":650,\"deficit\":0}\n"});
  CHECK(post(a, "/v1/settle", settle_body("acme", ticket, 1350)).first == 409);

  // Step 4, the reserve: the doc's release fits the reserve (33,334 of a 10 s period's
  // 333,333 tokens); more than what is left does not.
  const auto release = [&](const std::string& units) {
    httplib::Client c("127.0.0.1", a);
    auto r =
        c.Post("/v1/admin/reserve", {{"Authorization", "Bearer t0ken"}},
               R"({"rule":"provider-tpm","tenant":"acme","units":)" + units + R"(,"seconds":3600})",
               "application/json");
    REQUIRE(r);
    return std::pair<int, std::string>{r->status, r->body};
  };
  CHECK(release("20000") == std::pair<int, std::string>{
                                200,
                                "{\"rule\":\"provider-tpm\",\"tenant\":\"acme\",\"units\":20000,"
                                "\"seconds\":3600}\n"});
  auto [over, over_body] = release("33335");
  CHECK(over == 409);
  CHECK_THAT(over_body, Catch::Matchers::Contains("of its reserve of 33334 left"));

  // The same over gRPC (quota.v1.Budget): estimated at b, settled at a, once.
  auto stub = [](int port) {
    return quota::v1::Budget::NewStub(grpc::CreateChannel("127.0.0.1:" + std::to_string(port),
                                                          grpc::InsecureChannelCredentials()));
  };
  {  // (the channels closed before the servers stop)
    auto at_b = stub(s.b.port("grpc")), at_a = stub(s.a.port("grpc"));
    quota::v1::EstimateRequest est;
    est.set_tenant("acme");
    est.set_plan("pro");
    est.set_route("completion");
    est.set_prompt_tokens(100);
    est.set_max_output(0);
    quota::v1::EstimateResponse estimated;
    {
      grpc::ClientContext ctx;
      REQUIRE(at_b->Estimate(&ctx, est, &estimated).ok());
    }
    CHECK(estimated.allowed());
    CHECK(estimated.estimate() == 100);
    REQUIRE(estimated.ticket() != 0);
    quota::v1::SettleRequest settle;
    settle.set_tenant("acme");
    settle.set_ticket(estimated.ticket());
    settle.set_actual(130);  // over the estimate: a deficit of 30
    for (int again = 0; again < 2; ++again) {
      grpc::ClientContext ctx;
      quota::v1::SettleResponse settled;
      const grpc::Status st = at_a->Settle(&ctx, settle, &settled);
      if (again == 0) {
        REQUIRE(st.ok());
        CHECK(settled.deficit() == 30);
        CHECK(settled.surplus() == 0);
      } else {
        CHECK(st.error_code() == grpc::StatusCode::FAILED_PRECONDITION);
      }
    }
    settle.set_tenant("globex");
    {
      grpc::ClientContext ctx;
      quota::v1::SettleResponse settled;
      CHECK(at_a->Settle(&ctx, settle, &settled).error_code() == grpc::StatusCode::NOT_FOUND);
    }
    est.clear_prompt_tokens();  // an Estimate needs what its route estimates from
    {
      grpc::ClientContext ctx;
      CHECK(at_b->Estimate(&ctx, est, &estimated).error_code() ==
            grpc::StatusCode::INVALID_ARGUMENT);
    }
  }
  CHECK(s.a.stop() == 0);
  CHECK(s.b.stop() == 0);
}

}  // namespace settle_test
