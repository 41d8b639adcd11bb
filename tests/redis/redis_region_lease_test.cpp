// Regions over real Redis (quota/region/regional_backend.hpp): one redis-server per
// region for its tenants and one central redis-server for the global budget and its
// grant record (RedisGrantLedger), all started by the test on free loopback ports. Three
// regions lease the global budget; a region cut off from the central server — through a
// proxy that closes every connection, or with the central server paused (SIGSTOP) —
// spends only what it held, then answers kUnavailable (the route fails closed). The
// global budget does not refill (1 unit per hour), so the union of the regions'
// admissions must stay within its burst, every unit the central record lists as granted
// is spent or still held, and the verifier checks r·T + B + Σ regional grants.
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "quota/gateway/gateway.hpp"
#include "quota/gateway/rules/rule_registry.hpp"
#include "quota/redis/gateway_store.hpp"
#include "quota/redis/grant_ledger.hpp"
#include "quota/region/regional_backend.hpp"
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
using quota::testing::build;
using quota::testing::kSlow;

namespace {

using Backend = quota::region::RegionalBackend<GatewayStore, GatewayStore, RedisGrantLedger>;

// One region: its own redis-server and store for its tenants, its own connections to the
// central server (`central_port`: the server's, or a proxy's), the central grant record,
// its regional grants, rules and gateway.
struct Region : quota::testing::RegionServer, quota::testing::RegionStores {
  Region(int central_port, std::chrono::microseconds central_deadline,
         std::shared_ptr<const quota::gateway::RuleSet> rules, std::uint64_t incarnation,
         quota::gateway::LeaseSpec lease, const std::string& name)
      : RegionServer("quota-region-" + name),
        RegionStores(server.port(), central_port, central_deadline),
        backend(local, central, ledger,
                {.lease = lease,
                 .holder = {.incarnation = incarnation, .backoff_min = 1ms, .backoff_max = 50ms}}),
        registry(std::move(rules)),
        gateway(backend, registry) {}

  std::int64_t held(Nanos now) {
    std::int64_t units = 0;
    for (const auto& h : backend.holdings(now)) units += h.units;
    return units;
  }

  Backend backend;
  quota::gateway::RuleRegistry registry;
  quota::gateway::Gateway gateway;
};

// What the regions admitted, and what the cut-off ones did while cut off.
struct Tally {
  std::vector<quota::verify::AdmittedEvent> log;  // every region's kAllowed, in time order
  std::vector<std::int64_t> admitted = std::vector<std::int64_t>(3, 0);
  std::vector<std::int64_t> admitted_while_cut = std::vector<std::int64_t>(3, 0);
  std::vector<std::int64_t> unavailable_while_cut = std::vector<std::int64_t>(3, 0);
  std::vector<std::int64_t> admitted_after_unavailable = std::vector<std::int64_t>(3, 0);
  std::vector<std::int64_t> admitted_after_cut = std::vector<std::int64_t>(3, 0);
};

// One request per region per ms of the caller's clock, from `from` to `to`; `cut[i]`:
// whether region i is cut off in that stretch.
void drive(std::vector<std::unique_ptr<Region>>& regions, std::mt19937_64& rng, int from, int to,
           const std::vector<bool>& cut, bool after_cut, Tally& tally) {
  std::vector<bool> unavailable_seen(regions.size(), false);
  for (int k = from; k < to; ++k) {
    const Nanos now{k * 1ms};
    for (std::size_t i = 0; i < regions.size(); ++i) {
      const std::string who = "t" + std::to_string(rng() % 5);
      auto r = regions[i]->gateway.decide({.who = {.tenant = who, .plan = "free"}, .route = "read"},
                                          now);
      INFO("region " << i << " at " << k << " ms: " << r.status().ToString());
      REQUIRE(r.ok());
      const quota::Decision& d = r->decision;
      if (d.allowed) {
        REQUIRE(d.reason != Reason::kFailOpen);  // the route fails closed
        tally.log.push_back({now.count(), 1});
        ++tally.admitted[i];
        if (after_cut) ++tally.admitted_after_cut[i];
      }
      if (!cut[i]) continue;
      if (d.allowed) {
        ++tally.admitted_while_cut[i];
        if (unavailable_seen[i]) ++tally.admitted_after_unavailable[i];
      }
      if (d.reason == Reason::kUnavailable) {
        ++tally.unavailable_while_cut[i];
        unavailable_seen[i] = true;
      }
    }
  }
}

// The central record against the regions: every unit granted is spent or held, each
// region's grants are listed under its incarnation, and the envelope holds.
void check_central(std::vector<std::unique_ptr<Region>>& regions, const Tally& tally,
                   const TokenBucket& global, Nanos now) {
  auto listed = regions[0]->ledger.outstanding("{~global}read");
  REQUIRE(listed.ok());
  std::int64_t granted = 0;
  std::vector<std::int64_t> by_region(regions.size(), 0);
  for (const auto& g : *listed) {
    granted += g.units;
    for (std::size_t i = 0; i < regions.size(); ++i) {
      if (g.incarnation == regions[i]->backend.incarnation()) by_region[i] += g.units;
    }
  }
  std::int64_t admitted = 0, held = 0;
  for (std::size_t i = 0; i < regions.size(); ++i) {
    INFO("region " << i);
    CHECK(by_region[i] == tally.admitted[i] + regions[i]->held(now));
    admitted += tally.admitted[i];
    held += regions[i]->held(now);
  }
  std::printf("central record: %lld units granted; admitted %lld, held %lld\n",
              static_cast<long long>(granted), static_cast<long long>(admitted),
              static_cast<long long>(held));
  CHECK(granted == admitted + held);
  CHECK(granted <= global.burst);  // nothing refills: a grant is taken from the burst
  auto report = quota::verify::verify_token_bucket(tally.log, global.rate, global.burst, held);
  REQUIRE(report.ok());
  std::printf("global envelope: %s\n", quota::verify::to_string(*report).c_str());
  CHECK(report->holds());
}

const TokenBucket kTenant{.rate = kSlow, .burst = 10000};  // per region: never the limit
const quota::gateway::LeaseSpec kLease{
    .mode = quota::gateway::LeaseMode::kOn, .units = 50, .expiry = 1min, .low_water = 10};

}  // namespace

