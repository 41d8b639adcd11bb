// quota/gateway/gateway.hpp — the layer a gateway author calls: one decision per request.
//
// `Gateway::decide({who, route}, now)` takes the rules in force (rules.hpp), builds
// the keys from the authenticated identity and the whitelisted route class, and decides
// every budget level the request must pass — user, tenant, global — through a Backend
// chosen at run time (backend.hpp): an in-process store of KeyStates (`LocalStore<KeyPolicy>`
// for one thread, `ShardedStore<KeyPolicy>` for many), `quota::redis::GatewayStore`, shared
// by every gateway process, or a decorator of either (leases, regions). The requests,
// results and options are in request.hpp. A decision's steps are this class's private
// members, in the order they run: the plan, the deadline, the per-request cap, the
// attempt, fair shares, the backend (`run`), the combined decision and its counts.
//
// Guarantees: the levels are all or nothing (a denial leaves no level with a deduction);
// a rule change never hands out a burst (key_state.hpp); an unreachable store is answered
// by the route's fail mode (fail closed, or a bounded local emergency bucket); with an
// attempt id a retry replays the first decision (attempts.hpp) and a request past its
// deadline decides nothing (Reason::kAttemptExpired); an estimate is settled
// once (settle.hpp); every outcome is counted per rule, route and level (metrics.hpp); a
// global rule with fair_share asks its allocator first (fair_limits.hpp): kOverShare or
// kPaused, nothing deducted.
// The details are on decide() and on the declarations below.
//
// Thread safety: that of the store (ShardedStore, GatewayStore: any thread). Rule reloads
// go through the RuleRegistry and never block decisions.
//
//   quota::ShardedStore<quota::gateway::KeyPolicy> store;
//   quota::gateway::RuleRegistry registry(*quota::gateway::RuleSet::create(spec));
//   quota::gateway::Gateway gw(store, registry);
//   auto r = gw.decide({.who = {.tenant = "acme", .plan = "free"}, .route = "read"}, clock.now());
//   // r->decision.allowed, r->decision.version, quota::http::answer(r->decision, ...)
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/numeric/int128.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "quota/attempts.hpp"
#include "quota/decision.hpp"
#include "quota/gateway/backend.hpp"
#include "quota/gateway/fair_share/fair_limits.hpp"
#include "quota/gateway/key_state.hpp"
#include "quota/gateway/metrics.hpp"
#include "quota/gateway/outage.hpp"
#include "quota/gateway/request.hpp"
#include "quota/gateway/rules/rule_registry.hpp"
#include "quota/gateway/rules/rules.hpp"
#include "quota/gateway/settle.hpp"
#include "quota/store/store.hpp"

namespace quota::gateway {

// The answer past a deadline (Reason::kAttemptExpired): nothing decided; with the
// attempt's recorded decision `d`, its remaining and reset as of that decision.
inline Result expired_attempt(const Decision* d, std::uint64_t version, std::string rule) {
  const Decision out{.allowed = false,
                     .remaining = d != nullptr ? d->remaining : 0,
                     .retry_after = kNever,
                     .reset_after = d != nullptr ? d->reset_after : Nanos{0},
                     .version = version,
                     .reason = Reason::kAttemptExpired};
  return Result{.decision = out, .rule = std::move(rule), .replayed = false};
}

// An attempt's recorded decision `d` replayed at `now`, or kAttemptExpired past the
// deadline recorded with it (replayed either way: the record was read).
inline Result replay_attempt(const Decision& d, std::optional<Nanos> deadline, std::string rule,
                             Nanos now) {
  if (deadline.has_value() && now > *deadline) {
    Result out = expired_attempt(&d, d.version, std::move(rule));
    out.replayed = true;
    return out;
  }
  return Result{.decision = d, .rule = std::move(rule), .replayed = true};
}

class Gateway {
 public:
  // Decides through `backend` (backend.hpp), which must outlive the Gateway.
  Gateway(Backend& backend, RuleRegistry& rules, GatewayOptions options = {})
      : Gateway(nullptr, &backend, rules, options) {}

  // Decides in process, on a StoreBackend over `store` (which must outlive the Gateway).
  template <InProcessKeyStore Store>
  Gateway(Store& store, RuleRegistry& rules, GatewayOptions options = {})
      : Gateway(std::make_unique<StoreBackend<Store>>(store), nullptr, rules, options) {}

