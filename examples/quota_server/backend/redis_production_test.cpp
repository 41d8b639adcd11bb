// quota_server_redis_production_test — quota-server's production Redis options
// (redis_flags.hpp) against real redis-server and redis-sentinel processes the test
// starts on free loopback ports (quota/testing/redis_server.hpp RedisServer;
// the failover's primary, replica and sentinel: sentinel_deployment.hpp, shared with
// redis_sentinel_test), stopped by pid:
//   - an evicting Redis (maxmemory-policy allkeys-lru) answers 503 unless the server runs
//     with --redis-allow-evicting, which decides (and warns on stderr);
//   - --redis-replicas 1 on a primary with no replica: every call 503 (WAIT in vain, never
//     an admission); once a replica is attached it decides;
//   - --redis-coalesce with --redis-clock-guard-ms: 4 client threads admit exactly the
//     burst;
//   - a failover under the server: a primary, its replica and one redis-sentinel (quorum
//     1); quota-server --redis-sentinel with default flags (failover safety, the clock
//     guard, the breaker and the in-flight guard on; the 50 ms deadline) spends a
//     tenant's budget, the primary is SIGKILLed, every answer is 503 / UNAVAILABLE until
//     the sentinel has promoted the replica, then the same process decides on the new
//     primary: the spent tenant stays denied (its admissions pass the token-bucket
//     verifier for r·T + B) and a tenant never seen gets no fresh burst, while a server
//     with --redis-failover-safety=false gives one;
//   - one Redis and no replica, SIGKILLed and restarted empty (no persistence) under
//     quota-server with default flags: 503 while it is down, then the spent tenant stays
//     denied and a tenant never seen gets no burst (the restart is the failover that
//     failover safety sees: a new run id), while --redis-failover-safety=false hands the
//     spent tenant its burst again.
#include <httplib.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "envoy/service/ratelimit/v3/rls.grpc.pb.h"
#include "quota/redis/transport/connection.hpp"
#include "quota/verify/envelope.hpp"
#include "redis/support/redis_server.hpp"
#include "redis/support/sentinel_deployment.hpp"
#include "testing/load_clients.hpp"
#include "testing/scratch.hpp"
#include "testing/server_process.hpp"

