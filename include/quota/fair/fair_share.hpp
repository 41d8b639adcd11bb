// quota/fair/fair_share.hpp — fair shares of one budget shared by many tenants.
//
// A FairShare admits or refuses requests of `units` against a budget shared by many
// tenants (an upstream provider's tokens per minute, a global lease pool). With `load`
// the larger of the units in use after the request and the units the active tenants
// want (docs/fair_share.md):
//   - load ≤ share threshold (default 70 % of the budget): admitted freely (kFree);
//   - above it: admitted while the tenant stays within its share (kWithinShare), the
//     exact weighted max-min fair allocation (weighted_max_min.hpp) of the budget minus
//     the reserve (default 10 %) among the active tenants' demands, else kOverShare;
//   - above the share threshold, a request that would carry the units in use above the
//     pause threshold (default 90 %) is refused with a verdict of its own (kPaused),
//     checked before the share;
//   - a tenant alone (no other tenant active) may use the whole budget: there is nobody
//     to be fair to or to keep a reserve for. The capacity it borrows is reclaimed when
//     its leases expire (`expire`): from then on the others' demands cap it at its share.
// Guarantees, with two or more active tenants: the shares sum to at most budget −
// reserve; every admission leaves the units in use at most the pause level; a tenant
// within its share is refused only while others hold more than their shares (capacity
// borrowed before it arrived or before the demands rose), i.e. until their leases expire.
// Each tenant's own limits (its rules) are checked elsewhere; this class decides only its
// part of the shared budget. It keeps no time: the caller reports demands and expiries.
//
// Thread safety: every method may be called from any thread (one mutex); a returned
// share or use is a snapshot that other callers may change at once.
//
//   quota::fair::FairShare fs(*quota::fair::FairShareConfig{.budget = 4'000'000}.checked());
//   fs.report("acme", {.weight = 2, .demand = 600'000});
//   auto d = fs.request("acme", 200'000);  // StatusOr<FairShareDecision>
//   if (d.ok() && !d->allowed) log(to_string(d->verdict));  // "over_share", "paused"
//   fs.expire("acme", 200'000);            // the lease holding them ran out
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/numeric/int128.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "quota/detail/mutex.hpp"
#include "quota/fair/weighted_max_min.hpp"

namespace quota::fair {

// The largest budget: half the int64 range, so a tenant's use plus a request (each at
// most the budget) always fits in an int64.
inline constexpr std::int64_t kMaxBudget = std::numeric_limits<std::int64_t>::max() / 2;

// The shared budget and its thresholds, in units and permille (‰) of the budget.
struct FairShareConfig {
  std::int64_t budget = 0;              // units shared by all tenants, ≥ 1
  std::int64_t reserve_permille = 100;  // never part of a share: budget − ⌈budget·r⌉
  std::int64_t share_permille = 700;    // load above it: weighted max-min shares apply
  std::int64_t pause_permille = 900;    // units in use above it: new admissions paused

  // OK, or InvalidArgument naming the field and its bound: 1 ≤ budget ≤ kMaxBudget; 0 ≤
  // reserve_permille < 1000; 1 ≤ share_permille ≤ pause_permille ≤ 1000; and
  // pause_permille ≥ 1000 − reserve_permille, so that the pause never cuts into the
  // shares (which sum to budget − reserve).
  absl::Status validate() const {
    if (budget < 1 || budget > kMaxBudget) {
      return absl::InvalidArgumentError(
          absl::StrCat("FairShareConfig.budget must be in [1, ", kMaxBudget, "], got ", budget));
    }
    if (reserve_permille < 0 || reserve_permille >= 1000) {
      return absl::InvalidArgumentError(absl::StrCat(
          "FairShareConfig.reserve_permille must be in [0, 999], got ", reserve_permille));
    }
    if (share_permille < 1 || share_permille > 1000) {
      return absl::InvalidArgumentError(absl::StrCat(
          "FairShareConfig.share_permille must be in [1, 1000], got ", share_permille));
    }
    if (pause_permille < share_permille || pause_permille > 1000) {
      return absl::InvalidArgumentError(
          absl::StrCat("FairShareConfig.pause_permille must be in [share_permille (",
                       share_permille, "), 1000], got ", pause_permille));
    }
    if (pause_permille < 1000 - reserve_permille) {
      return absl::InvalidArgumentError(
          absl::StrCat("FairShareConfig.pause_permille must be >= 1000 - reserve_permille (",
                       1000 - reserve_permille,
                       ") so that the pause never cuts into the shares, got ", pause_permille));
    }
    return absl::OkStatus();
  }
  // This config when valid, else validate()'s error.
  absl::StatusOr<FairShareConfig> checked() const {
    if (auto s = validate(); !s.ok()) return s;
    return *this;
  }

