// quota/fair/fair_share.hpp — fair shares of one budget shared by many tenants.
//
// A FairShare admits or refuses requests of `units` against a budget of units in use
// shared by many tenants (an upstream provider's tokens per lease period, a global lease
// pool). Time is split into allocation periods (one lease expiry each): the caller calls
// allocate() at every period boundary, which decays each tenant's demand and recomputes
// the exact weighted max-min shares (weighted_max_min.hpp) of budget − reserve, once;
// every request in between is O(1) against those cached shares (docs/fair_share.md):
//   - a tenant alone (no other tenant active) may use the whole budget (kFree);
//   - load ≤ share threshold (default 70 % of the budget): admitted freely (kFree);
//   - units in use after the request above the pause threshold (default 90 %): kPaused;
//   - a constrained tenant (its demand above its share) is admitted while it stays within
//     its share and leaves free what the below-level tenants were allocated and have not
//     used (together), never past budget − reserve (kWithinShare), else kOverShare:
//     below-level tenants come first, as in max-min;
//   - any other tenant: within its share kWithinShare; past it, up to the water level
//     (the constrained tenants' share per unit of weight) kBorrowed, else kOverShare.
// `load` is the larger of the units in use after the request and Σ demand of the period.
// A tenant's demand is its reported demand (report()) or, without one, its decayed recent
// asks: (asked in the period that ended + the previous estimate) / 2, so a burst stops
// counting after a few periods. Guarantees, with two or more tenants active: Σ shares ≤
// budget − reserve at every allocation (allocate() checks it); every admission leaves the
// units in use at most the pause level; a tenant within its share is refused only while
// capacity borrowed before this allocation is still held (it leaves within one lease
// expiry) or while the below-level tenants together ask more than they were allocated.
// Each tenant's own limits are checked elsewhere. With several holders of one budget,
// allocate_split() takes the shares computed over all of them (holder_split.hpp) instead.
// The tenants' state and the arithmetic of one decision are FairShareTable's
// (fair_share_table.hpp), FairShare's private base.
//
// Thread safety: every method may be called from any thread (one mutex); a returned
// share or use is a snapshot that other callers may change at once.
//
//   quota::fair::FairShare fs(*quota::fair::FairShareConfig{.budget = 4'000'000}.checked());
//   fs.report("acme", {.weight = 2, .demand = 600'000});
//   (void)fs.allocate();                   // at every lease-period boundary
//   auto d = fs.request("acme", 200'000);  // StatusOr<FairShareDecision>
//   if (d.ok() && !d->allowed) log(to_string(d->verdict));  // "over_share", "paused"
//   fs.expire("acme", 200'000);            // the lease holding them ran out
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/numeric/int128.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "quota/detail/keyed_states.hpp"
#include "quota/detail/mutex.hpp"
#include "quota/fair/fair_share_config.hpp"
#include "quota/fair/fair_share_results.hpp"
#include "quota/fair/fair_share_table.hpp"
#include "quota/fair/holder_split.hpp"
#include "quota/fair/tenant_weights.hpp"
#include "quota/fair/weighted_max_min.hpp"

namespace quota::fair {

class FairShare : private FairShareTable {
 public:
  // `config` should be valid (FairShareConfig::checked()), and `weights` (each tenant's
  // weight when it first appears; report() may change it) too; with an invalid one every
  // request fails with validate()'s InvalidArgument, which names the field.
  explicit FairShare(FairShareConfig config, TenantWeights weights = {})
      : FairShareTable(config, std::move(weights)) {}

  const FairShareConfig& config() const { return config_; }

  // Sets a tenant's weight (effective at once) and its demand (from the next allocate()
  // on). InvalidArgument (naming the field) on a weight out of [1, kMaxWeight] or a
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
    Tenant& t = find_or_add(tenant);
    if (t.constrained) level_weight_ += r.weight - t.weight;
    t.weight = r.weight;
    t.reported = std::min(r.demand, config_.budget);
    return absl::OkStatus();
  }

