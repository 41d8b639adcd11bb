// quota/gateway/fair_share/fair_limits.hpp — the fair-share allocators of a gateway's global
// budgets.
//
// A Gateway (gateway.hpp) keeps one FairLimits: for each budget whose rule has
// `fair_share` (fair_share_spec.hpp) — a global rule, one store key shared by every
// tenant — a quota::fair::FairShare allocator (fair/fair_share.hpp) with the rule's
// thresholds and budget. Before the store decides a request, admit() asks each such
// budget's allocator for the request's tenant and cost (FairShare::request); a refusal is
// the request's answer (Reason::kOverShare, or kPaused above the pause threshold; a cost
// above the allocator's whole budget is kRequestTooLarge with the budget as the cap),
// counted `denied` on the rule, and nothing is deducted anywhere. After the store decided,
// commit() keeps the units in use for one period when the store admitted the request, and
// release() gives them back at once otherwise (denied, error, fail mode, a replayed
// attempt): all or nothing across the levels holds.
//
// Periods, on the gateway's clock (decide()'s `now` plus GatewayOptions::
// fair_share_clock_offset, which aligns holders on several hosts): the allocator allocates
// at every multiple of the rule's period (the first request of a period runs the allocations of the
// boundaries passed, at most kMaxCatchUp; older ones only halve estimates that are 0 by
// then), and units admitted at t leave its use at t + period (expiries of each boundary
// before its allocation). Every allocation is checked (Σ shares ≤ budget − reserve) and
// counted in stats().
//
// Where it sits: in this process, where a leased global budget's grant is held
// (LeasedBackend), so the shares split the units this process admits. With H processes:
//  - without an exchange, GatewayOptions::fair_share_holders = H gives each allocator the
//    fixed part P = ⌊budget / H⌋: Σ shares ≤ P − ⌈P·reserve⌉ per process; a tenant alone
//    may use one process's P, not more;
//  - with a FairAsksExchange (fair_asks_exchange.hpp), each allocator divides the whole
//    budget; at its first request of period n it reports its asks of its last period and
//    reads every holder's asks of period n − 2 (sealed: the same view everywhere), and
//    FairShare::allocate_split holds each tenant here to ⌊share_t · local_t / total_t⌋ of
//    its share of budget − reserve over all holders (holder_split.hpp): Σ over holders and
//    tenants ≤ budget − reserve; a tenant alone here and in the view may use the whole
//    budget; a tenant new here (asked last period, no local asks in the view) gets a
//    provisional part of the pool and of this holder's parts (newcomer_parts). If the
//    exchange fails, that period falls back to P: shares of P − ⌈P·reserve⌉ among this
//    process's own asks, a lone tenant capped at P, no free regime (counted
//    exchange_failures); a late report is counted late_reports.
// The global envelope (r·T + B + Σ outstanding grants) is the store's and the leases',
// unchanged: the allocator only refuses.
//
// Each tenant's weight is the rule's (FairShareSpec::weights), in every allocation here
// and for every tenant of the holders' view.
//
// The reserve (⌈budget · reserve⌉, never part of a share) can be released by an operator
// to one tenant for a while (release_reserve): a request its share refuses is then
// admitted from the release while the tenant holds at most the released units so
// admitted; the releases of a budget add up to at most the reserve, so Σ shares + Σ
// releases ≤ budget still holds. A release ends at its time; what it admitted stays in
// use for its period, as every unit.
//
// A rule change that keeps a budget's rule name, fair_share, policy and holders keeps its
// allocator; any other change starts a fresh one (the units in use are forgotten).
//
// Thread safety: any thread; one mutex per budget (the allocator's own mutex within it).
// The exchange is called under the budget's mutex, once per period: that budget's other
// requests in this process wait for it (at most the exchange's deadline).
//
//   FairLimits fair(/*holders=*/1);
//   FairLimits::Reserved held;
//   if (auto denied = fair.admit(checks, "acme", version, now, held)) return denied->decision;
//   ... the store decides; then fair.commit(held, now) or fair.release(held);
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <queue>
#include <span>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/numeric/int128.h"
#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "quota/decision.hpp"
#include "quota/detail/keyed_states.hpp"
#include "quota/detail/mutex.hpp"
#include "quota/fair/fair_share.hpp"
#include "quota/gateway/fair_share/fair_asks_exchange.hpp"
#include "quota/gateway/metrics.hpp"
#include "quota/gateway/rules/rules.hpp"