  Gateway(const Gateway&) = delete;
  Gateway& operator=(const Gateway&) = delete;

  // Decides `req` against every level the rules give it, in order user → tenant →
  // global; if a level denies, no level keeps a deduction (how, per backend:
  // backend.hpp). The combined decision is described on Result.
  //
  // Versions: every decision carries the version of the rule set it used; each key's
  // state keeps the parameters and version that wrote it, and a rule change converts the
  // state without handing out a burst (key_state.hpp). A key already converted by a NEWER
  // rule set (another process rolled out first) is decided by that newer rule.
  //
  // Shadow mode, per rule (RuleSpec::shadow, its enforce_percent, the set's shadow_all, the
  // registry's switch): a shadow budget is decided and counted; if it would deny, the
  // request is not denied (reason kShadow) and nothing is deducted from it; other
  // budgets enforce normally. A request over a per-request cap: over_cap().
  // Unreachable stores: see is_unavailable().
  //
  // Allocation: on an in-process store, a decision of a key that exists allocates
  // nothing: the levels are CheckVectors (inline, kInlineChecks), the keys StoreKeys built
  // in place (store_key.hpp); gateway_alloc_test counts it. What does allocate:
  // Result::rule, a copy of the deciding rule's name, when the name is longer than
  // std::string's inline capacity (15 bytes in libstdc++); a new key in the store; an
  // attempt id (its fingerprint and record); an estimate's ticket; metrics callbacks the
  // caller installs.
  //
  // `now` is the caller's Clock time. A Redis backend decides at the server's time; `now`
  // then dates the gateway's own bookkeeping: attempts, tickets, outages, emergency
  // buckets.
  absl::StatusOr<Result> decide(const Request& req, Nanos now) {
    const std::shared_ptr<const RuleSet> rules = rules_.current();
    auto route = rules->route(req.route);
    if (!route.ok()) return route.status();
    if (req.cost && (*req.cost < 1 || *req.cost > kMaxUnits)) {
      return absl::InvalidArgumentError(
          absl::StrFormat("cost %d is outside [1, %d]", *req.cost, kMaxUnits));
    }
    return decide_with(*rules, **route, req, req.cost, now, nullptr);
  }

  // Deducts `estimate` units from the budgets the route pays by estimate (those without a
  // fixed cost entry: RouteCost::estimate, or the route's default cost) and the fixed
  // costs from the others; when the store admitted it, returns a ticket for settle(),
  // which settles the estimated budgets only.
  absl::StatusOr<EstimateResult> acquire_estimate(const Request& req, std::int64_t estimate,
                                                  Nanos now) {
    const std::shared_ptr<const RuleSet> rules = rules_.current();
    auto route = rules->route(req.route);
    if (!route.ok()) return route.status();
    Deducted levels;
    auto r = decide_with(*rules, **route, req, estimate, now, &levels);
    if (!r.ok()) return r.status();
    EstimateResult out{.decision = r->decision,
                       .rule = r->rule,
                       .ticket = std::nullopt,
                       .request_cap = r->request_cap};
    if (r->decision.allowed && !levels.levels.empty()) {
      const std::vector<TicketLevel> levels_copy = levels.levels;
      auto id = tickets_.issue({.tenant = std::string(req.who.tenant),
                                .levels = std::move(levels.levels),
                                .estimate = estimate,
                                .acquired_at = now,
                                .spent_at = levels.time,
                                .expires_at = quota::detail::saturating_add(now, tickets_.ttl())},
                               now);
      if (!id.ok()) {
        // No ticket could be kept: give the estimate back rather than strand it.
        for (const TicketLevel& level : levels_copy) {
          (void)backend_.refund(level.policy, level.version, level.level_key(), estimate,
                                levels.time, now);
        }
        return id.status();
      }
      out.ticket = *id;
    }
    return out;
  }

