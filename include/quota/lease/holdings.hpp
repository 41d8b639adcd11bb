// quota/lease/holdings.hpp — what one process holds of each leased key, and the table
// every lease holder keeps its keys in.
//
// A LeasedLimiter (leased_limiter.hpp) keeps, per key, a LeaseHolding: the units left of
// its last grant and when they expire, the grant size it aims at, the grant request whose
// reply was lost (retried with the same id), and how long not to ask the authority after
// a denial or a failure. `HoldingTable<T>` is the table of a holder's per-key state, in 16
// locked shards: the limiter's LeaseHoldings, and the gateway's KeyLease table
// (gateway/leases/lease_state.hpp).
//
// Guarantees: an entry, once added, stays at the same address for the table's lifetime
// (a holder keeps a pointer to it across a grant round trip) and is never removed; a
// shard's lock is held only for the lookup, so a lookup never waits for another key's
// round trip; the table holds at most max_keys / 16 + 1 keys per shard, and get_or_add
// answers nullptr past that (the caller then does not lease the key).
//
// Thread safety: get_or_add, find and for_each may be called from any number of threads;
// an entry's fields are guarded by its own mutex, which the caller locks.
//
//   detail::LeaseHoldings holdings;
//   detail::LeaseHolding* h = holdings.get_or_add("{acme}read", /*max_keys=*/100'000);
//   if (h != nullptr) {
//     detail::MutexLock lock(h->mu);
//     h->units -= 1;
//   }
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "quota/decision.hpp"
#include "quota/detail/keyed_states.hpp"
#include "quota/detail/mutex.hpp"
#include "quota/lease/grant_request.hpp"
#include "quota/units.hpp"

namespace quota::detail {

// One key's holding: its last grant, the request in flight, and the wait before the next.
struct LeaseHolding {
  detail::Mutex mu;
  std::int64_t units ABSL_GUARDED_BY(mu) = 0;
  Nanos expires_at ABSL_GUARDED_BY(mu){0};
  std::int64_t q ABSL_GUARDED_BY(mu) = 0;
  Nanos granted_at ABSL_GUARDED_BY(mu){Nanos::min()};
  std::int64_t spent_since_grant ABSL_GUARDED_BY(mu) = 0;
  std::uint64_t version ABSL_GUARDED_BY(mu) = 0;
  std::string grant_id ABSL_GUARDED_BY(mu);  // of the last grant taken
  // The grant request: a lost one's id, the wait before the next (a denial, a failure,
  // or a grant that left less than q centrally), the failures in a row.
  GrantRequest request ABSL_GUARDED_BY(mu);
  Decision last_denial ABSL_GUARDED_BY(mu);
  // The last denial was kNever (a budget that cannot refill) for a request needing
  // `never_need` more units than were held.
  bool never ABSL_GUARDED_BY(mu) = false;
  std::int64_t never_need ABSL_GUARDED_BY(mu) = 0;
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

// The holdings of a LeasedLimiter.
using LeaseHoldings = HoldingTable<LeaseHolding>;

}  // namespace quota::detail
