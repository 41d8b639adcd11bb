// quota/lease/leased_limiter.hpp — quota leases for hot tenants.
//
// A hot tenant serializes on one key at the authority, and no number of Redis shards
// splits one key. A LeasedLimiter lets each gateway process take a *grant* of q units
// from the authority in one ordinary atomic acquire, then spend it locally with no round
// trip, and ask again when it runs out. Grants expire (checked before every local spend),
// are never refunded, and are idempotent per grant id, so a lost reply never charges
// twice. With at most H grant holders per key, admitted(T) <= r·T + B + H·q_max over any
// interval of length T. The rules are on LeasedLimiter; the authority side
// (LeaseAuthority, StoreAuthority) is in authority.hpp; what the process holds per key
// is lease/holdings.hpp's GrantsHeld, as for every lease holder.
//
// Thread safety: acquire() may be called from any number of threads.
//
//   quota::StoreAuthority<> authority(tb);                      // in-process authority
//   auto leased = quota::LeasedLimiter<quota::StoreAuthority<>>::create(authority,
//                                                                     {.q_max = 1000});
//   absl::StatusOr<quota::Decision> d = (*leased)->acquire("{acme}read", 1);
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <concepts>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/numeric/int128.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "quota/clock.hpp"
#include "quota/decision.hpp"
#include "quota/detail/keyed_states.hpp"
#include "quota/detail/mutex.hpp"
#include "quota/lease/authority.hpp"
#include "quota/lease/holder.hpp"
#include "quota/lease/holdings.hpp"
#include "quota/lease/lease_counters.hpp"
#include "quota/lease/lease_options.hpp"
#include "quota/limiter.hpp"
#include "quota/policy/token_bucket.hpp"
#include "quota/store/sharded_store.hpp"

namespace quota {

// Rules (DESIGN §6):
//   - A grant is a normal acquire of q units from the central token bucket, which
//     refills as usual. A grant is never refunded — not on expiry, not on shutdown:
//     refunding would create a second copy of capacity that a paused holder may still
//     believe it has.
//   - Local spending never refills. A grant expires `grant_ttl` after it was requested
//     (measured on this process's clock, from before the request was sent, so early);
//     the expiry is checked before EVERY local spend, with a clock that keeps counting
//     while the process is paused (SteadyClock: CLOCK_MONOTONIC). A process that wakes
//     after a pause longer than the expiry spends nothing of the old grant.
//   - At most one grant request per key per process is in flight: the key's local
//     lock is held across the round trip, so other threads of this process wait for it
//     rather than stampede the authority. After a failure the key backs off
//     exponentially (backoff_min .. backoff_max, with jitter) before asking again, so a
//     recovering authority is not stampeded either; meanwhile held units are still
//     spent, and a request that needs a grant gets the failure (kUnavailable).
//   - Every grant request carries a grant id `<incarnation>-<n>`; the incarnation is new
//     for every LeasedLimiter (every process start). A request whose reply was lost is
//     retried with the SAME id, and the authority replays the same grant (idempotent),
//     so a lost reply never charges twice. A restarted process has a new incarnation
//     and no grants: whatever the old one held is lost, never re-spent.
//   - q adapts to the local rate between q_min and q_max: a grant should last about
//     half its ttl, so a quiet gateway does not hoard budget. A cost above q_max is not
//     leased: it goes to the authority directly.
//   - A holder out of units that the authority denies waits (answering local denials
//     with what is left of the authority's retry_after, finite even when now plus that
//     wait leaves the int64 range: times saturate) instead of asking again at once, and
//     after a grant that left less than q at the authority it does not ask before q
//     could have refilled: at saturation every round trip brings q units.
//   - A budget that cannot refill (rate 0, a one-off budget): a grant it denies with
//     kNever is asked again for just what the request needs; once that is denied too,
//     the holder answers kNever locally (for that need and more) and asks the authority
//     again only once per grant_ttl, so that a rule change still reaches it.
//
// Overshoot bound. Units held at time s were granted before s; units granted in
// [s, t] obey the central bucket, ≤ r·(t − s) + B; and each holder holds at most q_max
// units at any time. So with at most H grant holders (incarnations) per key:
//
//     admitted(T) ≤ r·T + B + H·q_max        for every interval of length T.
//
// tests/leased_limiter_test.cpp checks it with the envelope verifier. A policy change or
// a revocation at the authority reaches holders at the latest at expiry: units already
// granted are spent under the old rule until then.
template <LeaseAuthority A, Clock C = SteadyClock>
class LeasedLimiter {
 public:
  // `authority` must outlive the limiter. Invalid options: see create().
  static absl::StatusOr<std::unique_ptr<LeasedLimiter>> create(A& authority, LeaseOptions options,
                                                               C clock = {}) {
    if (options.q_min < 1 || options.q_max < options.q_min || options.q_max > kMaxUnits) {
      return absl::InvalidArgumentError(
          absl::StrFormat("lease q_min/q_max must satisfy 1 <= q_min <= q_max <= %d (got %d, %d)",
                          kMaxUnits, options.q_min, options.q_max));
    }
    if (options.grant_ttl <= Nanos{0} || options.backoff_min <= Nanos{0} ||
        options.backoff_max < options.backoff_min) {
      return absl::InvalidArgumentError(
          "lease grant_ttl and backoff_min must be positive and backoff_max >= backoff_min");
    }
    if (options.central) {
      if (auto s = options.central->validate(); !s.ok()) return s;
    }
    if (options.incarnation == 0) options.incarnation = random_incarnation();
    return std::unique_ptr<LeasedLimiter>(new LeasedLimiter(authority, options, std::move(clock)));
  }

