// quota/detail/keyed_states.hpp — key → state with bounded size and safe idle eviction,
// in a compact layout. The building block of LocalStore (one of them) and ShardedStore
// (one per shard, under the shard's lock). Not thread-safe by itself.
//
// Layout: each key is one record, [State][uint32 key size][key bytes] padded to 8 bytes,
// appended to arena chunks that never move (1 KiB for the first, doubling to 64 KiB);
// the hash index holds only a 4-byte record id per key. A 10-byte key with a 24-byte
// token-bucket state takes 40 bytes of record plus about 10 bytes of index at the index's
// usual load, where a `flat_hash_map<std::string, State>` takes a 56-byte slot (32 of
// them the std::string) per table position, half of them empty after a growth (see
// benchmarks/store_bench.cpp, bytes_per_key). A state's address is stable until the next
// sweep: inserting keys allocates new chunks and never moves old records.
//
// Removal: sweep() destroys the idle records and compacts the survivors towards the
// front in their original order (each moves to an address no later than its own, so the
// compaction runs in place), frees the chunks left empty, and rebuilds the index at the
// size it needs. Sweeps are O(keys) and run only when the store is full (or on demand).
#pragma once

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <new>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/hash/hash.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
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

template <Policy P>
class KeyedStates {
 public:
  using State = typename P::State;

  // Records are aligned to kAlign inside chunks of at most kMaxChunk bytes; a record id is
  // (chunk index << kOffsetBits) | (offset / kAlign).
  static constexpr std::size_t kAlign = std::max<std::size_t>({alignof(State), 8});
  static constexpr std::size_t kMinChunk = 1024;
  static constexpr std::size_t kMaxChunk = 64 * 1024;
  static constexpr int kOffsetBits = std::bit_width(kMaxChunk / kAlign - 1);
  static constexpr std::size_t kMaxChunks = std::size_t{1} << (32 - kOffsetBits);
  static constexpr std::size_t kHeader = sizeof(State) + sizeof(std::uint32_t);
  // The longest key a record holds (the limiter's own bound is far below it).
  static constexpr std::size_t kMaxLocalKeyBytes = kMaxChunk - kHeader;
  static_assert(kAlign <= 64, "chunks are 64-byte aligned");

  // Bytes one key's record takes in the arena (the index adds a 4-byte id and a control
  // byte per table position).
  static constexpr std::size_t record_bytes(std::size_t key_size) {
    return (kHeader + key_size + kAlign - 1) / kAlign * kAlign;
  }

  // At most `capacity` keys (see find_or_create). Records of two tables never share a
  // cache line (chunks are 64-byte aligned), so the shards of a sharded store do not
  // falsely share the states they write; their indexes are written only on insertion.
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

  // Finds or creates the state of `key` (hash = key_hash(key)) and returns a pointer to it,
  // valid until the next sweep. ResourceExhausted when the store is full and no key is idle;
  // InvalidArgument for a key longer than kMaxLocalKeyBytes.
  absl::StatusOr<State*> find_or_create(const P& policy, std::string_view key, std::size_t hash,
                                        Nanos now) {
    const Prehashed k{to_absl(key), hash};
    // Fetch the index slot together with its control byte: the record id the slot holds is
    // then one memory access away, not two (control byte, then slot, then record).
    index_.prefetch(k);
    if (auto it = index_.find(k, hash); it != index_.end()) {
      return &arena_->state(*it);
    }
    if (key.size() > kMaxLocalKeyBytes) {
      return absl::InvalidArgumentError(
          absl::StrFormat("key is %d bytes; the store holds keys of at most %d bytes", key.size(),
                          kMaxLocalKeyBytes));
    }
    if (index_.size() >= capacity_ && !evict_idle(policy, now)) {
      return absl::ResourceExhaustedError(absl::StrFormat(
          "store full: %d keys held, none idle (full again) to evict; key \"%s\" not created",
          index_.size(), key));
    }
    auto fresh = new_state(policy, now);
    if (!fresh.ok()) return fresh.status();
    auto id = arena_->append(key, *std::move(fresh));
    if (!id.ok()) return id.status();
    index_.insert(*id);
    // The new key's idle time is not known until the caller has spent from it, so the
    // next full store sweeps again rather than trusting next_sweep_.
    next_sweep_ = Nanos::min();
    return &arena_->state(*id);
  }