  // Starts an allocation period (call it at every lease-period boundary): each tenant's
  // estimate becomes (asked in the period that ended + the previous estimate) / 2, its
  // demand its reported demand or that estimate, and the shares the exact weighted
  // max-min allocation of budget − reserve among the demands. Tenants with no demand,
  // nothing in use and no report are dropped. O(n log n); InternalError if Σ shares ever
  // exceeded the capacity (it cannot: weighted_max_min guarantees it), InvalidArgument
  // on an invalid config.
  absl::StatusOr<FairShareAllocation> allocate() {
    if (!status_.ok()) return status_;
    detail::MutexLock lock(mu_);
    FairShareAllocation a{.capacity = config_.share_capacity()};
    // By name, so that weighted_max_min's ties (broken by index) do not depend on the
    // hash table's order: the same reports give the same shares in every process.
    std::vector<std::pair<std::string_view, Tenant*>> order;
    for (auto it = tenants_.begin(); it != tenants_.end();) {
      Tenant& t = it->second;
      t.estimate = static_cast<std::int64_t>((absl::int128(t.asked) + t.estimate) / 2);
      t.asked = 0;
      t.demand = t.reported.value_or(t.estimate);
      t.share = 0;
      t.constrained = false;
      t.in_view = false;
      if (t.demand == 0 && t.used == 0 && !t.reported.has_value()) {
        tenants_.erase(it++);  // erasing leaves the other iterators valid
        continue;
      }
      if (t.demand > 0) order.emplace_back(it->first, &t);
      ++it;
    }
    std::sort(order.begin(), order.end());
    std::vector<std::int64_t> demands, weights;
    demands.reserve(order.size());
    weights.reserve(order.size());
    for (const auto& [name, t] : order) {
      demands.push_back(t->demand);
      weights.push_back(t->weight);
    }
    auto shares = weighted_max_min(a.capacity, demands, weights);
    if (!shares.ok()) return shares.status();  // demands ≤ budget, weights checked
    reset_allocation(config_.budget, true, 0);
    for (std::size_t i = 0; i < order.size(); ++i) {
      demand_sum_ += order[i].second->demand;
      set_share(*order[i].second, (*shares)[i], a);
    }
    count_active();
    a.tenants = order.size();
    a.demand_sum = static_cast<std::int64_t>(
        std::min<absl::int128>(demand_sum_, std::numeric_limits<std::int64_t>::max()));
    if (a.share_sum > a.capacity) {
      return absl::InternalError(absl::StrCat("FairShare::allocate: shares sum to ", a.share_sum,
                                              " > capacity ", a.capacity));
    }
    return a;
  }

  // The units each tenant asked in the current period (admitted or not), by name: what
  // this holder reports to the others before allocate_split().
  std::vector<std::pair<std::string, std::int64_t>> asked() const {
    detail::MutexLock lock(mu_);
    std::vector<std::pair<std::string, std::int64_t>> out;
    for (const auto& [name, t] : tenants_)
      if (t.asked > 0) out.emplace_back(name, t.asked);
    std::sort(out.begin(), out.end());
    return out;
  }

  // Starts an allocation period with shares of `capacity` (≤ budget − reserve) over every
  // holder of the budget (holder_split.hpp; `view` sorted by tenant, weights from it, each
  // tenant here taking the view's weight): each tenant here is held to its part, its
  // demand its local asks; one not in the view has share 0 (it may borrow up to the water
  // level). Alone (no other tenant active here or in the view) a tenant may use
  // `alone_cap` (≤ budget); `free_regime` false disables the free regime; its load is Σ of
  // the view's totals. `newcomers.tenants` (tenants new here: none in the view with local
  // asks) get provisional parts (newcomer_parts, holder_split.hpp), their demand their
  // asks, taken from the pool and the view's parts here. Estimates are not updated; the
  // asks restart at 0. InvalidArgument on a bad view, newcomer or config.
  absl::StatusOr<FairShareAllocation> allocate_split(std::int64_t capacity,
                                                     std::span<const HolderDemand> view,
                                                     std::int64_t alone_cap, bool free_regime,
                                                     const NewcomerPool& newcomers = {}) {
    if (!status_.ok()) return status_;
    capacity = std::clamp<std::int64_t>(capacity, 0, config_.share_capacity());
    auto split = split_shares(capacity, config_.budget, view);
    if (!split.ok()) return split.status();
    auto fresh = newcomer_parts(*split, view, capacity, newcomers.holders, newcomers.fixed_capacity,
                                newcomers.tenants);
    if (!fresh.ok()) return fresh.status();
    split->parts = fresh->view_parts;
    detail::MutexLock lock(mu_);
    for (auto it = tenants_.begin(); it != tenants_.end();) {
      Tenant& t = it->second;
      t.asked = 0;
      t.demand = t.share = 0;
      t.constrained = t.in_view = false;
      if (t.used == 0 && !t.reported.has_value()) {
        tenants_.erase(it++);
        continue;
      }
      ++it;
    }
    reset_allocation(std::clamp<std::int64_t>(alone_cap, 0, config_.budget), free_regime,
                     static_cast<std::int64_t>(view.size()));
    FairShareAllocation a{.capacity = capacity, .tenants = view.size()};
    for (std::size_t i = 0; i < view.size(); ++i) {
      demand_sum_ += std::min(view[i].total, config_.budget);
      if (view[i].local == 0) continue;
      Tenant& t = find_or_add(view[i].tenant);
      t.in_view = true;
      t.weight = view[i].weight;
      t.demand = std::min(view[i].local, config_.budget);
      set_share(t, split->parts[i], a);
    }
    for (std::size_t i = 0; i < newcomers.tenants.size(); ++i) {
      const Newcomer& n = newcomers.tenants[i];
      if (n.asked == 0) continue;
      Tenant& t = find_or_add(n.tenant);
      if (t.in_view) continue;  // already held to its part of the view
      t.weight = n.weight;
      t.demand = std::min(n.asked, config_.budget);
      set_share(t, fresh->parts[i], a);
    }
    count_active();
    a.demand_sum = static_cast<std::int64_t>(
        std::min<absl::int128>(demand_sum_, std::numeric_limits<std::int64_t>::max()));
    return a;
  }