  absl::StatusOr<Decision> acquire(std::string_view key, std::int64_t cost = 1) {
    if (auto s = validate_key(key); !s.ok()) return s;
    if (cost < 1) return detail::never_decision(Reason::kInvalidCost, 0, Nanos{0});
    if (cost > options_.q_max) return direct(key, cost);
    Holding* h = holding(key);
    if (h == nullptr) return direct(key, cost);
    detail::MutexLock lock(h->mu);
    const Nanos now = clock_.now();
    // Expired (or the process was paused): nothing of it is spent.
    if (h->drop_stale(0, now, &counters_) > 0) h->q = std::max(options_.q_min, h->q / 2);
    if (h->held() >= cost) return spend(*h, cost);
    if (!h->request.may_ask(now)) {
      if (!h->request.last_failure.ok()) return h->request.last_failure;  // backing off
      // A budget that never refills is "never" for what it denied, and for more; a
      // request that needs less may still pass, so it asks.
      if (!h->never || cost - h->held() >= h->never_need) return h->wait_decision(now);
    }
    return refill_and_spend(key, *h, now, cost);
  }

  // What is held for `key`, if any units are held and not expired: the units of every
  // grant held, the id and version of the last one taken, the first expiry.
  std::optional<Grant> held(std::string_view key) {
    Holding* h = holdings_.find(key);
    if (h == nullptr) return std::nullopt;
    detail::MutexLock lock(h->mu);
    const auto held = h->held_at(clock_.now());
    if (!held) return std::nullopt;
    return Grant{.grant_id = h->last_grant_id,
                 .incarnation = options_.incarnation,
                 .version = h->version,
                 .units = held->units,
                 .expires_at = held->expires_at};
  }

  std::uint64_t incarnation() const { return options_.incarnation; }
  // What this limiter's leases did (lease_counters.hpp): grants, renewals, their latency
  // and failures.
  const LeaseCounters& counters() const { return counters_; }
  // Grants taken (successful grant round trips) and units they brought.
  std::int64_t grants() const { return counters_.grants.load(std::memory_order_relaxed); }
  std::int64_t granted_units() const {
    return counters_.units_granted.load(std::memory_order_relaxed);
  }
  const LeaseOptions& options() const { return options_; }

 private:
  // One key's holding: the grants held and the request (holdings.hpp), with the grant
  // size aimed at and what was spent since the last grant (next_q), the version and id
  // of the authority's last answer, and a denial for ever (a budget that cannot refill)
  // for a request needing `never_need` more units than were held.
  struct Holding : detail::GrantsHeld {
    std::int64_t q = 0;
    Nanos granted_at{Nanos::min()};
    std::int64_t spent_since_grant = 0;
    std::uint64_t version = 0;
    std::string last_grant_id;
    bool never = false;
    std::int64_t never_need = 0;
  };

  LeasedLimiter(A& authority, LeaseOptions options, C clock)
      : authority_(authority),
        options_(std::move(options)),
        clock_(std::move(clock)),
        backoff_(options_.backoff_min, options_.backoff_max, options_.incarnation) {}

  Holding* holding(std::string_view key) { return holdings_.get_or_add(key, options_.max_keys); }

  // Spends `cost` <= held(): nothing keeps a spent grant (no give-back here).
  Decision spend(Holding& h, std::int64_t cost) ABSL_EXCLUSIVE_LOCKS_REQUIRED(h.mu) {
    h.spent_since_grant += cost;
    Decision d = h.spend(cost, h.version, &counters_, /*keep_spent=*/false);
    d.version = h.version;
    return d;
  }

  // The grant size for the next request: about half a ttl of the local rate since the
  // last grant, within [q_min, q_max], and at least what this request needs.
  std::int64_t next_q(const Holding& h, Nanos now, std::int64_t need) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(h.mu) {
    std::int64_t q = h.q == 0 ? options_.q_min : h.q;
    if (h.granted_at != Nanos::min()) {
      // In 128 bits: two times may be further apart than int64 holds.
      const absl::int128 elapsed =
          std::max<absl::int128>(1, absl::int128(now.count()) - h.granted_at.count());
      const absl::int128 target =
          absl::int128(h.spent_since_grant) * (options_.grant_ttl.count() / 2) / elapsed;
      q = target > options_.q_max ? options_.q_max : static_cast<std::int64_t>(target);
    }
    return std::clamp(std::max(q, need), options_.q_min, options_.q_max);
  }

