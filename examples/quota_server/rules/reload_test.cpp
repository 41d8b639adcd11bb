// quota_server_reload_test — hot reload of the rule file under load: quota-server as a
// process on free loopback ports, its rule file in a fresh temporary directory, rewritten
// (by rename) while client threads call it over gRPC and HTTP.
//
// Generation g of the file names its one rule "read-g<g>" with a rate of g units per
// second and a burst of 1000·g units, and carries no `version:`, so the server publishes
// it as version g (1 at start, +1 per valid reload). Every answer must be one
// generation's whole: gRPC — dynamic_metadata applied_rule_version v, current_limit name
// "read-g<v>" at v per SECOND, limit_remaining ≤ 1000·v; HTTP — applied_rule_version v,
// rule "read-g<v>", remaining ≤ 1000·v. Each thread's versions never go down. An invalid
// file in between changes nothing (answers stay at the version in force; one refusal on
// /metrics however long it stays), and the valid file after it takes effect.
#include <httplib.h>
#include <stdlib.h>
#include <unistd.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "envoy/service/ratelimit/v3/rls.grpc.pb.h"
#include "testing/scratch.hpp"
#include "testing/server_process.hpp"

namespace {

namespace rls = envoy::service::ratelimit::v3;

using quota::testing::env;

std::string generation(int g) {
  return "routes:\n  - name: read\nrules:\n  - name: read-g" + std::to_string(g) +
         "\n    level: tenant\n    plan: free\n    route: read\n    token_bucket: {rate: " +
         std::to_string(g) + "/1s, burst: " + std::to_string(1000 * g) + "}\n";
}

// Replaces `path` by a complete file with `text` (rename: never seen half-written).
void write_file(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  std::ofstream(tmp, std::ios::trunc) << text;
  REQUIRE(std::rename(tmp.c_str(), path.c_str()) == 0);
}

long long metric(httplib::Client& c, const std::string& name) {
  auto r = c.Get("/metrics");
  if (!r || r->status != 200) return -1;
  const auto at = r->body.find("\n" + name + " ");
  return at == std::string::npos ? -1 : std::atoll(r->body.c_str() + at + name.size() + 2);
}

// Polls `name` on /metrics until it equals `want` (at most 30 s).
bool wait_metric(httplib::Client& c, const std::string& name, long long want) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (std::chrono::steady_clock::now() < deadline) {
    if (metric(c, name) == want) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return false;
}

// What the client threads saw: answers, and the first inconsistency (empty: none).
struct Seen {
  std::mutex mu;
  std::string error;
  std::atomic<long long> answers{0};
  std::atomic<long long> max_version{0};
  void fail(const std::string& e) {
    std::lock_guard lock(mu);
    if (error.empty()) error = e;
  }
  void saw(long long v) {
    answers.fetch_add(1);
    long long m = max_version.load();
    while (v > m && !max_version.compare_exchange_weak(m, v)) {
    }
  }
};

void grpc_client(int port, int id, std::atomic<bool>& stop, Seen& seen) {
  auto stub = rls::RateLimitService::NewStub(
      grpc::CreateChannel("127.0.0.1:" + std::to_string(port), grpc::InsecureChannelCredentials()));
  long long last = 0;
  for (int n = 0; n < 200'000 && !stop.load(); ++n) {
    rls::RateLimitRequest req;
    req.set_domain("quota");
    for (int d = 0; d < 2; ++d) {  // two descriptors: decided under one rule set
      auto* desc = req.add_descriptors();
      auto* e = desc->add_entries();
      e->set_key("tenant");
      e->set_value("g" + std::to_string(id) + "-" + std::to_string(n % 50) + "-" +
                   std::to_string(d));
    }
    rls::RateLimitResponse resp;
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    const grpc::Status s = stub->ShouldRateLimit(&ctx, req, &resp);
    if (!s.ok()) return seen.fail("grpc error: " + s.error_message());
    const auto& f = resp.dynamic_metadata().fields();
    const auto it = f.find("applied_rule_version");
    if (it == f.end()) return seen.fail("grpc answer without applied_rule_version");
    const auto v = static_cast<long long>(it->second.number_value());
    if (v < last) return seen.fail("grpc version went down");
    last = v;
    if (resp.statuses_size() != 2) return seen.fail("grpc answer without 2 statuses");
    for (const auto& st : resp.statuses()) {
      const std::string want = "read-g" + std::to_string(v);
      if (st.current_limit().name() != want ||
          st.current_limit().requests_per_unit() != static_cast<unsigned>(v) ||
          st.current_limit().unit() != rls::RateLimitResponse::RateLimit::SECOND ||
          st.limit_remaining() > 1000 * v) {
        return seen.fail("grpc status of version " + std::to_string(v) + " is " +
                         st.ShortDebugString());
      }
    }
    seen.saw(v);
  }
}

void http_client(int port, int id, std::atomic<bool>& stop, Seen& seen) {
  httplib::Client c("127.0.0.1", port);
  c.set_read_timeout(30);
  long long last = 0;
  for (int n = 0; n < 200'000 && !stop.load(); ++n) {
    auto r = c.Post("/v1/check",
                    R"({"tenant":"h)" + std::to_string(id) + "-" + std::to_string(n % 50) +
                        R"(","route":"read","plan":"free"})",
                    "application/json");
    if (!r || r->status != 200) return seen.fail("http error: " + (r ? r->body : "no answer"));
    const auto at = r->body.find("\"applied_rule_version\":");
    if (at == std::string::npos) return seen.fail("http answer without version: " + r->body);
    const long long v = std::atoll(r->body.c_str() + at + 23);
    const auto rem = r->body.find("\"remaining\":");
    const long long remaining = std::atoll(r->body.c_str() + rem + 12);
    if (v < last) return seen.fail("http version went down");
    last = v;
    if (r->body.find("\"rule\":\"read-g" + std::to_string(v) + "\"") == std::string::npos ||
        remaining > 1000 * v) {
      return seen.fail("http answer of version " + std::to_string(v) + " is " + r->body);
    }
    seen.saw(v);
  }
}

}  // namespace

