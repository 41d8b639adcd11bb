// quota/detail/keyed_states.hpp — key → state with bounded size and safe idle eviction,
// in a compact layout. The building block of LocalStore (one of them) and ShardedStore
// (one per shard, under the shard's lock). Not thread-safe by itself.
//
// Layout: each key is one record of a RecordArena (detail/record_arena.hpp), and the hash
// index holds only a 4-byte record id per key. A 10-byte key with a 24-byte token-bucket
// state takes 40 bytes of record plus about 10 bytes of index at the index's usual load,
// where a `flat_hash_map<std::string, State>` takes a 56-byte slot (32 of them the
// std::string) per table position (benchmarks/store_bench.cpp, bytes_per_key). A state's
// address is stable until the next sweep.
//
// Eviction. A key may be forgotten once it is idle (its state equals a fresh one), and
// only then. A full store makes room by evicting every key idle at `now`, and refuses a
// new key only when none is. Once the store has been full it keeps an idle index: a
// min-heap of (lower bound of a key's idle time, record id), at least one entry per key
// — built when it first found itself full, an entry pushed for each new key and for each
// write that moved a key's idle time earlier (a refund, a give-back, a rule downgrade, a
// settle). Making room pops the entries due by `now`: a key found idle is evicted in O(1)
// (its record marked dead), one written since is pushed again at its real idle time. So
// each decision costs O(log keys) amortized and no decision scans the keys, except the
// compaction that reclaims dead records, which runs before a write once they are
// half the capacity (amortized O(1) per eviction). Making room never moves a record, so
// a caller may open several keys under one lock (open/close) and write them together.
// The index costs 16 bytes per entry, and only in a store that has been full.
//
//   KeyedStates<TokenBucket> states(/*capacity=*/1000);
//   auto d = states.update(tb, "tenant-1", key_hash("tenant-1"), now,
//                          [&](TokenBucket::State& s) { return tb.apply(s, now, 1); });
#pragma once

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <new>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/container/inlined_vector.h"
#include "absl/hash/hash.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "quota/detail/opened_states.hpp"
#include "quota/detail/record_arena.hpp"
#include "quota/policy/policy.hpp"

namespace quota::detail {

// Debian's abseil has its own absl::string_view (not std::string_view). Keys cross into
// the index through it, and are hashed with abseil's string hash so a lookup hashes the
// key once (the sharded store picks the shard from the same hash).
inline absl::string_view to_absl(std::string_view s) {
  return absl::string_view(s.data(), s.size());
}
inline std::size_t key_hash(std::string_view key) {
  return absl::Hash<absl::string_view>{}(to_absl(key));
}

// OK when `s` has no brace and no control character (bytes < 0x20 and 0x7f), so that it
// can stand in a Redis key beside a hash tag; else InvalidArgument naming `what`. The one
// rule for the text of keys and attempt ids, in process and over Redis.
inline absl::Status check_key_chars(std::string_view s, const char* what) {
  for (char ch : s) {
    const auto u = static_cast<unsigned char>(ch);
    if (ch == '{' || ch == '}' || u < 0x20 || u == 0x7f) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s \"%s\" contains a forbidden byte 0x%02x ('{', '}' and control characters are "
          "not allowed)",
          what, absl::CHexEscape(std::string(s)), u));
    }
  }
  return absl::OkStatus();
}

// The errors of KeyedStates::create, built out of line and cold (see "Code layout" in
// KeyedStates): rare, and their formatting is large.
[[gnu::cold, gnu::noinline]] inline absl::Status key_too_long(std::size_t size, std::size_t max) {
  return absl::InvalidArgumentError(
      absl::StrFormat("key is %d bytes; the store holds keys of at most %d bytes", size, max));
}
[[gnu::cold, gnu::noinline]] inline absl::Status store_full(std::size_t held,
                                                            std::string_view key) {
  return absl::ResourceExhaustedError(absl::StrFormat(
      "store full: %d keys held, none idle (full again) to evict; key \"%s\" not created", held,
      key));
}

template <Policy P>
class KeyedStates {
 public:
  using State = typename P::State;
  using Arena = RecordArena<State>;

  // The longest key a record holds (the limiter's own bound is far below it).
  static constexpr std::size_t kMaxLocalKeyBytes = Arena::kMaxKeyBytes;

