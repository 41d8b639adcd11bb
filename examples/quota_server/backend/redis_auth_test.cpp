// quota_server_redis_auth_test — quota-server's production Redis flags against real
// redis-server (and redis-sentinel) processes the test starts on free loopback ports
// (quota/testing/redis_server.hpp RedisServer), stopped by pid:
//   - a Redis with requirepass: --redis-password-file with the right password decides;
//     with a wrong one every call answers 503 / UNAVAILABLE (never an admission), the log
//     names authentication and quota_redis_errors_total{kind="unauthenticated"} moves;
//   - the Redis killed (SIGKILL) under --redis-breaker-failures 2: calls answer 503, and
//     once the breaker opens they are counted as breaker_open on /metrics;
//   - --redis-sentinel + --redis-sentinel-master: one redis-sentinel monitoring that
//     primary (AUTH on the primary) names it, and the server decides there;
//   - bad flag combinations and a missing password file exit 2 with a clear message,
//     also those of the production options (redis_flags.hpp).
#include <httplib.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "envoy/service/ratelimit/v3/rls.grpc.pb.h"
#include "redis/support/redis_server.hpp"
#include "testing/load_clients.hpp"
#include "testing/metrics_text.hpp"
#include "testing/scratch.hpp"
#include "testing/server_process.hpp"

