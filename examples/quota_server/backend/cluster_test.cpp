// quota_server_cluster_test — quota-server with --redis-cluster on the tests' Redis
// Cluster (3 masters, no replicas: cmake/redis_cluster.sh through the redis_cluster
// fixture; its ports in $QUOTA_REDIS_CLUSTER_DIR/ports). Two servers, seeded at
// different nodes, share every budget; each test uses tenants of its own run (the cluster
// is shared by other tests and runs).
//
//   - Leased rules (redis_leases.hpp): two tenants, each a leased 50/s burst-20 bucket,
//     spent by 4 client threads (gRPC and HTTP, both servers) for 2 s. Each tenant's
//     union passes verify_token_bucket with extra = 2 servers · (units + low_water) +
//     ceil(50/s · the longest admitted call) + 1, as on one redis-server
//     (lease_test.cpp); each server took grants.
//   - Several levels of one tenant (route `read` pays 1 unit and 1 call): exactly the
//     burst of units is admitted across both servers, and a denied check spent no call:
//     the two keys of a tenant are decided in one script, all or nothing.
//   - envoyproxy/ratelimit files (envoy_redis.hpp): 3 per hour per tenant value, spent
//     alternately and under load through both servers; values with `{` `}` are budgets of
//     their own.
//   - In every case the keys of a tenant (budgets, grant records) share one slot, and the
//     two tenants' slots differ (SCAN of every master, CLUSTER KEYSLOT).
#include <httplib.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "envoy/service/ratelimit/v3/rls.grpc.pb.h"
#include "quota/redis/transport/connection.hpp"
#include "quota/verify/envelope.hpp"
#include "testing/load_clients.hpp"
#include "testing/metrics_text.hpp"
#include "testing/probes.hpp"
#include "testing/scratch.hpp"
#include "testing/server_process.hpp"

