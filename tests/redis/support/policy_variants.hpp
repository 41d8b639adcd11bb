// tests/redis/support/policy_variants.hpp — small parameter sets of each policy, for
// tests that mix several in one call (coalesced batches, all-or-nothing checks).
#pragma once

#include <chrono>
#include <cstdint>
#include <iterator>
#include <random>
#include <vector>

#include "quota/decision.hpp"
#include "quota/policy/fixed_window.hpp"
#include "quota/policy/sliding_log.hpp"
#include "quota/policy/sliding_window_estimate.hpp"
#include "quota/policy/token_bucket.hpp"

namespace quota::testing {

// Three parameter sets of policy P, with budgets of 3 to 9 units (so that random costs
// of 1 to 3 meet denials often).
template <class P>
std::vector<P> policy_variants();

template <>
inline std::vector<TokenBucket> policy_variants() {
  using namespace std::chrono_literals;
  return {TokenBucket{.rate = {.units = 5, .per = 1s}, .burst = 6},
          TokenBucket{.rate = {.units = 1, .per = 3s}, .burst = 4},
          TokenBucket{.rate = {.units = 7, .per = 2s}, .burst = 9}};
}

template <class W>
std::vector<W> window_policy_variants() {
  using namespace std::chrono_literals;
  return {W{.limit = 5, .window = 1s}, W{.limit = 3, .window = 500ms}, W{.limit = 8, .window = 2s}};
}
template <>
inline std::vector<FixedWindow> policy_variants() {
  return window_policy_variants<FixedWindow>();
}
template <>
inline std::vector<SlidingWindowEstimate> policy_variants() {
  return window_policy_variants<SlidingWindowEstimate>();
}
template <>
inline std::vector<SlidingLog> policy_variants() {
  return window_policy_variants<SlidingLog>();
}

// A random token bucket for the twins' reply tests: up to 10^6 units per one of a few
// periods (1 ns to a day, primes among them), a burst in [1, max_burst]; three draws of
// `rng`. Not checked against any store's range (the caller does).
inline TokenBucket random_token_bucket(std::mt19937_64& rng, std::int64_t max_burst) {
  const std::int64_t periods[] = {1, 7, 1'000, 999'983, 1'000'000'007, 86'400'000'000'000};
  TokenBucket tb{.rate = {.units = static_cast<std::int64_t>(rng() % 1'000'000), .per = {}},
                 .burst = 0};
  tb.rate.per = Nanos{periods[rng() % std::size(periods)]};
  tb.burst = 1 + static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(max_burst));
  return tb;
}

// A random cost for a bucket of `burst`: in [1, burst], one time in 10 an invalid one (-1
// to 1), one in 10 above the burst; three draws of `rng`.
inline std::int64_t random_cost(std::mt19937_64& rng, std::int64_t burst) {
  std::int64_t cost = 1 + static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(burst));
  if (rng() % 10 == 0) cost = static_cast<std::int64_t>(rng() % 3) - 1;
  if (rng() % 10 == 0) cost = burst + 1 + static_cast<std::int64_t>(rng() % 5);
  return cost;
}

// The outcomes a property test met: allowed, over the limit with a retry, never
// retryable (each should be common, or the test proves little).
struct OutcomeTally {
  int allowed = 0, over = 0, never = 0;
  void add(const Decision& d) {
    allowed += d.reason == Reason::kAllowed;
    over += d.reason == Reason::kOverLimit && d.retry_after != kNever;
    never += d.retry_after == kNever;
  }
};

}  // namespace quota::testing