TEST_CASE("over Redis, a region cut off from the central server spends what it holds",
          "[redis][region]") {
  quota::testing::ScratchServer central(quota::testing::scratch_dir("quota-region-central"));
  REQUIRE(central.started());
  quota::testing::LossyProxy proxy(central.port());  // region 2's path to the center
  const TokenBucket global{.rate = kSlow, .burst = 3000};
  auto rules = build(quota::testing::levels_spec(1, kTenant, std::nullopt, global));
  std::vector<std::unique_ptr<Region>> regions;
  for (int i = 0; i < 3; ++i) {
    const int port = i == 2 ? proxy.port() : central.port();
    regions.push_back(
        std::make_unique<Region>(port, 2s, rules, 0x300 + i, kLease, "cut-" + std::to_string(i)));
    REQUIRE(regions.back()->server.started());
  }
  const std::uint64_t seed = 1203;
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  std::mt19937_64 rng(seed);
  Tally tally;
  drive(regions, rng, 0, 300, {false, false, false}, false, tally);
  const std::int64_t held_at_cut = regions[2]->held(Nanos{300ms});
  proxy.set_blocked(true);
  drive(regions, rng, 300, 700, {false, false, true}, false, tally);
  proxy.set_blocked(false);
  drive(regions, rng, 700, 1200, {false, false, false}, true, tally);
  std::printf("region 2: held %lld when cut off, admitted %lld and %lld unavailable while cut\n",
              static_cast<long long>(held_at_cut),
              static_cast<long long>(tally.admitted_while_cut[2]),
              static_cast<long long>(tally.unavailable_while_cut[2]));
  REQUIRE(held_at_cut > 0);
  CHECK(tally.admitted_while_cut[2] <= held_at_cut);
  CHECK(tally.unavailable_while_cut[2] >= 400 - held_at_cut);
  CHECK(tally.admitted_after_unavailable[2] == 0);
  CHECK(proxy.dropped() > 0);
  CHECK(tally.admitted_after_cut[2] > 0);  // back: it takes grants again
  // 3,600 requests for 3,000 units: the budget is spent, and bounds them exactly.
  check_central(regions, tally, global, Nanos{1200ms});
  CHECK(tally.log.size() >= static_cast<std::size_t>(global.burst - 3 * (50 + 10)));
}

