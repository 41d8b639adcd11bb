// quota/gateway/gateway.hpp — the layer a gateway author calls: one decision per request.
//
// `Gateway<Store>::decide({who, route}, now)` looks up the rules in force (rules.hpp),
// builds the keys from the authenticated identity and the whitelisted route class, and
// decides every budget level the request must pass — user, tenant, global — through a
// backend (backend.hpp): an in-process store of KeyStates (`LocalStore<KeyPolicy>` for
// one thread, `ShardedStore<KeyPolicy>` for many; anything with `update`), or
// `quota::redis::GatewayStore` (redis/gateway_store.hpp), shared by every gateway
// process. On top of that:
//
// Versions. Every decision carries the version of the rule set it used; each key's state
// keeps the parameters and version that wrote it, and a rule change converts the state
// without handing out a burst (key_state.hpp). A key already converted by a NEWER rule
// set (another process rolled out first) is decided by that newer rule, and the decision
// carries the newer version: the combined decision's version is the highest any level
// used.
//
// Multi-level budgets, all-or-nothing. Levels are decided in order user → tenant →
// global; if a level denies, no level keeps a deduction. How (backend.hpp): in-process,
// each level is atomic and the levels already deducted are given back exactly before the
// call returns — between the deduction and the give-back a concurrent request may see a
// level lower by this cost and be denied, never admitted beyond any level's envelope.
// On Redis, the user and tenant levels (one hash slot) are one atomic script; the global
// level is one key shared by all tenants, in its own slot, decided by a second script
// after the tenant's, and the tenant's levels are given back when it denies (the same
// non-isolated window as in-process, for the global level only).
// The combined decision: allowed iff every enforcing level allows; remaining the least,
// retry_after and reset_after the largest over the levels decided; the reason and rule of
// the first level that denies.
//
// Fail modes, per route class. A store error that means the authority is unreachable
// (Unavailable, DeadlineExceeded, ResourceExhausted):
//   - fail_closed → a Decision with reason kUnavailable (HTTP 503, never 429);
//   - fail_open   → the route's local emergency bucket (per process, per tenant key):
//     kFailOpen when it admits, kUnavailable when it is empty or when the outage (since
//     the first failure after the last success, per Gateway) has lasted max_duration.
//     The emergency bucket is a token bucket on the same clock, never reset by an
//     outage, so during outages the extra admitted for one key by one process is at most
//       EmergencyBucket::outage_allowance() = burst_e + ceil(rate_e · max_duration)
//     units per outage (and, across any interval T, at most rate_e·T + burst_e);
//     with N processes, N times that. gateway_fail_mode_test checks it with the envelope
//     verifier. Other store errors (InvalidArgument, DataLoss, ...) are returned as is.
//
// Shadow mode, per rule. A shadow level is decided and counted; if it would deny, the
// request is not denied (reason kShadow, `shadow_would_deny` counted) and nothing is
// deducted from that level; other levels enforce normally.
//
// Attempts (attempts.hpp): with an attempt id, the first decision is replayed for
// `attempt_ttl`; the same id with another key or cost is InvalidArgument. In this
// process's AttemptCache, or — over Redis — in Redis, shared by every gateway process
// (redis/gateway_store.hpp).
//
// Estimate, then settle (settle.hpp): acquire_estimate deducts an estimate and returns a
// ticket; settle refunds the surplus or charges the deficit, once.
//
// Metrics (metrics.hpp): per rule, route and level. An admitted request counts
// `allowed` on every enforcing level (or `fail_open_allowed` on the tenant level); a
// denial counts `denied` on the level that denied; a fail-closed error counts
// `unavailable` on the tenant level; a shadow level that would deny counts
// `shadow_would_deny`.
//
// Allocation. On an in-process store, a decision of a key that exists (a warmed-up
// tenant) allocates nothing: the levels are LevelVectors (inline, kMaxLevels), the keys
// StoreKeys built in place (rules.hpp); gateway_alloc_test counts it. What does
// allocate: Result::rule, a copy of the deciding rule's name, when the name is longer
// than std::string's inline capacity (15 bytes in libstdc++); a new key in the store;
// an attempt id (its fingerprint and record); an estimate's ticket; metrics callbacks
// the caller installs. benchmarks/gateway_bench.cpp measures ns and allocations per
// decision.
//
// Thread safety: that of the store (ShardedStore, GatewayStore: any thread). Rule reloads
// go through the RuleRegistry and never block decisions. `now` is the caller's Clock
// time (a Redis backend decides at the server's time; `now` then dates the gateway's own
// bookkeeping: attempts, tickets, outages, emergency buckets).
//
//   quota::ShardedStore<quota::gateway::KeyPolicy> store;
//   quota::gateway::RuleRegistry registry(*quota::gateway::RuleSet::create(spec));
//   quota::gateway::Gateway gw(store, registry);
//   auto r = gw.decide({.who = {.tenant = "acme", .plan = "free"}, .route = "read"}, clock.now());
//   // r->decision.allowed, r->decision.version, quota::http::answer(r->decision, ...)
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "quota/decision.hpp"
#include "quota/gateway/attempts.hpp"
#include "quota/gateway/backend.hpp"
#include "quota/gateway/key_state.hpp"
#include "quota/gateway/metrics.hpp"
#include "quota/gateway/rules.hpp"
#include "quota/gateway/settle.hpp"
#include "quota/store/sharded_store.hpp"
#include "quota/store/store.hpp"

