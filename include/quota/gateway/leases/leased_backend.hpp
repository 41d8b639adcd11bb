// quota/gateway/leases/leased_backend.hpp — a gateway backend that decides leased budgets locally.
//
// `LeasedBackend<Inner>` wraps any gateway backend (backend.hpp: StoreBackend in-process,
// quota::redis::GatewayStore on Redis) and satisfies the same concept, so
// `Gateway` keeps the rules, versions, fail modes, shadow mode and
// metrics of the gateway. A level whose rule has `lease` on (lease_spec.hpp; or `auto`
// while this process decides the key at or above the rule's rate) is decided from the
// grant this process holds for the key; every other level goes to the inner backend.
// So the global level, one key shared by every tenant, costs the authority one grant
// (over Redis three script calls: lease_grant.hpp) per `lease.units` units instead of one
// round trip per request.
//
// Guarantees:
//   - A grant is ONE ordinary decision of `units` units on the key by the inner backend:
//     atomic, from the same authoritative budget every other holder and every unleased
//     decision draws on, under the request's rule-set version. It is idempotent by grant
//     id ("<incarnation hex>-<n>"): a request whose answer was lost is retried with the
//     same id and replayed, not taken twice (over Redis by the gateway attempt record in
//     the key's slot; in process a recorded id is replayed from the ledger). Each grant
//     is recorded at the authority (grant_ledger.hpp: key, id, incarnation, version,
//     units, expiry). Grants are never refunded: a unit granted is spent or expires.
//   - Local spending never refills. A grant expires `lease.expiry` after it was asked for,
//     on the caller's clock (`now` of decide; measured from before the request, so
//     early): never spent past it, what is left is counted as unused. A grant taken under
//     an older rule-set version than a request's is dropped at that request; a holder
//     without the new rules spends its grant until it expires, and its next grant is
//     decided under the newer rule that converted the key: a rule change reaches every
//     holder at the latest one expiry after a process with it decides the key.
//   - Revocation at once (lease_revocation.hpp): with a RevocationAuthority ledger it
//     subscribes, drops what it holds of revoked grants (units_revoked) and decides the
//     rule's keys at the authority while its version is below the revoked one.
//   - Renewal at the low-water mark: the request that leaves `low_water` units or fewer
//     asks for `units` more; at most one grant request is in flight per key and process
//     (the others spend what is left, or wait for it when nothing is left). After a
//     failure the key backs off exponentially with jitter before asking again; a request
//     that needs a grant meanwhile gets the failure (kUnavailable: the route's fail
//     mode). When the authority denies a grant, the key denies locally until the
//     authority's retry_after for a whole grant (so at saturation every round trip
//     brings `units`; a local denial's retry_after is that wait, not the tight one of
//     the unleased budget); a budget that can never refill to a whole grant (kNever) is
//     asked once more for just what the request needs.
//   - All or nothing with the other levels is kept: a level decided earlier gets its cost
//     back when a later one denies — locally into its grant when it was leased, through
//     the inner backend's refund otherwise.
//   - Bound: each holder holds at most `units + low_water` of a key, so with H holders
//     (incarnations) admitted(T) <= r·T + B + Σ units held <= r·T + B + H·(units +
//     low_water) over every interval of length T, checked on several holders' admissions
//     by the envelope verifier (tests/gateway_lease_envelope_test.cpp).
//   - Costs: a request costing more than `lease.units` on a level is decided there by
//     the authority. A settle refund on a leased key goes back into the grants held
//     (never above what each brought), never to the authority; a deficit is charged at
//     the authority.
//   - Non-blocking (LeasedBackendOptions::renewals, renewal_thread.hpp), for event-loop
//     hosts: a deciding thread never waits. A leased level is decided from what is held;
//     a grant it needs (at the low-water mark, or when too little is held) is posted to
//     the renewal thread, and a request that finds too little held is denied at once
//     (kOverLimit, retry_after kWhileRenewing, counted in denials_while_renewing) instead
//     of waiting for the round trip: the same bound, bought with false denials while a
//     key's grant is under way. A level the authority would have to decide (no lease, a
//     cost above lease.units, a version revoked) is kUnavailable (the route's fail mode);
//     attempts are the Gateway's own; a deficit is charged by the renewal thread.
//   - Attempts: over an inner backend that shares them (Redis), a request with an attempt
//     id is decided there entirely, leased levels too: its record lives beside its budget,
//     so a retry is replayed at any process and across a reload that adds or removes a
//     lease; exact, since grants held anywhere are already spent there. Otherwise they
//     are the Gateway's own (its AttemptCache) and leases decide as for any request.
//
// Thread safety: any thread (as the inner backend).
//
//   quota::gateway::StoreBackend inner(store);             // or a redis::GatewayStore
//   quota::GrantLedger ledger;                    // shared by the holders
//   quota::gateway::LeasedBackend leased(inner, ledger);
//   quota::gateway::Gateway gw(leased, registry);
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "quota/decision.hpp"
#include "quota/detail/keyed_states.hpp"
#include "quota/detail/mutex.hpp"
#include "quota/gateway/backend.hpp"
#include "quota/gateway/leases/lease_grant.hpp"
#include "quota/gateway/leases/lease_metrics.hpp"
#include "quota/gateway/leases/lease_spec.hpp"
#include "quota/gateway/leases/lease_state.hpp"
#include "quota/lease/grant_ledger.hpp"
#include "quota/lease/holdings.hpp"

