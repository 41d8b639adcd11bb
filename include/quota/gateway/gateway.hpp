// quota/gateway/gateway.hpp — the layer a gateway author calls: one decision per request.
//
// `Gateway<Store>::decide({who, route}, now)` looks up the rules in force (rules.hpp),
// builds the keys from the authenticated identity and the whitelisted route class, and
// decides every budget level the request must pass — user, tenant, global — through an
// in-process store of KeyStates (`LocalStore<KeyPolicy>` for one thread,
// `ShardedStore<KeyPolicy>` for many; anything with `update`). On top of that:
//
// Versions. Every decision carries the version of the rule set it used; each key's state
// keeps the parameters and version that wrote it, and a rule change converts the state
// without handing out a burst (key_state.hpp).
//
// Multi-level budgets, all-or-nothing. Levels are decided in order user → tenant →
// global, each atomically in the store. If a level denies, the levels already deducted
// are given back exactly (refund of the same cost, capped at their capacity) before the
// call returns, so nothing stays deducted. What is NOT atomic across levels: between the
// deduction and the give-back, a concurrent request may see a level lower by this cost
// and be denied — never admitted beyond any level's envelope (the give-back restores at
// most what was taken). The global level is one key shared by all tenants; in-process it
// is as atomic as the others (the same store), while across processes (Redis) it lives in
// its own slot and is not in the tenant's script.
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
// `attempt_ttl`; the same id with another key or cost is InvalidArgument.
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
// Thread safety: that of the store (ShardedStore: any thread). Rule reloads go through
// the RuleRegistry and never block decisions. `now` is the caller's Clock time.
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

