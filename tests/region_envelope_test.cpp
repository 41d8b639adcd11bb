// Regions (quota/region/regional_backend.hpp): three regions, each with its own in-process
// authority for its tenants, lease one global budget from a central authority; one region
// is cut off from the central authority for a while (its calls fail as unavailable). The
// envelope verifier checks the union of every region's global admissions against
// A(T) <= r·T + B + Σ regional grants; the cut-off region admits no more than it held when
// cut off, then answers with the route's fail mode (fail closed: kUnavailable; fail open:
// the emergency bucket's kFailOpen, then kUnavailable).
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "quota/gateway/gateway.hpp"
#include "quota/gateway/rules/rule_registry.hpp"
#include "quota/region/regional_backend.hpp"
#include "quota/store/sharded_store.hpp"
#include "quota/testing/fault_backend.hpp"
#include "quota/verify/envelope.hpp"
#include "support/gateway_rules.hpp"

using namespace std::chrono_literals;
using quota::GrantLedger;
using quota::Nanos;
using quota::Reason;
using quota::TokenBucket;
using quota::gateway::KeyPolicy;
using quota::gateway::StoreBackend;
using quota::testing::build;
using quota::testing::FaultBackend;
using quota::verify::AdmittedEvent;

namespace {

using Store = quota::ShardedStore<KeyPolicy>;
using Central = StoreBackend<Store>;
using Cut = FaultBackend<Central>;
using Backend = quota::region::RegionalBackend<StoreBackend<Store>, Cut>;

// One region: its own authority (store) for its tenants, its own path to the central
// authority (which the test cuts), its regional grants, rules and gateway.
struct Region {
  Region(Central& central, GrantLedger& ledger,
         std::shared_ptr<const quota::gateway::RuleSet> rules, std::uint64_t incarnation,
         quota::gateway::LeaseSpec lease)
      : local(store),
        path(central),
        backend(local, path, ledger, {.lease = lease, .holder = {.incarnation = incarnation}}),
        registry(std::move(rules)),
        gateway(backend, registry) {}

  Store store;
  StoreBackend<Store> local;
  Cut path;
  Backend backend;
  quota::gateway::RuleRegistry registry;
  quota::gateway::Gateway gateway;

