// quota_server_lease_test — leased rules in quota-server (redis_leases.hpp).
//
// On Redis: two quota-server processes with --redis on one real redis-server (a
// ScratchServer of this test, stopped by pid) decide one tenant's token bucket (50
// units/s, burst 20) whose rule is leased (`lease: {mode: on, units: 10, low_water: 2,
// expiry: 1s}`). Four client threads (gRPC and HTTP, to each server) ask for 1 unit as
// fast as they can for 2 s; each admission is dated by the test's clock at its answer.
//   - The union passes the envelope verifier for rate 50/s and burst 20 with
//     extra = 2 servers · (units + low_water) (the grants outstanding, docs/gateway.md
//     "Bound") + ceil(50/s · the longest admitted call) + 1 (an answer is dated at most
//     that late after its grant; +1 for the two clocks' rates).
//   - Redis runs well under one script call per check (INFO commandstats: EVALSHA and
//     EVAL calls, counted from a CONFIG RESETSTAT before the load): three per grant of
//     10 units (the revocation check, the grant, its record), none for a check decided
//     from a grant.
//   - Each server's /metrics shows its leases: quota_lease_renewals_total{level="tenant"}
//     and grants > 0, denials while leased > 0 in all, and a lone tenant's grant left
//     to expire is counted in quota_lease_units_unused_at_expiry_total.
// In process: the same file decides (unleased), no quota_lease_* series are served, and
// stderr says that `lease:` is ignored.
#include <httplib.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "envoy/service/ratelimit/v3/rls.grpc.pb.h"
#include "quota/redis/transport/connection.hpp"
#include "quota/verify/envelope.hpp"
#include "redis/support/redis_server.hpp"
#include "testing/load_clients.hpp"
#include "testing/metrics_text.hpp"
#include "testing/scratch.hpp"
#include "testing/script_calls.hpp"
#include "testing/server_process.hpp"

namespace {

namespace rls = envoy::service::ratelimit::v3;

using quota::testing::Admission;
using quota::testing::grpc_client;
using quota::testing::http_check;
using quota::testing::http_client;
using quota::testing::Log;
using quota::testing::now_ns;

using quota::testing::env;
using quota::testing::metric_value;
using quota::testing::script_calls;

constexpr std::int64_t kRate = 50;  // units per second
constexpr std::int64_t kBurst = 20;
constexpr std::int64_t kUnits = 10;
constexpr std::int64_t kLowWater = 2;
constexpr int kServers = 2;

constexpr const char* kRules =
    "routes:\n  - name: read\nrules:\n  - name: shared\n    level: tenant\n"
    "    plan: free\n    route: read\n"
    "    token_bucket: {rate: 50/1s, burst: 20}\n"
    "    lease: {mode: on, units: 10, low_water: 2, expiry: 1s}\n";

std::string metrics_of(quota::testing::ServerProcess& s) {
  httplib::Client c("127.0.0.1", s.port("http"));
  c.set_read_timeout(10);
  auto r = c.Get("/metrics");
  return r && r->status == 200 ? r->body : std::string();
}

double tenant_lease(const std::string& metrics, const std::string& family) {
  return metric_value(metrics, family + "{level=\"tenant\"}");
}

std::string write_rules(char* dir_template) {
  REQUIRE(mkdtemp(dir_template) != nullptr);
  const std::string rules = std::string(dir_template) + "/rules.yaml";
  std::ofstream(rules) << kRules;
  return rules;
}

}  // namespace

