// quota_server_envoy_test — quota-server deciding with envoyproxy/ratelimit's YAML
// (testdata/envoy_rules.yaml, selected by its shape; testdata/envoy_fixed_window.yaml with
// `quota_policy: fixed_window`), called with the generated gRPC client: exact key+value
// before key alone, nesting depth = number of entries, each value its own budget, token
// buckets with burst = requests_per_unit and nothing spent by a denial, unlimited, no
// limit, shadow_mode, replaces, the file's domain, the fixed-window opt-in, and a hot
// reload of such a file (a copy in a temporary directory); and POST /json, envoyproxy/
// ratelimit's JSON call, over real HTTP on the same budgets.
#include <httplib.h>
#include <stdlib.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "envoy/service/ratelimit/v3/rls.grpc.pb.h"
#include "testing/scratch.hpp"
#include "testing/server_process.hpp"

namespace {

namespace rls = envoy::service::ratelimit::v3;
using Response = rls::RateLimitResponse;
using Entries = std::vector<std::pair<std::string, std::string>>;

using quota::testing::env;

struct Server {
  quota::testing::ServerProcess process;
  std::unique_ptr<rls::RateLimitService::Stub> stub;

  explicit Server(const std::string& rules) {
    REQUIRE(!env("QUOTA_SERVER").empty());
    REQUIRE(process.start({env("QUOTA_SERVER"), "--rules", rules, "--grpc-port", "0", "--http-port",
                           "0", "--max-cost", "1000", "--fresh-budgets-at-start"},
                          {"grpc", "http"}));
    stub = rls::RateLimitService::NewStub(grpc::CreateChannel(
        "127.0.0.1:" + std::to_string(process.port("grpc")), grpc::InsecureChannelCredentials()));
  }
};

Server& imported() {
  static Server s(env("QUOTA_SERVER_DATA") + "/envoy_rules.yaml");
  return s;
}

struct Call {
  grpc::Status status;
  Response response;
};

Call call(Server& s, const std::vector<Entries>& descriptors, unsigned hits = 0,
          const std::string& domain = "edge") {
  rls::RateLimitRequest req;
  req.set_domain(domain);
  req.set_hits_addend(hits);
  for (const Entries& d : descriptors) {
    auto* p = req.add_descriptors();
    for (const auto& [k, v] : d) {
      auto* e = p->add_entries();
      e->set_key(k);
      e->set_value(v);
    }
  }
  Call c;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  c.status = s.stub->ShouldRateLimit(&ctx, req, &c.response);
  return c;
}

Call one(const Entries& d, unsigned hits = 0) { return call(imported(), {d}, hits); }

}  // namespace

TEST_CASE("envoy rules: an exact key and value is matched before the key alone") {
  auto c = one({{"tenant", "acme"}});
  REQUIRE(c.status.ok());
  REQUIRE(c.response.statuses_size() == 1);
  const auto& s = c.response.statuses(0);
  CHECK(s.code() == Response::OK);
  CHECK(s.current_limit().name() == "acme-hourly");
  CHECK(s.current_limit().requests_per_unit() == 5);
  CHECK(s.current_limit().unit() == Response::RateLimit::HOUR);
  CHECK(s.limit_remaining() == 4);
  // Any other tenant: the key alone, 3 per hour, named after its path in the file.
  c = one({{"tenant", "env-other"}});
  REQUIRE(c.status.ok());
  CHECK(c.response.statuses(0).current_limit().name() == "tenant");
  CHECK(c.response.statuses(0).current_limit().requests_per_unit() == 3);
  CHECK(c.response.statuses(0).limit_remaining() == 2);
}

