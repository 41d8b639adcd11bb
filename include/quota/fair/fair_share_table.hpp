// quota/fair/fair_share_table.hpp — the state FairShare (fair_share.hpp) decides on.
//
// FairShareTable holds one FairShare's tenants (weight, demand, share, asks, use) and the
// sums of the current allocation (Σ demand, the water level's units and weights, what
// the tenants below the level were allocated and use, the active tenants), and the
// arithmetic of one decision against them (decide(): the thresholds, the alone case, a
// constrained tenant's share, borrowing up to the water level). It is FairShare's base
// and nothing else: every member is protected, FairShare takes its mutex around every
// use, and docs/fair_share.md states the rules. Nothing here is a public interface.
//
// Thread safety: none of its own; every member is guarded by mu_, which FairShare holds.
//
//   class FairShare : private FairShareTable { ... };  // the only user
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/numeric/int128.h"
#include "absl/status/status.h"
#include "quota/detail/keyed_states.hpp"
#include "quota/detail/mutex.hpp"
#include "quota/fair/fair_share_config.hpp"
#include "quota/fair/fair_share_results.hpp"
#include "quota/fair/tenant_weights.hpp"

namespace quota::fair {

class FairShareTable {
 protected:
  FairShareTable(FairShareConfig config, TenantWeights weights)
      : config_(config),
        weights_(std::move(weights)),
        status_(config.validate().ok() ? weights_.validate("FairShare") : config.validate()) {}

  struct Tenant {
    std::int64_t weight = 1;
    std::optional<std::int64_t> reported;  // report()'s demand, when given
    std::int64_t estimate = 0;  // decayed asks: (asked + previous estimate) / 2 per period
    std::int64_t asked = 0;     // units asked in the current period, admitted or not
    std::int64_t demand = 0;    // its demand in the current allocation
    std::int64_t share = 0;     // its share in the current allocation
    bool constrained = false;   // share < demand
    bool in_view = false;       // allocate_split(): in the holders' view
    std::int64_t used = 0;
    bool active() const { return demand > 0 || used > 0 || asked > 0; }
  };
  // Hashed: a request's lookup is O(1); allocate() sorts by name where order matters.
  using Map = absl::flat_hash_map<std::string, Tenant>;

  Tenant& find_or_add(std::string_view tenant) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    auto it = tenants_.find(detail::to_absl(tenant));
    if (it == tenants_.end()) {
      Tenant fresh;
      fresh.weight = weights_.of(tenant);
      it = tenants_.emplace(std::string(tenant), fresh).first;
    }
    return it->second;
  }