namespace quota::gateway {

template <GatewayBackend Inner, GrantRecorder Ledger = GrantLedger>
class LeasedBackend final : public Backend {
 public:
  // `inner` and `ledger` must outlive the backend. A backoff below 1 ns is raised to it.
  LeasedBackend(Inner& inner, Ledger& ledger, LeasedBackendOptions options = {})
      : inner_(inner),
        ledger_(ledger),
        options_(detail::filled(options)),
        backoff_(options_.backoff_min, options_.backoff_max, options_.incarnation) {
    if constexpr (RevocationAuthority<Ledger>) {
      listener_ = ledger_.subscribe([this](const Revocation& r) { revoked(r); });
    }
  }
  ~LeasedBackend() {
    if constexpr (RevocationAuthority<Ledger>) ledger_.unsubscribe(listener_);
  }
  LeasedBackend(const LeasedBackend&) = delete;
  LeasedBackend& operator=(const LeasedBackend&) = delete;

  std::uint64_t incarnation() const { return options_.incarnation; }

  // Non-blocking: the retry_after of a denial while the key's grant request is under way.
  static constexpr Nanos kWhileRenewing = std::chrono::milliseconds(1);

  absl::StatusOr<LevelsResult> decide(std::span<const LevelCheck> levels, std::uint64_t version,
                                      Nanos now) override {
    CheckVector<detail::KeyLease*> leased;
    for (const LevelCheck& l : levels) leased.push_back(lease_for(l, version, now));
    // A run: one leased level, decided from this process's grants, or the levels up to
    // the next leased one, one call of the inner backend (all or nothing there).
    const auto run_end = [&](std::size_t begin) {
      std::size_t end = begin + 1;
      if (leased[begin] == nullptr) {
        while (end < levels.size() && leased[end] == nullptr) ++end;
      }
      return end;
    };
    const auto decide_run = [&](std::size_t begin, std::size_t end, CheckVector<Decision>& parts,
                                CheckVector<Taken>& taken) -> absl::StatusOr<RunStep> {
      if (detail::KeyLease* lease = leased[begin]; lease != nullptr) {
        auto local = decide_local(*lease, levels[begin], version, now);
        if (!local.ok()) return local.status();
        if (!local->has_value()) {  // revoked for this version: the authority decides
          leased[begin] = nullptr;
          return RunStep{.redo = true};
        }
        parts.push_back(**local);
        if ((*local)->allowed) taken.push_back({.level = begin, .local = lease, .spent_at = now});
        return RunStep{};
      }
      if (options_.renewals != nullptr) {
        return absl::UnavailableError(absl::StrCat(
            "non-blocking: the level of ", quota::detail::to_absl(levels[begin].key),
            " would need the authority (no lease, a cost above lease.units, or its rule "
            "revoked for this version)"));
      }
      auto r = inner_.decide(levels.subspan(begin, end - begin), version, now);
      if (!r.ok()) return r.status();
      for (std::size_t k = 0; k < r->parts.size(); ++k) {
        parts.push_back(r->parts[k]);
        if (r->parts[k].allowed) {
          taken.push_back({.level = begin + k, .local = nullptr, .spent_at = r->time});
        }
      }
      return RunStep{.redo = false, .time = r->time};
    };
    return decide_all_or_nothing<Taken>(
        levels, now, run_end, decide_run,
        [&](std::span<const Taken> taken) { give_back(levels, taken, version, now); });
  }

