// The envelope of leased gateway budgets (quota/gateway/leases/leased_backend.hpp): several
// gateway processes (holders, each with its own incarnation) over one in-process
// authority, leased tenant and global budgets at saturation, a holder paused past its
// grants' expiry and coming back, a holder restarted with a new incarnation, and a
// downgrade while grants are out. The envelope verifier checks, on the union of every
// holder's admissions, A(T) <= r·T + B + Σ outstanding grants, with Σ bounded by
// H·(units + low_water) for H incarnations.
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "quota/gateway/leases/leased_backend.hpp"
#include "quota/store/sharded_store.hpp"
#include "quota/verify/envelope.hpp"
#include "support/lease_rules.hpp"

using namespace std::chrono_literals;
using quota::GrantLedger;
using quota::Nanos;
using quota::TokenBucket;
using quota::gateway::KeyPolicy;
using quota::gateway::LeaseMetrics;
using quota::gateway::Level;
using quota::gateway::StoreBackend;
using quota::testing::build;
using quota::testing::lease_levels_spec;
using quota::testing::lease_on;
using quota::verify::AdmittedEvent;

namespace {

using Store = quota::ShardedStore<KeyPolicy>;
using Holder = quota::testing::LeaseHolder<StoreBackend<Store>>;

void check_envelope(const std::vector<AdmittedEvent>& log, quota::Rate rate, std::int64_t burst,
                    std::int64_t extra, const char* what) {
  auto report = quota::verify::verify_token_bucket(log, rate, burst, extra);
  REQUIRE(report.ok());
  std::printf("%s: %zu events; %s\n", what, log.size(), quota::verify::to_string(*report).c_str());
  INFO(what << ": " << quota::verify::to_string(*report));
  CHECK(report->holds());
}

}  // namespace

TEST_CASE("leased tenant and global budgets stay within r*T + B + sum of outstanding grants",
          "[lease][envelope]") {
  const std::uint64_t seed = 20261202;
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  std::mt19937_64 rng(seed);

  // v1: global 2000/s, burst 400, leased 60 at a time (renewed at 15); tenants 800/s,
  // burst 100, leased 20 (renewed at 5). v2 (a downgrade at 2 s): global 1000/s, burst
  // 200, leased 30 (renewed at 5).
  const TokenBucket tenant{.rate = {800, 1s}, .burst = 100};
  const TokenBucket global1{.rate = {2000, 1s}, .burst = 400};
  const TokenBucket global2{.rate = {1000, 1s}, .burst = 200};
  const Nanos expiry = 200ms;
  const auto tenant_lease = lease_on(20, 5, expiry);
  auto v1 = build(lease_levels_spec(1, tenant, tenant_lease, global1, lease_on(60, 15, expiry)));
  auto v2 = build(lease_levels_spec(2, tenant, tenant_lease, global2, lease_on(30, 5, expiry)));
  const std::int64_t global_held = 60 + 15;  // the most one holder holds, under either rule
  const std::int64_t tenant_held = 20 + 5;

  Store store;
  StoreBackend inner(store);
  GrantLedger ledger;
  constexpr int kHolders = 4;
  std::vector<std::unique_ptr<LeaseMetrics>> metrics;
  std::vector<std::unique_ptr<Holder>> holders;
  for (int i = 0; i < kHolders; ++i) {
    metrics.push_back(std::make_unique<LeaseMetrics>());
    holders.push_back(std::make_unique<Holder>(inner, ledger, v1, i + 1, metrics.back().get()));
  }
  int incarnations = kHolders;

  const std::vector<std::string> tenants = {"t0", "t1", "t2", "t3"};
  std::vector<AdmittedEvent> global_log;
  std::vector<AdmittedEvent> global_after;  // from the downgrade + one expiry on
  std::map<std::string, std::vector<AdmittedEvent>> tenant_logs;
  std::int64_t decisions = 0;
  std::int64_t admitted_after = 0;
  bool stale_version_after = false;
  const Nanos paused_from = 800ms, paused_until = 1500ms;  // holder 1: longer than expiry
  const Nanos restart_at = 1200ms;                         // holder 2: a new incarnation
  const Nanos downgrade_at = 2000ms;                       // holder i reloads 40 ms·i later
  const Nanos end = 3000ms;
  std::uint64_t restarted_incarnation = 0;
  std::int64_t unused_before_pause = -1;
  std::int64_t held_at_pause = 0;
  const auto unused = [&](int i) {
    return metrics[i]->at(Level::kGlobal).units_unused_at_expiry.load() +
           metrics[i]->at(Level::kTenant).units_unused_at_expiry.load();
  };

  for (Nanos t{0}; t < end; t += 1ms) {
    if (t == restart_at) {
      restarted_incarnation = holders[2]->backend.incarnation();
      // The old process is gone with what it held; its grants stay outstanding at the
      // authority until they expire.
      holders[2] = std::make_unique<Holder>(inner, ledger, v1, ++incarnations, metrics[2].get());
      bool old_listed = false;
      for (const auto& g : ledger.outstanding(t)) {
        old_listed = old_listed || g.incarnation == restarted_incarnation;
      }
      CHECK(old_listed);
    }
    for (int i = 0; i < kHolders; ++i) {
      if (t == downgrade_at + i * 40ms) REQUIRE(holders[i]->registry.publish(v2).ok());
    }
    if (t == paused_from) {
      unused_before_pause = unused(1);
      for (const auto& h : holders[1]->backend.holdings(t)) held_at_pause += h.units;
    }
    for (int i = 0; i < kHolders; ++i) {
      if (i == 1 && t >= paused_from && t < paused_until) continue;
      const int n = static_cast<int>(rng() % 3);  // 0..2 requests per ms: 4,000/s in all
      for (int k = 0; k < n; ++k) {
        const std::string& who = tenants[rng() % tenants.size()];
        auto r = holders[i]->gateway.decide(
            {.who = {.tenant = who, .plan = "free"}, .route = "read"}, t);
        REQUIRE(r.ok());
        ++decisions;
        if (!r->decision.allowed) continue;
        global_log.push_back({t.count(), 1});
        tenant_logs[who].push_back({t.count(), 1});
        if (t >= downgrade_at + expiry) {
          global_after.push_back({t.count(), 1});
          ++admitted_after;
          stale_version_after = stale_version_after || r->decision.version != 2;
        }
      }
    }
  }

  // The union of every holder's admissions, against each budget's envelope.
  check_envelope(global_log, global1.rate, global1.burst, incarnations * global_held,
                 "global, v1 envelope, whole run");
  check_envelope(global_after, global2.rate, global2.burst, kHolders * global_held,
                 "global, v2 envelope, from one expiry after the downgrade");
  for (const auto& [who, log] : tenant_logs) {
    check_envelope(log, tenant.rate, tenant.burst, incarnations * tenant_held, who.c_str());
  }
  // Saturated, not starved: at least 80 % of what the budgets refill was admitted.
  CHECK(global_log.size() >= static_cast<std::size_t>(0.8 * (2000 * 2 + 1000 * 1)));
  CHECK(admitted_after >= static_cast<std::int64_t>(0.8 * 1000 * 0.8));
  // The rule change reached every holder within one expiry.
  CHECK_FALSE(stale_version_after);
  // The paused holder came back past expiry: what it held was counted unused, not spent.
  REQUIRE(held_at_pause > 0);
  CHECK(unused(1) >= unused_before_pause + held_at_pause);
  // The restarted incarnation's grants left the record when they expired.
  for (const auto& g : ledger.outstanding(restart_at + expiry)) {
    CHECK(g.incarnation != restarted_incarnation);
  }
  // Few authority round trips for leases: one per grant.
  std::int64_t grant_requests = 0;
  for (const auto& h : holders) grant_requests += h->backend.grant_requests();
  std::printf("%lld decisions, %lld grant requests\n", static_cast<long long>(decisions),
              static_cast<long long>(grant_requests));
  CHECK(grant_requests * 5 < decisions);
  std::int64_t dropped = 0;
  for (const auto& m : metrics) dropped += m->at(Level::kGlobal).units_dropped_on_rule_change;
  CHECK(dropped > 0);
}

