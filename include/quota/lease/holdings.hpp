// quota/lease/holdings.hpp — what a lease holder holds of each key: its grants, the
// request it may have in flight, the revocations it heard, and the table of its keys.
//
// Every lease holder — a LeasedLimiter (leased_limiter.hpp) and a gateway LeasedBackend
// (gateway/leases/leased_backend.hpp) — keeps, per key, a `GrantsHeld`: the grants held,
// each with its own expiry, rule-set version and rule, spent oldest expiry first; the
// grant request (grant_request.hpp: a lost request's id, the wait before the next); and
// the authority's last denial. `RevocationsHeard` is what a holder heard of revocations
// (grant_ledger.hpp), by rule. `HoldingTable<T>` is the table of a holder's per-key
// state, in 16 locked shards.
//
// Guarantees: a grant is never spent at or after its expiry (a time that saturated,
// Nanos::max(), is never reached) nor under a rule-set version newer than its own when
// the holder drops stale grants first; a give-back never raises a grant above the units
// it brought; every unit leaving the holding is counted in the holder's LeaseCounters
// (spent, unused at expiry, dropped on a rule change, revoked). A table entry, once added,
// stays at the same address for the table's lifetime (a holder keeps a pointer to it
// across a grant round trip) and is never removed; a shard's lock is held only for the
// lookup; the table holds at most max_keys / 16 + 1 keys per shard, and get_or_add
// answers nullptr past that (the caller then does not lease the key).
//
// Thread safety: HoldingTable's functions and RevocationsHeard may be called from any
// thread; a GrantsHeld's fields are guarded by its `mu`, which the caller locks.
//
//   detail::HoldingTable<detail::GrantsHeld> holdings;
//   detail::GrantsHeld* h = holdings.get_or_add("{acme}read", /*max_keys=*/100'000);
//   detail::MutexLock lock(h->mu);
//   h->add({.grant_id = id, .units = 100, .expires_at = now + 1s}, &counters);
//   Decision d = h->spend(1, /*version=*/0, &counters);
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "quota/decision.hpp"
#include "quota/detail/keyed_states.hpp"
#include "quota/detail/mutex.hpp"
#include "quota/lease/grant_ledger.hpp"
#include "quota/lease/grant_request.hpp"
#include "quota/lease/lease_counters.hpp"
#include "quota/units.hpp"

namespace quota::detail {

// One grant as its holder sees it.
struct HeldGrant {
  std::string grant_id{};
  std::int64_t units = 0;    // left to spend
  std::int64_t granted = 0;  // granted: a give-back never raises `units` above it
  std::uint64_t version = 0;
  Nanos expires_at{0};              // on the holder's clock: never spent at or after it
  std::string rule{};               // the rule it was asked for under (revocations)
  std::uint64_t asked_version = 0;  // the holder's rule-set version when it asked
};

// Whether `now` has reached `at`; a time that saturated (saturating_add) is never reached.
inline bool reached(Nanos now, Nanos at) { return now >= at && at != Nanos::max(); }

// What one holder holds of one key: the grants, the grant request, the last denial.
struct GrantsHeld {
  detail::Mutex mu;
  std::vector<HeldGrant> grants;  // by expiry, the first to expire first
  GrantRequest request;
  Decision last_denial{};

  std::int64_t held() const {
    std::int64_t n = 0;
    for (const HeldGrant& g : grants) n += g.units;
    return n;
  }

  // What the grants not expired at `now` hold: their units, the first expiry, the highest
  // version; nullopt when they hold nothing.
  struct Held {
    std::int64_t units = 0;
    Nanos expires_at = Nanos::max();
    std::uint64_t version = 0;
  };
  std::optional<Held> held_at(Nanos now) const {
    Held h;
    for (const HeldGrant& g : grants) {
      if (reached(now, g.expires_at)) continue;
      h.units += g.units;
      h.expires_at = std::min(h.expires_at, g.expires_at);
      h.version = std::max(h.version, g.version);
    }
    if (h.units <= 0) return std::nullopt;
    return h;
  }

  // Drops the grants expired at `now` or taken under an older rule-set version than
  // `version` (0: none is stale by version); returns the units that expired unused.
  std::int64_t drop_stale(std::uint64_t version, Nanos now, LeaseCounters* c) {
    std::int64_t unused = 0;
    std::erase_if(grants, [&](const HeldGrant& g) {
      const bool expired = reached(now, g.expires_at);
      if (!expired && g.version >= version) return false;
      if (expired) unused += g.units;
      if (c != nullptr) {
        c->units_held.fetch_sub(g.units, std::memory_order_relaxed);
        (expired ? c->units_unused_at_expiry : c->units_dropped_on_rule_change)
            .fetch_add(g.units, std::memory_order_relaxed);
      }
      return true;
    });
    return unused;
  }

