// Tests for RedisStore's coalescing (RedisStoreOptions::coalesce) against a real
// redis-server: concurrent apply() calls decided together in one script call, each
// exactly as if alone; a corrupt bucket or a bad key failing only its own caller.
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <random>
#include <string>
#include <thread>
#include <typeinfo>
#include <vector>

#include <catch2/catch.hpp>

#include "quota/limiter.hpp"
#include "quota/policy/fixed_window.hpp"
#include "quota/policy/sliding_log.hpp"
#include "quota/policy/sliding_window_estimate.hpp"
#include "quota/policy/token_bucket.hpp"
#include "quota/redis/redis_store.hpp"
#include "support/coalescing.hpp"
#include "support/policy_variants.hpp"
#include "support/printers.hpp"
#include "support/redis_server.hpp"
#include "support/seed.hpp"

using namespace std::chrono_literals;
using quota::Decision;
using quota::Nanos;
using quota::RedisStore;
using quota::RedisStoreOptions;
using quota::TokenBucket;
using quota::redis::TimeSource;

namespace {

RedisStoreOptions coalescing(const std::string& test, int coalesce, int calls, TimeSource time) {
  RedisStoreOptions o{.pool = quota::testing::redis_pool(4),
                      .prefix = quota::testing::unique_prefix(test),
                      .time = time};
  o.coalesce = coalesce;
  o.coalesce_calls = calls;
  return o;
}

}  // namespace

TEST_CASE("coalesced apply: threads sharing one budget admit exactly it, several per call") {
  // Rate 0: a one-off budget, so the count admitted does not depend on timing.
  const TokenBucket budget{.rate = {.units = 0, .per = 1s}, .burst = 300};
  RedisStore<TokenBucket> store(coalescing("coalesce-budget", 32, 1, TimeSource::kServer));
  constexpr int kThreads = 8, kEach = 100;
  // Half the threads spend the shared key, half keys of their own (distinct keys in one
  // script call); every 4th request of the latter also spends the shared key.
  std::vector<std::vector<Decision>> shared(kThreads);
  std::atomic<int> errors{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      const std::string own = "{coalesce-" + std::to_string(t) + "}own";
      for (int i = 0; i < kEach; ++i) {
        const bool on_shared = t % 2 == 0 || i % 4 == 0;
        auto d = store.apply(budget, on_shared ? "{coalesce}shared" : own, Nanos{0}, 1);
        if (!d.ok()) {
          errors.fetch_add(1);
          continue;
        }
        if (on_shared) shared[t].push_back(*d);
      }
    });
  }
  for (auto& th : threads) th.join();
  CHECK(errors.load() == 0);
  // Each allowed decision on the shared key saw its own remaining count: 299 down to 0,
  // each once; every other was denied for good (rate 0).
  std::vector<int> seen(budget.burst, 0);
  std::int64_t allowed = 0, denied = 0;
  for (const auto& list : shared) {
    for (const Decision& d : list) {
      if (d.allowed) {
        ++allowed;
        REQUIRE(d.remaining >= 0);
        REQUIRE(d.remaining < budget.burst);
        ++seen[static_cast<std::size_t>(d.remaining)];
      } else {
        ++denied;
        CHECK(d.remaining == 0);
        CHECK(d.retry_after == quota::kNever);
      }
    }
  }
  CHECK(allowed == budget.burst);
  CHECK(allowed + denied == kThreads / 2 * kEach + kThreads / 2 * (kEach / 4));
  for (std::size_t r = 0; r < seen.size(); ++r) {
    INFO("remaining " << r);
    CHECK(seen[r] == 1);
  }
  const auto stats = store.coalesce_stats();
  INFO("round trips " << stats.round_trips << ", decisions " << stats.decisions);
  CHECK(stats.decisions == std::uint64_t{kThreads} * kEach);
  CHECK(stats.round_trips < stats.decisions);  // calls that waited went together
}

