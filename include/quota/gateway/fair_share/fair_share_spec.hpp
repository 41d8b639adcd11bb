// quota/gateway/fair_share/fair_share_spec.hpp — the `fair_share` option of a rule: fair shares of
// a budget shared by every tenant near saturation.
//
// A global rule (the one budget level shared by tenants) with `fair_share` enabled is
// decided, in each gateway process, by a quota::fair::FairShare allocator
// (fair/fair_share.hpp) BEFORE its store is asked: the request's tenant asks the allocator
// for the request's cost; an admission by the allocator goes on to the budget's policy as
// before, a refusal is the request's answer (Reason::kOverShare or kPaused, nothing
// deducted anywhere). The allocator divides `budget` units held per `period` (default: the
// policy's rate × period, e.g. 4,000,000 tokens/min over 10 s = 666,666): below
// `shares_above` tenants draw freely, above it each active tenant is held to its exact
// weighted max-min share of budget − reserve, and above `pause_above` new admissions
// pause. Admitted units count as in use for one period. The Gateway keeps the allocator
// (gateway/fair_share/fair_limits.hpp).
//
// Validation (RuleSet::create, naming the field): only on a global rule; 0 ≤ reserve <
// 100 %; 0 < shares_above ≤ pause_above ≤ 100 %; pause_above ≥ 100 % − reserve (the
// pause never cuts into the shares); period > 0; budget ≥ 1 (given, or derived from the
// policy and the period) and ≤ fair::kMaxBudget. Thresholds are in permille (‰) of the
// budget; rule files write them in percent (`10%`, `72.5%`). `weights` gives each
// tenant (the request's tenant id) its weight in the shares (fair/tenant_weights.hpp:
// `weights.by_tenant` by name, else `weights.default_weight`; each in [1, 2^32]); the
// rule carries them, so every holder of the budget computes the same shares.
//
// Thread safety: a value.
//
//   quota::gateway::RuleSpec global{.level = quota::gateway::Level::kGlobal, ...,
//       .fair_share = {.enabled = true, .reserve_permille = 100,
//                      .shares_above_permille = 700, .pause_above_permille = 900,
//                      .period = 10s,
//                      .weights = {.default_weight = 1, .by_tenant = {{"acme", 3}}}}};
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <type_traits>
#include <variant>

#include "absl/numeric/int128.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "quota/fair/fair_share_config.hpp"
#include "quota/fair/tenant_weights.hpp"
#include "quota/gateway/key_state.hpp"
#include "quota/policy/token_bucket.hpp"
#include "quota/units.hpp"

namespace quota::gateway {

struct FairShareSpec {
  bool enabled = false;
  std::int64_t reserve_permille = 100;       // never part of a share
  std::int64_t shares_above_permille = 700;  // load above it: weighted max-min shares
  std::int64_t pause_above_permille = 900;   // units in use above it: admissions paused
  // One allocation period: shares are recomputed at every multiple of it on the
  // gateway's clock, and an admitted unit is in use for one period.
  Nanos period = std::chrono::seconds(10);
  // Units in use the allocator divides; 0: the policy's rate × period (budget_for()).
  std::int64_t budget = 0;
  // Each tenant's weight in the weighted max-min shares.
  fair::TenantWeights weights{};

  friend bool operator==(const FairShareSpec&, const FairShareSpec&) = default;

  // The budget the allocator divides: `budget` when given, else ⌊rate · period⌋ with the
  // policy's rate (a token bucket's refill rate; limit / window for the window kinds).
  std::int64_t budget_for(const RulePolicy& policy) const {
    if (budget > 0) return budget;
    const absl::int128 v = std::visit(
        [&](const auto& p) -> absl::int128 {
          if constexpr (std::is_same_v<std::decay_t<decltype(p)>, TokenBucket>) {
            return absl::int128(p.rate.units) * period.count() / p.rate.per.count();
          } else {
            return absl::int128(p.limit) * period.count() / p.window.count();
          }
        },
        policy);
    return v > absl::int128(fair::kMaxBudget) ? fair::kMaxBudget + 1 : static_cast<std::int64_t>(v);
  }

  // The allocator's config when each of `holders` processes divides an equal part of the
  // budget (GatewayOptions::fair_share_holders): ⌊budget / holders⌋, at least 1.
  fair::FairShareConfig config(const RulePolicy& policy, std::int64_t holders = 1) const {
    const std::int64_t part = budget_for(policy) / (holders < 1 ? 1 : holders);
    return {.budget = part < 1 ? 1 : part,
            .reserve_permille = reserve_permille,
            .share_permille = shares_above_permille,
            .pause_permille = pause_above_permille};
  }

  // Checks the option of a rule with `policy`, `global` when the rule is on the global
  // level; the message names the field ("fair_share.pause_above ...").
  absl::Status validate(bool global, const RulePolicy& policy) const {
    if (!enabled) return absl::OkStatus();
    if (!global) {
      return absl::InvalidArgumentError(
          "fair_share applies only to a budget shared by tenants: a global rule");
    }
    if (reserve_permille < 0 || reserve_permille >= 1000) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "fair_share.reserve is %s; it must be in [0%%, 100%%)", percent(reserve_permille)));
    }
    if (shares_above_permille < 1 || shares_above_permille > 1000) {
      return absl::InvalidArgumentError(
          absl::StrFormat("fair_share.shares_above is %s; it must be in (0%%, 100%%]",
                          percent(shares_above_permille)));
    }
    if (pause_above_permille < shares_above_permille || pause_above_permille > 1000) {
      return absl::InvalidArgumentError(
          absl::StrFormat("fair_share.pause_above is %s; it must be in [shares_above (%s), 100%%]",
                          percent(pause_above_permille), percent(shares_above_permille)));
    }
    if (pause_above_permille < 1000 - reserve_permille) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "fair_share.pause_above is %s; it must be >= 100%% - reserve (%s) so that the pause "
          "never cuts into the shares",
          percent(pause_above_permille), percent(1000 - reserve_permille)));
    }
    if (period <= Nanos{0}) return absl::InvalidArgumentError("fair_share.period must be positive");
    if (auto s = weights.validate("fair_share"); !s.ok()) return s;
    if (budget < 0) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "fair_share.budget is %d; it must be >= 1 (or 0: rate x period)", budget));
    }
    const std::int64_t b = budget_for(policy);
    if (budget > fair::kMaxBudget) {
      return absl::InvalidArgumentError(
          absl::StrFormat("fair_share.budget is %d; it must be <= %d", budget, fair::kMaxBudget));
    }
    if (b < 1 || b > fair::kMaxBudget) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "fair_share.period gives a budget (the policy's rate x period) of %s units; it must "
          "be in [1, %d] (or give fair_share.budget)",
          b > fair::kMaxBudget ? "more than the largest" : absl::StrCat(b), fair::kMaxBudget));
    }
    return absl::OkStatus();
  }

 private:
  static std::string percent(std::int64_t permille) {
    const std::int64_t a = permille < 0 ? -permille : permille;
    return absl::StrFormat("%s%d%s%%", permille < 0 ? "-" : "", a / 10,
                           a % 10 == 0 ? "" : absl::StrCat(".", a % 10));
  }
};

}  // namespace quota::gateway