  // Drops every grant (a key no longer leased): their units count as unused.
  void drop_all(LeaseCounters* c) {
    if (c != nullptr) {
      const std::int64_t units = held();
      c->units_held.fetch_sub(units, std::memory_order_relaxed);
      c->units_unused_at_expiry.fetch_add(units, std::memory_order_relaxed);
    }
    grants.clear();
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

  // A grant taken: held from now on (`granted` is set to its units).
  void add(HeldGrant g, LeaseCounters* c) {
    g.granted = g.units;
    if (c != nullptr) {
      c->units_held.fetch_add(g.units, std::memory_order_relaxed);
      c->grants.fetch_add(1, std::memory_order_relaxed);
      c->units_granted.fetch_add(g.units, std::memory_order_relaxed);
    }
    request.retry_at = Nanos::min();
    grants.push_back(std::move(g));
    std::sort(grants.begin(), grants.end(),
              [](const HeldGrant& a, const HeldGrant& b) { return a.expires_at < b.expires_at; });
  }

  // Spends `cost` <= held(), the grant that expires first first. `keep_spent`: a grant
  // spent to 0 stays until it expires, room for a give-back; else it is dropped.
  Decision spend(std::int64_t cost, std::uint64_t version, LeaseCounters* c,
                 bool keep_spent = true) {
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
    if (!keep_spent) std::erase_if(grants, [](const HeldGrant& g) { return g.units == 0; });
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

  // After the authority denied a grant: do not ask before its retry_after (a budget
  // that never refills, kNever: before `never_wait`, so that a rule change still reaches
  // the holder).
  void deny_until(const Decision& d, Nanos now, Nanos never_wait) {
    last_denial = d;
    request.hold_off(now, d.retry_after == kNever ? never_wait : d.retry_after);
  }

  // A local denial while waiting for the next request: the last denial, with what is
  // held and what is left of the wait (GrantRequest::wait_left; kNever stays kNever).
  Decision wait_decision(Nanos now) const {
    Decision d = last_denial;
    d.allowed = false;
    if (d.reason == Reason::kAllowed) d.reason = Reason::kOverLimit;
    d.remaining = held();
    if (d.retry_after != kNever) d.retry_after = request.wait_left(now);
    return d;
  }
};

// What a holder heard of revocations (GrantLedger::subscribe), by rule id, and an epoch
// that moves with each: a key caches its rule's (RevocationCache) and looks again only
// when the epoch moved.
struct RevocationCache {
  std::uint64_t epoch = 0;
  std::string rule;
  std::uint64_t below = 0;
};
class RevocationsHeard {
 public:
  void add(const Revocation& r) {
    {
      detail::MutexLock lock(mu_);
      std::uint64_t& below = below_[r.rule];
      below = std::max(below, r.below);
    }
    epoch_.fetch_add(1, std::memory_order_acq_rel);
  }

  // The version below which `rule` is revoked (0: not revoked); `cache` is the key's,
  // under its lock.
  std::uint64_t below(RevocationCache& cache, const std::string& rule) {
    const std::uint64_t epoch = epoch_.load(std::memory_order_acquire);
    if (epoch == 0) return 0;  // nothing revoked yet
    if (cache.epoch != epoch || cache.rule != rule) {
      detail::MutexLock lock(mu_);
      auto it = below_.find(rule);
      cache.below = it == below_.end() ? 0 : it->second;
      cache.rule = rule;
      cache.epoch = epoch;
    }
    return cache.below;
  }

 private:
  detail::Mutex mu_;
  absl::flat_hash_map<std::string, std::uint64_t> below_ ABSL_GUARDED_BY(mu_);
  std::atomic<std::uint64_t> epoch_{0};
};

// The per-key state of one holder, found through 16 locked shards (held only for the
// lookup), then each entry locked on its own: a lookup never waits for another key's
// grant round trip.
template <class T>
class HoldingTable {
 public:
  // The entry of `key`, added if missing (and then passed to `init`, under the shard's
  // lock, before any other thread can find it); nullptr when the key's shard already
  // holds max_keys / kShards + 1 keys.
  template <class Init>
  T* get_or_add(std::string_view key, std::size_t max_keys, Init&& init) {
    Shard& shard = shard_for(key);
    detail::MutexLock lock(shard.mu);
    auto it = shard.map.find(detail::to_absl(key));
    if (it != shard.map.end()) return it->second.get();
    if (shard.map.size() >= max_keys / kShards + 1) return nullptr;
    auto& slot = shard.map[std::string(key)];
    slot = std::make_unique<T>();
    init(*slot);
    return slot.get();
  }
  T* get_or_add(std::string_view key, std::size_t max_keys) {
    return get_or_add(key, max_keys, [](T&) {});
  }

  // The entry of `key`, or nullptr if there is none.
  T* find(std::string_view key) {
    Shard& shard = shard_for(key);
    detail::MutexLock lock(shard.mu);
    auto it = shard.map.find(detail::to_absl(key));
    return it == shard.map.end() ? nullptr : it->second.get();
  }

  // fn(key, entry) for every entry, one shard locked at a time.
  template <class Fn>
  void for_each(Fn&& fn) {
    for (Shard& shard : shards_) {
      detail::MutexLock lock(shard.mu);
      for (auto& [key, entry] : shard.map) fn(key, *entry);
    }
  }

 private:
  static constexpr std::size_t kShards = 16;
  struct alignas(64) Shard {
    detail::Mutex mu;
    absl::flat_hash_map<std::string, std::unique_ptr<T>> map ABSL_GUARDED_BY(mu);
  };
  Shard& shard_for(std::string_view key) {
    return shards_[detail::key_hash(key) >> 60];  // the top 4 bits: 16 shards
  }
  std::array<Shard, kShards> shards_;
};

}  // namespace quota::detail