  std::int64_t held(Nanos now) {
    std::int64_t units = 0;
    for (const auto& h : backend.holdings(now)) units += h.units;
    return units;
  }
};

struct Run {
  std::vector<AdmittedEvent> global_log;  // every region's admissions, kAllowed
  std::int64_t admitted_while_cut = 0;    // the cut-off region, kAllowed
  std::int64_t fail_open_while_cut = 0;   // the cut-off region, kFailOpen
  std::int64_t unavailable_while_cut = 0;
  std::int64_t admitted_after_unavailable = 0;  // kAllowed after its first kUnavailable
  std::int64_t held_at_cut = 0;
  std::int64_t decisions = 0;
  std::int64_t grant_requests = 0;
};

// Three regions at 0..3 requests per ms each (4,500/s offered against the global
// 3,000/s) for 3 s; region 2 cut off from 1 s to 2 s.
Run run(quota::gateway::RuleSetSpec spec, quota::gateway::LeaseSpec lease, std::uint64_t seed) {
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  std::mt19937_64 rng(seed);
  auto rules = build(std::move(spec));
  Store central_store;
  Central central(central_store);
  GrantLedger ledger;
  std::vector<std::unique_ptr<Region>> regions;
  for (int i = 0; i < 3; ++i) {
    regions.push_back(std::make_unique<Region>(central, ledger, rules, 0x100 + i, lease));
  }
  const std::vector<std::string> tenants = {"t0", "t1", "t2", "t3", "t4"};
  // The cut starts at the first ms from 1 s on at which region 2 holds some of the budget
  // (at saturation it often holds nothing: the central authority denied its last ask).
  Nanos cut_from = Nanos::max(), cut_until = Nanos::max();
  const Nanos end = 3000ms;
  Run out;
  bool unavailable_seen = false;
  for (Nanos t{0}; t < end; t += 1ms) {
    if (cut_from == Nanos::max() && t >= 1000ms && regions[2]->held(t) > 0) {
      cut_from = t;
      cut_until = t + 1000ms;
      out.held_at_cut = regions[2]->held(t);
      regions[2]->path.fail(absl::UnavailableError("cut off from the central authority"));
    }
    if (t == cut_until) regions[2]->path.heal();
    const bool cut = t >= cut_from && t < cut_until;
    for (int i = 0; i < 3; ++i) {
      const int n = static_cast<int>(rng() % 4);
      for (int k = 0; k < n; ++k) {
        const std::string& who = tenants[rng() % tenants.size()];
        auto r = regions[i]->gateway.decide(
            {.who = {.tenant = who, .plan = "free"}, .route = "read"}, t);
        REQUIRE(r.ok());
        ++out.decisions;
        const quota::Decision& d = r->decision;
        if (d.allowed && d.reason != Reason::kFailOpen) out.global_log.push_back({t.count(), 1});
        if (i != 2 || !cut) continue;
        if (d.reason == Reason::kFailOpen) ++out.fail_open_while_cut;
        if (d.allowed && d.reason != Reason::kFailOpen) {
          ++out.admitted_while_cut;
          if (unavailable_seen) ++out.admitted_after_unavailable;
        }
        if (d.reason == Reason::kUnavailable) {
          ++out.unavailable_while_cut;
          unavailable_seen = true;
        }
      }
    }
  }
  std::printf("region 2 cut off from %lld ms to %lld ms\n",
              static_cast<long long>(cut_from.count() / 1'000'000),
              static_cast<long long>(cut_until.count() / 1'000'000));
  REQUIRE(cut_from < 1500ms);
  for (const auto& r : regions) out.grant_requests += r->backend.grant_requests();
  // The central record names each region's grants by its incarnation.
  for (int i = 0; i < 3; ++i) {
    bool listed = false;
    for (const auto& g : ledger.outstanding(end - 1ms))
      listed = listed || g.incarnation == 0x100u + i;
    CHECK(listed);
  }
  // Nothing was granted to the cut-off region while it was cut off.
  for (const auto& g : ledger.outstanding(cut_from)) {
    if (g.incarnation == 0x102) CHECK((g.granted_at < cut_from || g.granted_at >= cut_until));
  }
  return out;
}

void check_envelope(const std::vector<AdmittedEvent>& log, quota::Rate rate, std::int64_t burst,
                    std::int64_t extra, const char* what) {
  auto report = quota::verify::verify_token_bucket(log, rate, burst, extra);
  REQUIRE(report.ok());
  std::printf("%s: %zu events; %s\n", what, log.size(), quota::verify::to_string(*report).c_str());
  INFO(what << ": " << quota::verify::to_string(*report));
  CHECK(report->holds());
}

const TokenBucket kTenant{.rate = {2000, 1s}, .burst = 200};  // per region: never the limit
const TokenBucket kGlobal{.rate = {3000, 1s}, .burst = 600};
const quota::gateway::LeaseSpec kRegionLease{
    .mode = quota::gateway::LeaseMode::kOn, .units = 100, .expiry = 300ms, .low_water = 25};

}  // namespace

TEST_CASE("three regions stay within r*T + B + regional grants, one cut off, fail closed",
          "[region][envelope]") {
  Run r =
      run(quota::testing::levels_spec(1, kTenant, std::nullopt, kGlobal), kRegionLease, 20261202);
  const std::int64_t max_held = kRegionLease.units + kRegionLease.low_water;
  check_envelope(r.global_log, kGlobal.rate, kGlobal.burst, 3 * max_held,
                 "global, three regions, r*T + B + 3 x (units + low_water)");
  // Saturated, not starved: at least 80 % of the burst and 3 s of refill.
  CHECK(r.global_log.size() >= static_cast<std::size_t>(0.8 * (600 + 3 * 3000)));
  // The cut-off region spent what it held, then answered with the fail mode.
  std::printf("cut-off region: held %lld, admitted %lld, unavailable %lld\n",
              static_cast<long long>(r.held_at_cut), static_cast<long long>(r.admitted_while_cut),
              static_cast<long long>(r.unavailable_while_cut));
  REQUIRE(r.held_at_cut > 0);
  CHECK(r.admitted_while_cut <= r.held_at_cut);
  CHECK(r.unavailable_while_cut > 500);  // ~1,500 requests in the second cut off
  CHECK(r.admitted_after_unavailable == 0);
  CHECK(r.fail_open_while_cut == 0);
  // Few cross-region round trips: one per regional grant (and the failed ones).
  std::printf("%lld decisions, %lld grant requests to the central authority\n",
              static_cast<long long>(r.decisions), static_cast<long long>(r.grant_requests));
  CHECK(r.grant_requests * 20 < r.decisions);
}