TEST_CASE("over Redis, regions spend what they hold while the central server is paused",
          "[redis][region]") {
  quota::testing::PausedServer central("quota-region-paused");
  REQUIRE(central.started());
  const TokenBucket global{.rate = kSlow, .burst = 2000};
  auto rules = build(quota::testing::levels_spec(1, kTenant, std::nullopt, global));
  std::vector<std::unique_ptr<Region>> regions;
  for (int i = 0; i < 3; ++i) {
    // A short deadline: a call to the paused server fails after 50 ms.
    regions.push_back(std::make_unique<Region>(central.port(), 50ms, rules, 0x400 + i, kLease,
                                               "paused-" + std::to_string(i)));
    REQUIRE(regions.back()->server.started());
  }
  std::mt19937_64 rng(1204);
  Tally tally;
  drive(regions, rng, 0, 200, {false, false, false}, false, tally);
  std::vector<std::int64_t> held_at_pause;
  for (auto& r : regions) held_at_pause.push_back(r->held(Nanos{200ms}));
  {
    auto paused = central.pause();
    drive(regions, rng, 200, 400, {true, true, true}, false, tally);
  }
  // A grant request the paused server ran after its deadline is retried with its id and
  // replayed (the central record below counts it once).
  drive(regions, rng, 400, 800, {false, false, false}, true, tally);
  for (std::size_t i = 0; i < regions.size(); ++i) {
    INFO("region " << i << ": held " << held_at_pause[i]);
    CHECK(tally.admitted_while_cut[i] <= held_at_pause[i]);
    CHECK(tally.unavailable_while_cut[i] > 0);
    CHECK(tally.admitted_after_unavailable[i] == 0);
    CHECK(tally.admitted_after_cut[i] > 0);
  }
  check_central(regions, tally, global, Nanos{800ms});
}

TEST_CASE("over Redis, a regional grant whose reply was lost is retried with its id, taken once",
          "[redis][region]") {
  quota::testing::ScratchServer central(quota::testing::scratch_dir("quota-region-lost"));
  REQUIRE(central.started());
  quota::testing::LossyProxy proxy(central.port());
  const TokenBucket global{.rate = kSlow, .burst = 100};
  auto rules = build(quota::testing::levels_spec(1, kTenant, std::nullopt, global));
  const quota::gateway::LeaseSpec lease{
      .mode = quota::gateway::LeaseMode::kOn, .units = 10, .expiry = 1min, .low_water = 0};
  Region region(proxy.port(), 2s, rules, 0xab, lease, "lost-region");
  REQUIRE(region.server.started());
  GatewayStore direct(
      {.pool = quota::testing::loopback_connections(central.port(), 2s), .prefix = "central:"});
  const quota::gateway::Request req{.who = {.tenant = "acme", .plan = "free"}, .route = "read"};
  // The first regional grant (10 units), nine of them spent.
  for (int i = 0; i < 9; ++i) REQUIRE(region.gateway.decide(req, Nanos{0})->decision.allowed);
  // The tenth spends the last unit; the reply to its renewal is lost after Redis ran it.
  auto global_key = direct.redis_key("{~global}read");
  REQUIRE(global_key.ok());
  proxy.drop_reply_to(*global_key);
  REQUIRE(region.gateway.decide(req, Nanos{0})->decision.allowed);
  REQUIRE(proxy.dropped() == 1);
  // After the backoff the same grant id goes to the central server through the router's
  // attempt: Redis replays the grant.
  auto r = region.gateway.decide(req, Nanos{60ms});
  REQUIRE(r.ok());
  CHECK(r->decision.allowed);
  CHECK(region.backend.grant_requests() == 3);
  // Taken once: 100 − 10 − 10, and 1 more by this check.
  const auto* rule =
      region.registry.current()->find(quota::gateway::Level::kGlobal, req.who, "read");
  REQUIRE(rule != nullptr);
  const quota::gateway::LevelCheck check{.policy = &rule->policy, .key = "{~global}read"};
  auto left = direct.decide(std::span(&check, 1), 1, Nanos{0});
  REQUIRE(left.ok());
  CHECK(left->parts.at(0).remaining == 79);
  auto listed = region.ledger.outstanding("{~global}read");
  REQUIRE(listed.ok());
  REQUIRE(listed->size() == 2);
  CHECK((*listed)[0].grant_id == "ab-1");
  CHECK((*listed)[1].grant_id == "ab-2");
  CHECK((*listed)[1].incarnation == 0xab);
}