TEST_CASE(
    "envoy rules: an exact token bucket whose burst is requests_per_unit; a denial "
    "spends nothing; each value is its own budget") {
  auto c = one({{"tenant", "env-tb"}}, 2);
  REQUIRE(c.status.ok());
  CHECK(c.response.statuses(0).limit_remaining() == 1);
  // 2 more than the 1 left: denied, with Retry-After, and nothing spent.
  c = one({{"tenant", "env-tb"}}, 2);
  REQUIRE(c.status.ok());
  CHECK(c.response.overall_code() == Response::OVER_LIMIT);
  CHECK(c.response.statuses(0).code() == Response::OVER_LIMIT);
  CHECK(c.response.statuses(0).limit_remaining() == 1);
  bool retry_after = false;
  for (const auto& h : c.response.response_headers_to_add())
    retry_after |= h.key() == "Retry-After";
  CHECK(retry_after);
  c = one({{"tenant", "env-tb"}});
  REQUIRE(c.status.ok());
  CHECK(c.response.statuses(0).code() == Response::OK);
  CHECK(c.response.statuses(0).limit_remaining() == 0);
  // 3 per hour refills 1 unit in 20 min: the budget is whole again in ~1 h.
  const auto reset = c.response.statuses(0).duration_until_reset().seconds();
  CHECK(reset > 3500);
  CHECK(reset <= 3600);
  // Another value of the same key: a budget of its own.
  c = one({{"tenant", "env-tb2"}});
  REQUIRE(c.status.ok());
  CHECK(c.response.statuses(0).limit_remaining() == 2);
}

TEST_CASE("envoy rules: nesting depth is the number of entries; unlimited; no limit") {
  auto c = one({{"tenant", "env-d"}, {"path", "/batch"}});
  REQUIRE(c.status.ok());
  CHECK(c.response.statuses(0).current_limit().name() == "batch");
  CHECK(c.response.statuses(0).current_limit().unit() == Response::RateLimit::DAY);
  CHECK(c.response.statuses(0).limit_remaining() == 1);
  // The tenant's own budget (depth 1) was not touched by the depth-2 descriptor.
  c = one({{"tenant", "env-d"}});
  REQUIRE(c.status.ok());
  CHECK(c.response.statuses(0).limit_remaining() == 2);
  // path alone under tenant: unlimited.
  c = one({{"tenant", "env-d"}, {"path", "/other"}}, 1000);
  REQUIRE(c.status.ok());
  CHECK(c.response.statuses(0).code() == Response::OK);
  CHECK_FALSE(c.response.statuses(0).has_current_limit());
  CHECK(c.response.statuses(0).limit_remaining() == 4294967295u);
  // Deeper than the file, a key it does not know, a node without rate_limit: no limit.
  for (const Entries& e :
       std::vector<Entries>{{{"tenant", "env-d"}, {"path", "/batch"}, {"x", "1"}},
                            {{"unknown", "1"}},
                            {{"nolimit", "1"}}}) {
    c = one(e, 1000);
    REQUIRE(c.status.ok());
    CHECK(c.response.statuses(0).code() == Response::OK);
    CHECK_FALSE(c.response.statuses(0).has_current_limit());
    CHECK(c.response.statuses(0).limit_remaining() == 0);
  }
}

TEST_CASE("envoy rules: shadow_mode decides and counts but answers OK") {
  auto c = one({{"remote_address", "10.0.0.1"}});
  REQUIRE(c.status.ok());
  CHECK(c.response.statuses(0).limit_remaining() == 0);
  c = one({{"remote_address", "10.0.0.1"}});
  REQUIRE(c.status.ok());
  CHECK(c.response.overall_code() == Response::OK);
  CHECK(c.response.statuses(0).code() == Response::OK);
  CHECK(c.response.statuses(0).current_limit().name() == "shadowed");
  CHECK(c.response.statuses(0).limit_remaining() == 0);
}

TEST_CASE("envoy rules: a matched limit with replaces removes the named one") {
  auto c = call(imported(), {{{"plan", "gold"}}, {{"plan", "gold-user"}}});
  REQUIRE(c.status.ok());
  REQUIRE(c.response.statuses_size() == 2);
  CHECK_FALSE(c.response.statuses(0).has_current_limit());  // gold: replaced
  CHECK(c.response.statuses(1).current_limit().name() == "gold-user");
  c = call(imported(), {{{"plan", "gold"}}, {{"plan", "gold-user"}}});
  REQUIRE(c.status.ok());
  CHECK(c.response.statuses(0).code() == Response::OK);
  CHECK(c.response.statuses(1).code() == Response::OVER_LIMIT);
  CHECK(c.response.overall_code() == Response::OVER_LIMIT);
  // Alone, gold applies (100 per day, nothing spent on it so far).
  c = one({{"plan", "gold"}});
  REQUIRE(c.status.ok());
  CHECK(c.response.statuses(0).current_limit().name() == "gold");
  CHECK(c.response.statuses(0).limit_remaining() == 99);
}

