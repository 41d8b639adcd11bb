// Differential test of the token bucket's Lua twin (quota/redis/twin/token_bucket.hpp):
// random traces through quota::TokenBucket with manual times and through RedisStore in
// caller-time mode must give identical decisions — allowed, reason, remaining,
// retry_after, reset_after — request by request, including parameters at the edge of
// the Lua twin's exact range (2^53) and times far from zero.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "quota/policy/fixed_window.hpp"
#include "quota/policy/sliding_log.hpp"
#include "quota/policy/sliding_window_estimate.hpp"
#include "quota/policy/token_bucket.hpp"
#include "quota/redis/redis_store.hpp"
#include "support/printers.hpp"
#include "support/redis_server.hpp"
#include "support/seed.hpp"

using namespace std::chrono_literals;
using quota::Decision;
using quota::FixedWindow;
using quota::Nanos;
using quota::RedisStore;
using quota::TokenBucket;

namespace {

std::int64_t log_uniform(std::mt19937_64& rng, std::int64_t lo, std::int64_t hi) {
  // Picks a magnitude first so that small and huge values are both common.
  const int bits_lo = 64 - __builtin_clzll(static_cast<unsigned long long>(lo));
  const int bits_hi = 64 - __builtin_clzll(static_cast<unsigned long long>(hi));
  const int bits = std::uniform_int_distribution<int>(bits_lo, bits_hi)(rng);
  const std::int64_t top = std::min<std::int64_t>(hi, (std::int64_t{1} << bits) - 1);
  const std::int64_t bottom = std::max<std::int64_t>(lo, std::int64_t{1} << (bits - 1));
  return std::uniform_int_distribution<std::int64_t>(std::min(bottom, top), top)(rng);
}

// Random policies the Lua twin accepts, often close to its bounds.
TokenBucket random_policy(std::mt19937_64& rng) {
  static const std::int64_t periods[] = {1,
                                         7,
                                         1'000,
                                         999'983,
                                         1'000'000,
                                         1'000'000'007,
                                         1'000'000'000,
                                         3'000'000'000,
                                         60'000'000'000,
                                         86'400'000'000'000,
                                         94'906'267};
  for (int attempt = 0; attempt < 1000; ++attempt) {
    TokenBucket p;
    p.burst = log_uniform(rng, 1, 9'007'199'254);
    p.rate.per = Nanos{periods[rng() % std::size(periods)]};
    p.rate.units = rng() % 10 == 0 ? 0 : log_uniform(rng, 1, 9'000'000'000'000);
    if (RedisStore<TokenBucket>::check(p).ok()) return p;
  }
  return TokenBucket{.rate = {.units = 3, .per = 7s}, .burst = 11};
}

// Policies right at the bounds, found by construction.
std::vector<TokenBucket> edge_policies() {
  return {
      // the largest burst; refills in about 104 days
      {.rate = {.units = 1001, .per = 1s}, .burst = 9'007'199'254},
      // a coprime rate with (m+2)(p+1) = 9.000006e15, just under 2^53, and a fill time
      // just under 9e15 ns: m = 3e6, p = 3e9 + 1
      {.rate = {.units = 3, .per = Nanos{3'000'000'001}}, .burst = 8'999'999},
      // fill time exactly at the bound 9e15 ns
      {.rate = {.units = 1, .per = Nanos{9'000'000'000}}, .burst = 1'000'000},
      // a one-off budget (rate 0) of the largest burst
      {.rate = {.units = 0, .per = 1s}, .burst = 9'007'199'254},
      // a tiny, fast bucket
      {.rate = {.units = 7, .per = Nanos{3}}, .burst = 2},
  };
}

std::int64_t random_cost(std::mt19937_64& rng, const TokenBucket& p) {
  switch (rng() % 10) {
    case 0:
      return static_cast<std::int64_t>(rng() % 2) - static_cast<std::int64_t>(rng() % 3);  // <= 1
    case 1:
      return p.burst + 1 + static_cast<std::int64_t>(rng() % 3);
    case 2:
      return p.burst;
    case 3:
      return quota::kMaxUnits;
    default:
      return log_uniform(rng, 1, std::max<std::int64_t>(1, p.burst / 3 + 1));
  }
}

std::int64_t next_time(std::mt19937_64& rng, const TokenBucket& p, std::int64_t now) {
  const std::int64_t per = p.rate.per.count();
  std::int64_t fill = per;
  if (p.rate.units > 0) {
    fill = static_cast<std::int64_t>(quota::detail::ceil_div(
        absl::int128(quota::to_micro(p.burst)) * per, quota::to_micro(p.rate.units)));
  }
  switch (rng() % 8) {
    case 0:
      return now;
    case 1:
      return now + static_cast<std::int64_t>(rng() % 3);
    case 2:
      return now - static_cast<std::int64_t>(rng() % 1'000'000'000);  // backwards
    case 3:
      return now + static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(per / 3 + 1));
    case 4:
      return now + fill - 1 + static_cast<std::int64_t>(rng() % 3);
    case 5:
      return now + log_uniform(rng, 1, 20'000'000'000'000'000);  // up to ~231 days
    default:
      return now + static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(fill / 7 + 1));
  }
}

}  // namespace

TEST_CASE("the Lua twin decides bit-identically to quota::TokenBucket on random traces") {
  const std::uint64_t seed = quota::testing::test_seed(20261129);
  INFO("seed " << seed);
  std::mt19937_64 rng(seed);
  RedisStore<TokenBucket> store(
      quota::RedisStoreOptions{.pool = quota::testing::redis_pool(1),
                               .prefix = quota::testing::unique_prefix("diff"),
                               .time = quota::redis::TimeSource::kCaller});

  std::vector<TokenBucket> policies = edge_policies();
  while (policies.size() < 48) policies.push_back(random_policy(rng));

  int requests = 0, allowed = 0;
  for (std::size_t trace = 0; trace < policies.size(); ++trace) {
    const TokenBucket& p = policies[trace];
    REQUIRE(p.validate().ok());
    REQUIRE(RedisStore<TokenBucket>::check(p).ok());
    const std::string key = "{diff}" + std::to_string(trace);
    std::int64_t now = static_cast<std::int64_t>(rng() >> 2);  // anywhere in [0, 2^62)
    TokenBucket::State state = p.init(Nanos{now});
    for (int i = 0; i < 250; ++i) {
      if (i > 0) now = std::max<std::int64_t>(0, next_time(rng, p, now));
      const std::int64_t cost = random_cost(rng, p);
      const Decision expected = p.apply(state, Nanos{now}, cost);
      auto got = store.apply(p, key, Nanos{now}, cost);
      INFO("trace " << trace << " request " << i << " burst=" << p.burst
                    << " rate=" << quota::to_string(p.rate) << " now=" << now << " cost=" << cost);
      REQUIRE(got.ok());
      REQUIRE(*got == expected);
      ++requests;
      allowed += expected.allowed;
    }
  }
  std::printf("%d requests, %d allowed, identical decisions\n", requests, allowed);
  CHECK(requests >= 10'000);
  CHECK(allowed > requests / 10);
  CHECK(allowed < requests);
}

namespace {

// Windows the Lua twins accept: divisors of 1 s and whole seconds (up to 10^8 s for the
// fixed window; each twin's bound clamps the last ones).
const std::int64_t kWindows[] = {1,
                                 2,
                                 8,
                                 1'000,
                                 1'000'000,
                                 250'000'000,
                                 1'000'000'000,
                                 2'000'000'000,
                                 60'000'000'000,
                                 3'600'000'000'000,
                                 9'000'000'000'000'000,
                                 34'560'000'000'000'000,
                                 100'000'000'000'000'000};

std::int64_t next_window_time(std::mt19937_64& rng, std::int64_t w, std::int64_t now) {
  const std::int64_t start = quota::detail::floor_div(now, w) * w;
  switch (rng() % 7) {
    case 0:
      return now;
    case 1:
      return now + static_cast<std::int64_t>(rng() % 3);
    case 2:
      return now - static_cast<std::int64_t>(rng() % 1'000'000'000);  // backwards
    case 3:
      return start + w - 1 + static_cast<std::int64_t>(rng() % 3);  // around the boundary
    case 4:
      return now + log_uniform(rng, 1, 20'000'000'000'000'000);
    default:
      return now + static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(w / 5 + 1));
  }
}

}  // namespace

// Random traces through a window policy P (FixedWindow, SlidingWindowEstimate) and its
// twin: `traces` traces of 250 requests; trace 0 has the largest limit.
template <class P>
void window_differential(const char* name, std::uint64_t default_seed, std::int64_t max_window) {
  const std::uint64_t seed = quota::testing::test_seed(default_seed);
  INFO(name << " seed " << seed);
  std::mt19937_64 rng(seed);
  RedisStore<P> store(
      quota::RedisStoreOptions{.pool = quota::testing::redis_pool(1),
                               .prefix = quota::testing::unique_prefix(std::string("diff-") + name),
                               .time = quota::redis::TimeSource::kCaller});
  std::vector<std::int64_t> windows;
  for (std::int64_t w : kWindows) windows.push_back(std::min(w, max_window));
  int requests = 0, allowed = 0;
  for (int trace = 0; trace < 44; ++trace) {
    P p{.limit = trace == 0 ? quota::kMaxUnits : log_uniform(rng, 1, 1'000'000'000'000),
        .window = Nanos{windows[static_cast<std::size_t>(trace) % windows.size()]}};
    if (trace % 5 == 1) p.limit = log_uniform(rng, 1, 20);  // small limits: many denials
    REQUIRE(p.validate().ok());
    REQUIRE(RedisStore<P>::check(p).ok());
    const std::string key = "{diff}w" + std::to_string(trace);
    std::int64_t now = static_cast<std::int64_t>(rng() >> 2);
    typename P::State state = p.init(Nanos{now});
    for (int i = 0; i < 250; ++i) {
      if (i > 0) now = std::max<std::int64_t>(0, next_window_time(rng, p.window.count(), now));
      std::int64_t cost;
      switch (rng() % 8) {
        case 0:
          cost = static_cast<std::int64_t>(rng() % 2) - 1;
          break;
        case 1:
          cost = p.limit + 1;
          break;
        case 2:
          cost = quota::kMaxUnits;
          break;
        default:
          cost = log_uniform(rng, 1, std::max<std::int64_t>(1, p.limit / 3 + 1));
      }
      const Decision expected = p.apply(state, Nanos{now}, cost);
      auto got = store.apply(p, key, Nanos{now}, cost);
      INFO("trace " << trace << " request " << i << " limit=" << p.limit
                    << " window=" << p.window.count() << " now=" << now << " cost=" << cost);
      REQUIRE(got.ok());
      REQUIRE(*got == expected);
      ++requests;
      allowed += expected.allowed;
    }
  }
  std::printf("%s: %d requests, %d allowed, identical decisions\n", name, requests, allowed);
  CHECK(requests >= 10'000);
  CHECK(allowed > requests / 10);
  CHECK(allowed < requests);
}

TEST_CASE("the FixedWindow Lua twin decides bit-identically to quota::FixedWindow") {
  window_differential<FixedWindow>("FixedWindow", 20261130, quota::redis::kMaxWideSpanNs);
}

TEST_CASE("the SlidingWindowEstimate Lua twin decides bit-identically to the C++ policy") {
  window_differential<quota::SlidingWindowEstimate>(
      "SlidingWindowEstimate", 20261131,
      quota::redis::LuaTwin<quota::SlidingWindowEstimate>::kMaxWindowNs / 1'000'000'000 *
          1'000'000'000);
}

TEST_CASE("FixedWindow windows the Lua twin cannot make exact are rejected, naming the bound") {
  const absl::Status s = RedisStore<FixedWindow>::check({.limit = 10, .window = Nanos{3}});
  CHECK(absl::IsInvalidArgument(s));
  CHECK(s.message().find("window") != absl::string_view::npos);
  CHECK(RedisStore<FixedWindow>::check({.limit = 10, .window = std::chrono::hours(24 * 400)}).ok());
  const absl::Status past = RedisStore<FixedWindow>::check(
      {.limit = 10, .window = Nanos{quota::redis::kMaxWideSpanNs + 1'000'000'000}});
  CHECK(absl::IsInvalidArgument(past));
  CHECK(past.message().find("100000000 s") != absl::string_view::npos);
  CHECK(absl::IsInvalidArgument(
      RedisStore<FixedWindow>::check({.limit = quota::redis::kLuaExact, .window = 1s})));
}

TEST_CASE("the SlidingLog Lua twin decides bit-identically to quota::SlidingLog") {
  window_differential<quota::SlidingLog>("SlidingLog", 20261132, quota::redis::kMaxFillNs);
}

TEST_CASE("SlidingWindowEstimate windows outside the Lua twin's exact range are rejected") {
  using S = RedisStore<quota::SlidingWindowEstimate>;
  CHECK(S::check({.limit = 10, .window = 1s}).ok());
  const absl::Status s = S::check({.limit = 10, .window = std::chrono::hours(24 * 53)});
  CHECK(absl::IsInvalidArgument(s));
  CHECK(s.message().find("2^52") != absl::string_view::npos);
  CHECK(absl::IsInvalidArgument(S::check({.limit = 10, .window = Nanos{3}})));
}