  // The units the shares divide: budget − ⌈budget · reserve_permille / 1000⌉ (the
  // reserve rounded up, so the shares never reach into it).
  std::int64_t share_capacity() const {
    const absl::int128 reserve = (absl::int128(budget) * reserve_permille + 999) / 1000;
    return budget - static_cast<std::int64_t>(reserve);
  }
  // ⌊budget · share_permille / 1000⌋: the load up to which tenants draw freely.
  std::int64_t share_level() const { return permille_of(share_permille); }
  // ⌊budget · pause_permille / 1000⌋: the units in use no admission carries use above.
  std::int64_t pause_level() const { return permille_of(pause_permille); }

 private:
  std::int64_t permille_of(std::int64_t permille) const {
    return static_cast<std::int64_t>(absl::int128(budget) * permille / 1000);
  }
};

// Why a request was admitted or refused. Stable names: to_string().
enum class FairShareVerdict : std::uint8_t {
  kFree = 0,         // admitted: the load stays at or below the share threshold, or the
                     // tenant is alone
  kWithinShare = 1,  // admitted: above the share threshold, within the tenant's share
  kOverShare = 2,    // refused: the tenant would exceed its fair share
  kPaused = 3,       // refused: the units in use would pass the pause threshold
  kOverBudget = 4,   // refused: the request does not fit the budget (a tenant alone, or
                     // units > budget: it can never pass)
};

constexpr std::string_view to_string(FairShareVerdict v) {
  switch (v) {
    case FairShareVerdict::kFree:
      return "free";
    case FairShareVerdict::kWithinShare:
      return "within_share";
    case FairShareVerdict::kOverShare:
      return "over_share";
    case FairShareVerdict::kPaused:
      return "paused";
    case FairShareVerdict::kOverBudget:
      return "over_budget";
  }
  return "unknown";
}

// A tenant's report: its weight (1 ≤ weight ≤ kMaxWeight) and the units it wants to hold
// in the current lease period (demand ≥ 0; a request for u units raises it to at least
// used + u). Report every lease period; demand 0 with nothing in use makes it inactive.
struct TenantReport {
  std::int64_t weight = 1;
  std::int64_t demand = 0;
};

struct FairShareDecision {
  bool allowed = false;
  FairShareVerdict verdict = FairShareVerdict::kOverShare;
  // The tenant's share when shares applied (kWithinShare, kOverShare); the budget when
  // it is alone; 0 otherwise (kFree below the threshold, kPaused).
  std::int64_t share = 0;
  std::int64_t used = 0;        // the tenant's units in use after the decision
  std::int64_t total_used = 0;  // all tenants' units in use after the decision
};

// One tenant's state in a snapshot: its report, its use and its current share.
struct TenantShare {
  std::string tenant;
  std::int64_t weight = 1;
  std::int64_t demand = 0;  // max(reported demand, used)
  std::int64_t used = 0;
  std::int64_t share = 0;
};

class FairShare {
 public:
  // `config` should be valid (FairShareConfig::checked()); with an invalid one every
  // request fails with validate()'s InvalidArgument, which names the field.
  explicit FairShare(FairShareConfig config) : config_(config), status_(config.validate()) {}

  const FairShareConfig& config() const { return config_; }

  // Sets a tenant's weight and demand; a tenant with demand > 0 or units in use is
  // active. InvalidArgument (naming the field) on a weight out of [1, kMaxWeight] or a
  // negative demand.
  absl::Status report(std::string_view tenant, TenantReport r) {
    if (r.weight < 1 || r.weight > kMaxWeight) {
      return absl::InvalidArgumentError(
          absl::StrCat("TenantReport.weight must be in [1, ", kMaxWeight, "], got ", r.weight));
    }
    if (r.demand < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("TenantReport.demand must be >= 0, got ", r.demand));
    }
    detail::MutexLock lock(mu_);
    Tenant& t = tenants_[std::string(tenant)];
    t.weight = r.weight;
    t.demand = r.demand;
    return absl::OkStatus();
  }

  // `units` of the tenant's use are no longer held (their lease expired or the window
  // rolled): its use falls by them, never below 0. InvalidArgument when units < 0.
  absl::Status expire(std::string_view tenant, std::int64_t units) {
    if (units < 0) {
      return absl::InvalidArgumentError(absl::StrCat("expire: units must be >= 0, got ", units));
    }
    detail::MutexLock lock(mu_);
    auto it = tenants_.find(tenant);
    if (it == tenants_.end()) return absl::OkStatus();
    const std::int64_t freed = std::min(units, it->second.used);
    it->second.used -= freed;
    total_used_ -= freed;
    return absl::OkStatus();
  }

  // The tenant leaves: its use and demand no longer count.
  void forget(std::string_view tenant) {
    detail::MutexLock lock(mu_);
    auto it = tenants_.find(tenant);
    if (it == tenants_.end()) return;
    total_used_ -= it->second.used;
    tenants_.erase(it);
  }