TEST_CASE("envoy rules: the file's domain; bad requests are INVALID_ARGUMENT") {
  CHECK(call(imported(), {{{"tenant", "env-x"}}}, 0, "quota").status.error_code() ==
        grpc::StatusCode::INVALID_ARGUMENT);
  CHECK(call(imported(), {}, 0).status.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
  CHECK(call(imported(), {{}}, 0).status.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
  CHECK(call(imported(), {{{"", "x"}}}, 0).status.error_code() ==
        grpc::StatusCode::INVALID_ARGUMENT);
  CHECK(call(imported(), {{{"tenant", "env-x"}}}, 1001).status.error_code() ==
        grpc::StatusCode::INVALID_ARGUMENT);
  // Nothing was spent by the refused calls.
  auto c = one({{"tenant", "env-x"}});
  REQUIRE(c.status.ok());
  CHECK(c.response.statuses(0).limit_remaining() == 2);
}

TEST_CASE("envoy rules: quota_policy: fixed_window makes every limit a fixed window") {
  Server fixed(env("QUOTA_SERVER_DATA") + "/envoy_fixed_window.yaml");
  auto first = call(fixed, {{{"tenant", "fw"}}});
  auto second = call(fixed, {{{"tenant", "fw"}}});
  REQUIRE(first.status.ok());
  REQUIRE(second.status.ok());
  CHECK(second.response.statuses(0).limit_remaining() == 0);
  // A window's reset is its end, the same for both; a token bucket's would double (each
  // unit refills in 12 h).
  const auto r1 = first.response.statuses(0).duration_until_reset().seconds();
  const auto r2 = second.response.statuses(0).duration_until_reset().seconds();
  CHECK(r2 <= r1);
  CHECK(r1 - r2 < 5);
  CHECK(call(fixed, {{{"tenant", "fw"}}}).response.statuses(0).code() == Response::OVER_LIMIT);
  // The same file without the opt-in: a token bucket.
  auto tb = one({{"tenant", "env-fw-tb"}, {"path", "/batch"}});
  auto tb2 = one({{"tenant", "env-fw-tb"}, {"path", "/batch"}});
  const auto t1 = tb.response.statuses(0).duration_until_reset().seconds();
  const auto t2 = tb2.response.statuses(0).duration_until_reset().seconds();
  CHECK(t1 > 43100);
  CHECK(t1 <= 43200);
  CHECK(t2 > 86300);
  CHECK(t2 <= 86400);
}

TEST_CASE(
    "envoy rules: a changed file is reloaded as the next version; an invalid one is "
    "refused") {
  char dir_template[] = "/tmp/quota_envoy_reload_XXXXXX";
  REQUIRE(mkdtemp(dir_template) != nullptr);
  const std::string path = std::string(dir_template) + "/rl.yaml";
  const auto write = [&](const std::string& text) {
    std::ofstream(path + ".tmp", std::ios::trunc) << text;
    REQUIRE(std::rename((path + ".tmp").c_str(), path.c_str()) == 0);
  };
  const auto file = [](int n) {
    return "domain: edge\ndescriptors:\n  - key: k\n    rate_limit: {unit: day, "
           "requests_per_unit: " +
           std::to_string(n) + "}\n";
  };
  write(file(3));
  Server s(path);
  // The limit in force, once the server answers with `want` requests per unit (at most 30 s).
  const auto wait_for = [&](unsigned want, long long version) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (std::chrono::steady_clock::now() < deadline) {
      auto c = call(s, {{{"k", "probe"}}});
      const auto& f = c.response.dynamic_metadata().fields();
      if (c.status.ok() && c.response.statuses(0).current_limit().requests_per_unit() == want &&
          f.count("applied_rule_version") == 1 &&
          static_cast<long long>(f.at("applied_rule_version").number_value()) == version) {
        return true;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return false;
  };
  CHECK(wait_for(3, 1));
  write(file(7));
  CHECK(wait_for(7, 2));
  // Invalid (unlimited with a unit): version 2 stays, through several polls.
  write("domain: edge\ndescriptors:\n  - key: k\n    rate_limit: {unlimited: true, unit: day}\n");
  std::this_thread::sleep_for(std::chrono::milliseconds(1000));
  CHECK(wait_for(7, 2));
  write(file(9));
  CHECK(wait_for(9, 3));
  CHECK(s.process.stop() == 0);
  std::remove(path.c_str());
  rmdir(dir_template);
}

TEST_CASE("envoy rules: POST /json takes envoyproxy/ratelimit's request and answers its shape") {
  Server& s = imported();
  httplib::Client http("127.0.0.1", s.process.port("http"));
  http.set_read_timeout(30, 0);
  const auto post = [&](const std::string& body) {
    auto r = http.Post("/json", body, "application/json");
    REQUIRE(r);
    return *r;
  };
  const std::string request =
      R"({"domain": "edge", "descriptors": [{"entries": [{"key": "tenant", "value": "env-json"}]}],)";
  auto r = post(request + R"( "hits_addend": 2})");
  CHECK(r.status == 200);
  CHECK(r.get_header_value("Content-Type") == "application/json");
  CHECK(r.body.find(R"("overallCode":"OK")") != std::string::npos);
  CHECK(
      r.body.find(
          R"("statuses":[{"code":"OK","currentLimit":{"requestsPerUnit":3,"unit":"HOUR","name":"tenant"},"limitRemaining":1,)") !=
      std::string::npos);
  // protobuf's JSON mapping takes either spelling: the last unit, then over the limit.
  CHECK(post(request + R"( "hitsAddend": 1})").status == 200);
  r = post(request + "}");
  CHECK(r.status == 429);
  CHECK(r.body.find(R"("overallCode":"OVER_LIMIT")") != std::string::npos);
  CHECK(r.body.find(R"("code":"OVER_LIMIT")") != std::string::npos);
  CHECK(r.has_header("Retry-After"));
  CHECK(r.has_header("RateLimit-Policy"));
  // The same budget as gRPC's.
  CHECK(one({{"tenant", "env-json"}}).response.overall_code() == Response::OVER_LIMIT);
  // README example 5's unlimited answer and a descriptor without a limit.
  r = post(R"({"domain": "edge", "descriptors": [{"entries": [{"key": "tenant", "value": "env-j2"},
              {"key": "path", "value": "/any"}]}, {"entries": [{"key": "nolimit", "value": "1"}]}]})");
  CHECK(r.status == 200);
  CHECK(r.body.find(R"("statuses":[{"code":"OK","limitRemaining":4294967295},{"code":"OK"}])") !=
        std::string::npos);
  // Bad requests: 400 naming the problem, nothing spent.
  for (const std::string& bad :
       {std::string("{"), std::string(R"({"domain": "edge", "descriptor": []})"),
        std::string(R"({"domain": "other", "descriptors": [{"entries": [{"key": "k"}]}]})"),
        std::string(R"({"domain": "edge", "descriptors": []})")}) {
    INFO(bad);
    r = post(bad);
    CHECK(r.status == 400);
    CHECK(r.body.rfind(R"({"error":"invalid_argument","message":)", 0) == 0);
  }
  CHECK(http.Get("/json")->status != 200);
  // Counted under their own API: 3 admitted and 1 over the limit above.
  const std::string metrics = http.Get("/metrics")->body;
  CHECK(metrics.find("quota_server_requests_total{api=\"json\",answer=\"ok\"} 3\n") !=
        std::string::npos);
  CHECK(metrics.find("quota_server_requests_total{api=\"json\",answer=\"over_limit\"} 1\n") !=
        std::string::npos);
}
