// fuzz/check/input.hpp — decoding fuzz inputs into parameters, times and costs, and the
// failure report shared by the libFuzzer targets and the corpus test driver.
//
// Every decoder reads bytes from the front of the input and reads zeros once it is
// exhausted, so every byte string is a valid input. Values are biased towards the
// boundaries rate limiters get wrong: the ends of a range, powers of two and their
// neighbours, the ends of the int64 timeline, window starts and the exact moment a
// denied request was told to come back.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <string>

#include "absl/numeric/int128.h"
#include "absl/strings/str_format.h"
#include "quota/decision.hpp"

namespace quota::fuzz {

inline constexpr std::int64_t kMin = std::numeric_limits<std::int64_t>::min();
inline constexpr std::int64_t kMax = std::numeric_limits<std::int64_t>::max();

// Reports a violated check and stops: __builtin_trap, so libFuzzer saves the input and
// the corpus test fails with the message on stderr.
[[noreturn]] inline void fail(const std::string& what) {
  std::fprintf(stderr, "quota fuzz check failed: %s\n", what.c_str());
  std::fflush(stderr);
  __builtin_trap();
}

inline void check(bool ok, const std::string& what) {
  if (!ok) fail(what);
}

inline std::string str(const Decision& d) {
  return absl::StrFormat("{allowed=%d reason=%d remaining=%d retry_after=%d reset_after=%d v=%d}",
                         d.allowed, static_cast<int>(d.reason), d.remaining, d.retry_after.count(),
                         d.reset_after.count(), d.version);
}

inline std::int64_t clamp64(absl::int128 v) {
  if (v > absl::int128(kMax)) return kMax;
  if (v < absl::int128(kMin)) return kMin;
  return static_cast<std::int64_t>(v);
}

class Input {
 public:
  Input(const std::uint8_t* data, std::size_t size) : data_(data), size_(size) {}

  bool empty() const { return pos_ >= size_; }

  std::uint8_t byte() { return pos_ < size_ ? data_[pos_++] : 0; }

  std::uint64_t u64() {
    std::uint64_t v = 0;
    for (int i = 0; i < 8; ++i) v |= std::uint64_t{byte()} << (8 * i);
    return v;
  }

  // A value in [lo, hi] (lo <= hi), biased towards the ends and powers of two.
  std::int64_t in_range(std::int64_t lo, std::int64_t hi) {
    const absl::int128 l = lo, h = hi;
    absl::int128 v;
    switch (byte() % 6) {
      case 0:
        v = l + byte();
        break;
      case 1:
        v = h - byte();
        break;
      case 2:
        v = l + absl::int128(u64()) % (h - l + 1);
        break;
      case 3:
        v = (absl::int128(1) << (byte() % 63)) + (byte() % 3) - 1;
        break;
      case 4:
        v = l + (h - l) / (1 + byte());
        break;
      default:
        v = byte() % 16;
        break;
    }
    if (v < l) v = l;
    if (v > h) v = h;
    return static_cast<std::int64_t>(v);
  }

  // A time near `prev`: equal, a little later or earlier, anywhere in int64, an end of the
  // timeline, a big jump either way, `prev + hint` ± 1 (the time a denial named), a
  // multiple of `period` ± 1, or up to two periods later. period > 0.
  std::int64_t time(std::int64_t prev, absl::int128 hint, std::int64_t period) {
    static constexpr std::int64_t kEnds[] = {kMin, kMin + 1, -1, 0, 1, kMax - 1, kMax};
    const absl::int128 p = prev;
    switch (byte() % 10) {
      case 0:
        return prev;
      case 1:
        return clamp64(p + byte());
      case 2:
        return clamp64(p - byte());
      case 3:
        return static_cast<std::int64_t>(u64());
      case 4:
        return kEnds[byte() % 7];
      case 5:
        return clamp64(p + absl::int128(u64()));
      case 6:
        return clamp64(p - absl::int128(u64()));
      case 7:
        return clamp64(p + hint + (byte() % 3) - 1);
      case 8: {
        absl::int128 k = p / period;
        if (k * period > p) k -= 1;
        return clamp64((k + (byte() % 4) - 1) * period + (byte() % 3) - 1);
      }
      default:
        return clamp64(p + in_range(0, static_cast<std::int64_t>(std::min<absl::int128>(
                                           absl::int128(period) * 2, absl::int128(kMax)))));
    }
  }

  // A cost around `budget` (a burst or a limit): 1, small, the budget and its neighbours,
  // invalid (0, negative), or anything.
  std::int64_t cost(std::int64_t budget) {
    switch (byte() % 8) {
      case 0:
        return 1;
      case 1:
        return 1 + byte() % 4;
      case 2:
        return budget;
      case 3:
        return budget + 1;
      case 4:
        return -static_cast<std::int64_t>(byte());
      case 5:
        return in_range(1, budget);
      case 6:
        return static_cast<std::int64_t>(u64());
      default: {
        static constexpr std::int64_t kOdd[] = {kMin, kMax, 1'000'000, 9'223'372'036'854,
                                                9'223'372'036'855};
        return kOdd[byte() % 5];
      }
    }
  }

 private:
  const std::uint8_t* data_;
  std::size_t size_;
  std::size_t pos_ = 0;
};

}  // namespace quota::fuzz
