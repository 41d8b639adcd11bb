// quota_server_redis_test — two quota-server processes with --redis on one real
// redis-server (a ScratchServer of this test: cmake/redis_server.sh on a free loopback
// port, stopped by pid) share one budget, and a stopped Redis makes them answer as the
// route fails (closed: 503 / UNAVAILABLE), never a silent allow.
//
// The budget: one tenant, a token bucket of 10 units/s and burst 10. Four client threads
// (gRPC and HTTP, to each server) ask for 1 unit as fast as they can for 2 s; each
// admission is dated by the test's clock when its answer arrived. The union must pass
// the envelope verifier (quota/verify/envelope.hpp) for rate 10/s and burst 10 with a
// stated margin: extra = ceil(10/s · the longest call that admitted) + 1 — an answer is
// dated at most that late after Redis decided, and the +1 covers the two clocks' rates.
// Two servers with budgets of their own would admit about twice the envelope.
#include <httplib.h>
#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "envoy/service/ratelimit/v3/rls.grpc.pb.h"
#include "quota/verify/envelope.hpp"
#include "redis/support/redis_server.hpp"
#include "testing/load_clients.hpp"
#include "testing/scratch.hpp"
#include "testing/server_process.hpp"

namespace {

namespace rls = envoy::service::ratelimit::v3;

using quota::testing::Admission;
using quota::testing::grpc_client;
using quota::testing::http_client;
using quota::testing::Log;
using quota::testing::now_ns;
using quota::testing::one_unit;

using quota::testing::env;

}  // namespace

TEST_CASE("two servers on one Redis share one budget; a stopped Redis fails closed", "[single]") {
  quota::testing::ScratchServer redis(quota::testing::scratch_dir("quota-server-redis-test"));
  REQUIRE(redis.started());
  char dir_template[] = "/tmp/quota_server_redis_XXXXXX";
  REQUIRE(mkdtemp(dir_template) != nullptr);
  const std::string rules = std::string(dir_template) + "/rules.yaml";
  std::ofstream(rules) << "routes:\n  - name: read\nrules:\n  - name: shared\n    level: tenant\n"
                          "    plan: free\n    route: read\n"
                          "    token_bucket: {rate: 10/1s, burst: 10}\n";

  quota::testing::ServerProcess a, b;
  for (auto* s : {&a, &b}) {
    REQUIRE(s->start({env("QUOTA_SERVER"), "--rules", rules, "--default-plan", "free",
                      "--default-route", "read", "--grpc-port", "0", "--http-port", "0", "--redis",
                      "127.0.0.1:" + std::to_string(redis.port()), "--redis-deadline-ms", "2000"},
                     {"grpc", "http"}));
  }

  Log log;
  const std::int64_t start = now_ns();
  const std::int64_t until = start + 2'000'000'000;
  std::vector<std::thread> clients;
  clients.emplace_back(grpc_client, a.port("grpc"), 0, until, std::ref(log));
  clients.emplace_back(http_client, a.port("http"), 0, until, std::ref(log));
  clients.emplace_back(grpc_client, b.port("grpc"), 1, until, std::ref(log));
  clients.emplace_back(http_client, b.port("http"), 1, until, std::ref(log));
  for (auto& t : clients) t.join();

  INFO(log.error);
  REQUIRE(log.error.empty());
  long long by_server[2] = {0, 0};
  for (const Admission& x : log.admitted) ++by_server[x.server];
  const auto report = quota::testing::token_bucket_verdict(
      log, quota::Rate{.units = 10, .per = std::chrono::seconds(1)}, 10);
  INFO("server a admitted " << by_server[0] << ", b " << by_server[1]);
  CHECK(report.holds());
  CHECK(by_server[0] > 0);
  CHECK(by_server[1] > 0);
  CHECK(log.denied > 0);

  // Redis killed: both APIs of both servers answer "cannot decide", never an admission.
  REQUIRE(redis.pid() > 0);
  REQUIRE(::kill(static_cast<pid_t>(redis.pid()), SIGKILL) == 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  for (auto* s : {&a, &b}) {
    httplib::Client c("127.0.0.1", s->port("http"));
    c.set_read_timeout(10);
    auto r = c.Post("/v1/check", R"({"tenant":"shared"})", "application/json");
    REQUIRE(r);
    CHECK(r->status == 503);
    auto stub = rls::RateLimitService::NewStub(grpc::CreateChannel(
        "127.0.0.1:" + std::to_string(s->port("grpc")), grpc::InsecureChannelCredentials()));
    rls::RateLimitResponse resp;
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    const grpc::Status st = stub->ShouldRateLimit(&ctx, one_unit("fresh"), &resp);
    CHECK(st.error_code() == grpc::StatusCode::UNAVAILABLE);
  }
  CHECK(a.stop() == 0);
  CHECK(b.stop() == 0);
  std::remove(rules.c_str());
  rmdir(dir_template);
}

// Run by quota_server_redis_cluster_test, on the tests' Redis Cluster (3 masters, the
// redis_cluster fixture; $QUOTA_REDIS_CLUSTER_DIR/ports).
TEST_CASE("two servers seeded at different nodes of a Redis Cluster share one budget",
          "[cluster]") {
  std::vector<int> ports;
  {
    std::ifstream in(env("QUOTA_REDIS_CLUSTER_DIR") + "/ports");
    for (int p = 0; in >> p;) ports.push_back(p);
  }
  REQUIRE(ports.size() >= 2);
  char dir_template[] = "/tmp/quota_server_cluster_XXXXXX";
  REQUIRE(mkdtemp(dir_template) != nullptr);
  const std::string rules = std::string(dir_template) + "/rules.yaml";
  std::ofstream(rules) << "routes:\n  - name: read\nrules:\n  - name: shared\n    level: tenant\n"
                          "    plan: free\n    route: read\n"
                          "    token_bucket: {rate: 1/100s, burst: 3}\n";
  quota::testing::ServerProcess a, b;
  for (auto [s, port] : {std::pair{&a, ports[0]}, std::pair{&b, ports[1]}}) {
    REQUIRE(s->start(
        {env("QUOTA_SERVER"), "--rules", rules, "--default-plan", "free", "--default-route", "read",
         "--grpc-port", "0", "--http-port", "0", "--redis-cluster",
         "127.0.0.1:" + std::to_string(port), "--redis-deadline-ms", "2000"},
        {"grpc", "http"}));
  }
  // A tenant of this run only (the cluster is shared by other tests and runs).
  const std::string body = R"({"tenant":"cl-)" + std::to_string(::getpid()) + R"("})";
  const auto allowed = [&](quota::testing::ServerProcess& s) {
    httplib::Client c("127.0.0.1", s.port("http"));
    c.set_read_timeout(10);
    auto r = c.Post("/v1/check", body, "application/json");
    REQUIRE(r);
    REQUIRE(r->status == 200);
    return r->body.find("\"allowed\":true") != std::string::npos;
  };
  // 3 units in all, whichever server is asked: a, b, a admitted; then neither.
  CHECK(allowed(a));
  CHECK(allowed(b));
  CHECK(allowed(a));
  CHECK_FALSE(allowed(b));
  CHECK_FALSE(allowed(a));
  CHECK(a.stop() == 0);
  CHECK(b.stop() == 0);
  std::remove(rules.c_str());
  rmdir(dir_template);
}