namespace {

namespace rls = envoy::service::ratelimit::v3;

using quota::testing::Admission;
using quota::testing::env;
using quota::testing::Log;
using quota::testing::metric_value;
using quota::testing::now_ns;
using quota::testing::ServerProcess;
using quota::testing::TempDir;

std::vector<int> cluster_ports() {
  std::vector<int> ports;
  std::ifstream in(env("QUOTA_REDIS_CLUSTER_DIR") + "/ports");
  for (int p = 0; in >> p;) ports.push_back(p);
  REQUIRE(ports.size() >= 2);
  return ports;
}

// Two servers seeded at the first two nodes, with `rules` and `more`.
void start_pair(ServerProcess (&servers)[2], const std::string& rules,
                std::vector<std::string> more = {}) {
  const std::vector<int> ports = cluster_ports();
  for (int i = 0; i < 2; ++i) {
    std::vector<std::string> args = quota::testing::server_args(
        rules, {"--redis-cluster", "127.0.0.1:" + std::to_string(ports[i]), "--redis-deadline-ms",
                "2000"});
    args.insert(args.end(), more.begin(), more.end());
    REQUIRE(servers[i].start(args, {"grpc", "http"}));
  }
}

// The slot of every key on any master whose name contains `part` (SCAN, bounded).
std::set<long long> slots_of_keys(const std::string& part) {
  std::set<long long> slots;
  const auto deadline = [] { return quota::redis::Deadline::after(std::chrono::seconds(2)); };
  for (const int port : cluster_ports()) {
    quota::redis::Connection node(
        quota::redis::ConnectionConfig{.host = "127.0.0.1", .port = port});
    std::string cursor = "0";
    const std::string pattern = "*" + part + "*";
    for (int round = 0; round < 100'000; ++round) {
      auto reply = node.command({"SCAN", cursor, "MATCH", pattern, "COUNT", "1000"}, deadline());
      REQUIRE(reply.ok());
      REQUIRE((*reply)->type == REDIS_REPLY_ARRAY);
      REQUIRE((*reply)->elements == 2);
      cursor.assign((*reply)->element[0]->str, (*reply)->element[0]->len);
      const redisReply* keys = (*reply)->element[1];
      for (std::size_t i = 0; i < keys->elements; ++i) {
        const std::string key(keys->element[i]->str, keys->element[i]->len);
        auto slot = node.command({"CLUSTER", "KEYSLOT", key}, deadline());
        REQUIRE(slot.ok());
        REQUIRE((*slot)->type == REDIS_REPLY_INTEGER);
        slots.insert((*slot)->integer);
      }
      if (cursor == "0") break;
    }
  }
  return slots;
}

// Every key of each tenant in one slot, and the tenants' slots distinct.
void check_tenant_slots(const std::vector<std::string>& tenants) {
  std::set<long long> seen;
  for (const std::string& t : tenants) {
    const std::set<long long> slots = slots_of_keys(t);
    INFO("tenant " << t);
    REQUIRE(slots.size() == 1);
    CHECK(seen.insert(*slots.begin()).second);
  }
}

// The admissions of `log`, dated at their answers, against a token bucket of `rate`/s and
// `burst` with extra = `held` + ceil(rate · the longest admitted call) + 1.
void check_envelope(const Log& log, std::int64_t rate, std::int64_t burst, std::int64_t held) {
  INFO(log.error);
  REQUIRE(log.error.empty());
  std::int64_t longest = 0;
  long long by_server[2] = {0, 0};
  std::vector<quota::verify::AdmittedEvent> events;
  for (const Admission& x : log.admitted) {
    longest = std::max(longest, x.answered - x.sent);
    ++by_server[x.server];
    events.push_back({.time_ns = x.answered, .cost = 1});
  }
  std::sort(events.begin(), events.end(),
            [](const auto& l, const auto& r) { return l.time_ns < r.time_ns; });
  const std::int64_t extra = held + (longest * rate + 999'999'999) / 1'000'000'000 + 1;
  auto report = quota::verify::verify_token_bucket(
      events, quota::Rate{.units = rate, .per = std::chrono::seconds(1)}, burst, extra);
  REQUIRE(report.ok());
  INFO("admitted " << events.size() << " (server a " << by_server[0] << ", b " << by_server[1]
                   << "), denied " << log.denied << ", longest admitted call " << longest
                   << " ns, extra " << extra << ", required burst " << report->required_burst());
  CHECK(report->holds());
  std::printf(
      "cluster lease: admitted %zu (a %lld, b %lld), denied %lld, extra %lld, required "
      "burst %lld of %lld\n",
      events.size(), by_server[0], by_server[1], log.denied, static_cast<long long>(extra),
      static_cast<long long>(report->required_burst()), static_cast<long long>(burst));
  CHECK(by_server[0] > 0);
  CHECK(by_server[1] > 0);
  CHECK(log.denied > 0);
}

rls::RateLimitRequest envoy_request(const std::string& tenant) {
  rls::RateLimitRequest req;
  req.set_domain("edge");
  auto* e = req.add_descriptors()->add_entries();
  e->set_key("tenant");
  e->set_value(tenant);
  return req;
}

// One envoy call: OK (true) or OVER_LIMIT (false); the call must succeed.
bool envoy_allowed(const ServerProcess& s, const std::string& tenant,
                   unsigned* remaining = nullptr) {
  auto stub = rls::RateLimitService::NewStub(grpc::CreateChannel(
      "127.0.0.1:" + std::to_string(s.port("grpc")), grpc::InsecureChannelCredentials()));
  rls::RateLimitResponse resp;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  const grpc::Status st = stub->ShouldRateLimit(&ctx, envoy_request(tenant), &resp);
  INFO(st.error_message());
  REQUIRE(st.ok());
  REQUIRE(resp.statuses_size() == 1);
  if (remaining != nullptr) *remaining = resp.statuses(0).limit_remaining();
  return resp.overall_code() == rls::RateLimitResponse::OK;
}

}  // namespace

