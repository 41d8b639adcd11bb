// quota_server_fair_exchange_test — two quota-server processes on one real redis-server
// (a ScratchServer of this test, stopped by pid) divide a fair-share global budget by
// both servers' asks (--fair-share-holders 2: the asks exchanged through Redis,
// fair_exchange.hpp).
//
// The budget: a global token bucket of 50 units/s, burst 20, with `fair_share: {period:
// 1s, reserve: 30%}` (a budget of 50 units in use per period, shares of 35). Server a
// (--instance-id server-a) serves one heavy tenant: two gRPC client threads, each asking
// 1 unit every 2 ms; server b (default id HOST:PID) serves three light tenants, each
// asking 1 unit over HTTP every 250 ms (4/s, 12/s together). For 10 s:
//   - with the exchange: both servers' asks reach every allocation two periods after
//     they are made, so from the 4th second on the heavy tenant is held to its share
//     (35 − 12 = 23 per period) at a, the bucket keeps units for b, and the light tenants
//     get at least 75 % of their asks (runs: 72 of 72); both servers together admit at
//     most 35 per second after the warm-up plus 35 (245; runs: 210); the `{~fair}`
//     hashes in Redis hold both servers' fields (`server-a|heavy`, `HOST:PID|light-0`,
//     ...) and are named by periods of the wall clock (seconds since the epoch, within
//     30 s of now), neither server fell back to its fixed part, and a refused the heavy
//     tenant by share;
//   - without it (--fair-share-holders 1, the control): a's allocator sees the heavy
//     tenant alone (the whole budget), it drains the shared bucket, the light tenants get
//     less than half of their asks (runs: 5 to 11 of 72) and both servers admit more
//     than 245 (runs: 305); nothing is written under `{~fair}`.
// Both ways, the union of both servers' admissions, dated by the client's clock at the
// answer, passes verify_token_bucket for 50/s burst 20 with extra = ⌈50/s · the longest
// admitted call⌉ + 1 (the shares only refuse: the store's envelope holds unchanged).
#include <httplib.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "quota/redis/transport/connection.hpp"
#include "quota/verify/envelope.hpp"
#include "redis/support/redis_server.hpp"
#include "testing/load_clients.hpp"
#include "testing/metrics_text.hpp"
#include "testing/probes.hpp"
#include "testing/scratch.hpp"
#include "testing/server_process.hpp"