TEST_CASE("two servers lease one tenant's budget from Redis: the union within the bound",
          "[redis]") {
  quota::testing::ScratchServer redis(quota::testing::scratch_dir("quota-server-lease-test"));
  REQUIRE(redis.started());
  char dir_template[] = "/tmp/quota_server_lease_XXXXXX";
  const std::string rules = write_rules(dir_template);

  quota::testing::ServerProcess servers[kServers];
  for (auto& s : servers) {
    REQUIRE(s.start({env("QUOTA_SERVER"), "--rules", rules, "--default-plan", "free",
                     "--default-route", "read", "--grpc-port", "0", "--http-port", "0", "--redis",
                     "127.0.0.1:" + std::to_string(redis.port()), "--redis-deadline-ms", "2000"},
                    {"grpc", "http"}));
  }
  quota::redis::Connection direct(
      quota::redis::ConnectionConfig{.host = "127.0.0.1", .port = redis.port()});
  REQUIRE(
      direct
          .command({"CONFIG", "RESETSTAT"}, quota::redis::Deadline::after(std::chrono::seconds(2)))
          .ok());

  Log log;
  const std::int64_t until = now_ns() + 2'000'000'000;
  std::vector<std::thread> clients;
  for (int i = 0; i < kServers; ++i) {
    clients.emplace_back(grpc_client, servers[i].port("grpc"), i, until, std::ref(log));
    clients.emplace_back(http_client, servers[i].port("http"), i, until, std::ref(log));
  }
  for (auto& t : clients) t.join();
  const long long calls = script_calls(direct);

  INFO(log.error);
  REQUIRE(log.error.empty());
  std::int64_t longest = 0;
  long long by_server[kServers] = {0, 0};
  std::vector<quota::verify::AdmittedEvent> events;
  for (const Admission& x : log.admitted) {
    longest = std::max(longest, x.answered - x.sent);
    ++by_server[x.server];
    events.push_back({.time_ns = x.answered, .cost = 1});
  }
  std::sort(events.begin(), events.end(),
            [](const auto& l, const auto& r) { return l.time_ns < r.time_ns; });
  const std::int64_t outstanding = kServers * (kUnits + kLowWater);
  const std::int64_t extra = outstanding + (longest * kRate + 999'999'999) / 1'000'000'000 + 1;
  auto report = quota::verify::verify_token_bucket(
      events, quota::Rate{.units = kRate, .per = std::chrono::seconds(1)}, kBurst, extra);
  REQUIRE(report.ok());
  const long long checks = static_cast<long long>(events.size()) + log.denied;
  INFO("admitted " << events.size() << " (server a " << by_server[0] << ", b " << by_server[1]
                   << "), denied " << log.denied << ", longest admitted call " << longest
                   << " ns, extra " << extra << ", required burst " << report->required_burst()
                   << ", script calls " << calls << " for " << checks << " checks");
  CHECK(report->holds());
  CHECK(by_server[0] > 0);
  CHECK(by_server[1] > 0);
  CHECK(log.denied > 0);
  // Far fewer script calls than checks: three calls per grant of 10 units.
  REQUIRE(calls >= 0);
  CHECK(calls > 0);
  CHECK(calls * 10 < checks);
  std::printf("lease test: %lld checks, %lld script calls (%.4f per check), admitted %zu\n", checks,
              calls, checks > 0 ? static_cast<double>(calls) / checks : 0.0, events.size());

  // The lease counters of each server moved; denials answered while leased in all.
  double denials = 0;
  for (auto& s : servers) {
    const std::string m = metrics_of(s);
    INFO(m);
    CHECK(tenant_lease(m, "quota_lease_renewals_total") > 0);
    CHECK(tenant_lease(m, "quota_lease_grants_total") > 0);
    CHECK(tenant_lease(m, "quota_lease_units_granted_total") >= kUnits);
    CHECK(tenant_lease(m, "quota_lease_units_held") >= 0);
    CHECK(metric_value(m, "quota_lease_grants_total{level=\"global\"}") == 0);
    denials += tenant_lease(m, "quota_lease_denials_total");
  }
  CHECK(denials > 0);

  // A lone tenant's grant: 1 of 10 units spent, the grant left to expire (1 s), then the
  // next check drops it: 9 units counted unused at expiry.
  httplib::Client a("127.0.0.1", servers[0].port("http"));
  a.set_read_timeout(10);
  const double unused_before =
      tenant_lease(metrics_of(servers[0]), "quota_lease_units_unused_at_expiry_total");
  CHECK(http_check(a, "lone") == 1);
  CHECK(tenant_lease(metrics_of(servers[0]), "quota_lease_units_held") >= kUnits - 1);
  std::this_thread::sleep_for(std::chrono::milliseconds(1300));
  CHECK(http_check(a, "lone") == 1);
  const double unused_after =
      tenant_lease(metrics_of(servers[0]), "quota_lease_units_unused_at_expiry_total");
  CHECK(unused_after - unused_before >= kUnits - 1);

  for (auto& s : servers) CHECK(s.stop() == 0);
  std::remove(rules.c_str());
  rmdir(dir_template);
}

TEST_CASE("in process a lease has nothing to lease from: ignored, with a note", "[in_process]") {
  char dir_template[] = "/tmp/quota_server_lease_XXXXXX";
  const std::string rules = write_rules(dir_template);
  const std::string log_path = std::string(dir_template) + "/stderr.log";
  quota::testing::ServerProcess s;
  s.set_stderr(log_path);
  REQUIRE(
      s.start({env("QUOTA_SERVER"), "--rules", rules, "--default-plan", "free", "--default-route",
               "read", "--grpc-port", "0", "--http-port", "0", "--fresh-budgets-at-start"},
              {"grpc", "http"}));
  httplib::Client c("127.0.0.1", s.port("http"));
  c.set_read_timeout(10);
  // Decided (the burst is there), with no lease counters served.
  int admitted = 0;
  for (int i = 0; i < kBurst; ++i) admitted += http_check(c, "solo") == 1 ? 1 : 0;
  CHECK(admitted == kBurst);
  const std::string m = metrics_of(s);
  CHECK(metric_value(m, "quota_lease_grants_total{level=\"tenant\"}") == -1);  // not served
  CHECK(s.stop() == 0);
  std::ifstream in(log_path);
  const std::string err((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  CHECK(err.find("`lease:` options are ignored") != std::string::npos);
  std::remove(log_path.c_str());
  std::remove(rules.c_str());
  rmdir(dir_template);
}