  // Records that the state `s` (found or created by find_or_create, under the same lock)
  // was written. A write may move the key's idle time earlier — a refund, a give-back, a
  // rule downgrade converting the state — so the cached earliest idle time is lowered to
  // it: a full store then finds the key idle. One comparison while the cache is unset
  // (the store has not been full since its last insertion); one idle_at() otherwise.
  void note_written(const P& policy, const State& s) {
    if (next_sweep_ == Nanos::min()) return;
    next_sweep_ = std::min(next_sweep_, policy.idle_at(s));
  }

  // Forgets every key that is idle at `now` (its state equals a fresh one) and compacts the
  // rest. Returns how many were removed.
  std::size_t sweep(const P& policy, Nanos now) {
    Nanos next = kNever;
    const std::size_t before = index_.size();
    const bool moved = arena_->compact([&](const State& s) {
      const Nanos idle = policy.idle_at(s);
      if (idle <= now) return false;
      next = std::min(next, idle);
      return true;
    });
    next_sweep_ = next;
    const std::size_t removed = before - arena_->live();
    // No record removed or moved: the ids stand. Otherwise rebuild the index at the size
    // it now needs (which also returns the memory of a table grown for more keys).
    if (removed == 0 && !moved) return 0;
    Index rebuilt(0, IdHash{arena_.get()}, IdEq{arena_.get()});
    rebuilt.reserve(arena_->live());
    arena_->for_each([&](std::uint32_t id) { rebuilt.insert(id); });
    index_ = std::move(rebuilt);
    return removed;
  }

  std::size_t size() const { return index_.size(); }

 private:
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
  // The records. Heap-allocated on its own so that the index's hash and equality, which
  // hold a pointer to it, stay valid when the KeyedStates is moved.
  class Arena {
   public:
    Arena() = default;
    Arena(const Arena&) = delete;
    Arena& operator=(const Arena&) = delete;
    ~Arena() {
      if constexpr (!std::is_trivially_destructible_v<State>) {
        for_each([&](std::uint32_t id) { state(id).~State(); });
      }
    }

    State& state(std::uint32_t id) const { return *std::launder(reinterpret_cast<State*>(at(id))); }
    std::string_view key(std::uint32_t id) const {
      const std::byte* rec = at(id);
      std::uint32_t size;
      std::memcpy(&size, rec + sizeof(State), sizeof size);
      return {reinterpret_cast<const char*>(rec + kHeader), size};
    }
    std::size_t live() const { return live_; }

    absl::StatusOr<std::uint32_t> append(std::string_view key, State&& init) {
      const std::size_t bytes = record_bytes(key.size());
      if (chunks_.empty() || chunks_.back().capacity - chunks_.back().used < bytes) {
        if (chunks_.size() >= kMaxChunks) {
          return absl::ResourceExhaustedError(absl::StrFormat(
              "store arena full: %d chunks of at most %d bytes", kMaxChunks, kMaxChunk));
        }
        chunks_.push_back(Chunk::make(next_chunk_bytes(bytes)));
      }
      Chunk& c = chunks_.back();
      const auto id = make_id(chunks_.size() - 1, c.used);
      place(c.data.get() + c.used, key, std::move(init));
      c.used += bytes;
      ++live_;
      return id;
    }

    // Calls fn(id) for every record, in arena order.
    template <class Fn>
    void for_each(Fn&& fn) const {
      for (std::size_t ci = 0; ci < chunks_.size(); ++ci) {
        for (std::size_t off = 0; off < chunks_[ci].used;) {
          const std::uint32_t id = make_id(ci, off);
          off += record_bytes(key(id).size());
          fn(id);
        }
      }
    }

