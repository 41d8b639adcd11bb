// quota/store/store.hpp — the StateStore concept and the options stores share.
//
// A store holds per-key policy state for many keys and applies a policy's transition
// atomically per key: read, refill, decide, deduct and write are one indivisible step,
// whichever thread (or, for the Redis store, whichever process) asks.
//
// Contract for every store S (with S::policy_type = P):
//   - `s.apply(policy, key, now, cost)` runs `policy.apply` on the key's state, creating
//     it with `policy.init(now)` on first use (in-process stores with
//     StoreOptions::assume_spent_at: `policy.exhausted(assume_spent_at)`). It returns a
//     Decision, or an error status when the environment fails (capacity exhausted,
//     authority unreachable): an error never deducts, and is never a silent allow or
//     deny.
//   - A key's state is forgotten only once `policy.idle_at(state) <= now`, i.e. when
//     recreating it fresh is the same state: a store never hands out an extra burst.
//   - Thread safety is per store: LocalStore is for one thread; ShardedStore and
//     RedisStore may be called from any number of threads.
//
//   template <quota::StateStore S>
//   absl::StatusOr<quota::Decision> one(S& s, const typename S::policy_type& p) {
//     return s.apply(p, "tenant-7:read", quota::Nanos{0}, 1);
//   }
#pragma once

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "absl/status/statusor.h"
#include "quota/decision.hpp"
#include "quota/policy/policy.hpp"

namespace quota {

template <class S>
concept StateStore = Policy<typename S::policy_type> &&
    requires(S& store, const typename S::policy_type& policy, std::string_view key, Nanos now,
             std::int64_t cost) {
  { store.apply(policy, key, now, cost) } -> std::same_as<absl::StatusOr<Decision>>;
};

// In-process stores also offer `update(policy, key, now, fn)`: run `fn(State&)`
// atomically on a key's state (created fresh if absent) and return its result. The
// gateway layer builds settle, rule changes and multi-key checks on it.
template <class S>
concept has_update = StateStore<S> &&
    requires(S& store, const typename S::policy_type& policy, std::string_view key, Nanos now) {
  store.update(policy, key, now, [](typename S::policy_type::State&) { return 0; });
};

struct StoreOptions {
  // The most keys the store holds at once. A new key that finds the store full first
  // evicts idle keys (those already full again); if none is idle, the new key gets
  // ResourceExhausted and nothing is created — existing keys keep their state, so an
  // active key is never reset to a fresh burst. Finding the idle keys costs O(log keys)
  // amortized per decision, never a scan of every key per new key
  // (quota/detail/keyed_states.hpp). ShardedStore applies the bound per shard: each
  // holds at most ceil(max_keys / shards).
  std::size_t max_keys = 10'000'000;
  // ShardedStore only: the number of independently locked shards (rounded up to a power
  // of two). More shards mean less contention between threads on distinct keys.
  std::size_t shards = 64;
  // Restart safety. A process that restarts loses its store, and a fresh store would give
  // every key a full budget again, on top of what the previous process admitted just
  // before it stopped. With `assume_spent_at` = this process's start (on the limiter's
  // clock), a key the store creates starts with its whole budget spent at that time
  // (`policy.exhausted(assume_spent_at)`), refilling from there: across the restart no
  // key gets more than one budget plus what the rate gives. A key first seen long after
  // (a time to fill or a window later) is simply full, as without the option.
  // Nanos::min() (the default): new keys start with a full budget. The policy must have
  // exhausted() (every policy of quota does); otherwise creating a key fails with
  // InvalidArgument.
  Nanos assume_spent_at = Nanos::min();
};

}  // namespace quota