TEST_CASE("a cut-off region on a fail-open route: its grants, then the emergency bucket",
          "[region][envelope][fail_open]") {
  auto spec = quota::testing::levels_spec(1, kTenant, std::nullopt, kGlobal);
  spec.routes[0].fail_mode = quota::gateway::FailMode::kOpen;
  spec.routes[0].emergency = quota::testing::kTestEmergency;  // 5/s, burst 5, 2 s at most
  Run r = run(std::move(spec), kRegionLease, 20261203);
  const std::int64_t max_held = kRegionLease.units + kRegionLease.low_water;
  // The regional grants' envelope holds for kAllowed; kFailOpen is the route's own,
  // bounded allowance per process and tenant key (5 tenants x (5 + 5/s x 1 s)).
  check_envelope(r.global_log, kGlobal.rate, kGlobal.burst, 3 * max_held,
                 "global, fail open, kAllowed only");
  REQUIRE(r.held_at_cut > 0);
  CHECK(r.admitted_while_cut <= r.held_at_cut);
  CHECK(r.admitted_after_unavailable == 0);
  CHECK(r.fail_open_while_cut > 0);
  CHECK(r.fail_open_while_cut <= 5 * (5 + 5));
  CHECK(r.unavailable_while_cut > 0);
}

TEST_CASE("the regional overshoot is the regional grants outstanding, and no more",
          "[region][envelope]") {
  // Three regions each take a grant of 20 and keep most of it while the central budget
  // refills; then all spend together, region 2 cut off: the held units come on top of a
  // full burst, and the cut-off region still spends exactly what it held.
  const TokenBucket global{.rate = {10, 1s}, .burst = 100};
  auto rules = build(quota::testing::levels_spec(1, kTenant, std::nullopt, global));
  const quota::gateway::LeaseSpec lease{
      .mode = quota::gateway::LeaseMode::kOn, .units = 20, .expiry = 1h, .low_water = 0};
  Store central_store;
  Central central(central_store);
  GrantLedger ledger;
  std::vector<std::unique_ptr<Region>> regions;
  for (int i = 0; i < 3; ++i) {
    regions.push_back(std::make_unique<Region>(central, ledger, rules, 0x200 + i, lease));
  }
  std::vector<AdmittedEvent> log;
  const auto request = [&](Region& r, Nanos t) {
    auto d = r.gateway.decide({.who = {.tenant = "a", .plan = "free"}, .route = "read"}, t);
    REQUIRE(d.ok());
    if (d->decision.allowed) log.push_back({t.count(), 1});
    return d->decision;
  };
  for (auto& r : regions) REQUIRE(request(*r, Nanos{0}).allowed);
  const Nanos later = 10s;  // the central bucket is full again
  std::int64_t outstanding = 0;
  for (const auto& g : ledger.outstanding(later)) outstanding += g.units;
  CHECK(outstanding == 3 * 20);
  regions[2]->path.fail(absl::UnavailableError("cut off from the central authority"));
  CHECK(regions[2]->held(later) == 19);
  for (auto& r : regions) {
    for (int i = 0; i < 1000 && request(*r, later).allowed; ++i) {
    }
  }
  // 3·19 held + the full burst of 100, the cut-off region's 19 among them.
  CHECK(log.size() == 3 + 3 * 19 + 100);
  CHECK(request(*regions[2], later).reason == Reason::kUnavailable);
  CHECK(regions[2]->held(later) == 0);
  auto with_grants =
      quota::verify::verify_token_bucket(log, global.rate, global.burst, outstanding);
  auto without = quota::verify::verify_token_bucket(log, global.rate, global.burst, 0);
  REQUIRE(with_grants.ok());
  REQUIRE(without.ok());
  std::printf("3 regions at a full central budget: %s\n",
              quota::verify::to_string(*without).c_str());
  CHECK(with_grants->holds());
  CHECK_FALSE(without->holds());
  CHECK(without->required_burst() == global.burst + 3 * 19);
}