TEST_CASE("two servers lease two tenants' budgets on a Redis Cluster: each within the bound") {
  TempDir dir("cluster_lease");
  const std::string rules =
      dir.write("rules.yaml",
                "routes:\n  - name: read\nrules:\n  - name: shared\n    level: tenant\n"
                "    plan: free\n    route: read\n    token_bucket: {rate: 50/1s, burst: 20}\n"
                "    lease: {mode: on, units: 10, low_water: 2, expiry: 1s}\n");
  ServerProcess servers[2];
  start_pair(servers, rules);

  const std::string run = std::to_string(::getpid()) + "-" + std::to_string(now_ns() % 1'000'000);
  const std::vector<std::string> tenants = {"lease-a-" + run, "lease-b-" + run};
  Log logs[2];
  const std::int64_t until = now_ns() + 2'000'000'000;
  std::vector<std::thread> clients;
  for (int t = 0; t < 2; ++t) {
    // Each tenant through gRPC at one server and HTTP at the other.
    clients.emplace_back(quota::testing::grpc_request_client, servers[t].port("grpc"), t,
                         quota::testing::one_unit(tenants[t]), until, std::ref(logs[t]));
    clients.emplace_back(quota::testing::http_tenant_client, servers[1 - t].port("http"), 1 - t,
                         tenants[t], until, std::ref(logs[t]));
  }
  for (auto& c : clients) c.join();
  for (int t = 0; t < 2; ++t) {
    INFO("tenant " << tenants[t]);
    check_envelope(logs[t], 50, 20, 2 * (10 + 2));
  }
  for (ServerProcess& s : servers) {
    std::string m;
    {
      httplib::Client c("127.0.0.1", s.port("http"));
      c.set_read_timeout(10);
      auto r = c.Get("/metrics");
      REQUIRE(r);
      m = r->body;
    }
    CHECK(metric_value(m, R"(quota_lease_grants_total{level="tenant"})") > 0);
  }
  check_tenant_slots(tenants);
  for (ServerProcess& s : servers) CHECK(s.stop() == 0);
}

TEST_CASE("a tenant's levels are decided all or nothing on a Redis Cluster, per tenant slot") {
  TempDir dir("cluster_levels");
  // read pays 1 unit and 1 call; ping pays 1 call only. Units: burst 3, calls: burst 5; no
  // refill while the test runs.
  const std::string rules = dir.write(
      "rules.yaml",
      "routes:\n  - name: read\n    costs: {units: 1, calls: 1}\n  - name: ping\n"
      "    costs: {calls: 1}\nrules:\n  - name: units\n    level: tenant\n    plan: free\n"
      "    limit: units\n    token_bucket: {rate: 1/1000s, burst: 3}\n  - name: calls\n"
      "    level: tenant\n    plan: free\n    limit: calls\n"
      "    token_bucket: {rate: 1/1000s, burst: 5}\n");
  ServerProcess servers[2];
  start_pair(servers, rules);
  const std::string run = std::to_string(::getpid()) + "-" + std::to_string(now_ns() % 1'000'000);
  const std::vector<std::string> tenants = {"levels-a-" + run, "levels-b-" + run};
  const auto allowed = [](const ServerProcess& s, const std::string& tenant,
                          const std::string& route) {
    httplib::Client c("127.0.0.1", s.port("http"));
    c.set_read_timeout(10);
    auto r = c.Post("/v1/check", R"({"tenant":")" + tenant + R"(","route":")" + route + R"("})",
                    "application/json");
    REQUIRE(r);
    INFO(r->body);
    REQUIRE(r->status == 200);
    return r->body.find("\"allowed\":true") != std::string::npos;
  };
  for (const std::string& t : tenants) {
    INFO("tenant " << t);
    // 3 reads admitted (units run out), alternating servers; 2 more denied by units.
    int admitted = 0;
    for (int i = 0; i < 5; ++i) admitted += allowed(servers[i % 2], t, "read") ? 1 : 0;
    CHECK(admitted == 3);
    // The denied reads spent no call: 5 − 3 = 2 pings left, then none.
    CHECK(allowed(servers[0], t, "ping"));
    CHECK(allowed(servers[1], t, "ping"));
    CHECK_FALSE(allowed(servers[0], t, "ping"));
  }
  check_tenant_slots(tenants);
  for (ServerProcess& s : servers) CHECK(s.stop() == 0);
}

