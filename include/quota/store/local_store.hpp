// quota/store/local_store.hpp — key → state in one hash map, for one thread.
//
// The fastest store and the reference for the others: no locks, no atomics. Use it in
// single-threaded servers (one limiter per event loop) and in tests. Not thread-safe:
// every call must come from one thread at a time.
//
// Memory: one record per key (state, key size, key bytes; 40 bytes for a 10-byte key and
// a token bucket) plus a 4-byte id in an abseil hash index (quota/detail/keyed_states.hpp;
// bytes per key measured by benchmarks/store_bench.cpp, docs/benchmarks.md). Bounded by
// StoreOptions::max_keys with safe idle eviction (quota/store/store.hpp). Keys of up to
// 64 KiB less the state's size; a longer key gets InvalidArgument.
//
//   quota::LocalStore<quota::TokenBucket> store;
//   quota::TokenBucket tb{.rate = {10, std::chrono::seconds(1)}, .burst = 10};
//   auto d = store.apply(tb, "tenant-1:read", quota::Nanos{0}, 1);   // StatusOr<Decision>
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <utility>

#include "absl/container/inlined_vector.h"
#include "absl/hash/hash.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "quota/decision.hpp"
#include "quota/detail/keyed_states.hpp"
#include "quota/policy/policy.hpp"
#include "quota/store/store.hpp"

namespace quota {

template <Policy P>
class LocalStore {
 public:
  using policy_type = P;
  using State = typename P::State;

  explicit LocalStore(StoreOptions options = {})
      : states_(options.max_keys, options.assume_spent_at) {}

  absl::StatusOr<Decision> apply(const P& policy, std::string_view key, Nanos now,
                                 std::int64_t cost) {
    return update(policy, key, now, [&](State& s) { return policy.apply(s, now, cost); });
  }

  // Runs `fn(State&)` on the key's state (created fresh if absent).
  template <class Fn>
  auto update(const P& policy, std::string_view key, Nanos now, Fn&& fn)
      -> absl::StatusOr<std::invoke_result_t<Fn&, State&>> {
    return states_.update(policy, key, detail::key_hash(key), now, std::forward<Fn>(fn));
  }

  // Runs `fn(detail::OpenedStates<P>&)` over the keys `keys` (the i-th under
  // `policies[i]`) in one step: the multi-key form of update(), as
  // ShardedStore::update_all; a key `fn` never asks for is not created.
  template <class Fn>
  auto update_all(std::span<const P> policies, std::span<const std::string_view> keys, Nanos now,
                  Fn&& fn) -> absl::StatusOr<std::invoke_result_t<Fn&, detail::OpenedStates<P>&>> {
    if (policies.size() != keys.size()) {
      return absl::InvalidArgumentError("update_all: one policy per key");
    }
    absl::InlinedVector<typename detail::OpenedStates<P>::Key, 8> opened_keys;
    for (std::size_t k = 0; k < keys.size(); ++k) {
      states_.compact_if_due(policies[k]);
      opened_keys.push_back({.table = &states_,
                             .policy = &policies[k],
                             .key = keys[k],
                             .hash = detail::key_hash(keys[k])});
    }
    detail::OpenedStates<P> states(opened_keys, now);
    return std::forward<Fn>(fn)(states);
  }

  // Forgets every idle key; returns how many.
  std::size_t sweep(const P& policy, Nanos now) { return states_.sweep(policy, now); }
  std::size_t size() const { return states_.size(); }

 private:
  detail::KeyedStates<P> states_;
};

}  // namespace quota
