// Regional grant pools over real Redis (quota/region/regional_pool.hpp): one redis-server
// per region (its tenants and its pool) and one central redis-server (the global budget
// and its grant record, RedisGrantLedger), all started by the test on free loopback
// ports. Each region runs two gateway processes — threads, each with its own connections,
// stores, pool object and gateway — that share the region's pool: the region is one
// holder of the global budget. The global budget does not refill (1 unit per hour), so
// the union of every process's admissions is checked by the verifier with the pools'
// holdings as Σ regional grants, every unit the central record lists is admitted or still
// in a pool, and the central round trips are the region's refills (grant ids from the
// region's one sequence), not the processes'. A region cut off — through a proxy that
// closes every connection, or the central server paused (SIGSTOP) — spends only its pool,
// then answers kUnavailable. A lost grant reply and a lost deposit reply are each taken
// once.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "quota/gateway/gateway.hpp"
#include "quota/gateway/rules/rule_registry.hpp"
#include "quota/redis/gateway_store.hpp"
#include "quota/redis/grant_ledger.hpp"
#include "quota/region/regional_pool.hpp"
#include "quota/verify/envelope.hpp"
#include "support/gateway_fixtures.hpp"
#include "support/gateway_rules.hpp"
#include "support/lossy_proxy.hpp"
#include "support/paused_server.hpp"
#include "support/redis_server.hpp"
#include "support/region_fixtures.hpp"

using namespace std::chrono_literals;
using quota::Nanos;
using quota::Reason;
using quota::TokenBucket;
using quota::redis::GatewayStore;
using quota::redis::RedisGrantLedger;
using quota::region::PoolOptions;
using quota::testing::build;
using quota::testing::kSlow;

namespace {

using quota::testing::PoolProcess;
using Region = quota::testing::PoolRegion;

// What each region's processes did in one phase.
struct Phase {
  std::vector<std::int64_t> admitted, unavailable;
};

const auto kStart = std::chrono::steady_clock::now();

// `requests` per process of the listed regions, all processes at once (one thread each).
Phase drive(std::vector<std::unique_ptr<Region>>& regions, const std::vector<int>& which,
            int requests, std::uint64_t seed, std::vector<quota::verify::AdmittedEvent>& log) {
  Phase out{std::vector<std::int64_t>(regions.size(), 0),
            std::vector<std::int64_t>(regions.size(), 0)};
  std::mutex mu;
  std::vector<std::thread> threads;
  for (int i : which) {
    for (std::size_t p = 0; p < regions[i]->processes.size(); ++p) {
      threads.emplace_back([&, i, p] {
        std::mt19937_64 rng(seed + 100 * i + p);
        std::vector<quota::verify::AdmittedEvent> mine;
        std::int64_t admitted = 0, unavailable = 0;
        for (int k = 0; k < requests; ++k) {
          const auto now =
              std::chrono::duration_cast<Nanos>(std::chrono::steady_clock::now() - kStart);
          auto r = regions[i]->processes[p]->gateway.decide(
              {.who = {.tenant = "t" + std::to_string(rng() % 5), .plan = "free"}, .route = "read"},
              now);
          if (!r.ok()) continue;  // counted by the caller as neither
          if (r->decision.allowed && r->decision.reason != Reason::kFailOpen) {
            ++admitted;
            mine.push_back({now.count(), 1});
          }
          if (r->decision.reason == Reason::kUnavailable) ++unavailable;
        }
        std::lock_guard<std::mutex> lock(mu);
        out.admitted[i] += admitted;
        out.unavailable[i] += unavailable;
        log.insert(log.end(), mine.begin(), mine.end());
      });
    }
  }
  for (auto& t : threads) t.join();
  return out;
}

// The central record against the regions: each region's grants are listed under its id,
// numbered from its one sequence; every unit granted is admitted or still in its pool
// (nothing expires in these tests); its round trips are its refills; the envelope holds.
void check_central(std::vector<std::unique_ptr<Region>>& regions,
                   const std::vector<std::int64_t>& admitted, std::int64_t allowed_failures,
                   std::vector<quota::verify::AdmittedEvent> log, const TokenBucket& global) {
  auto listed = regions[0]->processes[0]->ledger.outstanding("{~global}read");
  REQUIRE(listed.ok());
  std::int64_t granted = 0, held = 0;
  for (std::size_t i = 0; i < regions.size(); ++i) {
    INFO("region " << i);
    std::int64_t units = 0, grants = 0;
    for (const auto& g : *listed) {
      if (g.incarnation != regions[i]->options.region) continue;
      units += g.units;
      ++grants;
    }
    const std::int64_t in_pool = regions[i]->held();
    auto state = regions[i]->processes[0]->pool.read("{~global}read");
    REQUIRE(state.ok());
    CHECK(state->unused == 0);
    CHECK(state->code <= regions[i]->options.max_grants);
    CHECK(units == admitted[i] + in_pool);
    CHECK(in_pool <= regions[i]->options.units + regions[i]->options.low_water);
    // One holder: the region's grant requests are its grants (plus the one denied when
    // the budget ran out, and the failed ones while cut off).
    std::printf("region %zu: %lld grants, %lld central round trips by its 2 processes\n", i,
                static_cast<long long>(grants),
                static_cast<long long>(regions[i]->grant_requests()));
    CHECK(regions[i]->grant_requests() >= grants);
    CHECK(regions[i]->grant_requests() <= grants + 1 + allowed_failures);
    granted += units;
    held += in_pool;
  }
  std::int64_t total = 0;
  for (auto a : admitted) total += a;
  std::printf("central record: %lld units granted; admitted %lld, in pools %lld\n",
              static_cast<long long>(granted), static_cast<long long>(total),
              static_cast<long long>(held));
  CHECK(granted <= global.burst);
  std::sort(log.begin(), log.end(),
            [](const auto& a, const auto& b) { return a.time_ns < b.time_ns; });
  auto report = quota::verify::verify_token_bucket(log, global.rate, global.burst, held);
  REQUIRE(report.ok());
  std::printf("global envelope: %s\n", quota::verify::to_string(*report).c_str());
  CHECK(report->holds());
}

const TokenBucket kTenant{.rate = kSlow, .burst = 10000};  // per region: never the limit

PoolOptions options(std::uint64_t region) {
  return {.region = region,
          .units = 50,
          .expiry = 1min,
          .low_water = 10,
          .max_grants = 4,
          .lock_ttl = 5s,
          .backoff_min = 1ms,
          .backoff_max = 50ms,
          .prefix = "pool:"};
}

std::vector<std::int64_t> sum(const Phase& a, const Phase& b) {
  std::vector<std::int64_t> s(a.admitted.size());
  for (std::size_t i = 0; i < s.size(); ++i) s[i] = a.admitted[i] + b.admitted[i];
  return s;
}

}  // namespace