namespace {

namespace rls = envoy::service::ratelimit::v3;
using quota::testing::RedisServer;
using quota::testing::metric_value;
using quota::testing::post_check;
using quota::testing::ServerProcess;

using quota::testing::env;

using quota::testing::server_args;
using quota::testing::TempDir;

const char kRules[] =
    "routes:\n  - name: read\nrules:\n  - name: shared\n    level: tenant\n"
    "    plan: free\n    route: read\n    token_bucket: {rate: 1/100s, burst: 3}\n";

std::string metrics(int port) {
  httplib::Client c("127.0.0.1", port);
  c.set_read_timeout(10);
  auto r = c.Get("/metrics");
  REQUIRE(r);
  return r->body;
}

grpc::StatusCode grpc_check(int port, const std::string& tenant) {
  auto stub = rls::RateLimitService::NewStub(
      grpc::CreateChannel("127.0.0.1:" + std::to_string(port), grpc::InsecureChannelCredentials()));
  rls::RateLimitRequest req;
  req.set_domain("quota");
  auto* e = req.add_descriptors()->add_entries();
  e->set_key("tenant");
  e->set_value(tenant);
  rls::RateLimitResponse resp;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  return stub->ShouldRateLimit(&ctx, req, &resp).error_code();
}

std::string read_all(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// Runs the server with `args` (no Redis is reached: they must fail first); its exit code
// and stderr.
std::pair<int, std::string> run_bad(const std::string& args) {
  FILE* p = ::popen((env("QUOTA_SERVER") + " " + args + " 2>&1").c_str(), "r");
  REQUIRE(p != nullptr);
  std::string out;
  char buf[512];
  while (std::fgets(buf, sizeof buf, p) != nullptr) out += buf;
  const int status = ::pclose(p);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

}  // namespace

TEST_CASE("AUTH: the right password decides, a wrong one is 503 and logged; a breaker opens") {
  RedisServer redis("server-auth", {"requirepass s3cret-pw"});
  REQUIRE(redis.started());
  TempDir dir("auth");
  const std::string rules = dir.write("rules.yaml", kRules);
  const std::string good = dir.write("good", "s3cret-pw\n");
  const std::string wrong = dir.write("wrong", "not-it\n");
  const std::string where = "127.0.0.1:" + std::to_string(redis.port());

  ServerProcess a, b;
  REQUIRE(a.start(server_args(rules, {"--redis", where, "--redis-password-file", good,
                                      "--redis-deadline-ms", "2000", "--redis-breaker-failures",
                                      "2", "--redis-breaker-cooldown-ms", "600000"}),
                  {"grpc", "http"}));
  const std::string b_log = dir.path + "/b.log";
  b.set_stderr(b_log);
  REQUIRE(b.start(server_args(rules, {"--redis", where, "--redis-password-file", wrong,
                                      "--redis-deadline-ms", "2000"}),
                  {"grpc", "http"}));
  const std::string tenant = "auth-" + std::to_string(::getpid());

  // Right password: decisions, the budget of 3 spent, then denied.
  for (int i = 0; i < 3; ++i) {
    const auto [status, body] = post_check(a.port("http"), tenant);
    INFO(body);
    CHECK(status == 200);
    CHECK(body.find("\"allowed\":true") != std::string::npos);
  }
  CHECK(post_check(a.port("http"), tenant).second.find("\"allowed\":false") != std::string::npos);
  CHECK(grpc_check(a.port("grpc"), tenant) == grpc::StatusCode::OK);

  // Wrong password: cannot decide, on both APIs, never an admission.
  for (int i = 0; i < 3; ++i) {
    const auto [status, body] = post_check(b.port("http"), "other-" + tenant);
    INFO(body);
    CHECK(status == 503);
    CHECK(body.find("\"allowed\":true") == std::string::npos);
    CHECK(body.find("authentication") != std::string::npos);
  }
  CHECK(grpc_check(b.port("grpc"), "other-" + tenant) == grpc::StatusCode::UNAVAILABLE);
  const std::string b_metrics = metrics(b.port("http"));
  CHECK(metric_value(b_metrics, "quota_redis_errors_total{kind=\"unauthenticated\"}") >= 4);
  CHECK(metric_value(b_metrics, "quota_server_requests_total{api=\"check\",answer=\"ok\"}") == 0);
  CHECK(b.stop() == 0);
  const std::string log = read_all(b_log);
  INFO("log of the server with the wrong password: " << log);
  CHECK(log.find("redis error (unauthenticated)") != std::string::npos);
  CHECK(log.find("authentication") != std::string::npos);

  // Redis killed: 503; after 2 failures the breaker opens and fails calls at once.
  REQUIRE(redis.kill(SIGKILL));
  for (int i = 0; i < 6; ++i) CHECK(post_check(a.port("http"), tenant).first == 503);
  const std::string a_metrics = metrics(a.port("http"));
  INFO(a_metrics);
  CHECK(metric_value(a_metrics, "quota_redis_errors_total{kind=\"unavailable\"}") >= 1);
  CHECK(metric_value(a_metrics, "quota_redis_errors_total{kind=\"breaker_open\"}") >= 1);
  CHECK(metric_value(a_metrics, "quota_redis_errors_total{kind=\"unauthenticated\"}") == 0);
  CHECK(a.stop() == 0);
}

TEST_CASE("--redis-sentinel: the primary a sentinel names decides, with AUTH") {
  RedisServer primary("server-sentinel-primary", {"requirepass s3cret-pw"});
  REQUIRE(primary.started());
  RedisServer sentinel(
      "server-sentinel",
      {"sentinel monitor quota 127.0.0.1 " + std::to_string(primary.port()) + " 1",
       "sentinel auth-pass quota s3cret-pw"},
      /*sentinel=*/true);
  REQUIRE(sentinel.started());
  TempDir dir("auth");
  const std::string rules = dir.write("rules.yaml", kRules);
  const std::string good = dir.write("good", "s3cret-pw");
  ServerProcess s;
  REQUIRE(s.start(
      server_args(rules, {"--redis-sentinel", "127.0.0.1:" + std::to_string(sentinel.port()),
                          "--redis-sentinel-master", "quota", "--redis-password-file", good,
                          "--redis-deadline-ms", "2000"}),
      {"grpc", "http"}));
  const std::string tenant = "sentinel-" + std::to_string(::getpid());
  for (int i = 0; i < 3; ++i) {
    const auto [status, body] = post_check(s.port("http"), tenant);
    INFO(body);
    CHECK(status == 200);
    CHECK(body.find("\"allowed\":true") != std::string::npos);
  }
  CHECK(post_check(s.port("http"), tenant).second.find("\"allowed\":false") != std::string::npos);
  CHECK(s.stop() == 0);
}

TEST_CASE("Redis flags: bad combinations and a missing password file exit 2") {
  TempDir dir("auth");
  const std::string rules = dir.write("rules.yaml", kRules);
  const std::string base = "--rules " + rules + " --grpc-port 0 --http-port 0 ";
  const std::pair<std::string, std::string> cases[] = {
      {"--redis 127.0.0.1:1 --redis-cluster 127.0.0.1:2", "exclude each other"},
      {"--redis 127.0.0.1:1 --redis-sentinel 127.0.0.1:2 --redis-sentinel-master m",
       "exclude each other"},
      {"--redis-sentinel 127.0.0.1:2", "--redis-sentinel needs --redis-sentinel-master"},
      {"--redis-sentinel-master m", "--redis-sentinel-master needs --redis-sentinel"},
      {"--redis-sentinel 127.0.0.1:2,nohost --redis-sentinel-master m", "--redis-sentinel"},
      {"--redis 127.0.0.1:1 --redis-password-file " + dir.path + "/missing",
       "--redis-password-file " + dir.path + "/missing: cannot read"},
      {"--redis 127.0.0.1:1 --redis-password-file " + dir.write("empty", "\n"),
       "the file is empty"},
      {"--redis-password-file " + dir.write("pw", "x"), "--redis-password-file needs --redis"},
      {"--redis 127.0.0.1:1 --redis-user u", "--redis-user needs --redis-password-file"},
      {"--redis-max-in-flight 4", "--redis-max-in-flight needs --redis"},
      {"--redis 127.0.0.1:1 --redis-breaker-failures -1", "--redis-breaker-failures"},
      {"--redis-failover-safety=false", "--redis-failover-safety needs --redis"},
      {"--redis-allow-evicting", "--redis-allow-evicting needs --redis"},
      {"--redis-clock-guard-ms 500", "--redis-clock-guard-ms needs --redis"},
      {"--redis 127.0.0.1:1 --redis-clock-guard-ms -1", "--redis-clock-guard-ms expects"},
      {"--redis-replicas 1", "--redis-replicas needs --redis"},
      {"--redis 127.0.0.1:1 --redis-replicas 1 --redis-replica-timeout-ms 60",
       "--redis-replica-timeout-ms 60 must be below --redis-deadline-ms 50"},
      {"--redis 127.0.0.1:1 --redis-replica-timeout-ms 10",
       "--redis-replica-timeout-ms needs --redis-replicas"},
      {"--redis 127.0.0.1:1 --redis-coalesce 1", "--redis-coalesce 1 coalesces nothing"},
      {"--redis 127.0.0.1:1 --redis-coalesce-calls 4",
       "--redis-coalesce-calls needs --redis-coalesce"},
      {"--redis 127.0.0.1:1 --redis-coalesce 8 --redis-coalesce-calls 9",
       "--redis-coalesce-calls 9 needs as many connections: --redis-connections is 8"},
      {"--redis-coalesce 8", "--redis-coalesce needs --redis"}};
  for (const auto& [args, message] : cases) {
    const auto [code, out] = run_bad(base + args);
    INFO(args << " → " << code << ": " << out);
    CHECK(code == 2);
    CHECK(out.find(message) != std::string::npos);
  }
}