  // Bytes one key's record takes in the arena (the index adds a 4-byte id and a control
  // byte per table position).
  static constexpr std::size_t record_bytes(std::size_t key_size) {
    return Arena::record_bytes(key_size);
  }

  // At most `capacity` keys (see find_or_create).
  explicit KeyedStates(std::size_t capacity, Nanos assume_spent_at = Nanos::min())
      : capacity_(std::max<std::size_t>(capacity, 1)),
        assume_spent_at_(assume_spent_at),
        arena_(std::make_unique<Arena>()),
        index_(0, IdHash{arena_.get()}, IdEq{arena_.get()}) {}

  KeyedStates(KeyedStates&&) noexcept = default;
  KeyedStates& operator=(KeyedStates&&) noexcept = default;
  KeyedStates(const KeyedStates&) = delete;
  KeyedStates& operator=(const KeyedStates&) = delete;
  ~KeyedStates() = default;

  // Runs `fn(State&)` on the state of `key` (hash = key_hash(key)), created fresh if absent,
  // and keeps the idle index true to the write. Errors as find_or_create. `fn` has this one
  // call site, and a store never full pays for the idle index only tests of one flag.
  template <class Fn>
  auto update(const P& policy, std::string_view key, std::size_t hash, Nanos now, Fn&& fn)
      -> absl::StatusOr<std::invoke_result_t<Fn&, State&>> {
    // Read before locate(): a locate that fills the store builds the index and enters the
    // new key at the lowest bound, so that write needs no entry of its own.
    const bool kept = indexed_;
    if (kept) [[unlikely]] {
      compact_if_due(policy);
    }
    auto id = locate(policy, key, hash, now);
    if (!id.ok()) return id.status();
    State& s = arena_->state(*id);
    const Nanos before = kept ? idle_before(policy, s) : kUnknown;
    auto result = std::forward<Fn>(fn)(s);
    if (kept) [[unlikely]] {
      written(policy, Writing{.state = &s, .id = *id, .before = before});
    }
    return result;
  }

  // A key's state open for writing (open() … close()), for a caller that writes several
  // keys under one lock: no record moves between open() and close(), so the states of
  // every key opened since the last compact_if_due() stay where they are.
  struct Writing {
    State* state;
    std::uint32_t id;
    Nanos before;  // the idle time before the write, when the idle index was kept then
  };

  // Reclaims the records of evicted keys once they are half the capacity (a compaction:
  // O(keys), once per capacity/2 evictions; every live key stays). Call with no state open.
  // Out of line: update() calls it only on a store that has been full, and its check
  // inlined into every caller's copy of the decision costs that copy registers (two more
  // instructions per decision on LocalStore's hot key; docs/benchmarks.md).
  [[gnu::noinline]] void compact_if_due(const P& policy) {
    if (arena_->dead_count() > capacity_ / 2) [[unlikely]]
      compact(policy);
  }

  // Finds or creates the state of `key`, evicting idle keys if the store is full (never
  // moving a record, and never evicting a key open now). ResourceExhausted when the store
  // is full and no key is idle; InvalidArgument for a key longer than kMaxLocalKeyBytes.
  absl::StatusOr<Writing> open(const P& policy, std::string_view key, std::size_t hash, Nanos now) {
    auto id = locate(policy, key, hash, now);
    if (!id.ok()) return id.status();
    open_.push_back(*id);
    State& s = arena_->state(*id);
    return Writing{.state = &s, .id = *id, .before = indexed_ ? policy.idle_at(s) : kUnknown};
  }

  // The write through `w` is done: if it moved the key's idle time earlier (a refund, a
  // give-back, a downgrade), the idle index learns it.
  void close(const P& policy, const Writing& w) {
    open_.erase(std::find(open_.begin(), open_.end(), w.id));
    written(policy, w);
  }

  // Finds or creates the state of `key` and returns a pointer to it, valid until the next
  // sweep. A caller that writes through it may only move the key's idle time later (spend);
  // writes that may move it earlier go through update(). Errors as open().
  absl::StatusOr<State*> find_or_create(const P& policy, std::string_view key, std::size_t hash,
                                        Nanos now) {
    compact_if_due(policy);
    auto id = locate(policy, key, hash, now);
    if (!id.ok()) return id.status();
    return &arena_->state(*id);
  }