TEST_CASE(
    "reload under load: every answer is one whole rule set; an invalid file changes "
    "nothing; the next valid file takes effect") {
  char dir_template[] = "/tmp/quota_reload_XXXXXX";
  REQUIRE(mkdtemp(dir_template) != nullptr);
  const std::string dir = dir_template;
  const std::string rules = dir + "/rules.yaml";
  write_file(rules, generation(1));

  quota::testing::ServerProcess server;
  REQUIRE(!env("QUOTA_SERVER").empty());
  REQUIRE(server.start(
      {env("QUOTA_SERVER"), "--rules", rules, "--default-plan", "free", "--default-route", "read",
       "--grpc-port", "0", "--http-port", "0", "--fresh-budgets-at-start"},
      {"grpc", "http"}));
  httplib::Client admin("127.0.0.1", server.port("http"));
  admin.set_read_timeout(30);
  REQUIRE(metric(admin, "quota_rule_version") == 1);
  REQUIRE(metric(admin, "quota_config_loads_total{outcome=\"ok\"}") == 1);

  std::atomic<bool> stop{false};
  Seen seen;
  std::vector<std::thread> clients;
  for (int i = 0; i < 2; ++i) {
    clients.emplace_back(grpc_client, server.port("grpc"), i, std::ref(stop), std::ref(seen));
    clients.emplace_back(http_client, server.port("http"), i, std::ref(stop), std::ref(seen));
  }
  const auto answers_after = [&](long long base) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (seen.answers.load() < base + 40 && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return seen.answers.load() >= base + 40;
  };

  CHECK(answers_after(0));
  write_file(rules, generation(2));
  CHECK(wait_metric(admin, "quota_rule_version", 2));
  CHECK(answers_after(seen.answers.load()));
  CHECK(seen.max_version.load() == 2);

  // Invalid (a burst of 0): refused once, version 2 stays, answers stay version 2.
  write_file(rules,
             "rules:\n  - name: read-g3\n    level: tenant\n    plan: free\n"
             "    route: read\n    token_bucket: {rate: 3/1s, burst: 0}\n"
             "routes:\n  - name: read\n");
  CHECK(wait_metric(admin, "quota_config_loads_total{outcome=\"error\"}", 1));
  CHECK(metric(admin, "quota_config_last_error_timestamp_seconds") > 1'600'000'000);
  std::this_thread::sleep_for(std::chrono::milliseconds(1000));  // several polls
  CHECK(answers_after(seen.answers.load()));
  CHECK(metric(admin, "quota_config_loads_total{outcome=\"error\"}") == 1);
  CHECK(metric(admin, "quota_rule_version") == 2);
  CHECK(seen.max_version.load() == 2);

  write_file(rules, generation(3));
  CHECK(wait_metric(admin, "quota_rule_version", 3));
  CHECK(answers_after(seen.answers.load()));
  CHECK(seen.max_version.load() == 3);
  CHECK(metric(admin, "quota_config_loads_total{outcome=\"ok\"}") == 3);

  stop.store(true);
  for (auto& t : clients) t.join();
  {
    std::lock_guard lock(seen.mu);
    INFO(seen.error);
    CHECK(seen.error.empty());
  }
  INFO("answers: " << seen.answers.load());
  CHECK(server.stop() == 0);
  std::remove(rules.c_str());
  rmdir(dir.c_str());
}