  absl::StatusOr<Decision> refill_and_spend(std::string_view key, Holding& h, Nanos now,
                                            std::int64_t cost) ABSL_EXCLUSIVE_LOCKS_REQUIRED(h.mu) {
    // At most three grant requests: a retried (pending) one may bring fewer units than
    // this request needs; a grant larger than the central burst is refused as a whole; a
    // grant larger than what is left of a budget that never refills is refused for ever.
    // The last two are asked again for just what this request needs.
    for (int round = 0; round < 3; ++round) {
      GrantRequest& r = h.request;
      if (r.pending_id.empty()) {
        // Units still held (fewer than cost) stay; the grant tops them up to the target,
        // so no holder ever holds more than q_max: the overshoot bound.
        r.pending_units = next_q(h, now, cost) - h.held();
        r.pending_id = grant_id(options_.incarnation, ++sequence_);
      }
      const std::int64_t units = r.pending_units;
      const auto asked = std::chrono::steady_clock::now();
      auto d = authority_.grant(key, units, r.pending_id);
      counters_.add_renewal_latency(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                        std::chrono::steady_clock::now() - asked)
                                        .count());
      if (!d.ok()) {
        // Unknown outcome (kUnavailable): the id stays, so that the retry replays a grant
        // already taken; a definite error (e.g. an invalid key) took nothing.
        counters_.renewal_failures.fetch_add(1, std::memory_order_relaxed);
        r.failed(d.status(), now, [this](int failures) { return backoff(failures); });
        return d.status();
      }
      counters_.renewals.fetch_add(1, std::memory_order_relaxed);
      if (d->allowed) {
        // `now` was read before the request: the grant expires early, never late.
        h.add({.grant_id = r.pending_id,
               .units = units,
               .version = d->version,
               .expires_at = detail::saturating_add(now, options_.grant_ttl)},
              &counters_);
        h.last_grant_id = r.pending_id;
      }
      r.answered();
      h.version = d->version;
      if (d->allowed) {
        h.q = h.held();
        h.granted_at = now;
        h.spent_since_grant = 0;
        h.never = false;
        if (const auto wait = not_before(*d, next_q(h, now, cost))) {
          r.hold_off(now, *wait);
        } else {
          r.retry_at = Nanos::min();
        }
        if (h.held() >= cost) return spend(h, cost);
        continue;  // a replayed grant smaller than this request needs: top up once more
      }
      if (d->reason == Reason::kCostExceedsBurst && units > cost - h.held()) {
        h.q = cost;  // the grant exceeded the central burst: ask for just this request
        r.pending_units = cost - h.held();
        r.pending_id = grant_id(options_.incarnation, ++sequence_);
        continue;
      }
      if (d->reason != Reason::kOverLimit) return *d;  // a configuration error: not cached
      const std::int64_t need = cost - h.held();
      if (d->retry_after == kNever && units > need) {
        // Never `units` more; what this request needs may still be there.
        r.pending_units = need;
        r.pending_id = grant_id(options_.incarnation, ++sequence_);
        continue;
      }
      // Wait for the authority's retry time. A budget that never refills answers kNever
      // (for this need and more) and is asked again once per grant_ttl, so that a rule
      // change still reaches this holder.
      h.never = d->retry_after == kNever;
      h.never_need = need;
      h.deny_until(*d, now, options_.grant_ttl);
      return h.wait_decision(now);
    }
    return h.wait_decision(now);
  }

  // After a grant that left `d.remaining` centrally, q more units cannot be there
  // before they refill: how long not to ask (if the central policy is known), finite.
  std::optional<Nanos> not_before(const Decision& d, std::int64_t q) const {
    if (!options_.central || d.remaining >= q) return std::nullopt;
    const TokenBucket& tb = *options_.central;
    if (tb.rate.units == 0) return std::nullopt;  // never refills: ask (and be denied)
    // `remaining` is rounded down, so this wait is an upper bound: by then q units are
    // there unless someone else spent them (then the request is denied and waits).
    const absl::int128 wait =
        detail::ceil_div(absl::int128(q - d.remaining) * tb.rate.per.count(), tb.rate.units);
    return Nanos{static_cast<std::int64_t>(std::min(wait, detail::kInt64Max - 1))};
  }

  // The wait after `failures` failed grants in a row (holder.hpp).
  Nanos backoff(int failures) { return backoff_.after(failures); }

  // A cost above q_max: one direct acquire at the authority, not leased.
  absl::StatusOr<Decision> direct(std::string_view key, std::int64_t cost) {
    const std::string id = direct_grant_id(options_.incarnation, sequence_.fetch_add(1) + 1);
    return authority_.grant(key, cost, id);
  }

  A& authority_;
  LeaseOptions options_;
  C clock_;
  detail::HoldingTable<Holding> holdings_;
  std::atomic<std::uint64_t> sequence_{0};
  LeaseCounters counters_;
  GrantBackoff backoff_;
};

}  // namespace quota