  // Forgets every key that is idle at `now` and compacts the rest. Returns how many were
  // removed. O(keys).
  [[gnu::cold, gnu::noinline]] std::size_t sweep(const P& policy, Nanos now) {
    const std::size_t before = index_.size();
    const bool moved = arena_->compact([&](const State& s) { return policy.idle_at(s) > now; });
    const std::size_t removed = before - arena_->live();
    if (removed != 0 || moved) {
      reindex(policy);
    } else if (indexed_) {
      rebuild_idle_index(policy);
    }
    return removed;
  }

  std::size_t size() const { return index_.size(); }

 private:
  static constexpr Nanos kUnknown = Nanos::min();  // Writing::before, no index kept then

  // One entry of the idle index: the key of record `id` is idle no earlier than `at`.
  struct IdleEntry {
    std::int64_t at;
    std::uint32_t id;
  };
  struct LaterFirst {
    bool operator()(const IdleEntry& a, const IdleEntry& b) const { return a.at > b.at; }
  };

  // Code layout. The decision path — update(), locate(), the policy step — is inlined into
  // the caller. What runs only when the store is full, compacts, sweeps or fails is
  // [[gnu::cold]]: GCC optimizes it for size and does not count it in a translation unit's
  // size, whose growth by inlining it caps (--param inline-unit-growth: 40 % over the
  // larger of the unit and 10,000 units at -O3), so the budget goes to the decision path in
  // the caller's unit (docs/benchmarks.md, "The hot path after the idle index").

  // The records of evicted keys dropped (see compact_if_due).
  [[gnu::cold, gnu::noinline]] void compact(const P& policy) {
    arena_->compact([](const State&) { return true; });  // the live records all stay
    reindex(policy);
  }

  // After a compaction (record ids changed): the index rebuilt at the size it now needs
  // (which also returns the memory of a table grown for more keys), and the idle index.
  void reindex(const P& policy) {
    Index rebuilt(0, IdHash{arena_.get()}, IdEq{arena_.get()});
    rebuilt.reserve(arena_->live());
    arena_->for_each([&](std::uint32_t id) { rebuilt.insert(id); });
    index_ = std::move(rebuilt);
    if (indexed_) rebuild_idle_index(policy);
  }

  // A key's idle time before a write, for the idle index. This and written() are out of
  // line: a store that has been full pays a call, the usual path stays small enough for
  // the compiler to inline the policy step into it.
  [[gnu::noinline]] Nanos idle_before(const P& policy, const State& s) const {
    return policy.idle_at(s);
  }

  // The idle index after a write (see close()). One branch while the store was never full.
  [[gnu::noinline]] void written(const P& policy, const Writing& w) {
    if (!indexed_) return;
    const Nanos after = policy.idle_at(*w.state);
    if (w.before == kUnknown || after < w.before) push(policy, after, w.id);
  }

  // The record of `key`: found, or created (create()).
  absl::StatusOr<std::uint32_t> locate(const P& policy, std::string_view key, std::size_t hash,
                                       Nanos now) {
    const Prehashed k{to_absl(key), hash};
    // Fetch the index slot together with its control byte: the record id the slot holds is
    // then one memory access away, not two (control byte, then slot, then record).
    index_.prefetch(k);
    if (auto it = index_.find(k, hash); it != index_.end()) return *it;
    return create(policy, key, now);
  }

  // The record of a key not held yet, made room for if the store is full. Out of line: a
  // key is created once and then found many times.
  [[gnu::noinline]] absl::StatusOr<std::uint32_t> create(const P& policy, std::string_view key,
                                                         Nanos now) {
    if (key.size() > kMaxLocalKeyBytes) return key_too_long(key.size(), kMaxLocalKeyBytes);
    if (index_.size() >= capacity_ && !make_room(policy, now)) {
      return store_full(index_.size(), key);
    }
    auto fresh = new_state(policy, now);
    if (!fresh.ok()) return fresh.status();
    auto id = arena_->append(key, *std::move(fresh));
    if (!id.ok()) return id.status();
    index_.insert(*id);
    // The new key's idle time is known only once the caller has written it: the lowest
    // bound, so the next room-making looks at it.
    if (indexed_) push(policy, Nanos::min(), *id);
    return *id;
  }

