// benchmarks/support/keys.hpp — what the in-process benchmarks share: 10^6 short keys,
// one random access sequence over them, and the heap in use (for bytes per key).
#pragma once

#include <malloc.h>

#include <cstddef>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

namespace quota::bench {

inline constexpr std::size_t kKeys = 1'000'000;

// 10-byte keys: they fit std::string's small buffer, so bytes_per_key is the table's
// (real "tenant:route" keys are often longer and then add a heap block each).
inline const std::vector<std::string>& keys() {
  static const std::vector<std::string> k = [] {
    std::vector<std::string> v;
    v.reserve(kKeys);
    for (std::size_t i = 0; i < kKeys; ++i) v.push_back("t" + std::to_string(1'000'000 + i) + ":r");
    return v;
  }();
  return k;
}

// One random access sequence (fixed seed) shared by every random-key benchmark; its
// length is a power of two so `i & (size - 1)` walks it.
inline const std::vector<std::uint32_t>& sequence() {
  static const std::vector<std::uint32_t> s = [] {
    std::mt19937 rng(12345);
    std::vector<std::uint32_t> v(1 << 22);
    for (auto& x : v) x = static_cast<std::uint32_t>(rng() % kKeys);
    return v;
  }();
  return s;
}

// Heap bytes in use: small blocks plus large mmap(2)ed ones (hash tables).
inline std::size_t heap_in_use() {
  const auto info = mallinfo2();
  return info.uordblks + info.hblkhd;
}

}  // namespace quota::bench
