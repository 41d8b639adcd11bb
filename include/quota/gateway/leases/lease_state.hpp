// quota/gateway/leases/lease_state.hpp — what one gateway process holds of one leased key.
//
// The per-key state of LeasedBackend (leased_backend.hpp): the grants held and the grant
// request (lease/holdings.hpp's GrantsHeld, as every lease holder keeps them), whether a
// request is in flight, the key's cached revocation, and the rate measured for
// `lease: auto`. Internal: every member is used under `mu` by LeasedBackend, which
// documents the rules.
//
// Thread safety: none of its own; the caller holds `mu`.
#pragma once

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <optional>
#include <string>

#include "absl/numeric/int128.h"
#include "quota/gateway/leases/lease_grant.hpp"
#include "quota/gateway/leases/lease_spec.hpp"
#include "quota/lease/holdings.hpp"
#include "quota/lease/lease_counters.hpp"
#include "quota/policy/policy.hpp"
#include "quota/units.hpp"

namespace quota::gateway::detail {

struct KeyLease : quota::detail::GrantsHeld {
  std::condition_variable_any done;  // a grant request in flight finished
  Level level = Level::kTenant;
  bool leasing = false;   // decided from grants now (always with mode on)
  bool renewing = false;  // a grant request is in flight
  // The revocation of the key's rule this key last looked up (RevocationsHeard): requests
  // under versions below it go to the authority.
  quota::detail::RevocationCache revocation;
  // lease: auto — units decided in the current one-second window.
  Nanos window_start = Nanos::min();
  std::int64_t window_units = 0;

  // What is held of `key` at `now` (grants not expired), or nullopt when nothing.
  std::optional<Holding> holding(const std::string& key, Nanos now) const {
    const auto h = held_at(now);
    if (!h) return std::nullopt;
    return Holding{
        .key = key, .units = h->units, .expires_at = h->expires_at, .version = h->version};
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
    if (was && !leasing) drop_all(c);  // back to the authority: what is held is not spent
  }
};

// The keys a process leases (lease/holdings.hpp): per shard at most max_keys / 16 + 1
// (LeasedBackendOptions::max_keys); a key past that is decided by the authority.
using KeyLeases = quota::detail::HoldingTable<KeyLease>;

}  // namespace quota::gateway::detail