  // Sets a tenant's use, keeping total_used_ and below_level_used_ (Σ use of the tenants
  // that are not constrained) in step.
  void set_used(Tenant& t, std::int64_t used) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (!t.constrained) below_level_used_ += used - t.used;
    total_used_ += used - t.used;
    t.used = used;
  }

  // The decision for `units` more by `self` (already counted as active), before anything
  // is deducted.
  FairShareDecision decide(const Tenant& self, std::int64_t units)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    FairShareDecision d;
    const std::int64_t used_after = total_used_ + units;  // both ≤ kMaxBudget
    const std::int64_t self_after = self.used + units;
    if (active_ <= 1 && view_tenants_ - (self.in_view ? 1 : 0) <= 0) {
      // alone here and in the holders' view: nobody to be fair to or to keep a reserve for
      d.share = alone_cap_;
      d.allowed = used_after <= alone_cap_;
      d.verdict = d.allowed ? FairShareVerdict::kFree : FairShareVerdict::kOverBudget;
      return d;
    }
    if (free_regime_ && std::max<absl::int128>(used_after, demand_sum_) <= config_.share_level()) {
      d.allowed = true;
      d.verdict = FairShareVerdict::kFree;
      return d;
    }
    if (used_after > config_.pause_level()) {
      d.verdict = FairShareVerdict::kPaused;
      return d;
    }
    d.share = self.share;
    if (self.constrained) {
      // Held to its share, and below-level tenants come first (max-min serves them in
      // full): it leaves free what they were allocated and have not used yet.
      d.allowed = self_after <= self.share &&
                  absl::int128(used_after) + unused_below_level() <= config_.share_capacity();
      d.verdict = d.allowed ? FairShareVerdict::kWithinShare : FairShareVerdict::kOverShare;
      return d;
    }
    if (self_after <= self.share) {
      d.allowed = true;
      d.verdict = FairShareVerdict::kWithinShare;
      return d;
    }
    // Past its share (its demand rose, or it is new in the period): it may go up to the
    // water level (level_units_ / level_weight_ per unit of weight; no level while nobody
    // is constrained), within the pause level checked above.
    d.allowed = level_weight_ == 0 || absl::int128(self_after) * level_weight_ <=
                                          absl::int128(level_units_) * self.weight;
    d.verdict = d.allowed ? FairShareVerdict::kBorrowed : FairShareVerdict::kOverShare;
    return d;
  }

  // Clears the allocation's sums before shares are set.
  void reset_allocation(std::int64_t alone_cap, bool free_regime, std::int64_t view_tenants)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    below_level_shares_ = level_units_ = level_weight_ = active_ = 0;
    demand_sum_ = 0;
    alone_cap_ = alone_cap;
    free_regime_ = free_regime;
    view_tenants_ = view_tenants;
  }

  // Sets a tenant's share in allocation `a` (its demand set), and the allocation's sums.
  void set_share(Tenant& t, std::int64_t share, FairShareAllocation& a)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    t.share = share;
    t.constrained = t.share < t.demand;
    a.share_sum += t.share;
    (t.constrained ? level_units_ : below_level_shares_) += t.share;
    level_weight_ += t.constrained ? t.weight : 0;
    a.constrained += t.constrained ? 1 : 0;
  }

  // Counts the active tenants and the use of those not constrained, once shares are set.
  void count_active() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    below_level_used_ = 0;
    for (const auto& [name, t] : tenants_) {
      active_ += t.active() ? 1 : 0;
      if (!t.constrained) below_level_used_ += t.used;
    }
  }

  // What the tenants below the water level were allocated and do not use yet, together.
  std::int64_t unused_below_level() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return std::max<std::int64_t>(0, below_level_shares_ - below_level_used_);
  }

  const FairShareConfig config_;
  const TenantWeights weights_;
  const absl::Status status_;
  mutable detail::Mutex mu_;
  Map tenants_ ABSL_GUARDED_BY(mu_);
  std::int64_t total_used_ ABSL_GUARDED_BY(mu_) = 0;
  // The current allocation: Σ demand, the constrained tenants' Σ shares and Σ weights
  // (the water level), the other tenants' Σ shares and Σ use, and the tenants active in
  // the period.
  absl::int128 demand_sum_ ABSL_GUARDED_BY(mu_) = 0;  // up to 2^30 demands of up to 2^62
  std::int64_t level_units_ ABSL_GUARDED_BY(mu_) = 0;
  std::int64_t level_weight_ ABSL_GUARDED_BY(mu_) = 0;
  std::int64_t below_level_shares_ ABSL_GUARDED_BY(mu_) = 0;
  std::int64_t below_level_used_ ABSL_GUARDED_BY(mu_) = 0;
  std::int64_t active_ ABSL_GUARDED_BY(mu_) = 0;
  // allocate_split(): the tenants of the holders' view, the cap of a tenant alone, and
  // whether the free regime applies (allocate(): 0, the budget, true).
  std::int64_t view_tenants_ ABSL_GUARDED_BY(mu_) = 0;
  std::int64_t alone_cap_ ABSL_GUARDED_BY(mu_) = config_.budget;
  bool free_regime_ ABSL_GUARDED_BY(mu_) = true;
};

}  // namespace quota::fair
