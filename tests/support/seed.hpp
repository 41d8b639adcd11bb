// tests/support/seed.hpp — fixed, printed seeds for randomized tests.
//
// Every randomized test draws its seed from test_seed(): a fixed default so runs are
// reproducible, overridable with QUOTA_SEED=<n> to explore, and always printed (via
// Catch2's INFO, shown on failure, and on stdout) so a failure can be replayed.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace quota::testing {

inline std::uint64_t test_seed(std::uint64_t fixed_default) {
  std::uint64_t seed = fixed_default;
  if (const char* env = std::getenv("QUOTA_SEED"); env != nullptr && *env != '\0') {
    seed = std::strtoull(env, nullptr, 10);
  }
  std::printf("seed: %llu (replay with QUOTA_SEED=%llu)\n", static_cast<unsigned long long>(seed),
              static_cast<unsigned long long>(seed));
  return seed;
}

}  // namespace quota::testing