template <class Store>
requires has_update<Store> && std::same_as<typename Store::policy_type, KeyPolicy>
class Gateway {
 public:
  Gateway(Store& store, RuleRegistry& rules, GatewayOptions options = {})
      : store_(store),
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
    std::vector<TicketLevel> levels;
    auto r = decide_with(*rules, **route, req, estimate, now, &levels);
    if (!r.ok()) return r.status();
    EstimateResult out{.decision = r->decision, .rule = r->rule, .ticket = std::nullopt};
    if (r->decision.allowed && !levels.empty()) {
      const std::vector<TicketLevel> levels_copy = levels;
      auto id = tickets_.issue({.levels = std::move(levels),
                                .estimate = estimate,
                                .acquired_at = now,
                                .expires_at = quota::detail::saturating_add(now, tickets_.ttl())},
                               now);
      if (!id.ok()) {
        // No ticket could be kept: give the estimate back rather than strand it.
        for (const TicketLevel& level : levels_copy) {
          const KeyPolicy kp{.policy = &level.policy, .version = level.version};
          (void)store_.update(kp, level.key, now,
                              [&](KeyState& s) { return refund(s, estimate, now, now); });
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
      const KeyPolicy kp{.policy = &level.policy, .version = level.version};
      auto r =
          store_.update(kp, level.key, now, [&](KeyState& s) -> std::pair<MicroUnits, MicroUnits> {
            if (out.surplus > 0) return {refund(s, out.surplus, ticket->acquired_at, now), 0};
            if (out.deficit > 0 && options_.charge_deficit) return {0, charge(s, out.deficit, now)};
            return {0, 0};
          });
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
  struct Outcome_ {
    Decision decision;
    std::string rule;
  };

  absl::StatusOr<Result> decide_with(const RuleSet& rules, const RouteClass& route,
                                     const Request& req, std::int64_t cost, Nanos now,
                                     std::vector<TicketLevel>* deducted) {
    auto checks = rules.plan(req.who, req.route);
    if (!checks.ok()) return checks.status();

    std::string fingerprint;
    if (!req.attempt_id.empty()) {
      fingerprint = absl::StrCat(cost);
      for (const Check& c : *checks) absl::StrAppend(&fingerprint, "|", c.key);
      auto begin = attempts_.begin(req.attempt_id, fingerprint, now);
      if (!begin.ok()) return begin.status();
      if (begin->replay.has_value()) {
        return Result{
            .decision = *begin->replay, .rule = tenant_check(*checks).rule->name, .replayed = true};
      }
    }

    auto r = run(rules.version(), *checks, cost, now, deducted);
    if (r.ok()) {
      note_success();
    } else if (is_unavailable(r.status())) {
      r = on_unavailable(rules.version(), route, *checks, cost, now);
      if (deducted != nullptr) deducted->clear();
    }
    if (!req.attempt_id.empty()) {
      if (r.ok()) {
        attempts_.finish(req.attempt_id, r->decision);
      } else {
        attempts_.abandon(req.attempt_id);
      }
    }
    if (!r.ok()) return r.status();
    return Result{.decision = r->decision, .rule = std::move(r->rule), .replayed = false};
  }

  // Decides every level; all-or-nothing (see the header comment).
  absl::StatusOr<Outcome_> run(std::uint64_t version, const std::vector<Check>& checks,
                               std::int64_t cost, Nanos now, std::vector<TicketLevel>* deducted) {
    std::vector<std::size_t> taken;  // indices of levels deducted so far
    taken.reserve(checks.size());
    Decision combined{.allowed = true,
                      .remaining = std::numeric_limits<std::int64_t>::max(),
                      .retry_after = Nanos{0},
                      .reset_after = Nanos{0},
                      .version = version,
                      .reason = Reason::kAllowed};
    bool shadowed = false;
    for (std::size_t i = 0; i < checks.size(); ++i) {
      const Check& c = checks[i];
      const KeyPolicy kp{.policy = &c.rule->policy, .version = version};
      auto d = store_.apply(kp, c.key, now, cost);
      if (!d.ok()) {
        give_back(checks, taken, version, cost, now);
        return d.status();
      }
      combined.remaining = std::min(combined.remaining, d->remaining);
      combined.reset_after = std::max(combined.reset_after, d->reset_after);
      if (!d->allowed) {
        if (c.rule->shadow) {
          shadowed = true;
          record(*c.rule, Outcome::kShadowWouldDeny, cost);
          continue;
        }
        give_back(checks, taken, version, cost, now);
        record(*c.rule, Outcome::kDenied, cost);
        Decision denial = *d;
        denial.version = version;
        denial.remaining = combined.remaining;
        denial.reset_after = combined.reset_after;
        return Outcome_{.decision = denial, .rule = c.rule->name};
      }
      taken.push_back(i);
    }
    for (std::size_t i : taken) {
      record(*checks[i].rule, Outcome::kAllowed, cost);
      if (deducted != nullptr) {
        deducted->push_back(
            {.key = checks[i].key, .policy = checks[i].rule->policy, .version = version});
      }
    }
    if (shadowed) combined.reason = Reason::kShadow;
    const Check& tenant = tenant_check(checks);
    return Outcome_{.decision = combined, .rule = tenant.rule->name};
  }

  // Gives back `cost` to the levels in `taken` (exactly what was deducted, capped).
  void give_back(const std::vector<Check>& checks, const std::vector<std::size_t>& taken,
                 std::uint64_t version, std::int64_t cost, Nanos now) {
    for (std::size_t i : taken) {
      const KeyPolicy kp{.policy = &checks[i].rule->policy, .version = version};
      // The key was just written and is not idle, so it exists; an error here cannot
      // over-admit (the level simply keeps the deduction).
      (void)store_.update(kp, checks[i].key, now,
                          [&](KeyState& s) { return refund(s, cost, now, now); });
    }
  }

  static const Check& tenant_check(const std::vector<Check>& checks) {
    for (const Check& c : checks) {
      if (c.rule->level == Level::kTenant) return c;
    }
    return checks.front();
  }

  absl::StatusOr<Outcome_> on_unavailable(std::uint64_t version, const RouteClass& route,
                                          const std::vector<Check>& checks, std::int64_t cost,
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
      return Outcome_{.decision = unavailable, .rule = tenant.rule->name};
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
      return Outcome_{.decision = unavailable, .rule = tenant.rule->name};
    }
    const RulePolicy emergency =
        TokenBucket{.rate = route.emergency.rate, .burst = route.emergency.burst};
    // Emergency buckets are versioned by nothing: version 0 keeps their state across
    // rule reloads (a reload must not refill them).
    const KeyPolicy kp{.policy = &emergency, .version = 0};
    auto d = emergency_.apply(kp, tenant.key, now, cost);
    if (!d.ok() || !d->allowed) {
      record(*tenant.rule, Outcome::kUnavailable, cost);
      return Outcome_{.decision = unavailable, .rule = tenant.rule->name};
    }
    record(*tenant.rule, Outcome::kFailOpenAllowed, cost);
    Decision admitted = *d;
    admitted.version = version;
    admitted.reason = Reason::kFailOpen;
    return Outcome_{.decision = admitted, .rule = tenant.rule->name};
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

  Store& store_;
  RuleRegistry& rules_;
  GatewayOptions options_;
  AttemptCache attempts_;
  TicketBook tickets_;
  ShardedStore<KeyPolicy> emergency_;
  std::atomic<std::int64_t> outage_since_{kNoOutage};
};

}  // namespace quota::gateway