namespace quota::gateway {

// What the allocator of one fair-share budget did so far (FairLimits::stats).
struct FairLimitStats {
  std::string key{};
  std::string rule{};  // the rule's name
  fair::FairShareConfig config{};
  std::int64_t units_in_use = 0;    // admitted units still in use (for one period each)
  std::int64_t active_tenants = 0;  // tenants that asked, hold units or have a demand
  std::int64_t allocations = 0;
  std::int64_t allocation_errors = 0;  // allocate() failed (Σ shares > capacity: never)
  std::int64_t max_share_sum = 0;      // the largest Σ shares of an allocation
  std::int64_t over_share = 0;         // refusals by share
  std::int64_t paused = 0;             // refusals above the pause threshold
  std::int64_t too_large = 0;          // costs above the allocator's budget
  std::int64_t exchange_failures = 0;  // allocations on the fallback part (exchange failed)
  std::int64_t late_reports = 0;       // this holder's reports that came after the seal
  std::int64_t reserve_units = 0;      // the reserve this process may release (release_reserve)
  std::optional<fair::FairShareAllocation> last{};  // the latest allocation
  std::vector<fair::TenantShare> tenants{};         // the current allocation, by tenant
};

// An operator's release of a fair-share budget's reserve to one tenant
// (FairLimits::release_reserve), as FairLimits::reserve_releases reports it.
struct ReserveRelease {
  std::string rule{};
  std::string tenant{};
  std::int64_t units = 0;   // released: the tenant may hold this many beyond its share
  std::int64_t in_use = 0;  // of them, admitted and still in use (one period each)
  Nanos until{0};           // no admission from it at or after this time
};

namespace detail {

// One fair-share budget: its allocator, its period and the admitted units' expiries.
struct FairLimitState {
  FairLimitState(const Rule& r, std::int64_t holders, bool shared)
      : rule_name(r.name),
        spec(r.fair_share),
        policy(r.policy),
        fallback(spec.config(policy, holders)),
        share(std::make_unique<fair::FairShare>(shared ? spec.config(policy, 1) : fallback,
                                                spec.weights)) {}

  struct Expiry {
    Nanos at;
    std::string tenant;
    std::int64_t units;
    bool from_reserve = false;  // admitted from an operator's release (FairLimits::release_reserve)
    bool operator>(const Expiry& o) const { return at > o.at; }
  };

  const std::string rule_name;
  const FairShareSpec spec;
  const RulePolicy policy;
  const fair::FairShareConfig fallback;          // the fixed part ⌊budget / holders⌋
  const std::unique_ptr<fair::FairShare> share;  // thread-safe on its own
  quota::detail::Mutex mu;
  bool started ABSL_GUARDED_BY(mu) = false;
  std::int64_t period_index ABSL_GUARDED_BY(mu) = 0;  // ⌊now / period⌋ of the last allocation
  std::priority_queue<Expiry, std::vector<Expiry>, std::greater<>> expiries ABSL_GUARDED_BY(mu);
  FairLimitStats stats ABSL_GUARDED_BY(mu);
};

}  // namespace detail

class FairLimits {
 public:
  // The most boundaries one request allocates for (an idle budget's estimates are 0 long
  // before: each allocation halves them).
  static constexpr std::int64_t kMaxCatchUp = 64;

  explicit FairLimits(std::int64_t holders = 1,
                      std::shared_ptr<FairAsksExchange> exchange = nullptr)
      : holders_(std::max<std::int64_t>(1, holders)), exchange_(std::move(exchange)) {}

  struct Denial {
    Decision decision;
    const Rule* rule = nullptr;
    std::int64_t request_cap = 0;  // kRequestTooLarge: the allocator's budget
  };

  // Units a request holds in allocators until commit() or release().
  class Reserved {
   public:
    bool empty() const { return held_.empty(); }