namespace quota::gateway {

struct GatewayOptions {
  Nanos attempt_ttl{std::chrono::minutes(10)};
  std::size_t max_attempts = 1'000'000;
  Nanos ticket_ttl{std::chrono::minutes(10)};
  std::size_t max_tickets = 1'000'000;
  // Charge a settle's deficit to the budget (as debt where it exceeds what is left).
  bool charge_deficit = false;
  // Capacity of the per-process emergency buckets (fail-open routes).
  StoreOptions emergency_store{.max_keys = 1'000'000, .shards = 16};
};

struct Request {
  Identity who{};
  std::string_view route{};
  std::string_view attempt_id = {};  // optional: idempotent retries
};

struct Result {
  Decision decision{};
  std::string rule{};     // the rule that decided (first denier, else the tenant rule)
  bool replayed = false;  // an attempt's stored first decision
};

struct EstimateResult {
  Decision decision{};
  std::string rule{};
  // Set when the estimate was deducted from the store (allowed, not fail-open).
  std::optional<TicketId> ticket{};
};

// True for the store errors that mean "the authority cannot answer now".
inline bool is_unavailable(const absl::Status& s) {
  return s.code() == absl::StatusCode::kUnavailable ||
         s.code() == absl::StatusCode::kDeadlineExceeded ||
         s.code() == absl::StatusCode::kResourceExhausted;
}

template <GatewayStorage Store>
class Gateway {
 public:
  Gateway(Store& store, RuleRegistry& rules, GatewayOptions options = {})
      : backend_(store),
        rules_(rules),
        options_(options),
        attempts_(options.attempt_ttl, options.max_attempts),
        tickets_(options.ticket_ttl, options.max_tickets),
        emergency_(options.emergency_store) {}

  absl::StatusOr<Result> decide(const Request& req, Nanos now) {
    const std::shared_ptr<const RuleSet> rules = rules_.current();
    auto route = rules->route(req.route);
    if (!route.ok()) return route.status();
    return decide_with(*rules, **route, req, (*route)->cost, now, nullptr);
  }