  // Settles `tenant`'s ticket with the actual cost (whole units >= 0). See settle.hpp.
  absl::StatusOr<SettleResult> settle(std::string_view tenant, TicketId id, std::int64_t actual,
                                      Nanos now) {
    if (actual < 0 || actual > kMaxUnits) {
      return absl::InvalidArgumentError(
          absl::StrFormat("settle: actual must be in [0, %d] units (got %d)", kMaxUnits, actual));
    }
    if (auto s = check_id(tenant, "tenant"); !s.ok()) return s;
    auto ticket = tickets_.take(tenant, id, now);
    if (!ticket.ok()) return ticket.status();
    SettleResult out{.estimate = ticket->estimate,
                     .actual = actual,
                     .surplus = std::max<std::int64_t>(0, ticket->estimate - actual),
                     .deficit = std::max<std::int64_t>(0, actual - ticket->estimate),
                     .refunded = {},
                     .debt = {}};
    for (const TicketLevel& level : ticket->levels) {
      absl::StatusOr<std::pair<MicroUnits, MicroUnits>> r = std::pair<MicroUnits, MicroUnits>{0, 0};
      if (out.surplus > 0) {
        auto given = backend_.refund(level.policy, level.version, level.level_key(), out.surplus,
                                     ticket->spent_at, now);
        r = given.ok() ? absl::StatusOr<std::pair<MicroUnits, MicroUnits>>({*given, 0})
                       : given.status();
      } else if (out.deficit > 0 && options_.charge_deficit) {
        auto debt =
            backend_.charge(level.policy, level.version, level.level_key(), out.deficit, now);
        r = debt.ok() ? absl::StatusOr<std::pair<MicroUnits, MicroUnits>>({0, *debt})
                      : debt.status();
      }
      if (!r.ok()) {
        // Levels already settled stay settled; the rest are not retried, so the ticket
        // is closed rather than put back if any level was applied.
        if (out.refunded.empty()) {
          tickets_.put_back(tenant, id);
        } else {
          tickets_.done(tenant, id);
        }
        return r.status();
      }
      out.refunded.push_back(r->first);
      out.debt.push_back(r->second);
    }
    tickets_.done(tenant, id);
    return out;
  }

  const AttemptCache& attempts() const { return attempts_; }
  const TicketStore& tickets() const { return tickets_; }
  // The fair-share allocators of this gateway's global budgets (fair_limits.hpp).
  std::vector<FairLimitStats> fair_shares() const { return fair_->stats(); }

  // An operator's release of `rule`'s reserve to `tenant`: `units` beyond its fair share
  // until `until` (the gateway's clock, as `now`). `rule` names a global rule with
  // fair_share in the rules in force (NotFound otherwise). See FairLimits::release_reserve.
  absl::Status release_reserve(std::string_view rule, std::string_view tenant, std::int64_t units,
                               Nanos until, Nanos now) {
    const std::shared_ptr<const RuleSet> rules = rules_.current();
    const Rule* found = nullptr;
    rules->for_each_rule([&](const Rule& r) {
      if (r.name == rule && r.level == Level::kGlobal && r.fair_share.enabled) found = &r;
    });
    if (found == nullptr) {
      return absl::NotFoundError(absl::StrFormat(
          "no global rule \"%s\" with fair_share in rule set version %d", rule, rules->version()));
    }
    return fair_->release_reserve(*found, tenant, units, fair_now(until), fair_now(now));
  }
  // The reserve releases kept, by rule and tenant (`until` on decide()'s clock).
  std::vector<ReserveRelease> reserve_releases() const {
    std::vector<ReserveRelease> out = fair_->reserve_releases();
    for (ReserveRelease& r : out) r.until -= options_.fair_share_clock_offset;
    return out;
  }

 private:
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
  static void record(const Rule& rule, Outcome o, std::int64_t cost) {
    if (rule.counters != nullptr) rule.counters->record(o, cost);
  }

  // The tenant level's check of a plan, or its first when it has none.
  static const Check& tenant_check(std::span<const Check> checks) {
    for (const Check& c : checks) {
      if (c.rule->level == Level::kTenant) return c;
    }
    return checks.front();
  }