TEST_CASE("over Redis, two processes per region share the region's pool: one holder each",
          "[redis][region][pool]") {
  quota::testing::ScratchServer central(quota::testing::scratch_dir("quota-pool-central"));
  REQUIRE(central.started());
  const TokenBucket global{.rate = kSlow, .burst = 3000};
  auto rules = build(quota::testing::levels_spec(1, kTenant, std::nullopt, global));
  std::vector<std::unique_ptr<Region>> regions;
  for (int i = 0; i < 3; ++i) {
    regions.push_back(std::make_unique<Region>("share-" + std::to_string(i), central.port(), 2s,
                                               rules, options(0x510 + i)));
    REQUIRE(regions.back()->server.started());
  }
  std::vector<quota::verify::AdmittedEvent> log;
  // 6 processes × 600 requests for 3,000 units: the budget runs out.
  const Phase phase = drive(regions, {0, 1, 2}, 600, 2212, log);
  check_central(regions, phase.admitted, 0, log, global);
  std::int64_t total = 0;
  for (auto a : phase.admitted) total += a;
  CHECK(total >= global.burst - 3 * (50 + 10));
  // The region's grants are numbered by its pool's one sequence: "<region hex>-1", -2, ...
  auto listed = regions[1]->processes[1]->ledger.outstanding("{~global}read");
  REQUIRE(listed.ok());
  std::vector<std::string> ids;
  for (const auto& g : *listed) {
    if (g.incarnation == 0x511) ids.push_back(g.grant_id);
  }
  REQUIRE(!ids.empty());
  CHECK(std::find(ids.begin(), ids.end(), "511-1") != ids.end());
}