  // Evicts every key idle at `now` from the idle index (built the first time: O(keys)
  // once; then O(log keys) per entry due); true when one was. Moves no record.
  [[gnu::cold, gnu::noinline]] bool make_room(const P& policy, Nanos now) {
    if (!indexed_) {
      indexed_ = true;
      rebuild_idle_index(policy);
    }
    bool evicted = false;
    absl::InlinedVector<IdleEntry, 4> kept;  // idle but open: pushed back after the loop
    while (!idle_.empty() && idle_.front().at <= now.count()) {
      std::pop_heap(idle_.begin(), idle_.end(), LaterFirst{});
      const IdleEntry e = idle_.back();
      idle_.pop_back();
      if (arena_->dead(e.id)) continue;  // a second entry of an evicted key
      const Nanos idle = policy.idle_at(arena_->state(e.id));
      if (idle <= now && std::find(open_.begin(), open_.end(), e.id) != open_.end()) {
        kept.push_back(e);
      } else if (idle <= now) {
        index_.erase(e.id);
        arena_->kill(e.id);
        evicted = true;
      } else {
        // Written since the entry: its true idle time, later than now.
        idle_.push_back({idle.count(), e.id});
        std::push_heap(idle_.begin(), idle_.end(), LaterFirst{});
      }
    }
    for (const IdleEntry& e : kept) {
      idle_.push_back(e);
      std::push_heap(idle_.begin(), idle_.end(), LaterFirst{});
    }
    return evicted;
  }

  void push(const P& policy, Nanos at, std::uint32_t id) {
    if (idle_.size() >= 2 * capacity_ + 64) {
      rebuild_idle_index(policy);  // every key once, at its current idle time
      return;
    }
    idle_.push_back({at.count(), id});
    std::push_heap(idle_.begin(), idle_.end(), LaterFirst{});
  }

  [[gnu::cold, gnu::noinline]] void rebuild_idle_index(const P& policy) {
    idle_.clear();
    if (idle_.capacity() > 4 * arena_->live() + 64) idle_.shrink_to_fit();
    idle_.reserve(arena_->live());
    arena_->for_each([&](std::uint32_t id) {
      idle_.push_back({policy.idle_at(arena_->state(id)).count(), id});
    });
    std::make_heap(idle_.begin(), idle_.end(), LaterFirst{});
  }

  // The state of a key seen for the first time at `now`: fresh, or with
  // StoreOptions::assume_spent_at, its whole budget spent then.
  absl::StatusOr<State> new_state(const P& policy, Nanos now) const {
    if (assume_spent_at_ == Nanos::min()) return policy.init(now);
    if constexpr (HasExhausted<P>) {
      return policy.exhausted(assume_spent_at_);
    } else {
      return absl::InvalidArgumentError(
          "StoreOptions::assume_spent_at is set, but the policy has no exhausted(at): a new "
          "key cannot start with its budget spent");
    }
  }

  // A key with its hash (key_hash), computed once by the caller.
  struct Prehashed {
    absl::string_view key;
    std::size_t hash;
  };
  // The index's hash and equality see a record id as its key's bytes; lookups pass the key
  // itself with its hash (heterogeneous lookup).
  struct IdHash {
    using is_transparent = void;
    const Arena* arena;
    std::size_t operator()(std::uint32_t id) const { return key_hash(arena->key(id)); }
    std::size_t operator()(const Prehashed& k) const { return k.hash; }
  };
  struct IdEq {
    using is_transparent = void;
    const Arena* arena;
    bool operator()(std::uint32_t a, std::uint32_t b) const { return a == b; }
    bool operator()(std::uint32_t id, const Prehashed& k) const {
      return to_absl(arena->key(id)) == k.key;
    }
    bool operator()(const Prehashed& k, std::uint32_t id) const { return (*this)(id, k); }
  };
  using Index = absl::flat_hash_set<std::uint32_t, IdHash, IdEq>;

  std::size_t capacity_;
  Nanos assume_spent_at_;  // StoreOptions::assume_spent_at
  std::unique_ptr<Arena> arena_;
  Index index_;
  bool indexed_ = false;                        // the store has been full: idle_ is kept
  std::vector<IdleEntry> idle_;                 // min-heap on `at` (LaterFirst)
  absl::InlinedVector<std::uint32_t, 4> open_;  // records open now (open() … close())
};

}  // namespace quota::detail