  // Decides a request of `units` (≥ 1) by `tenant` (an unknown tenant joins with weight
  // 1), raises its demand to at least its use + units (admitted or not: the tenant stays
  // active until report() lowers its demand to its use or forget()), and, when admitted,
  // adds the units to its use. A request of more units than the budget can never pass:
  // kOverBudget, and it raises no demand. InvalidArgument on units < 1 or an invalid
  // config. O(n log n) in the active tenants above the share threshold.
  absl::StatusOr<FairShareDecision> request(std::string_view tenant, std::int64_t units) {
    if (!status_.ok()) return status_;
    if (units < 1) {
      return absl::InvalidArgumentError(absl::StrCat("request: units must be >= 1, got ", units));
    }
    detail::MutexLock lock(mu_);
    if (units > config_.budget) {
      auto found = tenants_.find(tenant);
      const std::int64_t used = found == tenants_.end() ? 0 : found->second.used;
      return FairShareDecision{.allowed = false,
                               .verdict = FairShareVerdict::kOverBudget,
                               .share = 0,
                               .used = used,
                               .total_used = total_used_};
    }
    auto it = tenants_.try_emplace(std::string(tenant)).first;
    FairShareDecision d = decide(it, units);
    Tenant& self = it->second;
    // A request is a demand, admitted or not: a refused tenant stays active, so the
    // tenant that borrowed the budget meets it at its next request.
    self.demand = std::max(self.demand, self.used + units);
    if (d.allowed) {
      self.used += units;
      total_used_ += units;
    }
    d.used = self.used;
    d.total_used = total_used_;
    return d;
  }

  // Every known tenant with its use and its share of budget − reserve among the active
  // tenants' demands (the shares a request above the threshold is held to), by name.
  std::vector<TenantShare> snapshot() const {
    detail::MutexLock lock(mu_);
    std::vector<TenantShare> out;
    std::vector<std::int64_t> demands, weights;
    for (const auto& [name, t] : tenants_) {
      out.push_back({name, t.weight, std::max(t.demand, t.used), t.used, 0});
      demands.push_back(out.back().demand);
      weights.push_back(t.weight);
    }
    auto shares = weighted_max_min(config_.share_capacity(), demands, weights);
    if (shares.ok()) {  // the reports were validated: it cannot fail
      for (std::size_t i = 0; i < out.size(); ++i) out[i].share = (*shares)[i];
    }
    return out;
  }

  std::int64_t total_used() const {
    detail::MutexLock lock(mu_);
    return total_used_;
  }

 private:
  struct Tenant {
    std::int64_t weight = 1;
    std::int64_t demand = 0;
    std::int64_t used = 0;
    bool active() const { return demand > 0 || used > 0; }
  };
  using Map = std::map<std::string, Tenant, std::less<>>;

  // The decision for `units` more by *it, before anything is deducted.
  FairShareDecision decide(Map::iterator self_it, std::int64_t units)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const Tenant& self = self_it->second;
    FairShareDecision d;
    const absl::int128 used_after = absl::int128(total_used_) + units;
    bool alone = true;
    absl::int128 wanted = 0;  // Σ over active tenants of max(demand, used), self's raised
    for (auto it = tenants_.begin(); it != tenants_.end(); ++it) {
      if (it == self_it) continue;
      if (it->second.active()) alone = false;
      wanted += std::max(it->second.demand, it->second.used);
    }
    const std::int64_t self_demand = std::max(self.demand, self.used + units);
    wanted += self_demand;

    if (alone) {
      d.share = config_.budget;
      d.allowed = used_after <= config_.budget;
      d.verdict = d.allowed ? FairShareVerdict::kFree : FairShareVerdict::kOverBudget;
    } else if (std::max(used_after, wanted) <= config_.share_level()) {
      d.allowed = true;
      d.verdict = FairShareVerdict::kFree;
    } else if (used_after > config_.pause_level()) {
      d.verdict = FairShareVerdict::kPaused;
    } else {
      d.share = share_of(self_it, self_demand);
      d.allowed = self.used + units <= d.share;
      d.verdict = d.allowed ? FairShareVerdict::kWithinShare : FairShareVerdict::kOverShare;
    }
    return d;
  }

  // The share of *self_it (with demand `self_demand`) among the active tenants.
  std::int64_t share_of(Map::iterator self_it, std::int64_t self_demand)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    std::vector<std::int64_t> demands, weights;
    std::size_t self_index = 0;
    for (auto it = tenants_.begin(); it != tenants_.end(); ++it) {
      if (it == self_it) {
        self_index = demands.size();
        demands.push_back(self_demand);
      } else if (it->second.active()) {
        demands.push_back(std::max(it->second.demand, it->second.used));
      } else {
        continue;
      }
      weights.push_back(it->second.weight);
    }
    auto shares = weighted_max_min(config_.share_capacity(), demands, weights);
    return shares.ok() ? (*shares)[self_index] : 0;  // inputs validated: always ok
  }

  const FairShareConfig config_;
  const absl::Status status_;
  mutable detail::Mutex mu_;
  Map tenants_ ABSL_GUARDED_BY(mu_);
  std::int64_t total_used_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace quota::fair