TEST_CASE("over Redis, a region cut off from the central server spends only its pool",
          "[redis][region][pool]") {
  quota::testing::ScratchServer central(quota::testing::scratch_dir("quota-pool-cut"));
  REQUIRE(central.started());
  quota::testing::LossyProxy proxy(central.port());  // region 2's path to the center
  const TokenBucket global{.rate = kSlow, .burst = 3000};
  auto rules = build(quota::testing::levels_spec(1, kTenant, std::nullopt, global));
  std::vector<std::unique_ptr<Region>> regions;
  for (int i = 0; i < 3; ++i) {
    regions.push_back(std::make_unique<Region>("cut-" + std::to_string(i),
                                               i == 2 ? proxy.port() : central.port(), 2s, rules,
                                               options(0x520 + i)));
    REQUIRE(regions.back()->server.started());
  }
  std::vector<quota::verify::AdmittedEvent> log;
  const Phase before = drive(regions, {0, 1, 2}, 100, 1, log);
  const std::int64_t held_at_cut = regions[2]->held();
  proxy.set_blocked(true);
  const Phase cut = drive(regions, {2}, 200, 2, log);
  std::printf("region 2: %lld in its pool when cut off; admitted %lld, %lld unavailable\n",
              static_cast<long long>(held_at_cut), static_cast<long long>(cut.admitted[2]),
              static_cast<long long>(cut.unavailable[2]));
  REQUIRE(held_at_cut > 0);
  CHECK(cut.admitted[2] == held_at_cut);  // its pool, then nothing
  CHECK(regions[2]->held() == 0);
  CHECK(cut.unavailable[2] >= 400 - held_at_cut - 20);  // a few denied while a refill ran
  CHECK(proxy.dropped() > 0);
  proxy.set_blocked(false);
  std::this_thread::sleep_for(60ms);  // past the backoff
  const Phase after = drive(regions, {0, 1, 2}, 600, 3, log);
  CHECK(after.admitted[2] > 0);  // back: the region refills again
  std::vector<std::int64_t> admitted = sum(before, after);
  admitted[2] += cut.admitted[2];
  check_central(regions, admitted, 1000, log, global);
}

TEST_CASE("over Redis, regions spend their pools while the central server is paused",
          "[redis][region][pool]") {
  quota::testing::PausedServer central("quota-pool-paused");
  REQUIRE(central.started());
  const TokenBucket global{.rate = kSlow, .burst = 2000};
  auto rules = build(quota::testing::levels_spec(1, kTenant, std::nullopt, global));
  std::vector<std::unique_ptr<Region>> regions;
  for (int i = 0; i < 2; ++i) {
    // A short deadline: a call to the paused server fails after 50 ms.
    regions.push_back(std::make_unique<Region>("paused-" + std::to_string(i), central.port(), 50ms,
                                               rules, options(0x530 + i)));
    REQUIRE(regions.back()->server.started());
  }
  std::vector<quota::verify::AdmittedEvent> log;
  const Phase before = drive(regions, {0, 1}, 100, 4, log);
  const std::vector<std::int64_t> held = {regions[0]->held(), regions[1]->held()};
  Phase paused;
  {
    auto pause = central.pause();
    paused = drive(regions, {0, 1}, 100, 5, log);
  }
  std::this_thread::sleep_for(60ms);
  const Phase after = drive(regions, {0, 1}, 300, 6, log);
  for (int i = 0; i < 2; ++i) {
    INFO("region " << i << ": " << held[i] << " in its pool at the pause");
    CHECK(paused.admitted[i] == held[i]);
    CHECK(paused.unavailable[i] > 0);
    CHECK(after.admitted[i] > 0);
  }
  std::vector<std::int64_t> admitted = sum(before, after);
  for (int i = 0; i < 2; ++i) admitted[i] += paused.admitted[i];
  check_central(regions, admitted, 1000, log, global);
}

