// quota/gateway/leases/lease_state.hpp — what one gateway process holds of one leased key.
//
// The per-key state of LeasedBackend (leased_backend.hpp): the grants held (each with its
// own expiry and rule-set version, spent oldest first), the one grant request that may be
// in flight, the backoff after failures, the wait after a denial, and the rate measured
// for `lease: auto`. Internal: every member is used under `mu` by LeasedBackend, which
// documents the rules; the arithmetic is here so that it reads in one place.
//
// Thread safety: none of its own; the caller holds `mu`.
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/numeric/int128.h"
#include "absl/status/status.h"
#include "quota/decision.hpp"
#include "quota/detail/keyed_states.hpp"
#include "quota/detail/mutex.hpp"
#include "quota/gateway/leases/lease_grant.hpp"
#include "quota/gateway/leases/lease_metrics.hpp"
#include "quota/gateway/leases/lease_spec.hpp"
#include "quota/lease/grant_ledger.hpp"
#include "quota/lease/grant_request.hpp"
#include "quota/lease/holdings.hpp"
#include "quota/policy/policy.hpp"
#include "quota/units.hpp"

namespace quota::gateway::detail {

// One grant as its holder sees it.
struct HeldGrant {
  std::string grant_id{};
  std::int64_t units = 0;    // left to spend
  std::int64_t granted = 0;  // granted: a give-back never raises `units` above it
  std::uint64_t version = 0;
  Nanos expires_at{0};              // on the holder's clock: never spent at or after it
  std::string rule{};               // Rule::id of the rule it was asked for under
  std::uint64_t asked_version = 0;  // the holder's rule-set version when it asked
};

struct KeyLease {
  quota::detail::Mutex mu;
  std::condition_variable_any done;  // a grant request in flight finished
  Level level = Level::kTenant;
  bool leasing = false;  // decided from grants now (always with mode on)
  std::vector<HeldGrant> grants;
  bool renewing = false;  // a grant request is in flight
  // The grant request (lease/grant_request.hpp): a lost one's id, the wait before the
  // next (a denial, a failure), the failures in a row.
  GrantRequest request;
  Decision last_denial{};
  // The revocation of the key's rule this key last looked up (LeasedBackend: refreshed when
  // the backend's revocation epoch moves): requests under versions below it go to the
  // authority.
  std::uint64_t revocation_epoch = 0;
  std::string revoked_rule;
  std::uint64_t revoked_below = 0;
  // lease: auto — units decided in the current one-second window.
  Nanos window_start = Nanos::min();
  std::int64_t window_units = 0;

  std::int64_t held() const {
    std::int64_t n = 0;
    for (const HeldGrant& g : grants) n += g.units;
    return n;
  }

  bool may_ask(Nanos now) const { return request.may_ask(now); }

  // What is held of `key` at `now` (grants not expired), or nullopt when nothing.
  std::optional<Holding> holding(const std::string& key, Nanos now) const {
    Holding h{.key = key, .units = 0, .expires_at = Nanos::max(), .version = 0};
    for (const HeldGrant& g : grants) {
      if (now >= g.expires_at) continue;
      h.units += g.units;
      h.expires_at = std::min(h.expires_at, g.expires_at);
      h.version = std::max(h.version, g.version);
    }
    if (h.units == 0) return std::nullopt;
    return h;
  }

  // Drops the grants expired at `now` (unused at expiry) or taken under an older rule-set
  // version than `version` (dropped on a rule change).
  void drop_stale(std::uint64_t version, Nanos now, LeaseCounters* c) {
    std::erase_if(grants, [&](const HeldGrant& g) {
      const bool expired = now >= g.expires_at;
      if (!expired && g.version >= version) return false;
      if (c != nullptr) {
        c->units_held.fetch_sub(g.units, std::memory_order_relaxed);
        (expired ? c->units_unused_at_expiry : c->units_dropped_on_rule_change)
            .fetch_add(g.units, std::memory_order_relaxed);
      }
      return true;
    });
  }

  // Drops the grants `r` covers (revoked at the authority); returns their units.
  std::int64_t drop_revoked(const Revocation& r, LeaseCounters* c) {
    std::int64_t dropped = 0;
    std::erase_if(grants, [&](const HeldGrant& g) {
      if (!r.covers(g.rule, g.asked_version)) return false;
      dropped += g.units;
      return true;
    });
    if (c != nullptr) {
      c->units_held.fetch_sub(dropped, std::memory_order_relaxed);
      c->units_revoked.fetch_add(dropped, std::memory_order_relaxed);
    }
    return dropped;
  }

  void add(HeldGrant g, LeaseCounters* c) {
    g.granted = g.units;
    if (c != nullptr) c->units_held.fetch_add(g.units, std::memory_order_relaxed);
    request.retry_at = Nanos::min();
    grants.push_back(std::move(g));
    std::sort(grants.begin(), grants.end(),
              [](const HeldGrant& a, const HeldGrant& b) { return a.expires_at < b.expires_at; });
  }