    // Keeps the records for which keep(state) is true, moved towards the front in order;
    // destroys the others; frees the chunks left empty. True when a kept record moved.
    template <class Keep>
    bool compact(Keep&& keep) {
      std::size_t wc = 0, woff = 0;  // write cursor; never past the read cursor
      bool moved = false;
      live_ = 0;
      for (std::size_t rc = 0; rc < chunks_.size(); ++rc) {
        const std::size_t used = chunks_[rc].used;
        for (std::size_t off = 0; off < used;) {
          const std::uint32_t id = make_id(rc, off);
          const std::size_t bytes = record_bytes(key(id).size());
          off += bytes;
          State& s = state(id);
          if (!keep(std::as_const(s))) {
            s.~State();
            continue;
          }
          // First chunk at or after the write cursor with room; at worst the record's own.
          while (chunks_[wc].capacity - woff < bytes) {
            chunks_[wc].used = woff;
            ++wc;
            woff = 0;
          }
          std::byte* dst = chunks_[wc].data.get() + woff;
          std::byte* src = chunks_[rc].data.get() + (off - bytes);
          if (dst != src) {
            // The two may overlap: move the state out, then the key bytes, then the state in.
            State state_out(std::move(s));
            s.~State();
            std::memmove(dst + sizeof(State), src + sizeof(State), bytes - sizeof(State));
            new (dst) State(std::move(state_out));
            moved = true;
          }
          woff += bytes;
          ++live_;
        }
      }
      if (chunks_.empty()) return moved;
      chunks_[wc].used = woff;
      chunks_.resize(woff == 0 && wc == 0 ? 0 : wc + 1);
      return moved;
    }

   private:
    struct FreeBytes {
      void operator()(std::byte* p) const { ::operator delete (p, std::align_val_t{64}); }
    };
    struct Chunk {
      std::unique_ptr<std::byte[], FreeBytes> data;
      std::size_t capacity = 0;
      std::size_t used = 0;
      // Cache-line aligned, so records of two shards never share a line.
      static Chunk make(std::size_t capacity) {
        return {std::unique_ptr<std::byte[], FreeBytes>(
                    static_cast<std::byte*>(::operator new (capacity, std::align_val_t{64}))),
                capacity, 0};
      }
    };

    static std::uint32_t make_id(std::size_t chunk, std::size_t offset) {
      return static_cast<std::uint32_t>((chunk << kOffsetBits) | (offset / kAlign));
    }
    std::byte* at(std::uint32_t id) const {
      return chunks_[id >> kOffsetBits].data.get() +
             (id & ((std::uint32_t{1} << kOffsetBits) - 1)) * kAlign;
    }
    // Chunk sizes grow twofold from kMinChunk to kMaxChunk, so a small store stays small and a
    // large one wastes at most part of one chunk.
    std::size_t next_chunk_bytes(std::size_t record) const {
      const std::size_t grown = kMinChunk << std::min<std::size_t>(chunks_.size(), 6);
      return std::max(std::min(grown, kMaxChunk), std::bit_ceil(record));
    }
    static void place(std::byte* rec, std::string_view key, State&& init) {
      new (rec) State(std::move(init));
      const auto size = static_cast<std::uint32_t>(key.size());
      std::memcpy(rec + sizeof(State), &size, sizeof size);
      if (!key.empty()) std::memcpy(rec + kHeader, key.data(), key.size());
    }

    std::vector<Chunk> chunks_;
    std::size_t live_ = 0;
  };

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

  // A full sweep is O(size); it runs only when the map is full and some key may have
  // become idle since the last sweep. next_sweep_ is a lower bound of every key's idle
  // time: the earliest the last sweep saw, lowered by note_written() after every write
  // (spending moves an idle time later, a refund or a downgrade earlier), and reset by an
  // insertion (the new key is written only after find_or_create returns). So a full store
  // sweeps whenever an idle key may exist, and a full store of active keys rejects new
  // keys in O(1).
  bool evict_idle(const P& policy, Nanos now) {
    if (now < next_sweep_) return false;
    return sweep(policy, now) > 0;
  }

  std::size_t capacity_;
  Nanos assume_spent_at_;  // StoreOptions::assume_spent_at
  Nanos next_sweep_{Nanos::min()};
  std::unique_ptr<Arena> arena_;
  Index index_;
};

}  // namespace quota::detail