  absl::StatusOr<MicroUnits> refund(const RulePolicy& policy, std::uint64_t version, LevelKey key,
                                    std::int64_t units, Nanos spent_at, Nanos now) override {
    if (detail::KeyLease* k = keys_.find(key.key)) {
      quota::detail::MutexLock lock(k->mu);
      if (k->leasing) return to_micro(k->give_back(units, counters(k->level)));
    }
    return inner_.refund(policy, version, key, units, spent_at, now);
  }

  absl::StatusOr<MicroUnits> charge(const RulePolicy& policy, std::uint64_t version, LevelKey key,
                                    std::int64_t units, Nanos now) override {
    if (options_.renewals == nullptr) return inner_.charge(policy, version, key, units, now);
    // Non-blocking: charged by the renewal thread (an error there leaves the deficit
    // uncharged, as a failed charge does on the caller's thread).
    auto owned =
        std::make_shared<OwnedLevel>(OwnedLevel{std::string(key.key), key.layout, policy, Rule{}});
    const bool posted = options_.renewals->post(
        {.run =
             [this, owned, version, units, now] {
               (void)inner_.charge(owned->policy, version, {owned->key, owned->layout}, units, now);
             },
         .dropped = {}});
    if (!posted) return absl::UnavailableError("non-blocking: the renewal queue is full");
    return to_micro(units);
  }

  // A request with an attempt id, over an inner backend that shares attempts: decided
  // there, every level (see the header comment).
  bool shares_attempts() const override {
    return options_.renewals == nullptr && inner_.shares_attempts();
  }
  absl::StatusOr<AttemptResult> decide_attempt(std::span<const LevelCheck> levels,
                                               std::uint64_t version, Nanos now,
                                               const AttemptRequest& attempt) override {
    return inner_.decide_attempt(levels, version, now, attempt);
  }

  // What this process holds, by key (an operator's view of one holder; the authority's
  // is the ledger). Expired grants are not listed.
  std::vector<Holding> holdings(Nanos now) {
    std::vector<Holding> out;
    keys_.for_each([&](const std::string& key, detail::KeyLease& k) {
      quota::detail::MutexLock lock(k.mu);
      if (auto h = k.holding(key, now)) out.push_back(*std::move(h));
    });
    std::sort(out.begin(), out.end(),
              [](const Holding& a, const Holding& b) { return a.key < b.key; });
    return out;
  }

  // A revocation heard from the authority (the ledger's subscription calls it): the units
  // held of the grants it covers are dropped now, and requests under versions below it
  // decide the rule's keys at the authority.
  void revoked(const Revocation& r) {
    heard_.add(r);
    keys_.for_each([&](const std::string&, detail::KeyLease& k) {
      quota::detail::MutexLock lock(k.mu);
      k.drop_revoked(r, counters(k.level));
    });
  }

  // Grant requests sent to the inner backend (authority round trips for leases).
  std::int64_t grant_requests() const { return grant_requests_.load(std::memory_order_relaxed); }

 private:
  struct Taken {
    std::size_t level;
    detail::KeyLease* local;  // leased: give back into the grant; else through inner
    Nanos spent_at;
  };

  LeaseCounters* counters(Level level) {
    return options_.metrics == nullptr ? nullptr : &options_.metrics->at(level);
  }

