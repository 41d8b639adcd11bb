// quota_server_envoy_redis_test — envoyproxy/ratelimit rule files with the budgets in
// Redis: a real redis-server (a ScratchServer of this test, stopped by pid), the file of
// quota_server_envoy_test (testdata/envoy_rules.yaml: limits per hour or day, so counts
// are exact while the test runs) and the generated gRPC client.
//   - Two servers with `--rules envoy_rules.yaml --redis` share each descriptor's budget:
//     tenant acme's 5 per hour are admitted alternately by both, then both deny, with
//     limit_remaining counting down across them.
//   - Entry values with `{`, `}` and `%` are budgets of their own (the Redis key encodes
//     them; "x{y}" and its percent-encoded spelling are distinct budgets).
//   - shadow_mode answers OK over the budget; an unlimited limit needs no Redis.
//   - `quota-server publish` stores the file in Redis; a third server with
//     --rules-from-redis decides with it, on the same budgets (acme is already spent).
//   - Redis killed: UNAVAILABLE, never an admission.
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "envoy/service/ratelimit/v3/rls.grpc.pb.h"
#include "redis/support/redis_server.hpp"
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

  Server(std::vector<std::string> args, int redis_port) {
    args.insert(args.begin(), env("QUOTA_SERVER"));
    for (std::string a : {"--grpc-port", "0", "--http-port", "0", "--redis-deadline-ms", "2000"}) {
      args.push_back(a);
    }
    args.push_back("--redis");
    args.push_back("127.0.0.1:" + std::to_string(redis_port));
    REQUIRE(process.start(args, {"grpc"}));
    stub = rls::RateLimitService::NewStub(grpc::CreateChannel(
        "127.0.0.1:" + std::to_string(process.port("grpc")), grpc::InsecureChannelCredentials()));
  }
};

struct Call {
  grpc::Status status;
  Response response;
};

Call call(Server& s, const Entries& descriptor) {
  rls::RateLimitRequest req;
  req.set_domain("edge");
  auto* p = req.add_descriptors();
  for (const auto& [k, v] : descriptor) {
    auto* e = p->add_entries();
    e->set_key(k);
    e->set_value(v);
  }
  Call c;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  c.status = s.stub->ShouldRateLimit(&ctx, req, &c.response);
  return c;
}

// OK (true) or OVER_LIMIT (false) for one descriptor; the call must succeed.
bool allowed(Server& s, const Entries& descriptor) {
  const Call c = call(s, descriptor);
  INFO(c.status.error_message());
  REQUIRE(c.status.ok());
  REQUIRE(c.response.statuses_size() == 1);
  return c.response.overall_code() == Response::OK;
}

// Runs `quota-server <args>`: its exit code and output (stdout and stderr).
std::pair<int, std::string> run(const std::string& args) {
  FILE* p = ::popen((env("QUOTA_SERVER") + " " + args + " 2>&1").c_str(), "r");
  REQUIRE(p != nullptr);
  std::string out;
  char buf[512];
  while (std::fgets(buf, sizeof buf, p) != nullptr) out += buf;
  const int status = ::pclose(p);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

}  // namespace

TEST_CASE("envoyproxy/ratelimit rules with the budgets in Redis: shared by every server") {
  quota::testing::ScratchServer redis(quota::testing::scratch_dir("quota-server-envoy-redis"));
  REQUIRE(redis.started());
  const std::string rules = env("QUOTA_SERVER_DATA") + "/envoy_rules.yaml";
  Server a({"--rules", rules}, redis.port());
  Server b({"--rules", rules}, redis.port());

  // acme: 5 per hour (burst 5), whichever server is asked.
  for (int i = 0; i < 5; ++i) {
    Server& s = i % 2 == 0 ? a : b;
    const Call c = call(s, {{"tenant", "acme"}});
    INFO("call " << i << ": " << c.status.error_message());
    REQUIRE(c.status.ok());
    CHECK(c.response.overall_code() == Response::OK);
    CHECK(c.response.statuses(0).limit_remaining() == static_cast<unsigned>(4 - i));
    CHECK(c.response.statuses(0).current_limit().name() == "acme-hourly");
  }
  CHECK_FALSE(allowed(a, {{"tenant", "acme"}}));
  CHECK_FALSE(allowed(b, {{"tenant", "acme"}}));

  // Values the Redis key must encode: each its own budget of 3 (the key-alone limit).
  for (const std::string value : {"x{y}", "x%7By%7D", "x%7by%7d"}) {
    INFO(value);
    for (int i = 0; i < 3; ++i) CHECK(allowed(i % 2 == 0 ? a : b, {{"tenant", value}}));
    CHECK_FALSE(allowed(a, {{"tenant", value}}));
  }

  // shadow_mode: counted, always OK (1 per day: the second is over, still OK).
  CHECK(allowed(a, {{"remote_address", "10.0.0.1"}}));
  CHECK(allowed(b, {{"remote_address", "10.0.0.1"}}));
  // unlimited: OK with remaining 4294967295.
  const Call unlimited = call(a, {{"tenant", "t1"}, {"path", "/any"}});
  REQUIRE(unlimited.status.ok());
  CHECK(unlimited.response.statuses(0).limit_remaining() == 4294967295u);

  // Published to Redis and followed by a third server: the same budgets.
  const std::string where = "--redis=127.0.0.1:" + std::to_string(redis.port());
  const auto [code, out] = run("publish " + where + " --rules=" + rules);
  INFO(out);
  CHECK(code == 0);
  CHECK(out.find("published version 1 (envoy)") != std::string::npos);
  Server c({"--rules-from-redis"}, redis.port());
  CHECK_FALSE(allowed(c, {{"tenant", "acme"}}));
  CHECK(allowed(c, {{"tenant", "other"}}));

  // Redis gone: UNAVAILABLE from every server, never an admission.
  REQUIRE(redis.pid() > 0);
  REQUIRE(::kill(static_cast<pid_t>(redis.pid()), SIGKILL) == 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  for (Server* s : {&a, &b}) {
    const Call gone = call(*s, {{"tenant", "fresh"}});
    CHECK(gone.status.error_code() == grpc::StatusCode::UNAVAILABLE);
  }
  CHECK(a.process.stop() == 0);
  CHECK(b.process.stop() == 0);
  CHECK(c.process.stop() == 0);
}