  // A request that costs more on a budget than its per-request cap (the rule's max_cost,
  // or the route class's): denied with kRequestTooLarge, nothing deducted. A cap of a
  // budget in shadow only counts (as shadow_would_deny); the route's cap is in shadow only
  // under the global switch (`all_shadow`). nullopt: no cap applies.
  static std::optional<Result> over_cap(bool all_shadow, std::uint64_t version,
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
  static std::size_t deciding_level(std::span<const Decision> parts,
                                    std::span<const Check> checks) {
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

  // The backend's parts of `checks` (in plan order) as one decision whose fields all
  // describe one level, the one that decided (`deciding_level`): the first enforcing
  // denial, else the enforcing level that admits the fewest more requests like this one.
  // Its rule is named, and its remaining, retry and reset are the answer's, so a RateLimit
  // header never pairs one limit's policy with another's numbers; the version is the
  // highest of any part. A shadow level that would deny is counted and deducts nothing
  // (kShadow on an admission); an admission lists the levels an estimate was deducted
  // from. Counts, per rule, route and level: `allowed` on every enforcing level of an
  // admission, `denied` on the denier, `shadow_would_deny`; a replay counts nowhere. A
  // backend that answers more parts than levels, none, or stops short without a denial
  // is an InternalError naming the counts: never a silent allow.
  static absl::StatusOr<RuledDecision> combine_levels(const LevelsResult& result,
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
                                    .layout = checks[i].key.layout(),
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

  // Decides through `owned` when set, else through `*borrowed`.
  Gateway(std::unique_ptr<Backend> owned, Backend* borrowed, RuleRegistry& rules,
          GatewayOptions options)
      : owned_(std::move(owned)),
        backend_(owned_ != nullptr ? *owned_ : *borrowed),
        rules_(rules),
        options_(options),
        attempts_(options.attempt_ttl, options.max_attempts),
        own_tickets_(options.tickets != nullptr
                         ? nullptr
                         : std::make_shared<TicketBook>(options.ticket_ttl, options.max_tickets)),
        tickets_(options.tickets != nullptr ? *options.tickets : *own_tickets_),
        outage_(options.emergency_store),
        fair_(options.fair_limits != nullptr
                  ? options.fair_limits
                  : std::make_shared<FairLimits>(options.fair_share_holders,
                                                 options.fair_share_exchange)) {}

  // The fair-share allocators' clock (GatewayOptions::fair_share_clock_offset).
  Nanos fair_now(Nanos now) const { return now + options_.fair_share_clock_offset; }

  absl::StatusOr<Result> decide_with(const RuleSet& rules, const RouteClass& route,
                                     const Request& req, std::optional<std::int64_t> estimate,
                                     Nanos now, Deducted* deducted) {
    auto checks =
        rules.plan(req.who, req.route, {.estimate = estimate, .shadow_all = rules_.shadow_all()});
    if (!checks.ok()) return checks.status();
    const Check& tenant = tenant_check(*checks);
    if (req.deadline.has_value() && now > *req.deadline) {
      return expired_attempt(nullptr, rules.version(), tenant.rule->name);
    }
    if (auto capped =
            over_cap(rules.shadow_all() || rules_.shadow_all(), rules.version(), route, *checks)) {
      return *std::move(capped);
    }

    std::string fingerprint;
    bool attempt_open = false;
    // Attempt ids are the tenant's: another tenant's same id is another attempt (over
    // Redis the record lives in the tenant's slot, `{tenant}`, likewise).
    const AttemptKey attempt_key{.scope = req.who.tenant, .id = req.attempt_id};
    if (!req.attempt_id.empty()) {
      // "cost|key" of every budget, joined by '|': the same id with another cost or key
      // is another request.
      for (const Check& c : *checks) {
        absl::StrAppend(&fingerprint, fingerprint.empty() ? "" : "|", c.cost, "|",
                        quota::detail::to_absl(c.key));
      }
      if (!backend_.shares_attempts()) {
        auto begin = attempts_.begin(attempt_key, fingerprint, now);
        if (!begin.ok()) return begin.status();
        if (begin->replay.has_value()) {
          return replay_attempt(*begin->replay, begin->deadline, tenant.rule->name, now);
        }
        attempt_open = true;
      }
    }

    // Fair shares first: a refusal decides, nothing deducted anywhere. A plan without a
    // fair_share rule never reaches the allocators.
    std::optional<FairLimits::Reserved> fair;
    if (std::any_of(checks->begin(), checks->end(),
                    [](const Check& c) { return c.rule->fair_share.enabled; })) {
      fair.emplace();
      if (auto denied =
              fair_->admit(*checks, req.who.tenant, rules.version(), fair_now(now), *fair)) {
        if (attempt_open) attempts_.finish(attempt_key, denied->decision, req.deadline);
        return Result{.decision = denied->decision,
                      .rule = denied->rule->name,
                      .replayed = false,
                      .request_cap = denied->request_cap};
      }
    }
    const Attempt attempt{
        .id = req.attempt_id, .fingerprint = fingerprint, .deadline = req.deadline};
    auto r = run(rules.version(), *checks, now, deducted, attempt);
    if (fair.has_value()) {
      if (r.ok() && r->decision.allowed && !r->replayed) {
        fair_->commit(*fair, fair_now(now));
      } else {
        fair_->release(*fair);  // denied, an error (then the fail mode), a replayed attempt
      }
    }
    const bool decided = r.ok();
    if (decided) {
      outage_.note_success();
    } else if (is_unavailable(r.status())) {
      r = on_unavailable(rules.version(), route, *checks, now);
      if (deducted != nullptr) deducted->levels.clear();
    }
    // Only the store's own decision is an attempt's decision. An error, and the fail
    // mode's answer to one (kUnavailable, kFailOpen), are forgotten, so that a retry with
    // the same id decides afresh instead of replaying a 503 for the attempt's lifetime.
    // (Over Redis the store records the decision in the call that makes it: an error
    // records nothing.)
    if (attempt_open) {
      if (decided) {
        attempts_.finish(attempt_key, r->decision, req.deadline);
      } else {
        attempts_.abandon(attempt_key);
      }
    }
    if (!r.ok()) return r.status();
    if (r->replayed) return replay_attempt(r->decision, r->deadline, std::move(r->rule), now);
    return Result{.decision = r->decision, .rule = std::move(r->rule), .replayed = false};
  }

  // Attempts: in the backend when it shares them between processes (Redis: recorded in
  // the call that decides, redis/twin/gateway_attempts.hpp), else in this gateway's
  // AttemptCache.
  struct Attempt {
    std::string_view id;  // empty: none
    std::string_view fingerprint;
    std::optional<Nanos> deadline;
  };

  // Decides every level through the backend (all or nothing) and combines the result.
  // A replayed decision (a shared attempt's) is combined the same way, counted nowhere.
  absl::StatusOr<RuledDecision> run(std::uint64_t version, std::span<const Check> checks, Nanos now,
                                    Deducted* deducted, const Attempt& attempt) {
    CheckVector<LevelCheck> levels;  // inline: no allocation for up to kInlineChecks
    for (const Check& c : checks) {
      levels.push_back({.policy = &c.rule->policy,
                        .key = c.key,
                        .shadow = c.shadow,
                        .cost = c.cost,
                        .rule = c.rule,
                        .layout = c.key.layout()});
    }
    absl::StatusOr<LevelsResult> result;
    bool replayed = false;
    std::optional<Nanos> deadline;
    if (!attempt.id.empty() && backend_.shares_attempts()) {
      auto r = backend_.decide_attempt(levels, version, now,
                                       {.id = attempt.id,
                                        .fingerprint = attempt.fingerprint,
                                        .deadline = attempt.deadline,
                                        .ttl = options_.attempt_ttl});
      if (!r.ok()) return r.status();
      replayed = r->replayed;
      deadline = r->deadline;
      result = std::move(r->levels);
    } else {
      result = backend_.decide(levels, version, now);
    }
    if (!result.ok()) return result.status();
    return combine_levels(*result, checks, version,
                          {.replayed = replayed, .deadline = deadline, .deducted = deducted});
  }

  absl::StatusOr<RuledDecision> on_unavailable(std::uint64_t version, const RouteClass& route,
                                               std::span<const Check> checks, Nanos now) {
    const Check& tenant = tenant_check(checks);
    const Decision d = outage_.answer(route, tenant.key, tenant.cost, version, now);
    record(*tenant.rule, d.allowed ? Outcome::kFailOpenAllowed : Outcome::kUnavailable,
           tenant.cost);
    return RuledDecision{
        .decision = d, .rule = tenant.rule->name, .replayed = false, .deadline = std::nullopt};
  }

  std::unique_ptr<Backend> owned_;  // the StoreBackend of an in-process store, or null
  Backend& backend_;
  RuleRegistry& rules_;
  GatewayOptions options_;
  AttemptCache attempts_;
  std::shared_ptr<TicketStore> own_tickets_;  // a TicketBook, unless options_.tickets is set
  TicketStore& tickets_;
  Outage outage_;
  std::shared_ptr<FairLimits> fair_;  // GatewayOptions::fair_limits, or the Gateway's own
};

}  // namespace quota::gateway