  // The key's lease if this level is decided from a grant now, else null (also when the
  // rule is revoked for `version`). Auto mode measures the key's rate here.
  detail::KeyLease* lease_for(const LevelCheck& l, std::uint64_t version, Nanos now) {
    if (l.rule == nullptr || !l.rule->lease.enabled()) return nullptr;
    const LeaseSpec& spec = l.rule->lease;
    if (l.cost > spec.units) return nullptr;  // larger than a grant: the authority decides
    detail::KeyLease* k = keys_.get_or_add(l.key, options_.max_keys,
                                           [&](detail::KeyLease& n) { n.level = l.rule->level; });
    if (k == nullptr) return nullptr;
    quota::detail::MutexLock lock(k->mu);
    if (version < revoked_below(*k, *l.rule)) return nullptr;
    k->measure(spec, l.cost, now, counters(l.rule->level));
    return k->leasing ? k : nullptr;
  }

  // The level's decision from the grants held; nullopt when the rule turned out revoked
  // for `version` (the authority decides it).
  absl::StatusOr<std::optional<Decision>> decide_local(detail::KeyLease& k, const LevelCheck& l,
                                                       std::uint64_t version, Nanos now) {
    const LeaseSpec& spec = l.rule->lease;
    LeaseCounters* c = counters(l.rule->level);
    std::unique_lock<quota::detail::Mutex> lock(k.mu);
    if (options_.renewals != nullptr) return decide_now(k, l, version, now, c);
    bool never = false;  // a grant of spec.units can never pass: ask for the need only
    // Bounded: each round spends, waits for the request in flight, or asks (a grant taken
    // may be spent by other threads before this one gets the lock back).
    for (int round = 0; round < 8; ++round) {
      if (version < revoked_below(k, *l.rule)) return std::nullopt;
      k.drop_stale(version, now, c);
      if (k.held() >= l.cost) {
        Decision d = k.spend(l.cost, version, c);
        if (k.held() <= spec.low_water && !k.renewing && k.request.may_ask(now)) {
          // The request that crosses the low-water mark renews; its own answer stands.
          (void)renew(k, lock, l, spec.units, version, now, c);
        }
        return d;
      }
      if (k.renewing) {
        k.done.wait(lock, [&] { return !k.renewing; });
        continue;
      }
      const std::int64_t need = l.cost - k.held();
      if (!never && !k.request.may_ask(now)) {
        if (!k.request.last_failure.ok()) return k.request.last_failure;  // backing off
        return deny(k, now, c);
      }
      const std::int64_t ask = never ? need : std::max(spec.units, need);
      auto renewed = renew(k, lock, l, ask, version, now, c);
      if (!renewed.ok()) return renewed.status();
      if (!renewed->has_value()) return std::nullopt;
      const Decision& got = **renewed;
      if (got.allowed) continue;
      // Denied: wait until a whole grant is there (the authority's retry_after for it), so
      // that at saturation every round trip brings `units`. A budget that cannot refill
      // to a whole grant (kNever) is asked once more for just what this request needs.
      if (never || ask == need || got.reason != Reason::kOverLimit || got.retry_after != kNever) {
        return deny(k, now, c);
      }
      never = true;
    }
    return deny(k, now, c);
  }

  Decision deny(detail::KeyLease& k, Nanos now, LeaseCounters* c) {
    if (c != nullptr) c->denials_while_leased.fetch_add(1, std::memory_order_relaxed);
    return k.wait_decision(now);
  }