   private:
    friend class FairLimits;
    struct Held {
      std::shared_ptr<detail::FairLimitState> limit;
      std::int64_t units;
      bool from_reserve = false;
    };
    std::string tenant_;
    CheckVector<Held> held_;
  };

  // Asks the allocator of every fair-share check (in order) for `tenant` and the check's
  // cost. A refusal of an enforcing check: the Denial (counted `denied` on its rule; what
  // earlier checks reserved is given back). A shadow check that would be refused is
  // counted `shadow_would_deny` and passes, nothing reserved. Else nullopt, with `out`
  // holding what was reserved.
  std::optional<Denial> admit(std::span<const Check> checks, std::string_view tenant,
                              std::uint64_t version, Nanos now, Reserved& out) {
    for (const Check& c : checks) {
      if (!c.rule->fair_share.enabled) continue;
      std::shared_ptr<detail::FairLimitState> limit = state_for(*c.rule, c.key.view());
      quota::detail::MutexLock lock(limit->mu);
      tick(*limit, c.key.view(), now);
      auto d = limit->share->request(tenant, c.cost);
      const bool shared = d.ok() && d->allowed;
      // Refused its share: an operator's release of the reserve to this tenant may admit it.
      if (shared || (!c.shadow && take_reserve(limit->rule_name, tenant, c.cost, now))) {
        if (out.held_.empty()) out.tenant_ = std::string(tenant);
        out.held_.push_back({.limit = std::move(limit), .units = c.cost, .from_reserve = !shared});
        continue;
      }
      // An allocator error (none with a validated rule) refuses: never a silent allow.
      const fair::FairShareVerdict v = d.ok() ? d->verdict : fair::FairShareVerdict::kOverShare;
      if (c.shadow) {
        if (c.rule->counters != nullptr)
          c.rule->counters->record(Outcome::kShadowWouldDeny, c.cost);
        continue;
      }
      if (c.rule->counters != nullptr) c.rule->counters->record(Outcome::kDenied, c.cost);
      Denial denial = refusal(*limit, v, c.cost, version, now);
      denial.rule = c.rule;
      release(out);
      return denial;
    }
    return std::nullopt;
  }

  // The store admitted the request: its units stay in use for one period from `now`.
  void commit(Reserved& r, Nanos now) {
    for (auto& h : r.held_) {
      quota::detail::MutexLock lock(h.limit->mu);
      h.limit->expiries.push({.at = quota::detail::saturating_add(now, h.limit->spec.period),
                              .tenant = r.tenant_,
                              .units = h.units,
                              .from_reserve = h.from_reserve});
    }
    r.held_.clear();
  }

  // The request was not admitted: its units leave the allocators' use at once.
  void release(Reserved& r) {
    for (auto& h : r.held_) {
      if (h.from_reserve) {
        return_reserve(h.limit->rule_name, r.tenant_, h.units);
      } else {
        (void)h.limit->share->expire(r.tenant_, h.units);
      }
    }
    r.held_.clear();
  }

  // The most releases one budget keeps at once (each a series on /metrics).
  static constexpr std::size_t kMaxReleases = 64;

