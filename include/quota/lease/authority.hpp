// quota/lease/authority.hpp — the authority that grants leases, and an in-process one.
//
// A LeaseAuthority grants units: one atomic acquire of `units` from the key's central
// token bucket, idempotent per grant id, so that a LeasedLimiter (leased_limiter.hpp)
// can retry a request whose reply was lost without being charged twice. StoreAuthority
// is the in-process authority, for tests, simulations and single-host setups; the Redis
// authority is quota/redis/lease_authority.hpp.
//
// Thread safety: StoreAuthority may be called from any thread.
//
//   quota::TokenBucket tb{.rate = {.units = 10'000, .per = 1s}, .burst = 2'000};
//   quota::StoreAuthority<> authority(tb);
//   auto d = authority.grant("{acme}read", 500, "5f3a-1");  // StatusOr<Decision>
//   // asking again with the id "5f3a-1" replays *d and takes nothing more
#pragma once

#include <atomic>
#include <chrono>
#include <concepts>
#include <cstdint>
#include <string_view>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "quota/attempts.hpp"
#include "quota/clock.hpp"
#include "quota/decision.hpp"
#include "quota/detail/keyed_states.hpp"
#include "quota/limiter.hpp"
#include "quota/policy/token_bucket.hpp"
#include "quota/store/sharded_store.hpp"

namespace quota {

// The authority grants units: `grant(key, units, grant_id)` is one atomic acquire of
// `units` from the key's central token bucket, idempotent per grant id (the same id
// replays the first decision; the same id with another key or units is an error).
// Errors mean "unknown": the grant may or may not have been taken.
template <class A>
concept LeaseAuthority = requires(A& a, std::string_view key, std::int64_t units,
                                  std::string_view grant_id) {
  { a.grant(key, units, grant_id) } -> std::same_as<absl::StatusOr<Decision>>;
};

// An in-process authority: the central token bucket in an in-process store, with grant
// ids remembered for `grant_id_ttl`. For tests, simulations and single-host setups; the
// Redis authority is quota/redis/lease_authority.hpp. Thread-safe.
// (`template <class>`, not `template <Policy>`: clang 14 crashes on a constrained template
// template parameter with a default here; the stores constrain their policy themselves.)
template <template <class> class Store = ShardedStore, Clock C = SteadyClock>
class StoreAuthority {
 public:
  explicit StoreAuthority(TokenBucket policy, C clock = {},
                          Nanos grant_id_ttl = std::chrono::minutes(10))
      : policy_(policy), clock_(std::move(clock)), ids_(grant_id_ttl, 1'000'000) {}

  absl::StatusOr<Decision> grant(std::string_view key, std::int64_t units,
                                 std::string_view grant_id) {
    round_trips_.fetch_add(1, std::memory_order_relaxed);
    if (auto s = policy_.validate(); !s.ok()) return s;
    if (auto s = validate_key(key); !s.ok()) return s;
    const Nanos now = clock_.now();
    auto begin = ids_.begin(grant_id, absl::StrCat(detail::to_absl(key), "\n", units), now);
    if (!begin.ok()) return begin.status();
    if (begin->replay) return *begin->replay;
    auto d = store_.apply(policy_, key, now, units);
    if (!d.ok()) {
      ids_.abandon(grant_id);
      return d.status();
    }
    ids_.finish(grant_id, *d);
    return d;
  }

  // Calls of grant(), replays included: the authority round trips a real one would see.
  std::int64_t round_trips() const { return round_trips_.load(std::memory_order_relaxed); }
  const TokenBucket& policy() const { return policy_; }

 private:
  TokenBucket policy_;
  C clock_;
  Store<TokenBucket> store_;
  AttemptCache ids_;
  std::atomic<std::int64_t> round_trips_{0};
};

}  // namespace quota
