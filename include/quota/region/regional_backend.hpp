// quota/region/regional_backend.hpp — a region's gateway backend: its own authority for
// its tenants, and regional leases of the global budgets from a central allocator.
//
// `RegionalBackend<Regional, Central, Ledger>` is a gateway backend (backend.hpp), so a
// Gateway over it serves a region's requests with the gateway's rules, versions, fail
// modes, shadow mode and metrics. User and tenant levels
// are decided at the region's own authority (`Regional`: a StoreBackend, or a
// redis::GatewayStore on the region's Redis), as without regions. The global levels (one
// budget shared by every region, "{~global}...") live at the central authority
// (`Central`, its own store or Redis), and a region decides them only from the regional
// grants it holds: it is a LeasedBackend holder (leased_backend.hpp) of the central
// budget, over a ScopeRouter (scope_router.hpp) that sends its grant requests to
// `Central` and everything else to `Regional`. No lease arithmetic is repeated here.
// Its grants live in this object's memory: each gateway process holding one is a holder
// of its own. A region served by several processes shares one pool in its Redis instead
// (RegionalPool, regional_pool.hpp): one holder per region.
//
// Guarantees (those of LeasedBackend, for the region as one holder):
//   - A regional grant is ONE atomic decision of `lease.units` on the global key at the
//     central authority, under the request's rule-set version; idempotent by grant id
//     "<region incarnation hex>-<n>" (over Redis the id is the decision's attempt, in the
//     key's slot; in process the ledger replays it); recorded at the central authority by
//     `Ledger` (GrantLedger, or redis::RedisGrantLedger on the central GatewayStore: key,
//     id, region incarnation, version, units, expiry); never refunded. The region's
//     incarnation (`incarnation()`) names its grants in the central ledger.
//   - Every global level is leased with the region's `lease` (RegionalOptions), whatever
//     the rule's own `lease` says; `lease.units` is capped at the budget's capacity and
//     `low_water` below it. A request costing more than a grant is decided at the central
//     authority itself. User and tenant levels are never leased by the region (their
//     rule's `lease` is for gateway processes that wrap this backend in a LeasedBackend).
//   - Cut off from the central authority, a region spends only what it holds: the global
//     level admits from grants not expired, and once they are spent (or expired) a request
//     gets the renewal's failure, kUnavailable, which the Gateway answers with the route's
//     fail mode (fail_closed: kUnavailable; fail_open: the bounded emergency bucket,
//     kFailOpen, outage.hpp). An enforcing global level never admits beyond them.
//   - Bound: a region holds at most `units + low_water` of a global key, so over every
//     interval of length T the union of every region's admissions on it is within
//     A(T) <= r·T + B + Σ units the regions hold <= r·T + B + R·(units + low_water)
//     for R region incarnations (tests/region_envelope_test.cpp, with a region cut off).
//   - All regions must load the same rules for a global budget: the central authority
//     decides a grant under the policy the region sends.
//
// Thread safety: any thread (as the two backends and LeasedBackend).
//
//   quota::gateway::StoreBackend regional(regional_store);   // or redis::GatewayStore
//   quota::gateway::StoreBackend central(central_store);     // or redis::GatewayStore
//   quota::GrantLedger ledger;                      // or redis::RedisGrantLedger
//   quota::region::RegionalBackend eu(regional, central, ledger,
//       {.lease = {.mode = quota::gateway::LeaseMode::kOn, .units = 2000, .expiry = 2s,
//                  .low_water = 500}});
//   quota::gateway::Gateway gw(eu, registry);
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "quota/gateway/backend.hpp"
#include "quota/gateway/key_state.hpp"
#include "quota/gateway/leases/lease_spec.hpp"
#include "quota/gateway/leases/leased_backend.hpp"
#include "quota/gateway/rules/rules.hpp"
#include "quota/lease/grant_ledger.hpp"
#include "quota/region/scope_router.hpp"
#include "quota/units.hpp"

namespace quota::region {

struct RegionalOptions {
  // The regional grants of every global budget (mode kOn or kAuto; kOff sends every
  // global decision to the central authority).
  gateway::LeaseSpec lease{.mode = gateway::LeaseMode::kOn,
                           .units = 1000,
                           .expiry = std::chrono::seconds(1),
                           .low_water = 250};
  // The region as a holder: incarnation (0: a fresh random one), backoff after a failed
  // grant request, metrics (LeaseMetrics, global level).
  gateway::LeasedBackendOptions holder{};
};

template <gateway::GatewayBackend Regional, gateway::GatewayBackend Central,
          GrantRecorder Ledger = GrantLedger>
class RegionalBackend final : public gateway::Backend {
 public:
  using Router = ScopeRouter<Regional, Central>;

  // The backends and the ledger must outlive this one.
  RegionalBackend(Regional& regional, Central& central, Ledger& ledger,
                  RegionalOptions options = {})
      : lease_(options.lease),
        router_(regional, central),
        leased_(router_, ledger, options.holder) {}

  std::uint64_t incarnation() const { return leased_.incarnation(); }

  absl::StatusOr<gateway::LevelsResult> decide(std::span<const gateway::LevelCheck> levels,
                                               std::uint64_t version, Nanos now) override {
    gateway::CheckVector<gateway::LevelCheck> checks(levels.begin(), levels.end());
    // The rules as the region leases them; reserved first, so the pointers stay valid.
    gateway::CheckVector<gateway::Rule> rules;
    rules.reserve(levels.size());
    for (gateway::LevelCheck& c : checks) {
      if (c.rule == nullptr) continue;
      const bool central = is_central(c);
      if (!central && !c.rule->lease.enabled()) continue;
      rules.push_back(*c.rule);
      rules.back().lease = central ? lease_for(rules.back().policy) : gateway::LeaseSpec{};
      c.rule = &rules.back();
    }
    return leased_.decide(checks, version, now);
  }

  absl::StatusOr<MicroUnits> refund(const gateway::RulePolicy& policy, std::uint64_t version,
                                    gateway::LevelKey key, std::int64_t units, Nanos spent_at,
                                    Nanos now) override {
    return leased_.refund(policy, version, key, units, spent_at, now);
  }

  absl::StatusOr<MicroUnits> charge(const gateway::RulePolicy& policy, std::uint64_t version,
                                    gateway::LevelKey key, std::int64_t units, Nanos now) override {
    return leased_.charge(policy, version, key, units, now);
  }

  // The regional grants this region holds now, by global key (its own view; the central
  // ledger's `outstanding` is the authority's).
  std::vector<gateway::Holding> holdings(Nanos now) { return leased_.holdings(now); }

  // Grant requests sent to the central authority: its cross-region round trips.
  std::int64_t grant_requests() const { return leased_.grant_requests(); }

  // The most this region holds of one global key at any instant (of a budget whose
  // capacity is at least lease.units).
  std::int64_t max_held() const { return lease_.max_held(); }

 private:
  // The region's lease on a budget of this policy: units within its capacity.
  gateway::LeaseSpec lease_for(const gateway::RulePolicy& policy) const {
    gateway::LeaseSpec l = lease_;
    l.units = std::clamp<std::int64_t>(l.units, 1, gateway::detail::capacity(policy));
    l.low_water = std::clamp<std::int64_t>(l.low_water, 0, l.units - 1);
    return l;
  }

  gateway::LeaseSpec lease_;
  Router router_;
  gateway::LeasedBackend<Router, Ledger> leased_;
};

}  // namespace quota::region