  // Non-blocking (under k.mu): the level decided from what is held, never waiting; a
  // grant the key needs is posted to the renewal thread (see the top of this file).
  absl::StatusOr<std::optional<Decision>> decide_now(detail::KeyLease& k, const LevelCheck& l,
                                                     std::uint64_t version, Nanos now,
                                                     LeaseCounters* c) {
    const LeaseSpec& spec = l.rule->lease;
    if (version < revoked_below(k, *l.rule)) return std::nullopt;
    k.drop_stale(version, now, c);
    if (k.held() >= l.cost) {
      Decision d = k.spend(l.cost, version, c);
      if (k.held() <= spec.low_water && !k.renewing && k.request.may_ask(now)) {
        renew_later(k, l, spec.units, version, now, c);
      }
      return d;
    }
    if (!k.renewing) {
      if (!k.request.may_ask(now)) {
        if (!k.request.last_failure.ok()) return k.request.last_failure;  // backing off
        return deny(k, now, c);  // the authority denied a whole grant: its wait
      }
      renew_later(k, l, std::max(spec.units, l.cost - k.held()), version, now, c);
    }
    if (c != nullptr) c->denials_while_renewing.fetch_add(1, std::memory_order_relaxed);
    return Decision{.allowed = false,
                    .remaining = k.held(),
                    .retry_after = kWhileRenewing,
                    .reset_after = Nanos{0},
                    .version = version,
                    .reason = Reason::kOverLimit};
  }

  // A level's check with everything it points to owned: a renewal outlives the request
  // (and the rule set) that asked for it.
  struct OwnedLevel {
    std::string key;
    std::optional<KeyLayout> layout;
    RulePolicy policy;
    Rule rule;
    LevelCheck check() const {
      return {.policy = &policy,
              .key = key,
              .shadow = false,
              .cost = 1,
              .rule = &rule,
              .layout = layout};
    }
  };

  // Non-blocking (under k.mu): a grant request of `units` posted to the renewal thread,
  // which makes the round trip and adds the grant (take_and_hold). A full queue leaves the
  // key as it was: the next request posts again.
  void renew_later(detail::KeyLease& k, const LevelCheck& l, std::int64_t units,
                   std::uint64_t version, Nanos now, LeaseCounters* c) {
    const std::string id = begin_renewal(k, units, version);
    auto owned =
        std::make_shared<OwnedLevel>(OwnedLevel{std::string(l.key), l.layout, *l.policy, *l.rule});
    const bool posted = options_.renewals->post(
        {.run =
             [this, &k, owned, id, units, version, now, c] {
               std::unique_lock<quota::detail::Mutex> lock(k.mu, std::defer_lock);
               (void)take_and_hold(k, lock, owned->check(), id, units, version, now, c);
             },
         .dropped =
             [&k] {
               quota::detail::MutexLock lock(k.mu);
               k.renewing = false;
             }});
    if (!posted) k.renewing = false;
  }

  // The id of a grant request of `units` under `version` (kept while unanswered, so that
  // a lost reply is replayed, not taken twice); the key is renewing from here (under k.mu).
  std::string begin_renewal(detail::KeyLease& k, std::int64_t units, std::uint64_t version) {
    GrantRequest& r = k.request;
    if (r.pending_id.empty() || r.pending_units != units || r.pending_version != version) {
      r.pending_id =
          grant_id(options_.incarnation, sequence_.fetch_add(1, std::memory_order_relaxed) + 1);
      r.pending_units = units;
      r.pending_version = version;
    }
    k.renewing = true;
    return r.pending_id;
  }

  // One grant request of `units` on the key: the lock is released for the round trip,
  // `renewing` keeps it the only one in flight. nullopt: the rule is revoked for `version`
  // (the authority refused, or a revocation came while the request was in flight).
  absl::StatusOr<std::optional<Decision>> renew(detail::KeyLease& k,
                                                std::unique_lock<quota::detail::Mutex>& lock,
                                                const LevelCheck& l, std::int64_t units,
                                                std::uint64_t version, Nanos now,
                                                LeaseCounters* c) {
    const std::string id = begin_renewal(k, units, version);
    lock.unlock();
    return take_and_hold(k, lock, l, id, units, version, now, c);
  }