TEMPLATE_TEST_CASE("coalesced decisions are the C++ policy's, one by one", "", TokenBucket,
                   quota::FixedWindow, quota::SlidingWindowEstimate, quota::SlidingLog) {
  // Caller time: each thread spends keys of its own, at a time sequence all threads
  // share (calls at one time may go together), and compares every decision with the
  // C++ policy's on its own copy of the state.
  const auto seed = quota::testing::test_seed(20261130);
  INFO("seed " << seed);
  const std::vector<TestType> policies = quota::testing::policy_variants<TestType>();
  RedisStore<TestType> store(coalescing(std::string("coalesce-exact-") + typeid(TestType).name(),
                                        16, 1, TimeSource::kCaller));
  constexpr int kThreads = 6, kSteps = 150;
  std::mt19937_64 rng(seed);
  std::vector<Nanos> times(kSteps);
  Nanos now{1'000'000'000'000};
  for (auto& t : times) {
    now += Nanos{static_cast<std::int64_t>(rng() % 400'000'000)};
    t = now;
  }
  std::atomic<int> mismatches{0}, errors{0};
  std::vector<std::string> first_mismatch(kThreads);
  std::string first_error;  // written by the thread that counts the first error
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937_64 mine(seed + static_cast<std::uint64_t>(t) + 1);
      const std::string keys[2] = {"{exact-" + std::to_string(t) + "}a",
                                   "{exact-" + std::to_string(t) + "}b"};
      const TestType& policy = policies[static_cast<std::size_t>(t) % policies.size()];
      typename TestType::State model[2];
      bool fresh[2] = {true, true};
      for (int i = 0; i < kSteps; ++i) {
        const std::size_t k = mine() % 2;
        const std::int64_t cost = 1 + static_cast<std::int64_t>(mine() % 3);
        if (fresh[k]) {
          model[k] = policy.init(times[i]);
          fresh[k] = false;
        }
        const Decision want = policy.apply(model[k], times[i], cost);
        auto got = store.apply(policy, keys[k], times[i], cost);
        if (!got.ok()) {
          if (errors.fetch_add(1) == 0) first_error = got.status().ToString();
          continue;
        }
        if (got->allowed != want.allowed || got->remaining != want.remaining ||
            got->retry_after != want.retry_after || got->reason != want.reason) {
          if (mismatches.fetch_add(1) == 0) {
            first_mismatch[t] = "thread " + std::to_string(t) + " step " + std::to_string(i);
          }
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  std::string where;
  for (const auto& m : first_mismatch) where += m;
  INFO(where);
  INFO(first_error);
  CHECK(errors.load() == 0);
  CHECK(mismatches.load() == 0);
  const auto stats = store.coalesce_stats();
  INFO("round trips " << stats.round_trips << ", decisions " << stats.decisions);
  CHECK(stats.decisions == std::uint64_t{kThreads} * kSteps);
  CHECK(stats.round_trips < stats.decisions);  // calls at different times went together too
}

TEST_CASE("a corrupt bucket in a coalesced call fails its own caller only") {
  // The server is paused while the first call is in flight, until the next five wait;
  // then they go together in one script call, with the corrupt bucket among them.
  const TokenBucket ten{.rate = {.units = 1, .per = 1s}, .burst = 10};
  RedisStore<TokenBucket> store(coalescing("coalesce-corrupt", 16, 1, TimeSource::kCaller));
  auto bad = store.redis_key("{bad}x");
  REQUIRE(bad.ok());
  auto admin = quota::testing::redis_pool(1);
  auto lease = admin->acquire();
  REQUIRE(lease.ok());
  REQUIRE((*lease)->command({"SET", *bad, "17"}).ok());
  // WRITE: scripts wait, CLIENT UNPAUSE does not.
  REQUIRE((*lease)->command({"CLIENT", "PAUSE", "1500", "WRITE"}).ok());

  const std::vector<std::string> keys = {"{t0}a", "{t1}a", "{t2}a", "{bad}x", "{t3}a", "{t4}a"};
  std::vector<absl::StatusOr<Decision>> got(keys.size(), absl::UnknownError("not run"));
  std::vector<std::thread> threads;
  // The first call is the one in flight (held by the pause) before the others start.
  const auto before = store.coalesce_stats().round_trips;
  threads.emplace_back([&] { got[0] = store.apply(ten, keys[0], Nanos{0}, 2); });
  while (store.coalesce_stats().round_trips == before) std::this_thread::yield();
  for (std::size_t i = 1; i < keys.size(); ++i) {
    threads.emplace_back(
        [&, i] { got[i] = store.apply(ten, keys[i], Nanos{0}, static_cast<std::int64_t>(i)); });
  }
  const bool all_waited = quota::testing::wait_for_waiting(store, keys.size() - 1);
  REQUIRE((*lease)->command({"CLIENT", "UNPAUSE"}).ok());
  for (auto& th : threads) th.join();
  REQUIRE(all_waited);  // (else the pause ended before they all waited)

  const auto stats = store.coalesce_stats();
  INFO("round trips " << stats.round_trips << ", decisions " << stats.decisions);
  CHECK(stats.decisions == keys.size());
  CHECK(stats.round_trips == 2);  // the first alone, then the five that waited, together
  for (std::size_t i = 0; i < keys.size(); ++i) {
    INFO(keys[i] << ": " << got[i].status());
    if (keys[i] == "{bad}x") {
      REQUIRE_FALSE(got[i].ok());
      CHECK(absl::IsDataLoss(got[i].status()));
      continue;
    }
    REQUIRE(got[i].ok());
    const std::int64_t cost = i == 0 ? 2 : static_cast<std::int64_t>(i);
    CHECK(got[i]->allowed);
    CHECK(got[i]->remaining == 10 - cost);
    // Charged exactly once (a peek: cost 11 is over the burst).
    auto peek = store.apply(ten, keys[i], Nanos{0}, 11);
    REQUIRE(peek.ok());
    CHECK(peek->remaining == 10 - cost);
  }
}

TEST_CASE("coalescing: a bad key or policy fails its own call, bad options every call") {
  RedisStore<TokenBucket> store(coalescing("coalesce-bad", 8, 2, TimeSource::kServer));
  const TokenBucket ok{.rate = {.units = 1, .per = 1s}, .burst = 3};
  auto braces = store.apply(ok, "{a}b}", Nanos{0}, 1);
  REQUIRE_FALSE(braces.ok());
  CHECK(absl::IsInvalidArgument(braces.status()));
  const TokenBucket huge{.rate = {.units = 1, .per = 1s}, .burst = std::int64_t{1} << 50};
  auto out_of_range = store.apply(huge, "{a}b", Nanos{0}, 1);
  REQUIRE_FALSE(out_of_range.ok());
  CHECK(absl::IsInvalidArgument(out_of_range.status()));
  CHECK(store.coalesce_stats().round_trips == 0);  // neither waited nor was sent
  auto fine = store.apply(ok, "{a}b", Nanos{0}, 1);
  REQUIRE(fine.ok());
  CHECK(fine->allowed);

  for (const auto& [coalesce, calls] : {std::pair{-1, 2}, std::pair{5000, 2}, std::pair{4, 0}}) {
    INFO("coalesce " << coalesce << ", coalesce_calls " << calls);
    RedisStore<TokenBucket> wrong(
        coalescing("coalesce-opts", coalesce, calls, TimeSource::kServer));
    auto d = wrong.apply(ok, "{a}b", Nanos{0}, 1);
    REQUIRE_FALSE(d.ok());
    CHECK(absl::IsInvalidArgument(d.status()));
    CHECK(d.status().message().find("coalesce") != absl::string_view::npos);
  }
}