TEST_CASE("envoyproxy/ratelimit budgets on a Redis Cluster are shared by two servers") {
  ServerProcess servers[2];
  start_pair(servers, env("QUOTA_SERVER_DATA") + "/envoy_rules.yaml");
  const std::string run = std::to_string(::getpid()) + "-" + std::to_string(now_ns() % 1'000'000);

  // A tenant value's 3 per hour (the key-alone limit), admitted alternately by both servers
  // with limit_remaining counting down across them; values with braces are their own.
  const std::vector<std::string> values = {"env-a-" + run, "env-{b}-" + run, "env-%7Bb%7D-" + run};
  for (const std::string& v : values) {
    INFO("value " << v);
    for (unsigned i = 0; i < 3; ++i) {
      unsigned remaining = 99;
      CHECK(envoy_allowed(servers[i % 2], v, &remaining));
      CHECK(remaining == 2 - i);
    }
    CHECK_FALSE(envoy_allowed(servers[0], v));
    CHECK_FALSE(envoy_allowed(servers[1], v));
  }

  // Under load: two fresh values, each through gRPC at both servers for 1 s; each value's
  // union within 3 per hour (plus the answers' lateness).
  const std::vector<std::string> loaded = {"env-load-a-" + run, "env-load-b-" + run};
  Log logs[2];
  const std::int64_t until = now_ns() + 1'000'000'000;
  std::vector<std::thread> clients;
  for (int t = 0; t < 2; ++t) {
    for (int s = 0; s < 2; ++s) {
      clients.emplace_back(quota::testing::grpc_request_client, servers[s].port("grpc"), s,
                           envoy_request(loaded[t]), until, std::ref(logs[t]));
    }
  }
  for (auto& c : clients) c.join();
  for (int t = 0; t < 2; ++t) {
    INFO("value " << loaded[t]);
    CHECK(logs[t].admitted.size() == 3);  // 3 per hour: no refill within the run
    INFO(logs[t].error);
    REQUIRE(logs[t].error.empty());
    CHECK(logs[t].denied > 0);
  }
  check_tenant_slots({values[0], loaded[0], loaded[1]});
  for (ServerProcess& s : servers) CHECK(s.stop() == 0);
}

TEST_CASE("--redis-cluster with several seeds, the first dead: ready, and deciding") {
  const std::vector<int> ports = cluster_ports();
  TempDir dir("cluster_seeds");
  const std::string rules =
      dir.write("rules.yaml",
                "routes:\n  - name: read\nrules:\n  - name: r\n    level: tenant\n"
                "    plan: free\n    route: read\n    token_bucket: {rate: 1/100s, burst: 5}\n");
  // Port 1 on loopback: nothing listens there, connects are refused at once.
  ServerProcess s;
  REQUIRE(
      s.start(quota::testing::server_args(
                  rules, {"--redis-cluster", "127.0.0.1:1,127.0.0.1:" + std::to_string(ports[1]),
                          "--redis-deadline-ms", "2000"}),
              {"grpc", "http"}));
  httplib::Client c("127.0.0.1", s.port("http"));
  c.set_read_timeout(10);
  CHECK(quota::testing::eventually([&] {
    auto r = c.Get("/readyz");
    return r && r->status == 200;
  }));
  auto r = c.Post("/v1/check", R"({"tenant":"seeds-)" + std::to_string(::getpid()) + R"("})",
                  "application/json");
  REQUIRE(r);
  INFO(r->body);
  CHECK(r->status == 200);
  CHECK_THAT(r->body, Catch::Matchers::Contains("\"allowed\":true"));
}