TEST_CASE("over Redis, a lost grant reply and a lost deposit reply are each taken once",
          "[redis][region][pool]") {
  quota::testing::ScratchServer central(quota::testing::scratch_dir("quota-pool-lost"));
  REQUIRE(central.started());
  quota::testing::ScratchServer regional(quota::testing::scratch_dir("quota-pool-lost-region"));
  REQUIRE(regional.started());
  quota::testing::LossyProxy to_central(central.port());
  quota::testing::LossyProxy to_pool(regional.port());
  const TokenBucket global{.rate = kSlow, .burst = 100};
  auto rules = build(quota::testing::levels_spec(1, kTenant, std::nullopt, global));
  PoolOptions o = options(0xab);
  o.units = 10;
  o.low_water = 0;
  PoolProcess p(regional.port(), to_pool.port(), to_central.port(), 2s, rules, o);
  GatewayStore direct(
      {.pool = quota::testing::loopback_connections(central.port(), 2s), .prefix = "central:"});
  const quota::gateway::Request req{.who = {.tenant = "acme", .plan = "free"}, .route = "read"};
  // The first deposit's reply is lost after Redis ran it: the retry is replayed by id.
  to_pool.drop_reply_to("ab-1");
  for (int i = 0; i < 9; ++i) REQUIRE(p.gateway.decide(req, Nanos{0})->decision.allowed);
  CHECK(to_pool.dropped() == 1);
  CHECK(p.pool.read("{~global}read")->total == 1);
  // The tenth spends the last unit; the reply to the refill's grant is lost after the
  // central server ran it.
  auto global_key = direct.redis_key("{~global}read");
  REQUIRE(global_key.ok());
  to_central.drop_reply_to(*global_key);
  REQUIRE(p.gateway.decide(req, Nanos{0})->decision.allowed);
  REQUIRE(to_central.dropped() == 1);
  std::this_thread::sleep_for(20ms);  // past the backoff: the same id, replayed
  auto r = p.gateway.decide(req, Nanos{0});
  REQUIRE(r.ok());
  CHECK(r->decision.allowed);
  CHECK(p.pool.grant_requests() == 3);
  // Taken once each: 100 − 10 − 10, and 1 more by this check.
  const auto* rule = p.registry.current()->find(quota::gateway::Level::kGlobal, req.who, "read");
  REQUIRE(rule != nullptr);
  const quota::gateway::LevelCheck check{.policy = &rule->policy, .key = "{~global}read"};
  auto left = direct.decide(std::span(&check, 1), 1, Nanos{0});
  REQUIRE(left.ok());
  CHECK(left->parts.at(0).remaining == 79);
  auto pool = p.pool.read("{~global}read");
  REQUIRE(pool.ok());
  CHECK(pool->total == 9);
  CHECK(pool->unused == 0);
  // Bad costs: denied with their reason, nothing spent, no refill.
  for (const std::int64_t cost : {std::int64_t{11}, std::int64_t{0}, std::int64_t{-3}}) {
    const quota::gateway::LevelCheck bad{
        .policy = &rule->policy, .key = "{~global}read", .cost = cost};
    auto d = p.pool.decide(std::span(&bad, 1), 1, Nanos{0});
    REQUIRE(d.ok());
    REQUIRE(d->parts.size() == 1);
    CHECK_FALSE(d->parts[0].allowed);
    CHECK(d->parts[0].reason == (cost > 0 ? Reason::kCostExceedsBurst : Reason::kInvalidCost));
  }
  CHECK(p.pool.read("{~global}read")->total == 9);
  CHECK(p.pool.grant_requests() == 3);
  auto listed = p.ledger.outstanding("{~global}read");
  REQUIRE(listed.ok());
  REQUIRE(listed->size() == 2);
  CHECK((*listed)[0].grant_id == "ab-1");
  CHECK((*listed)[1].grant_id == "ab-2");
}

// A refill is one decision of the central store at the time of the request that asks for
// it: with a central store on the caller's clock (TimeSource::kCaller), a virtual second
// refills the global budget, which the test's few real milliseconds would not.
TEST_CASE("a region refills at the caller's time from a central store on the caller's clock",
          "[region]") {
  quota::testing::ScratchServer central(quota::testing::scratch_dir("quota-pool-caller-central"));
  quota::testing::ScratchServer regional(quota::testing::scratch_dir("quota-pool-caller-region"));
  REQUIRE(central.started());
  REQUIRE(regional.started());
  const TokenBucket global{.rate = {.units = 100, .per = 1s}, .burst = 200};
  const TokenBucket tenant{.rate = {.units = 1'000'000, .per = 1s}, .burst = 1'000'000};
  quota::gateway::RuleRegistry registry(
      build(quota::testing::levels_spec(1, tenant, std::nullopt, global)));
  GatewayStore local(
      {.pool = quota::testing::loopback_connections(regional.port(), 2s), .prefix = "region:"});
  GatewayStore central_store({.pool = quota::testing::loopback_connections(central.port(), 2s),
                              .prefix = "central:",
                              .time = quota::redis::TimeSource::kCaller});
  RedisGrantLedger ledger(central_store);
  quota::region::RegionalPool<> pool(
      quota::testing::loopback_connections(regional.port(), 2s), central_store, ledger,
      {.region = 0xca11, .units = 100, .expiry = 10s, .low_water = 10});
  quota::region::PooledRegion<> backend(local, pool);
  quota::gateway::Gateway gateway(backend, registry);
  auto admit = [&](int requests, Nanos at) {
    int admitted = 0;
    for (int k = 0; k < requests; ++k) {
      auto r = gateway.decide({.who = {.tenant = "t1", .plan = "free"}, .route = "read"}, at);
      REQUIRE(r.ok());
      admitted += r->decision.allowed ? 1 : 0;
    }
    return admitted;
  };
  auto held = [&] {
    auto r = pool.read("{~global}read");
    REQUIRE(r.ok());
    return r->total;
  };
  const Nanos t0 = 1000s;
  // The first request refills 100 (the central bucket: 200 -> 100); the one that leaves
  // the low-water mark refills 100 more ahead of need (-> 0 at t0).
  CHECK(admit(90, t0) == 90);
  CHECK(held() == 110);
  CHECK(pool.grant_requests() == 2);
  // A second later on the caller's clock the central bucket holds 100 again: the refill
  // ahead of need at t0 + 1 s is granted (on the server's clock it would be denied).
  CHECK(admit(100, t0 + 1s) == 100);
  CHECK(pool.grant_requests() == 3);
  CHECK(held() == 110);
}
