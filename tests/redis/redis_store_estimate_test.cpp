// Tests of the sliding window estimate's Lua twin where its products cross 2^53: decided
// exactly as the C++ policy decides, ties included.
#include <algorithm>
#include <cstdint>
#include <iterator>
#include <random>
#include <string>
#include <tuple>
#include <utility>

#include <catch2/catch.hpp>

#include "absl/numeric/int128.h"
#include "quota/policy/sliding_window_estimate.hpp"
#include "quota/redis/redis_store.hpp"
#include "support/printers.hpp"
#include "support/seed.hpp"
#include "support/store_fixtures.hpp"

using namespace std::chrono_literals;
using quota::Decision;
using quota::Nanos;
using quota::Reason;
using quota::RedisStore;
using quota::RedisStoreOptions;
using quota::TokenBucket;
using quota::redis::TimeSource;
using quota::testing::options;
using quota::testing::set_state;

TEST_CASE("the estimate twin decides exactly where its products cross 2^53") {
  // The twin compares prev·(W − el) with (limit − cur − cost)·W as plain numbers while
  // both are below 2^53 and in two limbs beyond; remaining's prev·el / W likewise (2^52).
  // States with both products within a few units of 2^53 (written by hand in the twin's
  // form) are decided as the C++ policy decides them.
  const auto seed = quota::testing::test_seed(20261204);
  INFO("seed " << seed);
  std::mt19937_64 rng(seed);
  using quota::SlidingWindowEstimate;
  RedisStore<SlidingWindowEstimate> store(options("estimate-2^53"));
  const std::int64_t t53 = std::int64_t{1} << 53;
  const std::int64_t windows[] = {1'000'000'000, 1'000'000'000'000, 1'000'000'000'000'000,
                                  4'500'000'000'000'000};
  int allowed = 0, denied = 0;
  for (int trial = 0; trial < 200; ++trial) {
    const std::int64_t w = windows[rng() % std::size(windows)];
    const std::int64_t el = static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(w / 2));
    auto near = [&](std::int64_t v) {
      return std::max<std::int64_t>(0, v + static_cast<std::int64_t>(rng() % 7) - 3);
    };
    const std::int64_t cur = static_cast<std::int64_t>(rng() % 4);
    const std::int64_t cost = 1 + static_cast<std::int64_t>(rng() % 3);
    const std::int64_t spare = near(t53 / w);
    const SlidingWindowEstimate p{.limit = cur + cost + spare, .window = Nanos{w}};
    REQUIRE(RedisStore<SlidingWindowEstimate>::check(p).ok());
    const std::int64_t k = static_cast<std::int64_t>(
        rng() % static_cast<std::uint64_t>((std::int64_t{1} << 62) / w - 1));
    SlidingWindowEstimate::State state{
        .cur = cur, .prev = std::max<std::int64_t>(1, near(t53 / (w - el))), .last = k * w + el};
    const std::string route = "{acme}e" + std::to_string(trial);
    auto key = store.redis_key(route);
    REQUIRE(key.ok());
    set_state(store, *key, state);
    std::int64_t now = state.last;
    for (int i = 0; i < 3; ++i) {
      const Decision expected = p.apply(state, Nanos{now}, cost);
      auto got = store.apply(p, route, Nanos{now}, cost);
      INFO("trial " << trial << " request " << i << " W " << w << " limit " << p.limit << " cur "
                    << state.cur << " prev " << state.prev << " now " << now);
      REQUIRE(got.ok());
      CHECK(*got == expected);
      (expected.allowed ? allowed : denied) += 1;
      now += static_cast<std::int64_t>(rng() % 1000);
    }
  }
  CHECK(allowed > 50);
  CHECK(denied > 50);

  // Ties: prev·(W − el) = spare·W ± 1 with spare·W >= 2^53 (where doubles are 2 apart, so
  // a rounded comparison would get one of the two wrong): −1 passes, +1 does not.
  int ties = 0;
  for (int trial = 0; ties < 200 && trial < 20'000; ++trial) {
    const std::int64_t w = windows[rng() % std::size(windows)];
    const std::int64_t lo = t53 / w + 1;
    const std::int64_t prev =
        lo + 1 + static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(3 * lo));
    // spare ≡ −e·W^-1 (mod prev), by the extended Euclid algorithm
    absl::int128 r0 = prev, r1 = w % prev, s0 = 0, s1 = 1;
    while (r1 != 0) {
      const absl::int128 q = r0 / r1;
      std::tie(r0, r1) = std::pair{r1, r0 - q * r1};
      std::tie(s0, s1) = std::pair{s1, s0 - q * s1};
    }
    if (r0 != 1) continue;  // W and prev share a factor
    const std::int64_t e = rng() % 2 == 0 ? -1 : 1;
    const std::int64_t inv = static_cast<std::int64_t>(((s0 % prev) + prev) % prev);
    const std::int64_t spare =
        static_cast<std::int64_t>(((absl::int128(-e) * inv) % prev + prev) % prev);
    if (spare < lo) continue;
    const absl::int128 target = absl::int128(spare) * w + e;
    REQUIRE(target % prev == 0);
    const std::int64_t d = static_cast<std::int64_t>(target / prev);  // W − el
    if (d < 1 || d > w) continue;
    const std::int64_t cur = static_cast<std::int64_t>(rng() % 3);
    const SlidingWindowEstimate p{.limit = cur + 1 + spare, .window = Nanos{w}};
    if (!RedisStore<SlidingWindowEstimate>::check(p).ok()) continue;
    const std::int64_t k = static_cast<std::int64_t>(
        rng() % static_cast<std::uint64_t>((std::int64_t{1} << 62) / w - 1));
    SlidingWindowEstimate::State state{.cur = cur, .prev = prev, .last = k * w + (w - d)};
    const std::string route = "{acme}tie" + std::to_string(ties);
    auto key = store.redis_key(route);
    REQUIRE(key.ok());
    set_state(store, *key, state);
    const Decision expected = p.apply(state, Nanos{state.last}, 1);
    INFO("tie " << ties << " W " << w << " prev " << prev << " spare " << spare << " e " << e);
    REQUIRE(expected.allowed == (e < 0));
    auto got = store.apply(p, route, Nanos{state.last}, 1);
    REQUIRE(got.ok());
    CHECK(*got == expected);
    ++ties;
  }
  CHECK(ties == 200);
}
