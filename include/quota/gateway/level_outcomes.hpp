// quota/gateway/level_outcomes.hpp — what a gateway decision makes of its levels: the
// per-request cap, the combined decision over the levels a backend decided, and the
// metrics each level counts.
//
// `Gateway` (gateway.hpp) plans a request's levels (rules.hpp: one Check per budget),
// asks a backend (backend.hpp) to decide them all or nothing, and turns what the backend
// answers into one decision. These are the pure parts of that, free functions over the
// plan and the backend's parts, with no state of their own:
//   - `over_cap`: a request above a per-request cap (a rule's `max_cost` or the route's)
//     is denied with kRequestTooLarge before any store is asked; a shadow cap only counts.
//   - `combine_levels`: the backend's parts, in plan order, become one decision whose
//     fields all describe one level, the one that decided (`deciding_level`): the first
//     enforcing denial, else the enforcing level that admits the fewest more requests
//     like this one (least remaining / cost). Its rule is named, and its remaining,
//     retry and reset are the answer's, so a RateLimit header never pairs one limit's
//     policy with another's numbers; the version is the highest of any part. A shadow
//     level that would deny is counted and deducts nothing (kShadow on an admission); an
//     admission lists the levels an estimate was deducted from. A backend that answers
//     more parts than levels, none, or stops short without a denial is an InternalError
//     naming the counts: never a silent allow.
//   - `record`: the metrics (metrics.hpp), per rule, route and level: an admitted request
//     counts `allowed` on every enforcing level (or `fail_open_allowed` on the tenant
//     level); a denial counts `denied` on the level that denied; a fail-closed error counts
//     `unavailable` on the tenant level; a shadow level that would deny counts
//     `shadow_would_deny`. A replayed decision (a shared attempt's) counts nowhere.
//
// Thread safety: the functions keep no state; the counters they record into are atomic.
//
//   auto parts = backend.decide(levels, version, now);
//   auto ruled = quota::gateway::combine_levels(*parts, checks, version, {});
//   // ruled->decision.allowed, ruled->rule ("tenant-read", or the denying rule)
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/numeric/int128.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_format.h"
#include "quota/decision.hpp"
#include "quota/gateway/backend.hpp"
#include "quota/gateway/metrics.hpp"
#include "quota/gateway/request.hpp"
#include "quota/gateway/rules.hpp"
#include "quota/gateway/settle.hpp"

