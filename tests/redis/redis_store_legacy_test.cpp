// Tests of RedisStore on states written in the earlier forms of the Lua twins (doubles):
// each is read and decided on exactly as the C++ policy decides, then rewritten in the
// current, smaller form.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <iterator>
#include <random>
#include <string>

#include <catch2/catch.hpp>

#include "quota/policy/fixed_window.hpp"
#include "quota/policy/sliding_log.hpp"
#include "quota/policy/sliding_window_estimate.hpp"
#include "quota/policy/token_bucket.hpp"
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
using quota::testing::kTen;
using quota::testing::options;
using quota::testing::run;
using quota::testing::run_in;
using quota::testing::set_legacy;
using quota::testing::TenOf;

namespace {

quota::FixedWindow::State random_state(std::mt19937_64& rng, const quota::FixedWindow& p,
                                       std::int64_t last) {
  return {.count = static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(p.limit + 1)),
          .last = last};
}
quota::SlidingWindowEstimate::State random_state(std::mt19937_64& rng,
                                                 const quota::SlidingWindowEstimate& p,
                                                 std::int64_t last) {
  const auto bound = static_cast<std::uint64_t>(p.limit + 1);
  return {.cur = static_cast<std::int64_t>(rng() % bound),
          .prev = static_cast<std::int64_t>(rng() % bound),
          .last = last};
}

}  // namespace

TEST_CASE("a token bucket state written by earlier versions (four doubles) is still read") {
  RedisStore<TokenBucket> store(options("legacy"));
  auto key = store.redis_key("{acme}old");
  REQUIRE(key.ok());
  // 3 of 10 units left at t = 5 s, no carry: the earlier 32-byte state.
  run(store,
      {"EVAL", "redis.call('SET', KEYS[1], struct.pack('<dddd', 3000000, 0, 5, 0))", "1", *key});
  TokenBucket::State state{.tokens = 3'000'000, .carry = 0, .last = 5'000'000'000};
  const Decision expected = kTen.apply(state, Nanos{5'500'000'000}, 2);
  auto got = store.apply(kTen, "{acme}old", Nanos{5'500'000'000}, 2);
  REQUIRE(got.ok());
  CHECK(*got == expected);
  CHECK(got->remaining == 1);
  // Rewritten in the current, smaller form.
  CHECK(run(store, {"STRLEN", *key})->integer < 32);
  const Decision again = kTen.apply(state, Nanos{6'000'000'000}, 1);
  auto got2 = store.apply(kTen, "{acme}old", Nanos{6'000'000'000}, 1);
  REQUIRE(got2.ok());
  CHECK(*got2 == again);
}

TEMPLATE_TEST_CASE("window states written by earlier versions (doubles) are still read", "",
                   quota::FixedWindow, quota::SlidingWindowEstimate) {
  // A deployed Redis holds states in the earlier form: each is read, decided on exactly as
  // the C++ policy decides from the same state, and rewritten in the current, smaller form.
  const auto seed = quota::testing::test_seed(20261202);
  INFO("seed " << seed);
  std::mt19937_64 rng(seed);
  using Ten = TenOf<TestType>;
  RedisStore<TestType> store(options(std::string("legacy-") + Ten::name));
  const Nanos windows[] = {Nanos{1'000'000}, 250ms, 1s, 60s, 1h};
  int allowed = 0, denied = 0;
  for (int trial = 0; trial < 60; ++trial) {
    const TestType p{.limit = 1 + static_cast<std::int64_t>(rng() % 20),
                     .window = windows[rng() % std::size(windows)]};
    const std::int64_t w = p.window.count();
    const std::int64_t last = static_cast<std::int64_t>(rng() >> 4);  // [0, 2^60)
    auto state = random_state(rng, p, last);
    const std::string route = "{acme}old" + std::to_string(trial);
    auto key = store.redis_key(route);
    REQUIRE(key.ok());
    set_legacy(store, *key, state);
    REQUIRE(run_in(store, {"STRLEN", *key})->integer == static_cast<long long>(Ten::legacy));
    // The first request at the stored time, in the same window or a later one, or earlier
    // (backwards time); then two more.
    std::int64_t now = last;
    for (int i = 0; i < 3; ++i) {
      switch (rng() % 4) {
        case 0:
          now += static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(w / 3 + 1));
          break;
        case 1:
          now += w + static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(w));
          break;
        case 2:
          now -= static_cast<std::int64_t>(rng() % 1'000'000'000);
          break;
        default:
          break;
      }
      now = std::max<std::int64_t>(now, 0);
      const std::int64_t cost = 1 + static_cast<std::int64_t>(rng() % 6);
      const Decision expected = p.apply(state, Nanos{now}, cost);
      auto got = store.apply(p, route, Nanos{now}, cost);
      INFO("trial " << trial << " request " << i << " limit " << p.limit << " window " << w
                    << " last " << last << " now " << now << " cost " << cost);
      REQUIRE(got.ok());
      CHECK(*got == expected);
      (expected.allowed ? allowed : denied) += 1;
      CHECK(run_in(store, {"STRLEN", *key})->integer == static_cast<long long>(Ten::bytes));
    }
  }
  CHECK(allowed > 20);
  CHECK(denied > 20);
}

TEMPLATE_TEST_CASE("a window key takes fewer bytes than in the earlier form (MEMORY USAGE)", "",
                   quota::FixedWindow, quota::SlidingWindowEstimate) {
  using Ten = TenOf<TestType>;
  RedisStore<TestType> store(options(std::string("memory-") + Ten::name, TimeSource::kServer));
  const TestType p = Ten::policy();
  auto d = store.apply(p, "{acme}mem-new", Nanos{0}, 3);
  REQUIRE(d.ok());
  REQUIRE(d->allowed);
  auto key = store.redis_key("{acme}mem-new");
  auto old_key = store.redis_key("{acme}mem-old");  // a key of the same length
  REQUIRE(key.ok());
  REQUIRE(old_key.ok());
  REQUIRE(key->size() == old_key->size());
  // The same decision's state in the earlier form (counted 3 at 10 s), with a TTL too.
  auto state = p.init(Nanos{10s});
  REQUIRE(p.apply(state, Nanos{10s}, 3).allowed);
  set_legacy(store, *old_key, state);
  const long long now_bytes = run_in(store, {"MEMORY", "USAGE", *key})->integer;
  const long long old_bytes = run_in(store, {"MEMORY", "USAGE", *old_key})->integer;
  std::printf("MEMORY USAGE of one %s key (key of %zu bytes): %lld bytes (earlier form: %lld)\n",
              Ten::name, key->size(), now_bytes, old_bytes);
  INFO(Ten::name << ": " << now_bytes << " bytes, earlier form " << old_bytes);
  CHECK(run_in(store, {"STRLEN", *key})->integer == static_cast<long long>(Ten::bytes));
  CHECK(now_bytes > 0);
  CHECK(now_bytes < old_bytes);
}
