// quota/gateway/rules/rule_spec.hpp — the rule model as plain data: route classes, the budgets
// (rules) they draw on, their costs and their rollout. RuleSet::create (rules.hpp)
// validates a RuleSetSpec into the set a gateway decides with; rule files
// (quota/rules/rule_file.hpp, target quota::rules) parse into the same spec.
//
// A rule is one budget: a policy on a scope. Its level says whose budget it is — kUser
// (each user of a tenant), kTenant (the tenant's), kGlobal (everyone's) — and it applies
// to tenants by id or by plan (a tenant's own rule wins over its plan's). What it is
// shared by:
//   - `route` set, `limit` empty: the route class's own budget, one per (level, scope,
//     route); the route's `cost` per request.
//   - `limit` set: one of several named budgets of the scope (per minute + per day +
//     per month; requests beside tokens). With `route` set it is that route class's;
//     with `route` empty it is shared by every route class whose `costs` name it, each
//     paying its own cost — one tenant budget from which a read takes 1 and a create 5.
// A request is decided against every rule that applies to it: all allow, or nothing is
// deducted. A rule with the same identity (level, scope, route, limit) in a later set is
// the same budget: its state is converted, never refilled (key_state.hpp).
//
// Rollout: `shadow` (decided and counted, never denies, deducts nothing when it would
// deny), `enforce_percent` (enforced for that share of tenants, deterministic by tenant;
// shadow for the rest), RuleSetSpec::shadow_all (every rule in shadow; also a call on
// RuleRegistry). `lease` decides the budget from grants each process holds
// (lease_spec.hpp, leased_backend.hpp); `fair_share` holds each tenant to its fair share
// of a global budget near saturation (fair_share_spec.hpp). A per-request cap (`max_cost`
// on a rule or a route class) answers a larger request with Reason::kRequestTooLarge,
// nothing deducted.
//
//   quota::gateway::RuleSetSpec spec{
//       .version = 1,
//       .routes = {{.name = "read", .costs = {{.limit = "units", .units = 1}}},
//                  {.name = "create", .costs = {{.limit = "units", .units = 5}}}},
//       .rules = {{.level = quota::gateway::Level::kTenant, .plan = "free", .name = "free",
//                  .policy = quota::TokenBucket{.rate = {100, 1s}, .burst = 20},
//                  .limit = "units"}}};
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "absl/numeric/int128.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "quota/gateway/fair_share/fair_share_spec.hpp"
#include "quota/gateway/key_state.hpp"
#include "quota/gateway/leases/lease_spec.hpp"
#include "quota/gateway/rules/estimate_formula.hpp"
#include "quota/policy/token_bucket.hpp"
#include "quota/units.hpp"

namespace quota::gateway {

enum class FailMode : std::uint8_t { kClosed = 0, kOpen = 1 };
enum class Level : std::uint8_t { kUser = 0, kTenant = 1, kGlobal = 2 };

// Per-request lists of budgets (RuleSet::plan(), the backends' decisions) are
// CheckVectors: inline up to kInlineChecks entries, so a decision allocates nothing for
// them; a request under more rules spills to the heap and stays correct.
inline constexpr std::size_t kInlineChecks = 6;
template <class T>
using CheckVector = absl::InlinedVector<T, kInlineChecks>;

constexpr std::string_view to_string(Level l) {
  switch (l) {
    case Level::kUser:
      return "user";
    case Level::kTenant:
      return "tenant";
    case Level::kGlobal:
      return "global";
  }
  return "unknown";
}

// The local bucket a fail-open route admits from while the store is unreachable: per
// process and per key, its own rate and burst, and at most `max_duration` after the
// outage began (then the route fails closed). Extra admitted per key, per process, per
// outage: at most outage_allowance() = burst + ceil(rate · max_duration) units.
struct EmergencyBucket {
  Rate rate{.units = 0, .per = std::chrono::seconds(1)};
  std::int64_t burst = 1;
  Nanos max_duration{0};

  absl::Status validate() const {
    if (auto s = TokenBucket{.rate = rate, .burst = burst}.validate(); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("emergency: ", s.message()));
    }
    if (max_duration.count() < 0) {
      return absl::InvalidArgumentError("emergency.max_duration must be >= 0");
    }
    if (outage_allowance_wide() > absl::int128(kMaxUnits)) {
      return absl::InvalidArgumentError(
          absl::StrFormat("emergency: burst + rate*max_duration exceeds %d units", kMaxUnits));
    }
    return absl::OkStatus();
  }

  // The documented bound on what one outage can add, in whole units (rounded up).
  std::int64_t outage_allowance() const {
    return static_cast<std::int64_t>(outage_allowance_wide());
  }

 private:
  absl::int128 outage_allowance_wide() const {
    return absl::int128(burst) +
           quota::detail::ceil_div(absl::int128(rate.units) * max_duration.count(),
                                   rate.per.count());
  }
};

// What a route class pays against one named budget (RuleSpec::limit): `units` whole
// units per request, or with `estimate` the request's estimate (Gateway::
// acquire_estimate; `units` when the request gives none), settled later.
struct RouteCost {
  std::string limit{};
  std::int64_t units = 1;
  bool estimate = false;
};

// A route class: one entry of the whitelist (`read`, `create`, ...), with its cost in
// whole units against its own rules and against the named budgets it lists in `costs`,
// its fail mode (fail_closed / fail_open with a local emergency bucket: request.hpp,
// is_unavailable) and its per-request cap. A request for a class not in the list is
// InvalidArgument, never a new key.
struct RouteClass {
  std::string name{};
  std::int64_t cost = 1;  // whole units per request against the rules without a cost entry
  FailMode fail_mode = FailMode::kClosed;
  EmergencyBucket emergency{};  // used when fail_mode == kOpen
  std::vector<RouteCost> costs{};
  std::int64_t max_cost = 0;  // a request costing more on any budget: kRequestTooLarge; 0: none
  // The estimate of a request from its prompt tokens and max output (estimate_formula.hpp);
  // off by default.
  EstimateFormula estimate_formula{};
};

// A rule: one budget (see the header comment).
struct RuleSpec {
  Level level = Level::kTenant;
  std::string tenant{};  // kUser/kTenant: exactly one of tenant, plan; kGlobal: neither
  std::string plan{};
  std::string route{};  // the route class; empty only with `limit` (shared by routes)
  std::string name{};   // metrics label: keep the set of names small
  RulePolicy policy{};
  bool shadow = false;
  std::string limit{};         // the budget's name within its scope; empty: the route's own
  int enforce_percent = 100;   // 0..100: the share of tenants it enforces on; shadow for the rest
  std::int64_t max_cost = 0;   // per-request cap in whole units; 0: none
  LeaseSpec lease{};           // decided locally from grants (lease_spec.hpp); off by default
  FairShareSpec fair_share{};  // global rules: fair shares near saturation (fair_share_spec.hpp)
};

struct RuleSetSpec {
  // Returned in every decision made with the set and stored with each key's state
  // (key_state.hpp), so a later set with other parameters converts the state without
  // handing out a burst.
  std::uint64_t version = 1;
  std::vector<RouteClass> routes{};
  std::vector<RuleSpec> rules{};
  bool shadow_all = false;  // every rule in shadow: decided and counted, nothing denied
};

}  // namespace quota::gateway