namespace quota::gateway {

// A decision with the name of the rule it answers for.
struct RuledDecision {
  Decision decision;
  std::string rule;
  bool replayed = false;          // a shared attempt's recorded decision
  std::optional<Nanos> deadline;  // then: the deadline recorded with it
};

// The levels an estimate was deducted from, and the backend's time of it.
struct Deducted {
  std::vector<TicketLevel> levels;
  Nanos time{0};
};

// Counts outcome `o` of `cost` units on `rule`'s counters (none installed: nothing).
inline void record(const Rule& rule, Outcome o, std::int64_t cost) {
  if (rule.counters != nullptr) rule.counters->record(o, cost);
}

// The tenant level's check of a plan, or its first when it has none.
inline const Check& tenant_check(std::span<const Check> checks) {
  for (const Check& c : checks) {
    if (c.rule->level == Level::kTenant) return c;
  }
  return checks.front();
}

// A request that costs more on a budget than its per-request cap (the rule's max_cost,
// or the route class's): denied with kRequestTooLarge, nothing deducted. A cap of a
// budget in shadow only counts (as shadow_would_deny); the route's cap is in shadow only
// under the global switch (`all_shadow`). nullopt: no cap applies.
inline std::optional<Result> over_cap(bool all_shadow, std::uint64_t version,
                                      const RouteClass& route, std::span<const Check> checks) {
  for (const Check& c : checks) {
    const bool rule_cap = c.rule->max_cost > 0 && c.cost > c.rule->max_cost;
    const bool route_cap = route.max_cost > 0 && c.cost > route.max_cost;
    if (!rule_cap && !route_cap) continue;
    if (rule_cap ? c.shadow : all_shadow) {
      record(*c.rule, Outcome::kShadowWouldDeny, c.cost);
      continue;
    }
    record(*c.rule, Outcome::kDenied, c.cost);
    const Decision too_large{.allowed = false,
                             .remaining = 0,
                             .retry_after = kNever,
                             .reset_after = Nanos{0},
                             .version = version,
                             .reason = Reason::kRequestTooLarge};
    return Result{.decision = too_large,
                  .rule = rule_cap ? c.rule->name : route.name,
                  .replayed = false,
                  .request_cap = rule_cap ? c.rule->max_cost : route.max_cost};
  }
  return std::nullopt;
}

// How the backend's answer came: a replay of a shared attempt (then counted nowhere and
// deducting nothing new) with its recorded deadline, and where to list the levels an
// estimate was deducted from (nullptr: not an estimate).
struct LevelsOrigin {
  bool replayed = false;
  std::optional<Nanos> deadline;
  Deducted* deducted = nullptr;
};

// The level an admission is described by: among the enforcing levels, the one that admits
// the fewest more requests like this one (the least remaining / cost, compared exactly;
// the first of equals); the tenant level when every level is in shadow.
inline std::size_t deciding_level(std::span<const Decision> parts, std::span<const Check> checks) {
  std::optional<std::size_t> best;
  for (std::size_t i = 0; i < parts.size(); ++i) {
    if (checks[i].shadow) continue;
    if (!best ||
        absl::int128(parts[i].remaining) * std::max<std::int64_t>(1, checks[*best].cost) <
            absl::int128(parts[*best].remaining) * std::max<std::int64_t>(1, checks[i].cost)) {
      best = i;
    }
  }
  if (best) return *best;
  const Check& tenant = tenant_check(checks);
  return static_cast<std::size_t>(&tenant - checks.data());
}

// The backend's parts of `checks` (in plan order) as one decision; see the header comment.
inline absl::StatusOr<RuledDecision> combine_levels(const LevelsResult& result,
                                                    std::span<const Check> checks,
                                                    std::uint64_t version,
                                                    const LevelsOrigin& origin) {
  const auto count = [&](const Rule& rule, Outcome o, std::int64_t cost) {
    if (!origin.replayed) record(rule, o, cost);
  };
  const CheckVector<Decision>& parts = result.parts;
  if (parts.empty() || parts.size() > checks.size()) {
    return absl::InternalError(
        absl::StrFormat("gateway backend decided %d of %d levels", parts.size(), checks.size()));
  }
  const auto is_shadow = [&](std::size_t i) { return checks[i].shadow; };
  for (std::size_t i = 0; i < parts.size(); ++i) {
    const Rule& rule = *checks[i].rule;
    if (parts[i].allowed) continue;
    if (checks[i].shadow) {
      count(rule, Outcome::kShadowWouldDeny, checks[i].cost);
      continue;
    }
    // The backend stops at the first enforcing denial: it decides.
    count(rule, Outcome::kDenied, checks[i].cost);
    Decision denial = parts[i];
    denial.version =
        std::max(combine_all(std::span(parts.data(), i + 1), is_shadow).version, version);
    return RuledDecision{.decision = denial,
                         .rule = rule.name,
                         .replayed = origin.replayed,
                         .deadline = origin.deadline};
  }
  if (parts.size() != checks.size()) {
    return absl::InternalError(
        absl::StrFormat("gateway backend stopped after %d of %d levels without a denial",
                        parts.size(), checks.size()));
  }
  Deducted* deducted = origin.deducted;
  for (std::size_t i = 0; i < parts.size(); ++i) {
    if (!parts[i].allowed) continue;  // a shadow level that would deny: nothing deducted
    count(*checks[i].rule, Outcome::kAllowed, checks[i].cost);
    if (deducted != nullptr && checks[i].estimate && !origin.replayed) {
      deducted->levels.push_back({.key = std::string(checks[i].key.view()),
                                  .policy = checks[i].rule->policy,
                                  .version = version});
    }
  }
  if (deducted != nullptr) deducted->time = result.time;
  const Decision all = combine_all(std::span(parts.data(), parts.size()), is_shadow);
  const std::size_t k = deciding_level(std::span(parts.data(), parts.size()), checks);
  Decision admitted = parts[k];
  admitted.allowed = true;  // a shadow level's own denial, when every level is in shadow
  admitted.retry_after = Nanos{0};
  admitted.reason = all.reason;  // kAllowed, or kShadow
  admitted.version = std::max(all.version, version);
  return RuledDecision{.decision = admitted,
                       .rule = checks[k].rule->name,
                       .replayed = origin.replayed,
                       .deadline = origin.deadline};
}

}  // namespace quota::gateway