  // Spends `cost` <= held(), the grant that expires first first.
  Decision spend(std::int64_t cost, std::uint64_t version, LeaseCounters* c) {
    std::uint64_t used = version;
    for (HeldGrant& g : grants) {
      const std::int64_t take = std::min(cost, g.units);
      if (take == 0) continue;
      g.units -= take;
      cost -= take;
      used = std::max(used, g.version);
      if (c != nullptr) c->units_held.fetch_sub(take, std::memory_order_relaxed);
      if (cost == 0) break;
    }
    return Decision{.allowed = true,
                    .remaining = held(),
                    .retry_after = Nanos{0},
                    .reset_after = Nanos{0},
                    .version = used,
                    .reason = Reason::kAllowed};
  }

  // Gives `units` back into the grants held (all or nothing with a later level's denial,
  // or a settle's surplus), never above what each was granted. Returns the units given;
  // what does not fit is dropped (never an admission beyond the bound).
  std::int64_t give_back(std::int64_t units, LeaseCounters* c) {
    std::int64_t given = 0;
    for (HeldGrant& g : grants) {
      const std::int64_t room = std::min(units - given, g.granted - g.units);
      g.units += room;
      given += room;
    }
    if (c != nullptr) c->units_held.fetch_add(given, std::memory_order_relaxed);
    return given;
  }

  // lease: auto — counts `cost` into the window; at each window's end decides whether the
  // key is leased: from `auto_rate` units/s up, and until it falls below half of it.
  void measure(const LeaseSpec& spec, std::int64_t cost, Nanos now, LeaseCounters* c) {
    if (spec.mode == LeaseMode::kOn) {
      leasing = true;
      return;
    }
    if (window_start == Nanos::min() || now < window_start) window_start = now;
    window_units += cost;
    const Nanos elapsed = now - window_start;
    if (elapsed < std::chrono::seconds(1)) return;
    const absl::int128 rate = absl::int128(window_units) * 1'000'000'000 / elapsed.count();
    const bool was = leasing;
    leasing = rate >= spec.auto_rate || (was && 2 * rate >= spec.auto_rate);
    window_start = now;
    window_units = 0;
    if (was && !leasing) {
      // Back to the authority: what is held is not spent any more.
      for (const HeldGrant& g : grants) {
        if (c != nullptr) {
          c->units_held.fetch_sub(g.units, std::memory_order_relaxed);
          c->units_unused_at_expiry.fetch_add(g.units, std::memory_order_relaxed);
        }
      }
      grants.clear();
    }
  }

  // After the authority denied a grant: do not ask before its retry_after (a budget
  // that never refills: before `expiry`, so that a rule change still reaches it).
  void deny_until(const Decision& d, Nanos now, Nanos expiry) {
    last_denial = d;
    request.hold_off(now, d.retry_after == kNever ? expiry : d.retry_after);
  }

  // A local denial while waiting for retry_at.
  Decision wait_decision(Nanos now) const {
    Decision d = last_denial;
    d.allowed = false;
    if (d.reason == Reason::kAllowed) d.reason = Reason::kOverLimit;
    d.remaining = held();
    if (d.retry_after != kNever) d.retry_after = request.wait_left(now);
    return d;
  }
};

// The revocations a process has heard (LeasedBackend::revoked), by rule id, and an epoch
// that moves with each: a KeyLease caches its rule's and looks again only when it moved.
class RevocationsHeard {
 public:
  void add(const Revocation& r) {
    {
      quota::detail::MutexLock lock(mu_);
      std::uint64_t& below = below_[r.rule];
      below = std::max(below, r.below);
    }
    epoch_.fetch_add(1, std::memory_order_acq_rel);
  }

  // The version below which `rule` is revoked (0: not revoked); the caller holds k.mu.
  std::uint64_t below(KeyLease& k, const std::string& rule) {
    const std::uint64_t epoch = epoch_.load(std::memory_order_acquire);
    if (epoch == 0) return 0;  // nothing revoked yet
    if (k.revocation_epoch != epoch || k.revoked_rule != rule) {
      quota::detail::MutexLock lock(mu_);
      auto it = below_.find(rule);
      k.revoked_below = it == below_.end() ? 0 : it->second;
      k.revoked_rule = rule;
      k.revocation_epoch = epoch;
    }
    return k.revoked_below;
  }

 private:
  quota::detail::Mutex mu_;
  absl::flat_hash_map<std::string, std::uint64_t> below_ ABSL_GUARDED_BY(mu_);
  std::atomic<std::uint64_t> epoch_{0};
};

// The keys a process leases (lease/holdings.hpp): per shard at most max_keys / 16 + 1
// (LeasedBackendOptions::max_keys); a key past that is decided by the authority.
using KeyLeases = quota::detail::HoldingTable<KeyLease>;

}  // namespace quota::gateway::detail