namespace {

namespace rls = envoy::service::ratelimit::v3;
using namespace std::chrono_literals;
using quota::testing::env;
using quota::testing::eventually;
using quota::testing::post_check;
using quota::testing::RedisServer;
using quota::testing::SentinelDeployment;
using quota::testing::server_args;
using quota::testing::ServerProcess;
using quota::testing::TempDir;

// Burst 3, refilling one unit per 100 s: over a test's seconds the budget is the burst.
const char kRules[] =
    "routes:\n  - name: read\nrules:\n  - name: shared\n    level: tenant\n"
    "    plan: free\n    route: read\n    token_bucket: {rate: 1/100s, burst: 3}\n";
constexpr std::int64_t kBurst = 3;

bool allowed(const std::pair<int, std::string>& answer) {
  return answer.first == 200 && answer.second.find("\"allowed\":true") != std::string::npos;
}
bool denied(const std::pair<int, std::string>& answer) {
  return answer.first == 200 && answer.second.find("\"allowed\":false") != std::string::npos;
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

// The value of `field` (e.g. "master_repl_offset:", "offset=") in INFO text, after `from`;
// -1 if absent.
long long info_number(const std::string& info, const std::string& from, const std::string& field) {
  const std::size_t at = info.find(from);
  if (at == std::string::npos) return -1;
  const std::size_t f = info.find(field, at);
  if (f == std::string::npos) return -1;
  return std::atoll(info.c_str() + f + field.size());
}

// The replica has everything the primary wrote: a write made now on the primary is
// acknowledged by it. (A replica just synced is listed online before the primary streams
// it anything: until its first acknowledgement, up to a second, WAIT counts it out.)
bool synced(const RedisServer& primary) {
  const auto info = [&] {
    return quota::testing::redis_ask(primary.port(), "", {"INFO", "replication"});
  };
  if (!eventually([&] { return info().find("state=online") != std::string::npos; }, 30s)) {
    return false;
  }
  quota::testing::redis_ask(primary.port(), "", {"SET", "quota-test-synced", "1"});
  const long long written = info_number(info(), "", "master_repl_offset:");
  return written > 0 &&
         eventually([&] { return info_number(info(), "slave0:", "offset=") >= written; }, 30s);
}

std::int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

std::string read_all(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::string tenant(const std::string& name) { return name + "-" + std::to_string(::getpid()); }

// `admitted` (client time, sorted) within r·T + B of the tests' 1/100s bucket, with one
// extra unit for the spread of client time against the server's.
void check_envelope(const std::vector<quota::verify::AdmittedEvent>& admitted) {
  auto report = quota::verify::verify_token_bucket(
      admitted, quota::Rate{.units = 1, .per = std::chrono::seconds(100)}, kBurst, 1);
  REQUIRE(report.ok());
  INFO("admitted " << admitted.size() << ", required burst " << report->required_burst());
  CHECK(report->holds());
}

}  // namespace

TEST_CASE("--redis-allow-evicting: an evicting Redis is 503 without it, decides with it") {
  RedisServer redis("server-evicting", {"maxmemory 64mb", "maxmemory-policy allkeys-lru"});
  REQUIRE(redis.started());
  TempDir dir("prod");
  const std::string rules = dir.write("rules.yaml", kRules);
  const std::string where = "127.0.0.1:" + std::to_string(redis.port());
  ServerProcess refused, accepted;
  REQUIRE(refused.start(server_args(rules, {"--redis", where, "--redis-deadline-ms", "2000"}),
                        {"grpc", "http"}));
  const std::string log = dir.path + "/accepted.log";
  accepted.set_stderr(log);
  REQUIRE(accepted.start(server_args(rules, {"--redis", where, "--redis-deadline-ms", "2000",
                                             "--redis-allow-evicting"}),
                         {"grpc", "http"}));
  const auto no = post_check(refused.port("http"), tenant("evicting"));
  INFO(no.second);
  CHECK(no.first == 503);
  CHECK(no.second.find("maxmemory-policy allkeys-lru") != std::string::npos);
  CHECK(no.second.find("--redis-allow-evicting") != std::string::npos);
  CHECK(grpc_check(refused.port("grpc"), tenant("evicting")) == grpc::StatusCode::UNAVAILABLE);
  CHECK(allowed(post_check(accepted.port("http"), tenant("evicting"))));
  CHECK(refused.stop() == 0);
  CHECK(accepted.stop() == 0);
  CHECK(read_all(log).find("maxmemory-policy allkeys-lru") != std::string::npos);
}

TEST_CASE("--redis-replicas 1: 503 while no replica acknowledges, decisions once one does") {
  RedisServer primary("server-wait-primary", {"repl-diskless-sync-delay 0"});
  REQUIRE(primary.started());
  TempDir dir("prod");
  const std::string rules = dir.write("rules.yaml", kRules);
  ServerProcess s;
  REQUIRE(s.start(server_args(rules, {"--redis", "127.0.0.1:" + std::to_string(primary.port()),
                                      "--redis-deadline-ms", "2000", "--redis-replicas", "1",
                                      // room for a replica's acknowledgement on a loaded
                                      // machine (each 503 below waits this long)
                                      "--redis-replica-timeout-ms", "300"}),
                  {"grpc", "http"}));
  const std::string t = tenant("wait");
  for (int i = 0; i < 4; ++i) {
    const auto a = post_check(s.port("http"), t);
    INFO(a.second);
    CHECK(a.first == 503);
  }
  CHECK(grpc_check(s.port("grpc"), t) == grpc::StatusCode::UNAVAILABLE);
  RedisServer replica("server-wait-replica",
                      {"replicaof 127.0.0.1 " + std::to_string(primary.port())});
  REQUIRE(replica.started());
  REQUIRE(synced(primary));
  // The unacknowledged writes above may have spent the budget already (WAIT does not
  // undo them): a fresh tenant shows the decisions.
  const std::string fresh = tenant("wait-fresh");
  for (int i = 0; i < kBurst; ++i) {
    const auto a = post_check(s.port("http"), fresh);
    INFO("request " << i << ": " << a.first << " " << a.second);
    CHECK(allowed(a));
  }
  const auto over = post_check(s.port("http"), fresh);
  INFO(over.first << " " << over.second);
  CHECK(denied(over));
  CHECK(s.stop() == 0);
}

TEST_CASE("--redis-coalesce with --redis-clock-guard-ms: 4 threads admit exactly the burst") {
  RedisServer redis("server-coalesce", {});
  REQUIRE(redis.started());
  TempDir dir("prod");
  const std::string rules = dir.write("rules.yaml", kRules);
  ServerProcess s;
  REQUIRE(s.start(server_args(rules, {"--redis", "127.0.0.1:" + std::to_string(redis.port()),
                                      "--redis-deadline-ms", "2000", "--redis-connections", "4",
                                      "--redis-coalesce", "8", "--redis-coalesce-calls", "2",
                                      "--redis-clock-guard-ms", "1000"}),
                  {"grpc", "http"}));
  const std::string t = tenant("coalesce");
  std::atomic<int> yes{0}, no{0}, other{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back([&] {
      for (int j = 0; j < 5; ++j) {
        httplib::Client c("127.0.0.1", s.port("http"));
        c.set_read_timeout(10);
        auto r = c.Post("/v1/check", R"({"tenant":")" + t + R"("})", "application/json");
        if (!r || r->status != 200) {
          ++other;
        } else if (r->body.find("\"allowed\":true") != std::string::npos) {
          ++yes;
        } else {
          ++no;
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  CHECK(other.load() == 0);
  CHECK(yes.load() == kBurst);
  CHECK(no.load() == 20 - kBurst);
  CHECK(s.stop() == 0);
}

TEST_CASE(
    "a failover under the server: 503 while no primary, then decisions on the promoted "
    "replica; with default flags no fresh burst") {
  // A primary, its replica and one sentinel (quorum 1), all up and known to each other.
  SentinelDeployment d("server-fo", {.replicas = 1, .sentinels = 1, .quorum = 1});
  RedisServer& primary = *d.primary;
  RedisServer& replica = *d.replicas[0];
  RedisServer& sentinel = *d.sentinels[0];

  TempDir dir("prod");
  const std::string rules = dir.write("rules.yaml", kRules);
  // `safe`: nothing but where the budgets are (every guard at its default);
  // `plain`: failover safety turned off, by name.
  const std::vector<std::string> defaults = {
      "--redis-sentinel", "127.0.0.1:" + std::to_string(sentinel.port()), "--redis-sentinel-master",
      quota::testing::kSentinelMaster};
  auto without = defaults;
  without.push_back("--redis-failover-safety=false");
  ServerProcess safe, plain;
  REQUIRE(safe.start(server_args(rules, defaults), {"grpc", "http"}));
  REQUIRE(plain.start(server_args(rules, without), {"grpc", "http"}));

  // Before: the budget of `spent` spent on the server with default flags; the plain one
  // decides too (its connections are to the first primary).
  const std::string spent = tenant("fo-spent");
  std::vector<quota::verify::AdmittedEvent> admitted;  // `spent`'s, client time
  for (int i = 0; i < kBurst + 2; ++i) {
    const auto a = post_check(safe.port("http"), spent);
    INFO(a.second);
    REQUIRE(a.first == 200);
    if (allowed(a)) admitted.push_back({.time_ns = now_ns(), .cost = 1});
  }
  CHECK(admitted.size() == static_cast<std::size_t>(kBurst));
  CHECK(allowed(post_check(plain.port("http"), tenant("fo-plain-before"))));

  // The primary crashes. Until the sentinel has promoted the replica (down-after 1 s),
  // nothing can decide: 503 / UNAVAILABLE, never an admission.
  REQUIRE(primary.kill(SIGKILL));
  const std::int64_t killed = now_ns();
  CHECK(grpc_check(safe.port("grpc"), spent) == grpc::StatusCode::UNAVAILABLE);
  int unavailable = 0, other = 0;
  bool decided = false;
  const auto end = std::chrono::steady_clock::now() + 40s;
  while (!decided && std::chrono::steady_clock::now() < end) {
    const auto a = post_check(safe.port("http"), spent);
    INFO(a.second);
    CHECK_FALSE(allowed(a));
    if (a.first == 503) {
      ++unavailable;
    } else if (denied(a)) {
      decided = true;
    } else {
      ++other;
    }
    if (!decided) std::this_thread::sleep_for(100ms);
  }
  INFO("503 answers while no primary: " << unavailable << ", other answers: " << other);
  REQUIRE(decided);
  std::printf(
      "failover under quota-server: SIGKILL to the first decision on the promoted "
      "replica %.0f ms, %d answers 503 in between\n",
      static_cast<double>(now_ns() - killed) / 1e6, unavailable);
  CHECK(unavailable >= 1);
  CHECK(other == 0);
  CHECK(
      quota::testing::redis_ask(replica.port(), "", {"INFO", "replication"}).find("role:master") !=
      std::string::npos);

  // After: the same process decides on the new primary. With failover safety every bucket
  // older than the failover is spent at it: the spent tenant stays denied, and one never
  // seen has no burst either (1 unit per 100 s refills from the failover on).
  for (int i = 0; i < 3; ++i) {
    const auto a = post_check(safe.port("http"), spent);
    INFO(a.second);
    CHECK(denied(a));
    if (allowed(a)) admitted.push_back({.time_ns = now_ns(), .cost = 1});
  }
  const auto fresh = post_check(safe.port("http"), tenant("fo-fresh-safe"));
  INFO(fresh.second);
  CHECK(denied(fresh));
  CHECK(grpc_check(safe.port("grpc"), tenant("fo-fresh-safe")) == grpc::StatusCode::OK);
  // The failover is on /metrics (for the alert on it, examples/alerts/).
  {
    httplib::Client c("127.0.0.1", safe.port("http"));
    auto m = c.Get("/metrics");
    REQUIRE(m);
    CHECK_THAT(m->body, Catch::Matchers::Contains("quota_redis_failovers_seen_total "));
    CHECK_THAT(m->body, !Catch::Matchers::Contains("quota_redis_failovers_seen_total 0\n"));
    CHECK_THAT(m->body,
               !Catch::Matchers::Contains("quota_redis_last_failover_timestamp_seconds 0\n"));
  }
  // With failover safety off the plain server follows the failover too, and a key with no
  // state starts full.
  CHECK(eventually(
      [&] { return allowed(post_check(plain.port("http"), tenant("fo-fresh-plain"))); }, 30s));

  // The union of `spent`'s admissions, before and after: within r·T + B (one extra unit
  // for the spread of client time against the server's).
  check_envelope(admitted);
  CHECK(safe.stop() == 0);
  CHECK(plain.stop() == 0);
}

TEST_CASE("one Redis, no replica, restarted empty under the server: default flags give no burst") {
  // No persistence (RedisServer: save "" and appendonly no): a restart loses every key.
  RedisServer redis("server-restart", {});
  REQUIRE(redis.started());
  TempDir dir("prod");
  const std::string rules = dir.write("rules.yaml", kRules);
  const std::string where = "127.0.0.1:" + std::to_string(redis.port());
  ServerProcess safe, plain;
  REQUIRE(safe.start(server_args(rules, {"--redis", where}), {"grpc", "http"}));
  REQUIRE(plain.start(server_args(rules, {"--redis", where, "--redis-failover-safety=false"}),
                      {"grpc", "http"}));
  const std::string spent = tenant("restart-spent"), spent_plain = tenant("restart-plain");
  std::vector<quota::verify::AdmittedEvent> admitted;  // `spent`'s, client time
  for (int i = 0; i < kBurst + 2; ++i) {
    const auto a = post_check(safe.port("http"), spent);
    INFO(a.second);
    REQUIRE(a.first == 200);
    if (allowed(a)) admitted.push_back({.time_ns = now_ns(), .cost = 1});
    CHECK(post_check(plain.port("http"), spent_plain).first == 200);
  }
  CHECK(admitted.size() == static_cast<std::size_t>(kBurst));
  CHECK(denied(post_check(plain.port("http"), spent_plain)));

  REQUIRE(redis.kill(SIGKILL));
  const auto down = post_check(safe.port("http"), spent);
  INFO(down.second);
  CHECK(down.first == 503);
  REQUIRE(redis.restart());
  // Back: the server reconnects by itself (the breaker lets a probe through every 250 ms).
  int unavailable = 0;
  bool decided = false;
  for (int i = 0; i < 200 && !decided; ++i) {
    const auto a = post_check(safe.port("http"), spent);
    INFO(a.second);
    CHECK_FALSE(allowed(a));
    if (a.first == 503) {
      ++unavailable;
      std::this_thread::sleep_for(50ms);
    } else {
      decided = denied(a);
    }
  }
  INFO("503 answers after the restart: " << unavailable);
  REQUIRE(decided);
  for (int i = 0; i < 3; ++i) {
    const auto a = post_check(safe.port("http"), spent);
    INFO(a.second);
    CHECK(denied(a));
    if (allowed(a)) admitted.push_back({.time_ns = now_ns(), .cost = 1});
  }
  CHECK(denied(post_check(safe.port("http"), tenant("restart-fresh"))));
  // Without failover safety the restart hands the spent tenant its burst again.
  CHECK(eventually([&] { return allowed(post_check(plain.port("http"), spent_plain)); }, 30s));

  check_envelope(admitted);
  CHECK(safe.stop() == 0);
  CHECK(plain.stop() == 0);
}
