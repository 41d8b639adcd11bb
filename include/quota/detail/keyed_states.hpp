// quota/detail/keyed_states.hpp — one hash map of key → state with bounded size and
// safe idle eviction. The building block of LocalStore (one of them) and ShardedStore
// (one per shard, under the shard's lock). Not thread-safe by itself.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/hash/hash.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "quota/policy/policy.hpp"

namespace quota::detail {

// Debian's abseil has its own absl::string_view (not std::string_view). Keys cross into
// the map through it, and are hashed with the map's own hash (StringHash hashes
// absl::string_view this way) so a lookup hashes the key once.
inline absl::string_view to_absl(std::string_view s) {
  return absl::string_view(s.data(), s.size());
}
inline std::size_t key_hash(std::string_view key) {
  return absl::Hash<absl::string_view>{}(to_absl(key));
}

template <Policy P>
class KeyedStates {
 public:
  using State = typename P::State;

  // `initial` slots are reserved up front: the sharded store gives each shard a few, so
  // that two shards' first keys never share a cache line (false sharing between threads
  // on distinct keys).
  explicit KeyedStates(std::size_t capacity, std::size_t initial = 0)
      : capacity_(std::max<std::size_t>(capacity, 1)) {
    if (initial > 0) map_.reserve(initial);
  }

  // Finds or creates the state of `key` (hash = key_hash(key)) and returns a pointer to it, valid
  // until the next call that may insert or evict. ResourceExhausted when the map is full and no key
  // is idle.
  absl::StatusOr<State*> find_or_create(const P& policy, std::string_view key, std::size_t hash,
                                        Nanos now) {
    if (auto it = map_.find(to_absl(key), hash); it != map_.end()) return &it->second;
    if (map_.size() >= capacity_ && !evict_idle(policy, now)) {
      return absl::ResourceExhaustedError(absl::StrFormat(
          "store full: %d keys held, none idle (full again) to evict; key \"%s\" not created",
          map_.size(), key));
    }
    // The new key's idle time is not known until the caller has spent from it, so the
    // next full store sweeps again rather than trusting next_sweep_.
    next_sweep_ = Nanos::min();
    return &map_.try_emplace(std::string(key), policy.init(now)).first->second;
  }

  // Forgets every key that is idle at `now` (its state equals a fresh one). Returns how
  // many were removed.
  std::size_t sweep(const P& policy, Nanos now) {
    std::size_t removed = 0;
    Nanos next = kNever;
    for (auto it = map_.begin(); it != map_.end();) {
      const Nanos idle = policy.idle_at(it->second);
      if (idle <= now) {
        map_.erase(it++);
        ++removed;
      } else {
        next = std::min(next, idle);
        ++it;
      }
    }
    next_sweep_ = next;
    return removed;
  }

  std::size_t size() const { return map_.size(); }

 private:
  // A full sweep is O(size); it runs only when the map is full and some key may have
  // become idle since the last sweep. next_sweep_ is the earliest idle time the last
  // sweep saw; spending only moves a key's idle time later, so it stays a lower bound
  // until a key is inserted. A full store of active keys thus rejects new keys in O(1).
  bool evict_idle(const P& policy, Nanos now) {
    if (now < next_sweep_) return false;
    return sweep(policy, now) > 0;
  }

  std::size_t capacity_;
  Nanos next_sweep_{Nanos::min()};
  absl::flat_hash_map<std::string, State> map_;
};

}  // namespace quota::detail