  // An operator's release of `rule`'s reserve (a global rule with fair_share) to `tenant`:
  // until `until`, a request of the tenant that its share refuses is admitted while the
  // tenant holds at most `units` so admitted (each in use one period, as every unit).
  // The releases of a budget add up to at most its reserve, ⌈budget · reserve⌉ — with
  // several holders each process's part of it (⌊reserve / holders⌋ with an exchange; the
  // reserve of its own part of the budget without) — so Σ shares + Σ releases ≤ budget.
  // A release for a tenant that has one replaces it (its units in use stay counted).
  // InvalidArgument names what is wrong (units < 1, until not after now, a tenant id that
  // is not one, a rule without fair_share); FailedPrecondition when the reserve left is
  // short (the message says how much is left), ResourceExhausted past kMaxReleases.
  absl::Status release_reserve(const Rule& rule, std::string_view tenant, std::int64_t units,
                               Nanos until, Nanos now) {
    if (!rule.fair_share.enabled) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "rule \"%s\" has no fair_share: it has no reserve to release", rule.name));
    }
    if (auto s = check_id(tenant, "tenant"); !s.ok()) return s;
    if (units < 1) {
      return absl::InvalidArgumentError(absl::StrFormat("units %d: at least 1", units));
    }
    if (until <= now) {
      return absl::InvalidArgumentError("the release must end after now");
    }
    const std::int64_t reserve = reserve_of(rule.fair_share, rule.policy);
    quota::detail::MutexLock lock(reserves_mu_);
    auto& book = reserves_[rule.name];
    std::int64_t others = 0;
    for (auto it = book.begin(); it != book.end();) {
      if (it->second.until <= now && it->second.in_use == 0) {
        book.erase(it++);  // ended and nothing of it in use: forgotten
        continue;
      }
      if (it->first != tenant && it->second.until > now) others += it->second.units;
      ++it;
    }
    if (others + units > reserve) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "rule \"%s\": %d units asked, %d of its reserve of %d left (released to other "
          "tenants: %d)",
          rule.name, units, reserve - others, reserve, others));
    }
    auto [it, fresh] = book.try_emplace(std::string(tenant));
    if (fresh && book.size() > kMaxReleases) {
      book.erase(it);
      return absl::ResourceExhaustedError(
          absl::StrFormat("rule \"%s\": %d releases kept already", rule.name, kMaxReleases));
    }
    it->second.units = units;
    it->second.until = until;
    any_release_.store(true, std::memory_order_relaxed);
    return absl::OkStatus();
  }

  // The reserve releases kept (live, or ended with units still in use), by rule and tenant.
  std::vector<ReserveRelease> reserve_releases() const {
    std::vector<ReserveRelease> out;
    quota::detail::MutexLock lock(reserves_mu_);
    for (const auto& [rule, book] : reserves_) {
      for (const auto& [tenant, r] : book) {
        out.push_back({.rule = rule,
                       .tenant = tenant,
                       .units = r.units,
                       .in_use = r.in_use,
                       .until = r.until});
      }
    }
    std::sort(out.begin(), out.end(), [](const ReserveRelease& a, const ReserveRelease& b) {
      return std::tie(a.rule, a.tenant) < std::tie(b.rule, b.tenant);
    });
    return out;
  }

  // The reserve this process may release of a budget with `spec` on `policy`: see
  // release_reserve.
  std::int64_t reserve_of(const FairShareSpec& spec, const RulePolicy& policy) const {
    const fair::FairShareConfig c = spec.config(policy, exchange_ ? 1 : holders_);
    const std::int64_t reserve = c.budget - c.share_capacity();
    return exchange_ ? reserve / holders_ : reserve;
  }

  // Every fair-share budget this gateway decided, by key.
  std::vector<FairLimitStats> stats() const {
    std::vector<std::pair<std::string, std::shared_ptr<detail::FairLimitState>>> all;
    {
      quota::detail::MutexLock lock(mu_);
      for (const auto& [key, s] : limits_) all.emplace_back(key, s);
    }
    std::sort(all.begin(), all.end(),
              [](const auto& a, const auto& b) { return a.first < b.first; });
    std::vector<FairLimitStats> out;
    for (const auto& [key, s] : all) {
      quota::detail::MutexLock lock(s->mu);
      FairLimitStats st = s->stats;
      st.key = key;
      st.rule = s->rule_name;
      st.config = s->share->config();
      st.units_in_use = s->share->total_used();
      st.active_tenants = s->share->active_tenants();
      st.tenants = s->share->snapshot();
      st.reserve_units = reserve_of(s->spec, s->policy);
      out.push_back(std::move(st));
    }
    return out;
  }

  std::int64_t holders() const { return holders_; }

 private:
  // The budget's state, fresh when its rule's name, fair_share or policy changed.
  std::shared_ptr<detail::FairLimitState> state_for(const Rule& rule, std::string_view key) {
    quota::detail::MutexLock lock(mu_);
    auto it = limits_.find(quota::detail::to_absl(key));
    if (it != limits_.end() && it->second->spec == rule.fair_share &&
        it->second->rule_name == rule.name &&
        detail::same_params(it->second->policy, rule.policy)) {
      return it->second;
    }
    auto fresh = std::make_shared<detail::FairLimitState>(rule, holders_, exchange_ != nullptr);
    if (it == limits_.end()) {
      limits_.emplace(std::string(key), fresh);
    } else {
      it->second = fresh;
    }
    return fresh;
  }

  // The start of period `b` of length `period`: b·period, saturated at the ends of Nanos
  // (a time near them has no boundary beyond them to reach).
  static Nanos boundary(std::int64_t b, std::int64_t period) {
    const absl::int128 t = absl::int128(b) * period;
    if (t > Nanos::max().count()) return Nanos::max();
    if (t < Nanos::min().count()) return Nanos::min();
    return Nanos{static_cast<std::int64_t>(t)};
  }

  // Expires what is due and allocates at every period boundary passed, in time order.
  void tick(detail::FairLimitState& s, std::string_view key, Nanos now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu) {
    const std::int64_t period = s.spec.period.count();
    const std::int64_t index = now.count() / period - (now.count() % period < 0 ? 1 : 0);
    const auto expire_until = [&](Nanos t) {
      while (!s.expiries.empty() && s.expiries.top().at <= t) {
        const auto& e = s.expiries.top();
        if (e.from_reserve) {
          return_reserve(s.rule_name, e.tenant, e.units);
        } else {
          (void)s.share->expire(e.tenant, e.units);
        }
        s.expiries.pop();
      }
    };
    if (!s.started) {  // the first request: the boundary of its period starts the first
      s.started = true;
      s.period_index = index == INT64_MIN ? index : index - 1;
    }
    if (index > s.period_index && exchange_ != nullptr) {
      expire_until(boundary(index, period));
      allocate_shared(s, key, index);
      s.period_index = index;
    } else if (index > s.period_index) {
      // The last kMaxCatchUp periods up to `index`, counted down from it (index > period_index,
      // so neither end leaves int64).
      const std::int64_t count = static_cast<std::int64_t>(
          std::min<absl::int128>(absl::int128(index) - s.period_index, kMaxCatchUp));
      for (std::int64_t left = count; left > 0; --left) {
        expire_until(boundary(index - (left - 1), period));
        auto a = s.share->allocate();
        ++s.stats.allocations;
        if (!a.ok()) {
          ++s.stats.allocation_errors;
          continue;
        }
        s.stats.max_share_sum = std::max(s.stats.max_share_sum, a->share_sum);
        s.stats.last = *a;
      }
      s.period_index = index;
    }
    expire_until(now);
  }

  // One allocation over every holder (one exchange call), or on the fallback part.
  void allocate_shared(detail::FairLimitState& s, std::string_view key, std::int64_t index)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu) {
    const auto asks = s.share->asked();
    auto view = exchange_->exchange(key, s.spec.period, s.period_index, asks, index - 2);
    absl::StatusOr<fair::FairShareAllocation> a;
    if (view.ok()) {
      if (view->late) ++s.stats.late_reports;
      // The weights come from the rule, which every holder shares: the same shares everywhere.
      for (fair::HolderDemand& d : view->tenants) d.weight = s.spec.weights.of(d.tenant);
      // Tenants that asked here last period and have no local asks in the view (two
      // periods old) are new here: provisional parts (holder_split.hpp, newcomer_parts).
      std::vector<fair::Newcomer> newcomers;
      auto seen = view->tenants.begin();
      for (const auto& [tenant, n] : asks) {
        while (seen != view->tenants.end() && seen->tenant < tenant) ++seen;
        if (seen != view->tenants.end() && seen->tenant == tenant && seen->local > 0) continue;
        newcomers.push_back({.tenant = tenant, .weight = s.spec.weights.of(tenant), .asked = n});
      }
      const fair::FairShareConfig& whole = s.share->config();
      a = s.share->allocate_split(whole.share_capacity(), view->tenants, whole.budget, true,
                                  {.holders = holders_,
                                   .fixed_capacity = s.fallback.share_capacity(),
                                   .tenants = newcomers});
    } else {
      ++s.stats.exchange_failures;
      std::vector<fair::HolderDemand> own;
      for (const auto& [tenant, n] : asks)
        own.push_back(
            {.tenant = tenant, .weight = s.spec.weights.of(tenant), .total = n, .local = n});
      a = s.share->allocate_split(s.fallback.share_capacity(), own, s.fallback.budget, false);
    }
    ++s.stats.allocations;
    if (!a.ok()) {
      ++s.stats.allocation_errors;
      return;
    }
    s.stats.max_share_sum = std::max(s.stats.max_share_sum, a->share_sum);
    s.stats.last = *a;
  }

  // The answer to a refusal by the allocator: when to try again is the next allocation
  // (a new share), or for a pause the first expiry if it comes sooner.
  static Denial refusal(detail::FairLimitState& s, fair::FairShareVerdict v, std::int64_t units,
                        std::uint64_t version, Nanos now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu) {
    const std::int64_t period = s.spec.period.count();
    const absl::int128 until =
        absl::int128(boundary(s.period_index, period).count()) + period - now.count();
    const Nanos wait{
        static_cast<std::int64_t>(std::clamp<absl::int128>(until, 1, Nanos::max().count()))};
    Decision d{.allowed = false,
               .remaining = 0,
               .retry_after = wait,
               .reset_after = wait,
               .version = version,
               .reason = Reason::kOverShare};
    const std::int64_t budget = s.share->config().budget;
    if (units > budget) {  // can never pass this allocator
      ++s.stats.too_large;
      d.reason = Reason::kRequestTooLarge;
      d.retry_after = kNever;
      return {.decision = d, .rule = nullptr, .request_cap = budget};
    }
    if (v == fair::FairShareVerdict::kPaused || v == fair::FairShareVerdict::kOverBudget) {
      ++s.stats.paused;
      d.reason = Reason::kPaused;
      if (!s.expiries.empty())
        d.retry_after = std::clamp(s.expiries.top().at - now, Nanos{1}, wait);
      return {.decision = d, .rule = nullptr, .request_cap = 0};
    }
    ++s.stats.over_share;
    return {.decision = d, .rule = nullptr, .request_cap = 0};
  }

  // A release of a budget's reserve to one tenant (release_reserve).
  struct Release {
    std::int64_t units = 0;
    std::int64_t in_use = 0;
    Nanos until{0};
  };

  // Admits `units` of `tenant` from its release of `rule`'s reserve when one is live with
  // room; true when it did.
  bool take_reserve(const std::string& rule, std::string_view tenant, std::int64_t units,
                    Nanos now) {
    // (a gateway whose operator never released anything takes no lock for its refusals)
    if (!any_release_.load(std::memory_order_relaxed)) return false;
    quota::detail::MutexLock lock(reserves_mu_);
    Release* r = find_release(rule, tenant);
    if (r == nullptr || r->until <= now || r->in_use > r->units - units) return false;
    r->in_use += units;
    return true;
  }

  // Units admitted from a release leave its use (their period ended, or the request was
  // not admitted after all).
  void return_reserve(const std::string& rule, std::string_view tenant, std::int64_t units) {
    quota::detail::MutexLock lock(reserves_mu_);
    if (Release* r = find_release(rule, tenant))
      r->in_use = std::max<std::int64_t>(0, r->in_use - units);
  }

  // `tenant`'s release of `rule`'s reserve, or null.
  Release* find_release(const std::string& rule, std::string_view tenant)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(reserves_mu_) {
    auto book = reserves_.find(rule);
    if (book == reserves_.end()) return nullptr;
    auto it = book->second.find(quota::detail::to_absl(tenant));
    return it == book->second.end() ? nullptr : &it->second;
  }

  const std::int64_t holders_;
  const std::shared_ptr<FairAsksExchange> exchange_;
  // Taken after a budget's mutex, never before it.
  mutable quota::detail::Mutex reserves_mu_;
  std::atomic<bool> any_release_{false};  // a release was ever made
  absl::flat_hash_map<std::string, absl::flat_hash_map<std::string, Release>> reserves_
      ABSL_GUARDED_BY(reserves_mu_);
  mutable quota::detail::Mutex mu_;
  absl::flat_hash_map<std::string, std::shared_ptr<detail::FairLimitState>> limits_
      ABSL_GUARDED_BY(mu_);
};

}  // namespace quota::gateway
