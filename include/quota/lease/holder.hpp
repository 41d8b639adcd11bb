// quota/lease/holder.hpp — what every grant holder keeps of itself: its incarnation, its
// grants' ids, and the backoff after a grant it failed to take.
//
// A holder (a LeasedLimiter, a gateway's LeasedBackend) names its grants after its
// incarnation, a random odd number drawn once per process start, so that the authority
// tells a restarted holder's grants from the ones it held before. After a failed grant a
// holder (and a regional pool's process after a failed refill) waits before it asks
// again: backoff_min doubled per failure after the first, at most backoff_max, with
// jitter — uniformly in [b/2, b] — so that holders that failed together do not ask again
// together. The jitter's generator is seeded with the incarnation, so a holder's waits
// are reproducible from its options.
//
// Thread safety: random_incarnation() may be called from any thread; a GrantBackoff's
// after() too (one mutex around its generator).
//
//   const std::uint64_t incarnation = quota::random_incarnation();
//   quota::GrantBackoff backoff(1ms, 1s, incarnation);
//   Nanos wait = backoff.after(/*failures=*/3);  // in [2 ms, 4 ms]
#pragma once

#include <algorithm>
#include <cstdint>
#include <random>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "quota/detail/mutex.hpp"
#include "quota/units.hpp"

namespace quota {

// A grant's id: the holder's incarnation in hex, '-', the holder's number for the request
// (from 1). An authority's ledger keeps grants by it, so a retried request with the same
// id is granted once; a restarted holder's ids differ by the incarnation. A regional
// pool's grants have the same form, the region for the incarnation (its Lua script,
// region/pool_script.hpp, writes them).
inline std::string grant_id(std::uint64_t incarnation, std::uint64_t n) {
  return absl::StrCat(absl::Hex(incarnation), "-", n);
}

// The id of a direct acquire (a cost above what is leased): "<incarnation>-d<n>".
inline std::string direct_grant_id(std::uint64_t incarnation, std::uint64_t n) {
  return absl::StrCat(absl::Hex(incarnation), "-d", n);
}

// A fresh random odd incarnation (never 0: 0 asks for one in the holders' options).
inline std::uint64_t random_incarnation() {
  std::random_device rd;
  return (std::uint64_t{rd()} << 32 | rd()) | 1;
}

class GrantBackoff {
 public:
  // `min` at least 1 ns and `max` at least `min` (the holders' options check or raise
  // them before).
  GrantBackoff(Nanos min, Nanos max, std::uint64_t seed) : min_(min), max_(max), rng_(seed) {}

  // The backoff before `failures` failures in a row, jitter excluded: backoff_min doubled
  // per failure after the first, at most backoff_max.
  std::int64_t ceiling(int failures) const {
    std::int64_t b = min_.count();
    const std::int64_t cap = max_.count();
    for (int i = 1; i < failures && b < cap; ++i) b = b > cap / 2 ? cap : b * 2;
    return std::min(b, cap);
  }

  // The wait after `failures` failures in a row: uniformly in [ceiling/2, ceiling].
  Nanos after(int failures) {
    const std::int64_t b = ceiling(failures);
    detail::MutexLock lock(mu_);
    return Nanos{b / 2 + static_cast<std::int64_t>(rng_() % static_cast<std::uint64_t>(b / 2 + 1))};
  }

 private:
  Nanos min_;
  Nanos max_;
  detail::Mutex mu_;
  std::mt19937_64 rng_ ABSL_GUARDED_BY(mu_);
};

}  // namespace quota
