// quota/store/sharded_store.hpp — key → state for many threads.
//
// Keys are hashed onto a power-of-two number of shards; each shard is a mutex and a
// hash map, on its own cache line (the mutex is std::mutex with abseil's thread-safety
// annotations: see quota/detail/mutex.hpp for why not absl::Mutex). A decision locks one
// shard for the length of one policy transition, so threads on distinct keys rarely
// meet, and threads on one key serialize exactly: read–refill–decide–deduct–write is one
// critical section. Eight threads racing to create one key create one state.
//
// Capacity: at most ceil(max_keys / shards) keys per shard. A new key in a full shard
// first evicts that shard's idle keys (those already full again, so forgetting them
// hands out nothing); if none is idle it gets ResourceExhausted and existing keys keep
// their state. Nothing is evicted in the background: call sweep() from a timer to
// reclaim memory early.
//
// Memory and the key bound are LocalStore's (quota/detail/keyed_states.hpp), per shard.
//
// Thread safety: every method may be called from any thread.
//
//   quota::ShardedStore<quota::TokenBucket> store({.max_keys = 1'000'000, .shards = 64});
//   auto d = store.apply(tb, "tenant-1:read", clock.now(), 1);
#pragma once

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string_view>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/container/inlined_vector.h"
#include "absl/hash/hash.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "quota/decision.hpp"
#include "quota/detail/keyed_states.hpp"
#include "quota/detail/mutex.hpp"
#include "quota/policy/policy.hpp"
#include "quota/store/store.hpp"

namespace quota {

template <Policy P>
class ShardedStore {
 public:
  using policy_type = P;
  using State = typename P::State;

  explicit ShardedStore(StoreOptions options = {})
      : shard_bits_(std::bit_width(std::bit_ceil(std::max<std::size_t>(options.shards, 1))) - 1),
        shards_(std::make_unique<Shard[]>(std::size_t{1} << shard_bits_)) {
    const std::size_t n = std::size_t{1} << shard_bits_;
    const std::size_t per_shard = (std::max<std::size_t>(options.max_keys, 1) + n - 1) / n;
    for (std::size_t i = 0; i < n; ++i) {
      shards_[i].states.emplace(per_shard, options.assume_spent_at);
    }
  }

  absl::StatusOr<Decision> apply(const P& policy, std::string_view key, Nanos now,
                                 std::int64_t cost) {
    return update(policy, key, now, [&](State& s) { return policy.apply(s, now, cost); });
  }

  // Runs `fn(State&)` on the key's state (created fresh if absent) under the shard lock.
  // `fn` must not call back into this store.
  template <class Fn>
  auto update(const P& policy, std::string_view key, Nanos now, Fn&& fn)
      -> absl::StatusOr<std::invoke_result_t<Fn&, State&>> {
    const std::size_t hash = detail::key_hash(key);
    Shard& shard = shard_for(hash);
    detail::MutexLock lock(shard.mu);
    return shard.states->update(policy, key, hash, now, std::forward<Fn>(fn));
  }

  // Runs `fn(detail::OpenedStates<P>&)` over the keys `keys` (the i-th under `policies[i]`)
  // with every shard they live in locked, so no other call sees any of them between the
  // first write and the last: one atomic step over several keys. `fn` asks for the
  // states it needs (states[i], a StatusOr: found, or created fresh; errors as update());
  // a key it never asks for is not created. Shards are locked in index order, so two such
  // calls never deadlock. `fn` must not call back into this store.
  template <class Fn>
  ABSL_NO_THREAD_SAFETY_ANALYSIS auto update_all(std::span<const P> policies,
                                                 std::span<const std::string_view> keys, Nanos now,
                                                 Fn&& fn)
      -> absl::StatusOr<std::invoke_result_t<Fn&, detail::OpenedStates<P>&>> {
    if (policies.size() != keys.size()) {
      return absl::InvalidArgumentError("update_all: one policy per key");
    }
    absl::InlinedVector<typename detail::OpenedStates<P>::Key, 8> opened_keys;
    absl::InlinedVector<std::size_t, 8> locked;
    for (std::size_t k = 0; k < keys.size(); ++k) {
      const std::size_t hash = detail::key_hash(keys[k]);
      locked.push_back(shard_index(hash));
      opened_keys.push_back(
          {.table = nullptr, .policy = &policies[k], .key = keys[k], .hash = hash});
    }
    for (std::size_t k = 0; k < keys.size(); ++k) {
      opened_keys[k].table = &*shards_[locked[k]].states;
    }
    std::sort(locked.begin(), locked.end());
    locked.erase(std::unique(locked.begin(), locked.end()), locked.end());
    for (std::size_t i : locked) shards_[i].mu.lock();
    struct Unlock {
      ShardedStore* store;
      std::span<const std::size_t> shards;
      ~Unlock() ABSL_NO_THREAD_SAFETY_ANALYSIS {
        for (std::size_t i : shards) store->shards_[i].mu.unlock();
      }
    } unlock{this, locked};
    for (const auto& k : opened_keys) k.table->compact_if_due(*k.policy);
    detail::OpenedStates<P> states(opened_keys, now);
    return std::forward<Fn>(fn)(states);
  }

  // Forgets every idle key in every shard; returns how many.
  std::size_t sweep(const P& policy, Nanos now) {
    std::size_t removed = 0;
    for (std::size_t i = 0; i < shard_count(); ++i) {
      detail::MutexLock lock(shards_[i].mu);
      removed += shards_[i].states->sweep(policy, now);
    }
    return removed;
  }

  std::size_t size() const {
    std::size_t total = 0;
    for (std::size_t i = 0; i < shard_count(); ++i) {
      detail::MutexLock lock(shards_[i].mu);
      total += shards_[i].states->size();
    }
    return total;
  }

  std::size_t shard_count() const { return std::size_t{1} << shard_bits_; }

 private:
  struct alignas(64) Shard {
    mutable detail::Mutex mu;
    // std::optional only to construct it with the per-shard capacity after the array.
    std::optional<detail::KeyedStates<P>> states ABSL_GUARDED_BY(mu);
  };

  // The shard comes from the hash's top bits; the map inside uses the low ones, so keys
  // of one shard still spread over its map.
  std::size_t shard_index(std::size_t hash) const {
    return shard_bits_ == 0 ? 0 : hash >> (64 - shard_bits_);
  }
  Shard& shard_for(std::size_t hash) const { return shards_[shard_index(hash)]; }

  int shard_bits_;
  std::unique_ptr<Shard[]> shards_;
};

}  // namespace quota