  // Deducts `estimate` units (instead of the route's cost) and, when the store admitted
  // it, returns a ticket for settle().
  absl::StatusOr<EstimateResult> acquire_estimate(const Request& req, std::int64_t estimate,
                                                  Nanos now) {
    const std::shared_ptr<const RuleSet> rules = rules_.current();
    auto route = rules->route(req.route);
    if (!route.ok()) return route.status();
    Deducted levels;
    auto r = decide_with(*rules, **route, req, estimate, now, &levels);
    if (!r.ok()) return r.status();
    EstimateResult out{.decision = r->decision, .rule = r->rule, .ticket = std::nullopt};
    if (r->decision.allowed && !levels.levels.empty()) {
      const std::vector<TicketLevel> levels_copy = levels.levels;
      auto id = tickets_.issue({.levels = std::move(levels.levels),
                                .estimate = estimate,
                                .acquired_at = now,
                                .spent_at = levels.time,
                                .expires_at = quota::detail::saturating_add(now, tickets_.ttl())},
                               now);
      if (!id.ok()) {
        // No ticket could be kept: give the estimate back rather than strand it.
        for (const TicketLevel& level : levels_copy) {
          (void)backend_.refund(level.policy, level.version, level.key, estimate, levels.time, now);
        }
        return id.status();
      }
      out.ticket = *id;
    }
    return out;
  }

