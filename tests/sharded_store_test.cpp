// Tests for quota/store/sharded_store.hpp (and the shared capacity logic in
// detail/keyed_states.hpp): atomicity under real threads, single creation of a racing
// key, bounded size that never resets an active key.
#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "absl/numeric/int128.h"
#include "quota/clock.hpp"
#include "quota/policy/token_bucket.hpp"
#include "quota/store/sharded_store.hpp"
#include "support/printers.hpp"

using namespace std::chrono_literals;
using quota::Nanos;
using quota::ShardedStore;
using quota::TokenBucket;

namespace {

constexpr int kThreads = 8;

// Catch2 assertions are not thread-safe: worker threads count problems in `errors`, and
// the test thread asserts after join.
std::atomic<int> errors{0};

template <class Fn>
void run_threads(int n, Fn fn) {
  std::vector<std::thread> threads;
  for (int t = 0; t < n; ++t) threads.emplace_back(fn, t);
  for (auto& th : threads) th.join();
}

}  // namespace

TEST_CASE("8 threads x 100,000 requests on one key with a frozen clock admit exactly B",
          "[sharded_store][concurrency]") {
  const TokenBucket p{.rate = {.units = 1000, .per = 1s}, .burst = 777};
  ShardedStore<TokenBucket> store;
  std::atomic<std::int64_t> admitted{0}, denied{0};
  run_threads(kThreads, [&](int) {
    for (int i = 0; i < 100'000; ++i) {
      auto d = store.apply(p, "tenant:hot", Nanos{5s}, 1);
      if (!d.ok()) {
        errors.fetch_add(1);
        continue;
      }
      (d->allowed ? admitted : denied).fetch_add(1);
    }
  });
  REQUIRE(errors.load() == 0);
  CHECK(admitted.load() == 777);
  CHECK(denied.load() == kThreads * 100'000 - 777);
}

TEST_CASE("with a running clock the union of admissions satisfies the envelope",
          "[sharded_store][concurrency]") {
  // r = 1 unit per 10 µs, B = 50. Every thread reads a shared manual clock that another
  // thread keeps advancing, and records (time, cost) of each admission.
  const TokenBucket p{.rate = {.units = 1, .per = 10us}, .burst = 50};
  ShardedStore<TokenBucket> store({.shards = 4});
  quota::ManualClock clock;
  std::atomic<bool> stop{false};
  std::mutex log_mu;
  std::vector<std::pair<std::int64_t, std::int64_t>> log;  // (time, cost)
  std::atomic<int> admissions{0};
  // At least 20,000 ticks, and on until the workers admitted 200 times (a slow,
  // instrumented or loaded machine may let the ticker run ahead of them), at most 2 M.
  std::thread ticker([&] {
    for (int i = 0; i < 2'000'000 && !stop.load(); ++i) {
      if (i >= 20'000 && admissions.load() >= 200) break;
      clock.advance(Nanos{1'000});
      std::this_thread::yield();
    }
    stop.store(true);
  });
  run_threads(kThreads, [&](int t) {
    std::int64_t cost = 1 + t % 3;
    while (!stop.load()) {
      // The store may apply a slightly older `now` after a newer one (threads race
      // between reading the clock and taking the lock); the policy then decides at the
      // stored time. Log that effective time, read inside the same critical section.
      auto r = store.update(p, "tenant:running", clock.now(), [&](TokenBucket::State& s) {
        const quota::Decision d = p.apply(s, clock.now(), cost);
        return std::make_pair(d.allowed, s.last);
      });
      if (!r.ok()) {
        errors.fetch_add(1);
        continue;
      }
      if (r->first) {
        std::lock_guard<std::mutex> lock(log_mu);
        log.emplace_back(r->second, cost);
        admissions.fetch_add(1);
      }
    }
  });
  ticker.join();
  std::sort(log.begin(), log.end());
  REQUIRE(errors.load() == 0);
  REQUIRE(log.size() > 100);
  // Exact envelope over every window [log[i].t, log[j].t]: sum·per <= units·dt + B·per.
  std::int64_t worst_excess_numer = INT64_MIN;
  for (std::size_t i = 0; i < log.size(); ++i) {
    absl::int128 sum = 0;
    for (std::size_t j = i; j < log.size(); ++j) {
      sum += log[j].second;
      const absl::int128 excess =
          sum * 10'000 - (absl::int128(log[j].first - log[i].first) + 50 * 10'000);
      worst_excess_numer =
          std::max<std::int64_t>(worst_excess_numer, static_cast<std::int64_t>(excess));
    }
  }
  INFO("admissions " << log.size() << ", worst excess (units x 10^4) " << worst_excess_numer);
  CHECK(worst_excess_numer <= 0);
}

TEST_CASE("8 threads racing to create one new key create one bucket",
          "[sharded_store][concurrency]") {
  const TokenBucket p{.rate = {.units = 1, .per = 1h}, .burst = 1};
  ShardedStore<TokenBucket> store;
  for (int round = 0; round < 50; ++round) {
    const std::string key = "tenant:new-" + std::to_string(round);
    std::atomic<int> go{0}, admitted{0};
    run_threads(kThreads, [&](int) {
      go.fetch_add(1);
      while (go.load() < kThreads) {
      }
      auto d = store.apply(p, key, Nanos{0}, 1);
      if (!d.ok())
        errors.fetch_add(1);
      else
        admitted += d->allowed;
    });
    REQUIRE(errors.load() == 0);
    REQUIRE(admitted.load() == 1);  // two buckets would have admitted twice
  }
  CHECK(store.size() == 50);
}

TEST_CASE("a full store evicts only idle keys and never resets an active one",
          "[sharded_store][capacity]") {
  const TokenBucket p{.rate = {.units = 1, .per = 1s}, .burst = 2};
  // One shard so the bound is exact: 3 keys.
  ShardedStore<TokenBucket> store({.max_keys = 3, .shards = 1});
  for (const char* k : {"a", "b", "c"}) REQUIRE(store.apply(p, k, Nanos{0}, 2)->allowed);
  CHECK(store.size() == 3);

  SECTION(
      "no key idle: the new key is refused with ResourceExhausted, the others keep their state") {
    auto d = store.apply(p, "d", 1s, 1);
    REQUIRE_FALSE(d.ok());
    CHECK(d.status().code() == absl::StatusCode::kResourceExhausted);
    CHECK_THAT(std::string(d.status().message()), Catch::Contains("store full"));
    // "a" was spent to 0 at t=0 and has refilled 1 unit by t=1 s: not a fresh 2.
    auto a = store.apply(p, "a", 1s, 2);
    REQUIRE(a.ok());
    CHECK_FALSE(a->allowed);
    CHECK(store.size() == 3);
  }
  SECTION("once a key is full again it is evicted to make room") {
    // Keep "a" and "b" active; "c" is full again at t = 2 s.
    REQUIRE(store.apply(p, "a", 2s, 1)->allowed);
    REQUIRE(store.apply(p, "b", 2s, 1)->allowed);
    auto d = store.apply(p, "d", 2s, 1);
    REQUIRE(d.ok());
    CHECK(d->allowed);
    CHECK(store.size() == 3);
    // "a" kept its state: 1 unit left at t=2 s, so 2 is denied.
    CHECK_FALSE(store.apply(p, "a", 2s, 2)->allowed);
  }
  SECTION("a full store of active keys refuses in O(1) until a key can be idle") {
    for (int i = 0; i < 1000; ++i)
      REQUIRE_FALSE(store.apply(p, "x" + std::to_string(i), 1s, 1).ok());
    CHECK(store.size() == 3);
  }
}

TEST_CASE("sweep forgets exactly the keys that are full again", "[sharded_store][capacity]") {
  const TokenBucket p{.rate = {.units = 1, .per = 1s}, .burst = 10};
  ShardedStore<TokenBucket> store;
  REQUIRE(store.apply(p, "spent-1", Nanos{0}, 1)->allowed);  // full again at 1 s
  REQUIRE(store.apply(p, "spent-5", Nanos{0}, 5)->allowed);  // full again at 5 s
  CHECK(store.sweep(p, 999ms) == 0);
  CHECK(store.sweep(p, 1s) == 1);
  CHECK(store.size() == 1);
  CHECK(store.sweep(p, 5s) == 1);
  CHECK(store.size() == 0);
}

TEST_CASE("shard count is rounded up to a power of two", "[sharded_store]") {
  CHECK(ShardedStore<TokenBucket>({.shards = 1}).shard_count() == 1);
  CHECK(ShardedStore<TokenBucket>({.shards = 3}).shard_count() == 4);
  CHECK(ShardedStore<TokenBucket>({.shards = 64}).shard_count() == 64);
  CHECK(ShardedStore<TokenBucket>({.shards = 0}).shard_count() == 1);
}