namespace {

using quota::testing::Admission;
using quota::testing::fair_sample;
using quota::testing::http_get;
using quota::testing::Log;
using quota::testing::now_ns;

constexpr std::int64_t kSecond = 1'000'000'000;
constexpr std::int64_t kRun = 10 * kSecond;         // the clients' time
constexpr std::int64_t kWarmUp = 4 * kSecond;       // the light tenants counted from here
constexpr std::int64_t kPace = kSecond / 4;         // a light tenant's interval
constexpr std::int64_t kHeavyPace = kSecond / 500;  // each heavy client's interval
constexpr int kLight = 3;
// Σ over both servers of the shares ≤ budget − reserve = 35 units in use at every
// allocation: after the warm-up at most 35 per second, plus the 35 in use when it ends.
constexpr long long kShareBound = 35 * (kRun - kWarmUp) / kSecond + 35;

const char* const kRules =
    "routes:\n  - name: read\nrules:\n"
    "  - name: per-tenant\n    level: tenant\n    plan: free\n    route: read\n"
    "    token_bucket: {rate: 1000000/s, burst: 1000000}\n"
    "  - name: provider\n    level: global\n    route: read\n"
    "    token_bucket: {rate: 50/s, burst: 20}\n"
    "    fair_share: {period: 1s, reserve: 30%}\n";

// Calls `call` (1 admitted, 0 denied, -1 no decision with `error` set) once per `pace`
// from `start` until `until` (back to back when a call takes longer), at most 100,000
// times; admissions and denials in `log` as from `server` (each denial's send time also
// in `denied_sent`), a call without a decision in log.error (and the client stops).
void paced_client(const std::function<int(std::string*)>& call, int server, std::int64_t pace,
                  std::int64_t start, std::int64_t until, Log& log,
                  std::vector<std::int64_t>& denied_sent) {
  std::int64_t at = start;
  for (int n = 0; n < 100'000 && at < until; ++n, at += pace) {
    std::this_thread::sleep_for(std::chrono::nanoseconds(std::max<std::int64_t>(0, at - now_ns())));
    const std::int64_t sent = now_ns();
    if (sent >= until) return;
    std::string error;
    const int got = call(&error);
    if (!log.record(got, error, sent, now_ns(), server)) return;
    if (got == 0) {
      std::lock_guard lock(log.mu);  // shared by the clients of one Log
      denied_sent.push_back(sent);
    }
  }
}

// A light tenant: HTTP /v1/check to server b, one every kPace.
void light_client(int port, const std::string& tenant, std::int64_t start, std::int64_t until,
                  Log& log, std::vector<std::int64_t>& denied_sent) {
  httplib::Client c("127.0.0.1", port);
  c.set_read_timeout(10);
  paced_client([&](std::string* error) { return quota::testing::http_check(c, tenant, error); }, 1,
               kPace, start, until, log, denied_sent);
}

// The heavy tenant: gRPC ShouldRateLimit to server a, one every kHeavyPace.
void heavy_client(int port, std::int64_t start, std::int64_t until, Log& log,
                  std::vector<std::int64_t>& denied_sent) {
  namespace rls = envoy::service::ratelimit::v3;
  auto stub = rls::RateLimitService::NewStub(
      grpc::CreateChannel("127.0.0.1:" + std::to_string(port), grpc::InsecureChannelCredentials()));
  const rls::RateLimitRequest req = quota::testing::one_unit("heavy");
  paced_client(
      [&](std::string* error) {
        rls::RateLimitResponse resp;
        grpc::ClientContext ctx;
        ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
        const grpc::Status st = stub->ShouldRateLimit(&ctx, req, &resp);
        if (!st.ok()) {
          *error = "grpc: " + st.error_message();
          return -1;
        }
        return resp.overall_code() == rls::RateLimitResponse::OK ? 1 : 0;
      },
      0, kHeavyPace, start, until, log, denied_sent);
}

// What Redis holds of the exchange: every `{~fair}` hash's period (the number after its
// last ':') and every field name.
struct FairHashes {
  std::vector<long long> periods;
  std::vector<std::string> fields;
};

FairHashes fair_hashes(quota::redis::Connection& redis) {
  const auto deadline = [] { return quota::redis::Deadline::after(std::chrono::seconds(2)); };
  FairHashes out;
  auto keys = redis.command({"KEYS", "*{~fair}*"}, deadline());
  if (!keys.ok() || (*keys)->type != REDIS_REPLY_ARRAY) return out;
  for (std::size_t k = 0; k < (*keys)->elements; ++k) {
    const std::string key((*keys)->element[k]->str, (*keys)->element[k]->len);
    out.periods.push_back(std::atoll(key.c_str() + key.rfind(':') + 1));
    auto all = redis.command({"HGETALL", key}, deadline());
    if (!all.ok() || (*all)->type != REDIS_REPLY_ARRAY) continue;
    for (std::size_t i = 0; i + 1 < (*all)->elements; i += 2)
      out.fields.emplace_back((*all)->element[i]->str, (*all)->element[i]->len);
  }
  return out;
}

struct Outcome {
  long long light_asked = 0;     // from kWarmUp on
  long long light_admitted = 0;  // from kWarmUp on
  long long heavy_admitted = 0;
  long long heavy_asked = 0;
  long long admitted_after_warm_up = 0;  // both servers
  std::string metrics[2];
  FairHashes redis;
  long long wall_s = 0;  // the wall clock's seconds when Redis was read
  std::string b_id;
};

// Runs the scenario of the file comment with --fair-share-holders `holders`.
Outcome run(int holders) {
  quota::testing::ScratchServer redis(
      quota::testing::scratch_dir("quota-server-fair-exchange-test"));
  REQUIRE(redis.started());
  quota::testing::TempDir dir("fair_exchange");
  const std::string rules = dir.write("rules.yaml", kRules);
  const std::vector<std::string> common = {"--redis",
                                           "127.0.0.1:" + std::to_string(redis.port()),
                                           "--redis-deadline-ms",
                                           "2000",
                                           "--fair-share-holders",
                                           std::to_string(holders)};
  std::vector<std::string> a_args = common;
  a_args.insert(a_args.end(), {"--instance-id", "server-a"});
  quota::testing::ServerProcess a, b;
  REQUIRE(a.start(quota::testing::server_args(rules, a_args), {"grpc", "http"}));
  REQUIRE(b.start(quota::testing::server_args(rules, common), {"grpc", "http"}));

  Log heavy, light;
  std::vector<std::int64_t> heavy_denied, light_denied;
  const std::int64_t start = now_ns();
  const std::int64_t until = start + kRun;
  std::vector<std::thread> clients;
  for (int i = 0; i < 2; ++i) {
    clients.emplace_back(heavy_client, a.port("grpc"), start + i * kHeavyPace / 2, until,
                         std::ref(heavy), std::ref(heavy_denied));
  }
  for (int i = 0; i < kLight; ++i) {
    // The light tenants' calls spread over the interval.
    clients.emplace_back(light_client, b.port("http"), "light-" + std::to_string(i),
                         start + i * kPace / kLight, until, std::ref(light),
                         std::ref(light_denied));
  }
  for (auto& t : clients) t.join();
  INFO(heavy.error << light.error);
  REQUIRE(heavy.error.empty());
  REQUIRE(light.error.empty());

  Outcome out;
  std::int64_t longest = 0;
  std::vector<quota::verify::AdmittedEvent> events;
  for (const Log* log : {&heavy, &light}) {
    for (const Admission& x : log->admitted) {
      longest = std::max(longest, x.answered - x.sent);
      events.push_back({.time_ns = x.answered, .cost = 1});
      if (x.sent < start + kWarmUp) continue;
      ++out.admitted_after_warm_up;
      if (log == &light) ++out.light_admitted;
    }
  }
  out.heavy_admitted = static_cast<long long>(heavy.admitted.size());
  out.heavy_asked = out.heavy_admitted + heavy.denied;
  out.light_asked = out.light_admitted;
  for (const std::int64_t sent : light_denied) out.light_asked += sent >= start + kWarmUp;
  std::sort(events.begin(), events.end(),
            [](const auto& l, const auto& r) { return l.time_ns < r.time_ns; });
  const std::int64_t extra = (longest * 50 + kSecond - 1) / kSecond + 1;
  auto report = quota::verify::verify_token_bucket(
      events, quota::Rate{.units = 50, .per = std::chrono::seconds(1)}, 20, extra);
  REQUIRE(report.ok());
  std::printf(
      "holders %d: heavy admitted %lld (denied %lld); light admitted %lld of %lld asked after "
      "the warm-up (%zu in all, denied %lld); %lld admitted after the warm-up by both; longest "
      "admitted call %lld ns, extra %lld, required burst %lld\n",
      holders, out.heavy_admitted, heavy.denied, out.light_admitted, out.light_asked,
      light.admitted.size(), light.denied, out.admitted_after_warm_up,
      static_cast<long long>(longest), static_cast<long long>(extra),
      static_cast<long long>(report->required_burst()));
  CHECK(report->holds());

  out.metrics[0] = http_get(a.port("http"), "/metrics");
  out.metrics[1] = http_get(b.port("http"), "/metrics");
  quota::redis::Connection direct(
      quota::redis::ConnectionConfig{.host = "127.0.0.1", .port = redis.port()});
  out.redis = fair_hashes(direct);
  out.wall_s = std::chrono::duration_cast<std::chrono::seconds>(
                   std::chrono::system_clock::now().time_since_epoch())
                   .count();
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  out.b_id = std::string(host) + ":" + std::to_string(b.pid());
  CHECK(a.stop() == 0);
  CHECK(b.stop() == 0);
  return out;
}

bool has(const std::vector<std::string>& v, const std::string& x) {
  return std::find(v.begin(), v.end(), x) != v.end();
}

}  // namespace

