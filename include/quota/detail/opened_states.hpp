// quota/detail/opened_states.hpp — the states of the keys of one multi-key step
// (LocalStore / ShardedStore::update_all, the gateway's scopes), over the KeyedStates
// tables (keyed_states.hpp) that hold them.
//
// Each key is opened — found, or created fresh — only when first asked for, so a key the
// step never reaches is not created; an error of one key (store full, key too long) is
// that key's, and the keys opened before it stay as they were written. While a key is
// open its record does not move and is never evicted (KeyedStates::open), so the states
// of every key of the step stay where they are until the step ends. The destructor
// closes what was opened, which tells each table's idle index about the writes.
//
// Thread safety: none of its own. The caller holds the locks of every table involved,
// has called compact_if_due() on each, and keeps this object alive no longer than the
// locks.
//
//   std::array<OpenedStates<TokenBucket>::Key, 2> keys{{{&table, &tb, "a", key_hash("a")},
//                                                       {&table, &tb, "b", key_hash("b")}}};
//   OpenedStates<TokenBucket> states(keys, now);
//   absl::StatusOr<TokenBucket::State*> a = states[0];  // opened now
#pragma once

#include <cstddef>
#include <optional>
#include <span>
#include <string_view>

#include "absl/container/inlined_vector.h"
#include "absl/status/statusor.h"
#include "quota/policy/policy.hpp"

namespace quota::detail {

template <Policy P>
class KeyedStates;  // keyed_states.hpp

template <Policy P>
class OpenedStates {
 public:
  using State = typename P::State;
  struct Key {
    KeyedStates<P>* table;
    const P* policy;
    std::string_view key;
    std::size_t hash;
  };

  OpenedStates(std::span<const Key> keys, Nanos now) : keys_(keys), now_(now), open_(keys.size()) {}
  OpenedStates(const OpenedStates&) = delete;
  OpenedStates& operator=(const OpenedStates&) = delete;
  ~OpenedStates() {
    for (std::size_t i = 0; i < keys_.size(); ++i) {
      if (open_[i]) keys_[i].table->close(*keys_[i].policy, *open_[i]);
    }
  }

  std::size_t size() const { return keys_.size(); }

  // The state of key i, opened now if it was not (errors as KeyedStates::open).
  absl::StatusOr<State*> operator[](std::size_t i) {
    if (!open_[i]) {
      const Key& k = keys_[i];
      auto w = k.table->open(*k.policy, k.key, k.hash, now_);
      if (!w.ok()) return w.status();
      open_[i] = *w;
    }
    return open_[i]->state;
  }

 private:
  std::span<const Key> keys_;
  Nanos now_;
  absl::InlinedVector<std::optional<typename KeyedStates<P>::Writing>, 8> open_;
};

}  // namespace quota::detail
