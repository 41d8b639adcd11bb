// quota/detail/record_arena.hpp — the records of a KeyedStates: one per key, [State]
// [uint32 key size][key bytes] padded to 8 bytes, in chunks that never move. Not
// thread-safe by itself (KeyedStates' caller holds the lock).
//
// Chunks are 1 KiB for the first, doubling to 64 KiB, and 64-byte aligned, so records of
// two arenas (two shards) never share a cache line. A record is named by a 32-bit id,
// (chunk index << kOffsetBits) | (offset / kAlign), which stays valid until compact().
//
// Removal is two-speed: kill(id) destroys one record's state and marks it dead in O(1)
// (its bytes stay until the next compaction, and for_each skips it); compact() drops the
// dead and the unwanted records and moves the survivors towards the front in their
// original order — each to an address no later than its own, so it runs in place — and
// frees the chunks left empty.
//
//   RecordArena<TokenBucket::State> arena;
//   auto id = arena.append("tenant-1", tb.init(now));   // StatusOr<std::uint32_t>
//   arena.state(*id).tokens;  arena.key(*id);           // "tenant-1"
//   arena.kill(*id);                                    // arena.live() == 0
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

#include "absl/status/statusor.h"
#include "absl/strings/str_format.h"

namespace quota::detail {

template <class State>
class RecordArena {
 public:
  static constexpr std::size_t kAlign = std::max<std::size_t>({alignof(State), 8});
  static constexpr std::size_t kMinChunk = 1024;
  static constexpr std::size_t kMaxChunk = 64 * 1024;
  static constexpr int kOffsetBits = std::bit_width(kMaxChunk / kAlign - 1);
  static constexpr std::size_t kMaxChunks = std::size_t{1} << (32 - kOffsetBits);
  static constexpr std::size_t kHeader = sizeof(State) + sizeof(std::uint32_t);
  // The longest key a record holds.
  static constexpr std::size_t kMaxKeyBytes = kMaxChunk - kHeader;
  static_assert(kAlign <= 64, "chunks are 64-byte aligned");

  // Bytes one key's record takes.
  static constexpr std::size_t record_bytes(std::size_t key_size) {
    return (kHeader + key_size + kAlign - 1) / kAlign * kAlign;
  }

  RecordArena() = default;
  RecordArena(const RecordArena&) = delete;
  RecordArena& operator=(const RecordArena&) = delete;
  ~RecordArena() {
    if constexpr (!std::is_trivially_destructible_v<State>) {
      for_each([&](std::uint32_t id) { state(id).~State(); });
    }
  }

  State& state(std::uint32_t id) const { return *std::launder(reinterpret_cast<State*>(at(id))); }
  std::string_view key(std::uint32_t id) const {
    return {reinterpret_cast<const char*>(at(id) + kHeader), size_word(id) & ~kDead};
  }
  bool dead(std::uint32_t id) const { return (size_word(id) & kDead) != 0; }
  std::size_t live() const { return live_; }
  std::size_t dead_count() const { return dead_; }

  // Appends a record for `key` (at most kMaxKeyBytes, checked by the caller).
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
    std::byte* rec = c.data.get() + c.used;
    new (rec) State(std::move(init));
    const auto size = static_cast<std::uint32_t>(key.size());
    std::memcpy(rec + sizeof(State), &size, sizeof size);
    if (!key.empty()) std::memcpy(rec + kHeader, key.data(), key.size());
    c.used += bytes;
    ++live_;
    return id;
  }

  // Destroys the live record `id`'s state and marks it dead; its key bytes stay readable
  // (an index may still hash them) until compact().
  void kill(std::uint32_t id) {
    state(id).~State();
    const std::uint32_t word = size_word(id) | kDead;
    std::memcpy(at(id) + sizeof(State), &word, sizeof word);
    --live_;
    ++dead_;
  }

  // Calls fn(id) for every live record, in arena order.
  template <class Fn>
  void for_each(Fn&& fn) const {
    for (std::size_t ci = 0; ci < chunks_.size(); ++ci) {
      for (std::size_t off = 0; off < chunks_[ci].used;) {
        const std::uint32_t id = make_id(ci, off);
        off += record_bytes(key(id).size());
        if (!dead(id)) fn(id);
      }
    }
  }

  // Keeps the live records for which keep(state) is true, moved towards the front in
  // order; destroys the others and drops the dead; frees the chunks left empty. Every id
  // changes meaning. True when a kept record moved.
  template <class Keep>
  bool compact(Keep&& keep) {
    std::size_t wc = 0, woff = 0;  // write cursor; never past the read cursor
    bool moved = false;
    live_ = 0;
    dead_ = 0;
    for (std::size_t rc = 0; rc < chunks_.size(); ++rc) {
      const std::size_t used = chunks_[rc].used;
      for (std::size_t off = 0; off < used;) {
        const std::uint32_t id = make_id(rc, off);
        const std::size_t bytes = record_bytes(key(id).size());
        off += bytes;
        if (dead(id)) {
          moved = true;  // the records after it change place or id
          continue;
        }
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
  // The size word's top bit marks a dead record (no key is 2 GiB long).
  static constexpr std::uint32_t kDead = std::uint32_t{1} << 31;

  struct FreeBytes {
    void operator()(std::byte* p) const { ::operator delete (p, std::align_val_t{64}); }
  };
  struct Chunk {
    std::unique_ptr<std::byte[], FreeBytes> data;
    std::size_t capacity = 0;
    std::size_t used = 0;
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
  std::uint32_t size_word(std::uint32_t id) const {
    std::uint32_t word;
    std::memcpy(&word, at(id) + sizeof(State), sizeof word);
    return word;
  }
  // Chunk sizes grow twofold from kMinChunk to kMaxChunk, so a small store stays small and a
  // large one wastes at most part of one chunk.
  std::size_t next_chunk_bytes(std::size_t record) const {
    const std::size_t grown = kMinChunk << std::min<std::size_t>(chunks_.size(), 6);
    return std::max(std::min(grown, kMaxChunk), std::bit_ceil(record));
  }

  std::vector<Chunk> chunks_;
  std::size_t live_ = 0;
  std::size_t dead_ = 0;
};

}  // namespace quota::detail
