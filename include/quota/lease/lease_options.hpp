// quota/lease/lease_options.hpp — the terms a LeasedLimiter (leased_limiter.hpp) leases
// on, and what it holds under them: LeaseOptions (the grant sizes q_min .. q_max, the
// grant's time to live, the backoff after a failure, the incarnation, how many keys are
// held at once, the central bucket's policy when known) and Grant (one key's holding:
// the last grant's id and incarnation, the policy version, the units left and when they
// expire on the holder's clock).
//
// Guarantees: the overshoot bound r·T + B + H·q_max (leased_limiter.hpp) is in terms of
// q_max; grant_ttl bounds how long a holder may spend a grant after it asked for it.
// LeasedLimiter::create checks the options (1 <= q_min <= q_max, positive times,
// backoff_min <= backoff_max) and refuses bad ones with InvalidArgument naming them.
//
// Thread safety: plain values.
//
//   quota::LeaseOptions options{.q_max = 500, .grant_ttl = std::chrono::milliseconds(500)};
//   auto leased = quota::LeasedLimiter<quota::StoreAuthority<>>::create(authority, options);
//   std::optional<quota::Grant> g = (*leased)->held("{acme}read");
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "quota/policy/token_bucket.hpp"
#include "quota/units.hpp"

namespace quota {

// What a holder holds for one key (LeasedLimiter::held): the last grant's id (which
// names the owner's incarnation), the policy version it was granted under, the units
// still held, and when they expire on the holder's clock.
struct Grant {
  std::string grant_id;
  std::uint64_t incarnation = 0;
  std::uint64_t version = 0;
  std::int64_t units = 0;
  Nanos expires_at{0};
};

struct LeaseOptions {
  std::int64_t q_min = 1;     // smallest grant, units
  std::int64_t q_max = 1000;  // largest grant, units; the overshoot bound is H·q_max
  Nanos grant_ttl = std::chrono::seconds(1);
  Nanos backoff_min = std::chrono::milliseconds(1);
  Nanos backoff_max = std::chrono::seconds(1);
  // 0: a fresh random incarnation (the default; one per process start).
  std::uint64_t incarnation = 0;
  // Most keys held at once (per shard: max_keys / 16 + 1); a new key beyond it goes to
  // the authority directly.
  std::size_t max_keys = 100'000;
  // The central bucket's policy, when known: lets a holder skip asking before q units
  // could have refilled (fewer denied round trips at saturation). Optional.
  std::optional<TokenBucket> central = std::nullopt;
};

}  // namespace quota