  // The round trip of grant request `id` (`lock`, on k.mu, not held), then its answer
  // applied to the key under the lock, which is held on return.
  absl::StatusOr<std::optional<Decision>> take_and_hold(
      detail::KeyLease& k, std::unique_lock<quota::detail::Mutex>& lock, const LevelCheck& l,
      const std::string& id, std::int64_t units, std::uint64_t version, Nanos now,
      LeaseCounters* c) {
    GrantRequest& r = k.request;
    const auto started = std::chrono::steady_clock::now();
    auto got = detail::take_grant(inner_, ledger_, l, id, units, version, now, grant_requests_);
    if (got.ok() && got->revoked_below > version) {
      revoked({.rule = l.rule->id, .below = got->revoked_below});  // as if notified
    }
    const auto took = std::chrono::duration_cast<Nanos>(std::chrono::steady_clock::now() - started);
    const std::uint64_t granted_version = got.ok() ? std::max(version, got->decision.version) : 0;
    if (got.ok() && got->revoked_below == 0 && got->decision.allowed && !got->replayed) {
      // Recorded before the key's lock is taken again: spending does not wait for it.
      const GrantRecord record{
          .key = std::string(l.key),
          .grant_id = id,
          .incarnation = options_.incarnation,
          .version = granted_version,
          .units = units,
          .granted_at = got->time,
          .expires_at = quota::detail::saturating_add(got->time, l.rule->lease.expiry),
          .rule = l.rule->id,
          .asked_version = version};
      if (!ledger_.record(record).ok() && c != nullptr) {
        c->record_failures.fetch_add(1, std::memory_order_relaxed);
      }
    }
    lock.lock();
    k.renewing = false;
    k.done.notify_all();
    if (c != nullptr) c->add_renewal_latency(took.count());
    if (!got.ok()) {
      if (c != nullptr) c->renewal_failures.fetch_add(1, std::memory_order_relaxed);
      // Unknown outcome: the retry keeps the id, so a grant taken is replayed.
      r.failed(got.status(), now, [this](int failures) { return backoff(failures); });
      return got.status();
    }
    r.answered();
    if (got->revoked_below != 0) return std::nullopt;  // refused: nothing taken
    if (c != nullptr) c->renewals.fetch_add(1, std::memory_order_relaxed);
    if (got->decision.allowed && version < revoked_below(k, *l.rule)) {
      // Revoked while in flight: the grant (recorded, listed as revoked) is not spent.
      if (c != nullptr) c->units_revoked.fetch_add(units, std::memory_order_relaxed);
      return std::nullopt;
    }
    if (!got->decision.allowed) {
      k.deny_until(got->decision, now, l.rule->lease.expiry);
    } else {
      k.add({.grant_id = id,
             .units = units,
             .version = granted_version,
             .expires_at = quota::detail::saturating_add(now, l.rule->lease.expiry),
             .rule = l.rule->id,
             .asked_version = version},
            c);
    }
    return std::optional<Decision>(got->decision);
  }

  // All or nothing: what the levels in `taken` deducted goes back.
  void give_back(std::span<const LevelCheck> levels, std::span<const Taken> taken,
                 std::uint64_t version, Nanos now) {
    for (const Taken& t : taken) {
      const LevelCheck& l = levels[t.level];
      if (t.local != nullptr) {
        quota::detail::MutexLock lock(t.local->mu);
        t.local->give_back(l.cost, counters(l.rule->level));
      } else {
        // An error here cannot over-admit: the level keeps the deduction.
        (void)inner_.refund(*l.policy, version, {l.key, l.layout}, l.cost, t.spent_at, now);
      }
    }
  }

  std::uint64_t revoked_below(detail::KeyLease& k, const Rule& rule) {
    return heard_.below(k.revocation, rule.id);
  }

  // The wait after `failures` failed grants in a row (lease/holder.hpp).
  Nanos backoff(int failures) { return backoff_.after(failures); }

  Inner& inner_;
  Ledger& ledger_;
  LeasedBackendOptions options_;
  detail::KeyLeases keys_;
  std::atomic<std::uint64_t> sequence_{0};
  std::atomic<std::int64_t> grant_requests_{0};
  GrantBackoff backoff_;
  quota::detail::RevocationsHeard heard_;
  std::uint64_t listener_ = 0;
};

}  // namespace quota::gateway