  // Settles a ticket with the actual cost (whole units >= 0). See settle.hpp.
  absl::StatusOr<SettleResult> settle(TicketId id, std::int64_t actual, Nanos now) {
    if (actual < 0 || actual > kMaxUnits) {
      return absl::InvalidArgumentError(
          absl::StrFormat("settle: actual must be in [0, %d] units (got %d)", kMaxUnits, actual));
    }
    auto ticket = tickets_.take(id, now);
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
        auto given = backend_.refund(level.policy, level.version, level.key, out.surplus,
                                     ticket->spent_at, now);
        r = given.ok() ? absl::StatusOr<std::pair<MicroUnits, MicroUnits>>({*given, 0})
                       : given.status();
      } else if (out.deficit > 0 && options_.charge_deficit) {
        auto debt = backend_.charge(level.policy, level.version, level.key, out.deficit, now);
        r = debt.ok() ? absl::StatusOr<std::pair<MicroUnits, MicroUnits>>({0, *debt})
                      : debt.status();
      }
      if (!r.ok()) {
        // Levels already settled stay settled; the rest are not retried, so the ticket
        // is closed rather than put back if any level was applied.
        if (out.refunded.empty()) {
          tickets_.put_back(id);
        } else {
          tickets_.done(id);
        }
        return r.status();
      }
      out.refunded.push_back(r->first);
      out.debt.push_back(r->second);
    }
    tickets_.done(id);
    return out;
  }

  const AttemptCache& attempts() const { return attempts_; }
  const TicketBook& tickets() const { return tickets_; }

 private:
  struct RuledDecision {
    Decision decision;
    std::string rule;
  };

  // The levels an estimate was deducted from, and the backend's time of it.
  struct Deducted {
    std::vector<TicketLevel> levels;
    Nanos time{0};
  };

  absl::StatusOr<Result> decide_with(const RuleSet& rules, const RouteClass& route,
                                     const Request& req, std::int64_t cost, Nanos now,
                                     Deducted* deducted) {
    auto checks = rules.plan(req.who, req.route);
    if (!checks.ok()) return checks.status();

    std::string fingerprint;
    const std::string_view tenant_key = tenant_check(*checks).key;
    bool attempt_open = false;
    if (!req.attempt_id.empty()) {
      fingerprint = absl::StrCat(cost);
      for (const Check& c : *checks) {
        absl::StrAppend(&fingerprint, "|", quota::detail::to_absl(c.key));
      }
      auto replay = begin_attempt(tenant_key, req.attempt_id, fingerprint, now);
      if (replay.ok() && replay->has_value()) {
        return Result{
            .decision = **replay, .rule = tenant_check(*checks).rule->name, .replayed = true};
      }
      // Shared attempts that cannot be reached (Redis down) leave the request to the
      // fail mode, unrecorded; any other attempt error decides nothing.
      if (!replay.ok() && !(kSharedAttempts && is_unavailable(replay.status()))) {
        return replay.status();
      }
      attempt_open = replay.ok();
    }

    auto r = run(rules.version(), *checks, cost, now, deducted);
    if (r.ok()) {
      note_success();
    } else if (is_unavailable(r.status())) {
      r = on_unavailable(rules.version(), route, *checks, cost, now);
      if (deducted != nullptr) deducted->levels.clear();
    }
    if (attempt_open) {
      if (r.ok()) {
        finish_attempt(tenant_key, req.attempt_id, fingerprint, r->decision);
      } else {
        abandon_attempt(tenant_key, req.attempt_id);
      }
    }
    if (!r.ok()) return r.status();
    return Result{.decision = r->decision, .rule = std::move(r->rule), .replayed = false};
  }

  // Attempts: in the backend when it shares them between processes (Redis), else in this
  // gateway's AttemptCache.
  using Backend = std::remove_reference_t<typename detail::backend_for<Store>::type>;
  static constexpr bool kSharedAttempts = requires(Backend & b, std::string_view s) {
    b.begin_attempt(s, s, s);
  };

  absl::StatusOr<std::optional<Decision>> begin_attempt(std::string_view tenant_key,
                                                        std::string_view id,
                                                        std::string_view fingerprint, Nanos now) {
    if constexpr (kSharedAttempts) {
      return backend_.begin_attempt(tenant_key, id, fingerprint);
    } else {
      auto begin = attempts_.begin(id, fingerprint, now);
      if (!begin.ok()) return begin.status();
      return begin->replay;
    }
  }

  void finish_attempt(std::string_view tenant_key, std::string_view id,
                      std::string_view fingerprint, const Decision& d) {
    if constexpr (kSharedAttempts) {
      (void)backend_.finish_attempt(tenant_key, id, fingerprint, d, options_.attempt_ttl);
    } else {
      attempts_.finish(id, d);
    }
  }

  void abandon_attempt(std::string_view tenant_key, std::string_view id) {
    if constexpr (kSharedAttempts) {
      backend_.abandon_attempt(tenant_key, id);
    } else {
      attempts_.abandon(id);
    }
  }

  // Decides every level through the backend (all or nothing) and combines the result.
  absl::StatusOr<RuledDecision> run(std::uint64_t version, std::span<const Check> checks,
                                    std::int64_t cost, Nanos now, Deducted* deducted) {
    LevelVector<LevelCheck> levels;  // inline: no allocation for up to kMaxLevels
    for (const Check& c : checks) {
      levels.push_back({.policy = &c.rule->policy, .key = c.key, .shadow = c.rule->shadow});
    }
    auto result = backend_.decide(levels, version, cost, now);
    if (!result.ok()) return result.status();
    const LevelVector<Decision>& parts = result->parts;
    if (parts.empty() || parts.size() > checks.size()) {
      return absl::InternalError(
          absl::StrFormat("gateway backend decided %d of %d levels", parts.size(), checks.size()));
    }
    Decision combined{.allowed = true,
                      .remaining = std::numeric_limits<std::int64_t>::max(),
                      .retry_after = Nanos{0},
                      .reset_after = Nanos{0},
                      .version = version,
                      .reason = Reason::kAllowed};
    bool shadowed = false;
    for (std::size_t i = 0; i < parts.size(); ++i) {
      const Decision& d = parts[i];
      const Rule& rule = *checks[i].rule;
      combined.remaining = std::min(combined.remaining, d.remaining);
      combined.reset_after = std::max(combined.reset_after, d.reset_after);
      combined.version = std::max(combined.version, d.version);
      if (d.allowed) continue;
      if (rule.shadow) {
        shadowed = true;
        record(rule, Outcome::kShadowWouldDeny, cost);
        continue;
      }
      record(rule, Outcome::kDenied, cost);
      Decision denial = d;
      denial.version = combined.version;
      denial.remaining = combined.remaining;
      denial.reset_after = combined.reset_after;
      return RuledDecision{.decision = denial, .rule = rule.name};
    }
    if (parts.size() != checks.size()) {
      return absl::InternalError(
          absl::StrFormat("gateway backend stopped after %d of %d levels without a denial",
                          parts.size(), checks.size()));
    }
    for (std::size_t i = 0; i < parts.size(); ++i) {
      if (!parts[i].allowed) continue;  // a shadow level that would deny: nothing deducted
      record(*checks[i].rule, Outcome::kAllowed, cost);
      if (deducted != nullptr) {
        deducted->levels.push_back({.key = std::string(checks[i].key.view()),
                                    .policy = checks[i].rule->policy,
                                    .version = version});
      }
    }
    if (deducted != nullptr) deducted->time = result->time;
    if (shadowed) combined.reason = Reason::kShadow;
    const Check& tenant = tenant_check(checks);
    return RuledDecision{.decision = combined, .rule = tenant.rule->name};
  }

  static const Check& tenant_check(std::span<const Check> checks) {
    for (const Check& c : checks) {
      if (c.rule->level == Level::kTenant) return c;
    }
    return checks.front();
  }

  absl::StatusOr<RuledDecision> on_unavailable(std::uint64_t version, const RouteClass& route,
                                               std::span<const Check> checks, std::int64_t cost,
                                               Nanos now) {
    const Check& tenant = tenant_check(checks);
    const Decision unavailable{.allowed = false,
                               .remaining = 0,
                               .retry_after = Nanos{0},
                               .reset_after = Nanos{0},
                               .version = version,
                               .reason = Reason::kUnavailable};
    if (route.fail_mode != FailMode::kOpen) {
      record(*tenant.rule, Outcome::kUnavailable, cost);
      return RuledDecision{.decision = unavailable, .rule = tenant.rule->name};
    }
    // The outage began at the first failure after the last success.
    std::int64_t since = outage_since_.load(std::memory_order_acquire);
    if (since == kNoOutage) {
      std::int64_t expected = kNoOutage;
      if (outage_since_.compare_exchange_strong(expected, now.count(), std::memory_order_acq_rel)) {
        since = now.count();
      } else {
        since = expected;
      }
    }
    if (now.count() - since >= route.emergency.max_duration.count()) {
      record(*tenant.rule, Outcome::kUnavailable, cost);
      return RuledDecision{.decision = unavailable, .rule = tenant.rule->name};
    }
    const RulePolicy emergency =
        TokenBucket{.rate = route.emergency.rate, .burst = route.emergency.burst};
    // Emergency buckets are versioned by nothing: version 0 keeps their state across
    // rule reloads (a reload must not refill them).
    const KeyPolicy kp{.policy = &emergency, .version = 0};
    auto d = emergency_.apply(kp, tenant.key, now, cost);
    if (!d.ok() || !d->allowed) {
      record(*tenant.rule, Outcome::kUnavailable, cost);
      return RuledDecision{.decision = unavailable, .rule = tenant.rule->name};
    }
    record(*tenant.rule, Outcome::kFailOpenAllowed, cost);
    Decision admitted = *d;
    admitted.version = version;
    admitted.reason = Reason::kFailOpen;
    return RuledDecision{.decision = admitted, .rule = tenant.rule->name};
  }

  void note_success() {
    if (outage_since_.load(std::memory_order_relaxed) != kNoOutage) {
      outage_since_.store(kNoOutage, std::memory_order_release);
    }
  }

  static void record(const Rule& rule, Outcome o, std::int64_t cost) {
    if (rule.counters != nullptr) rule.counters->record(o, cost);
  }

  static constexpr std::int64_t kNoOutage = std::numeric_limits<std::int64_t>::min();

  typename detail::backend_for<Store>::type backend_;
  RuleRegistry& rules_;
  GatewayOptions options_;
  AttemptCache attempts_;
  TicketBook tickets_;
  ShardedStore<KeyPolicy> emergency_;
  std::atomic<std::int64_t> outage_since_{kNoOutage};
};

}  // namespace quota::gateway