  // `units` of the tenant's use are no longer held (their lease expired or the window
  // rolled): its use falls by them, never below 0. InvalidArgument when units < 0.
  absl::Status expire(std::string_view tenant, std::int64_t units) {
    if (units < 0) {
      return absl::InvalidArgumentError(absl::StrCat("expire: units must be >= 0, got ", units));
    }
    detail::MutexLock lock(mu_);
    auto it = tenants_.find(detail::to_absl(tenant));
    if (it == tenants_.end()) return absl::OkStatus();
    Tenant& t = it->second;
    const bool was_active = t.active();
    set_used(t, t.used - std::min(units, t.used));
    if (was_active && !t.active()) --active_;
    return absl::OkStatus();
  }

  // The tenant leaves: its use, demand and share no longer count.
  void forget(std::string_view tenant) {
    detail::MutexLock lock(mu_);
    auto it = tenants_.find(detail::to_absl(tenant));
    if (it == tenants_.end()) return;
    Tenant& t = it->second;
    if (t.constrained) {  // it leaves the water level's tenants
      level_units_ -= t.share;
      level_weight_ -= t.weight;
    } else {
      below_level_shares_ -= t.share;
      below_level_used_ -= t.used;
    }
    total_used_ -= t.used;
    demand_sum_ -= t.demand;
    const bool was_active = t.active();
    if (was_active) --active_;
    tenants_.erase(it);
  }

  // Decides a request of `units` (≥ 1) by `tenant` (an unknown tenant joins with its
  // weight in `weights`), counts them as asked (admitted or not: the next allocation's
  // estimate, and the tenant is active for the rest of the period), and, when admitted,
  // adds them to its use. A request of more units than the budget can never pass:
  // kOverBudget, not counted as asked. O(1): a hash lookup and the cached shares.
  // InvalidArgument on units < 1 or an invalid config.
  absl::StatusOr<FairShareDecision> request(std::string_view tenant, std::int64_t units) {
    if (!status_.ok()) return status_;
    if (units < 1) {
      return absl::InvalidArgumentError(absl::StrCat("request: units must be >= 1, got ", units));
    }
    detail::MutexLock lock(mu_);
    if (units > config_.budget) {
      auto found = tenants_.find(detail::to_absl(tenant));
      const std::int64_t used = found == tenants_.end() ? 0 : found->second.used;
      return FairShareDecision{.allowed = false,
                               .verdict = FairShareVerdict::kOverBudget,
                               .share = 0,
                               .used = used,
                               .total_used = total_used_};
    }
    Tenant& self = find_or_add(tenant);
    const bool was_active = self.active();
    self.asked = std::min(self.asked + units, config_.budget);  // both ≤ kMaxBudget
    if (!was_active) ++active_;
    FairShareDecision d = decide(self, units);
    if (d.allowed) set_used(self, self.used + units);
    d.used = self.used;
    d.total_used = total_used_;
    return d;
  }

  // Every known tenant with its demand, use and share in the current allocation, by name.
  std::vector<TenantShare> snapshot() const {
    detail::MutexLock lock(mu_);
    std::vector<TenantShare> out;
    for (const auto& [name, t] : tenants_) {
      out.push_back({name, t.weight, t.demand, t.used, t.share, t.constrained});
    }
    std::sort(out.begin(), out.end(),
              [](const TenantShare& x, const TenantShare& y) { return x.tenant < y.tenant; });
    return out;
  }

  std::int64_t total_used() const {
    detail::MutexLock lock(mu_);
    return total_used_;
  }

  // The tenants active in the current period: asked, hold units or have a demand.
  std::int64_t active_tenants() const {
    detail::MutexLock lock(mu_);
    return active_;
  }
};

}  // namespace quota::fair