TEST_CASE("the overshoot is the grants outstanding, and no more", "[lease][envelope]") {
  // Four holders each take a grant and keep most of it while the budget refills; then all
  // spend together: the held units come on top of a full burst.
  const TokenBucket global{.rate = {10, 1s}, .burst = 100};
  auto rules = build(lease_levels_spec(1, {.rate = {1000, 1s}, .burst = 1000},
                                       quota::gateway::LeaseSpec{}, global, lease_on(20, 5, 1h)));
  Store store;
  StoreBackend inner(store);
  GrantLedger ledger;
  std::vector<std::unique_ptr<Holder>> holders;
  for (int i = 0; i < 4; ++i)
    holders.push_back(std::make_unique<Holder>(inner, ledger, rules, i + 1));
  std::vector<AdmittedEvent> log;
  const auto request = [&](Holder& h, Nanos t) {
    auto r = h.gateway.decide({.who = {.tenant = "a", .plan = "free"}, .route = "read"}, t);
    REQUIRE(r.ok());
    if (r->decision.allowed) log.push_back({t.count(), 1});
    return r->decision.allowed;
  };
  for (auto& h : holders) REQUIRE(request(*h, Nanos{0}));
  const Nanos later = 10s;  // the authority's bucket is full again
  std::int64_t outstanding = 0;
  for (const auto& g : ledger.outstanding(later)) outstanding += g.units;
  CHECK(outstanding == 4 * 20);
  for (auto& h : holders) {
    while (request(*h, later)) {
    }
  }
  // 4·19 held + the full burst of 100.
  CHECK(log.size() == 4 + 4 * 19 + 100);
  auto with_grants =
      quota::verify::verify_token_bucket(log, global.rate, global.burst, outstanding);
  auto without = quota::verify::verify_token_bucket(log, global.rate, global.burst, 0);
  REQUIRE(with_grants.ok());
  REQUIRE(without.ok());
  std::printf("4 holders at a full budget: %s\n", quota::verify::to_string(*without).c_str());
  CHECK(with_grants->holds());
  CHECK_FALSE(without->holds());
  CHECK(without->required_burst() == global.burst + 4 * 19);
}