TEST_CASE(
    "fair shares over two servers: the light tenants at one get their asks despite a "
    "heavy tenant at the other") {
  const Outcome o = run(2);
  INFO("server a:\n" << o.metrics[0] << "\nserver b:\n" << o.metrics[1]);
  CHECK(o.light_asked >= 60);  // 6 s at 12/s: the light tenants really asked
  CHECK(o.heavy_asked >= 2'000);
  CHECK(o.light_admitted * 4 >= o.light_asked * 3);
  CHECK(o.heavy_admitted > 0);
  CHECK(o.admitted_after_warm_up <= kShareBound);
  // The exchange was used: both servers' asks are in Redis, under their instance ids.
  CHECK(has(o.redis.fields, "server-a|heavy"));
  for (int i = 0; i < kLight; ++i)
    CHECK(has(o.redis.fields, o.b_id + "|light-" + std::to_string(i)));
  CHECK(has(o.redis.fields, "!sealed"));
  // Each hash is named by its period on the wall clock (seconds since the epoch here),
  // periods of the last run at most.
  REQUIRE_FALSE(o.redis.periods.empty());
  for (const long long p : o.redis.periods) {
    CHECK(p <= o.wall_s + 1);
    CHECK(p >= o.wall_s - 30);
  }
  for (const std::string& m : o.metrics) {
    CHECK(fair_sample(m, "quota_fair_share_allocations_total") >= 5);
    CHECK(fair_sample(m, "quota_fair_share_fallback_periods_total") == 0);
  }
  // a held the heavy tenant to its share.
  CHECK(fair_sample(o.metrics[0], "quota_fair_share_denials_total", "reason=\"over_share\"") > 0);
}

TEST_CASE(
    "without the exchange (--fair-share-holders 1) the heavy tenant starves the light "
    "ones") {
  const Outcome o = run(1);
  CHECK(o.light_asked >= 60);
  CHECK(o.heavy_asked >= 2'000);
  CHECK(o.light_admitted * 2 < o.light_asked);
  CHECK(o.heavy_admitted > 0);
  CHECK(o.admitted_after_warm_up > kShareBound);
  CHECK(o.redis.fields.empty());
}
