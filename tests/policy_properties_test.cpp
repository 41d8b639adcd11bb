// Policy-independent properties, run over all four policies (TokenBucket, FixedWindow,
// SlidingLog, SlidingWindowEstimate) × both in-process stores (LocalStore,
// ShardedStore) with TEMPLATE_LIST_TEST_CASE:
//   - a new key starts fresh, keys are independent;
//   - cost < 1 → invalid_cost and cost > limit → cost_exceeds_burst (kNever), nothing
//     deducted;
//   - backwards time counts as the latest time seen: it never un-counts or re-counts;
//   - idle_at: from then on the state behaves exactly like a fresh one, and 1 ns before
//     it does not; a store sweep at idle_at forgets the key;
//   - tight retry_after: the same request passes at now + retry_after, not 1 ns earlier;
//   - remaining: a request of exactly `remaining` passes, one more unit does not;
//     reset_after: the full limit passes at now + reset_after, not 1 ns earlier;
//   - 8 threads on a ShardedStore with a frozen clock admit exactly the limit;
//   - a Limiter is built for every policy and store, and rejects invalid parameters.
// "limit" is the burst of a token bucket (rate = limit per W) and the N of a window.
#include <atomic>
#include <chrono>
#include <cstdint>
#include <random>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include <catch2/catch.hpp>

#include "quota/clock.hpp"
#include "quota/limiter.hpp"
#include "quota/policy/fixed_window.hpp"
#include "quota/policy/sliding_log.hpp"
#include "quota/policy/sliding_window_estimate.hpp"
#include "quota/policy/token_bucket.hpp"
#include "quota/store/local_store.hpp"
#include "quota/store/sharded_store.hpp"
#include "support/printers.hpp"
#include "support/seed.hpp"

using quota::Decision;
using quota::kNever;
using quota::Nanos;
using quota::Reason;

namespace {

constexpr std::int64_t kLimit = 10;
constexpr quota::Nanos kW{1'000};

template <class P>
P make_policy(std::int64_t limit, Nanos w);

// Spend the whole limit, get denied, wait retry_after on the clock, pass; and `create`
// rejects an invalid limit.
// (The store is named directly: GCC 12 rejects forwarding a constrained template
// template parameter to Limiter's.)
template <class P, bool kLocal>
void limiter_roundtrip() {
  quota::ManualClock clock(Nanos{-7});
  using L = std::conditional_t<kLocal, quota::Limiter<P, quota::LocalStore, quota::ManualClock>,
                               quota::Limiter<P, quota::ShardedStore, quota::ManualClock>>;
  auto limiter = L::create(make_policy<P>(kLimit, kW), {}, clock);
  REQUIRE(limiter.ok());
  const auto first = limiter->acquire("tenant-1:read", kLimit);
  REQUIRE(first.ok());
  CHECK(first->allowed);
  const auto second = limiter->acquire("tenant-1:read", 1);
  REQUIRE(second.ok());
  CHECK(second->reason == Reason::kOverLimit);
  clock.advance(second->retry_after);
  const auto third = limiter->acquire("tenant-1:read", 1);
  REQUIRE(third.ok());
  CHECK(third->allowed);
  CHECK_FALSE(L::create(make_policy<P>(0, kW), {}, clock).ok());
}

template <class P, template <quota::Policy> class S>
struct Case {
  using Policy = P;
  using Store = S<P>;
  static void limiter_roundtrip() {
    ::limiter_roundtrip<P, std::is_same_v<S<P>, quota::LocalStore<P>>>();
  }
};

using AllCases = std::tuple<
    Case<quota::TokenBucket, quota::LocalStore>, Case<quota::TokenBucket, quota::ShardedStore>,
    Case<quota::FixedWindow, quota::LocalStore>, Case<quota::FixedWindow, quota::ShardedStore>,
    Case<quota::SlidingLog, quota::LocalStore>, Case<quota::SlidingLog, quota::ShardedStore>,
    Case<quota::SlidingWindowEstimate, quota::LocalStore>,
    Case<quota::SlidingWindowEstimate, quota::ShardedStore>>;

using ShardedCases = std::tuple<Case<quota::TokenBucket, quota::ShardedStore>,
                                Case<quota::FixedWindow, quota::ShardedStore>,
                                Case<quota::SlidingLog, quota::ShardedStore>,
                                Case<quota::SlidingWindowEstimate, quota::ShardedStore>>;

// A policy whose whole budget is `limit` units and whose time scale is `w`.
template <class P>
P make_policy(std::int64_t limit, Nanos w) {
  if constexpr (std::is_same_v<P, quota::TokenBucket>) {
    return quota::TokenBucket{.rate = {.units = limit, .per = w}, .burst = limit};
  } else {
    return P{.limit = limit, .window = w};
  }
}

template <class Store>
Decision must(Store& store, const typename Store::policy_type& p, const std::string& key,
              std::int64_t now, std::int64_t cost) {
  const absl::StatusOr<Decision> d = store.apply(p, key, Nanos{now}, cost);
  REQUIRE(d.ok());
  return *d;
}

template <class Store>
typename Store::State snapshot(Store& store, const typename Store::policy_type& p,
                               const std::string& key, std::int64_t now) {
  auto r = store.update(p, key, Nanos{now}, [](typename Store::State& s) { return s; });
  REQUIRE(r.ok());
  return *r;
}

// Writes `state` into `key` (created if absent) so the store itself decides from it.
template <class Store>
void restore(Store& store, const typename Store::policy_type& p, const std::string& key,
             std::int64_t now, const typename Store::State& state) {
  auto r = store.update(p, key, Nanos{now}, [&](typename Store::State& s) {
    s = state;
    return 0;
  });
  REQUIRE(r.ok());
}

// Non-decreasing times, steps spread over fractions and multiples of w; costs in
// [1, limit] biased small so that the budget runs out.
struct Traffic {
  std::mt19937_64 rng;
  std::int64_t w;
  std::int64_t limit;

  std::int64_t step() {
    switch (rng() % 6) {
      case 0:
        return 0;
      case 1:
        return static_cast<std::int64_t>(rng() % 3);
      case 2:
        return w;
      case 3:
        return static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(3 * w));
      default:
        return static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(w / 4 + 1));
    }
  }
  std::int64_t cost() {
    return rng() % 4 == 0 ? std::uniform_int_distribution<std::int64_t>(1, limit)(rng)
                          : std::uniform_int_distribution<std::int64_t>(1, 3)(rng);
  }
};

}  // namespace

TEMPLATE_LIST_TEST_CASE("a new key starts fresh and keys are independent", "[properties]",
                        AllCases) {
  using P = typename TestType::Policy;
  const P p = make_policy<P>(kLimit, kW);
  REQUIRE(p.validate().ok());
  typename TestType::Store store;
  for (std::int64_t t : {std::int64_t{0}, std::int64_t{-123'456'789}, std::int64_t{987'654'321}}) {
    const std::string a = "a@" + std::to_string(t), b = "b@" + std::to_string(t);
    CHECK(must(store, p, a, t, 3) == Decision{true, kLimit - 3, Nanos{0},
                                              must(store, p, b, t, 3).reset_after, 0,
                                              Reason::kAllowed});
    CHECK(must(store, p, a, t, kLimit - 3).allowed);
    CHECK_FALSE(must(store, p, a, t, 1).allowed);
    // Spending everything on `a` left the other key alone.
    CHECK(must(store, p, b, t, kLimit - 3).allowed);
    CHECK(must(store, p, "c@" + std::to_string(t), t, kLimit).remaining == 0);
  }
}

TEMPLATE_LIST_TEST_CASE("cost < 1 is invalid_cost and cost > limit is cost_exceeds_burst",
                        "[properties]", AllCases) {
  using P = typename TestType::Policy;
  const P p = make_policy<P>(kLimit, kW);
  typename TestType::Store store;
  REQUIRE(must(store, p, "k", 0, 4).allowed);
  for (std::int64_t bad : {std::int64_t{0}, std::int64_t{-1}, std::int64_t{-1'000'000}}) {
    const Decision d = must(store, p, "k", 0, bad);
    CHECK(d.reason == Reason::kInvalidCost);
    CHECK_FALSE(d.allowed);
    CHECK(d.retry_after == kNever);
    CHECK(d.remaining == kLimit - 4);
  }
  for (std::int64_t big :
       {kLimit + 1, quota::kMaxUnits, std::numeric_limits<std::int64_t>::max()}) {
    const Decision d = must(store, p, "k", 0, big);
    CHECK(d.reason == Reason::kCostExceedsBurst);
    CHECK(quota::to_string(d.reason) == "cost_exceeds_burst");
    CHECK_FALSE(d.allowed);
    CHECK(d.retry_after == kNever);
    CHECK(d.remaining == kLimit - 4);
  }
  // Nothing was deducted by any of them.
  CHECK(must(store, p, "k", 0, kLimit - 4) ==
        Decision{true, 0, Nanos{0}, must(store, p, "twin", 0, kLimit).reset_after, 0,
                 Reason::kAllowed});
  // On a fresh key, the whole limit is never cost_exceeds_burst.
  CHECK(must(store, p, "fresh", 0, kLimit + 1).reason == Reason::kCostExceedsBurst);
  CHECK(must(store, p, "fresh", 0, kLimit).allowed);
}

TEMPLATE_LIST_TEST_CASE("backwards time counts as the latest time seen", "[properties]", AllCases) {
  using P = typename TestType::Policy;
  const P p = make_policy<P>(kLimit, kW);
  const std::uint64_t seed = quota::testing::test_seed(0xBAC0'0001);
  INFO("seed " << seed);
  typename TestType::Store with_back, clamped;
  Traffic traffic{std::mt19937_64(seed), kW.count(), kLimit};
  for (int trace = 0; trace < 50; ++trace) {
    const std::string key = "k" + std::to_string(trace);
    std::int64_t latest = -5'000 + trace * 13;
    for (int i = 0; i < 200; ++i) {
      std::int64_t now = latest + traffic.step();
      if (traffic.rng() % 4 == 0)
        now = latest - 1 - static_cast<std::int64_t>(traffic.rng() % 5'000);
      const std::int64_t cost = traffic.cost();
      if (i == 0) latest = now;
      latest = std::max(latest, now);
      INFO("trace " << trace << " step " << i << " now " << now << " latest " << latest);
      REQUIRE(must(with_back, p, key, now, cost) == must(clamped, p, key, latest, cost));
    }
  }
  // Explicitly: an exhausted key stays exhausted far in the past (no un-count) ...
  typename TestType::Store store;
  REQUIRE(must(store, p, "x", 50'000, kLimit).allowed);
  CHECK_FALSE(must(store, p, "x", 50'000 - 100 * kW.count(), 1).allowed);
  // ... and once the budget is whole again, going back does not count the old spending
  // again (no re-count).
  const Decision probe = must(store, p, "x", 50'000, 1);
  REQUIRE(probe.reset_after != kNever);
  const std::int64_t whole = 50'000 + probe.reset_after.count();
  REQUIRE(must(store, p, "x", whole, kLimit).allowed);
  REQUIRE_FALSE(must(store, p, "x", 50'000, 1).allowed);  // whole was just spent at `whole`
  typename TestType::Store other;
  REQUIRE(must(other, p, "y", 50'000, kLimit).allowed);
  const std::int64_t whole_y = 50'000 + must(other, p, "y", 50'000, 1).reset_after.count();
  CHECK(must(other, p, "y", whole_y, 0).remaining == kLimit);
  CHECK(must(other, p, "y", 50'000, kLimit).allowed);  // treated as whole_y: fresh
}

TEMPLATE_LIST_TEST_CASE("idle_at: from then on the state is a fresh one", "[properties]",
                        AllCases) {
  using P = typename TestType::Policy;
  using State = typename TestType::Store::State;
  const P p = make_policy<P>(kLimit, kW);
  const std::uint64_t seed = quota::testing::test_seed(0x1D1E'0001);
  INFO("seed " << seed);
  Traffic traffic{std::mt19937_64(seed), kW.count(), kLimit};
  for (int trace = 0; trace < 200; ++trace) {
    INFO("trace " << trace);
    typename TestType::Store store, fresh;
    std::int64_t now = static_cast<std::int64_t>(traffic.rng() % 100'000) - 50'000;
    const int steps = 1 + static_cast<int>(traffic.rng() % 30);
    for (int i = 0; i < steps; ++i) {
      now += traffic.step();
      must(store, p, "k", now, traffic.cost());
    }
    auto idle = store.update(p, "k", Nanos{now}, [&](State& s) { return p.idle_at(s); });
    REQUIRE(idle.ok());
    REQUIRE(*idle != kNever);
    const std::int64_t at = idle->count();
    if (at > now) {
      // 1 ns earlier something still counts: the whole limit does not pass.
      typename TestType::Store probe_store;
      restore(probe_store, p, "probe", now, snapshot(store, p, "k", now));
      CHECK_FALSE(must(probe_store, p, "probe", at - 1, kLimit).allowed);
      CHECK(store.sweep(p, Nanos{at - 1}) == 0);  // not idle yet: a store keeps it
    }
    CHECK(store.size() == 1);
    // The same traffic from idle_at on gives the same decisions as on a fresh key.
    Traffic suffix{std::mt19937_64(seed + static_cast<std::uint64_t>(trace)), kW.count(), kLimit};
    std::int64_t t = std::max(at, now);
    for (int i = 0; i < 40; ++i) {
      const std::int64_t cost = suffix.cost();
      REQUIRE(must(store, p, "k", t, cost) == must(fresh, p, "k", t, cost));
      t += suffix.step();
    }
    // A sweep at idle_at forgets the key.
    typename TestType::Store sweeper;
    restore(sweeper, p, "k", now, snapshot(store, p, "k", t));
    const Nanos idle2 = p.idle_at(snapshot(sweeper, p, "k", t));
    CHECK(sweeper.sweep(p, idle2 - Nanos{1}) == 0);
    CHECK(sweeper.sweep(p, idle2) == 1);
    CHECK(sweeper.size() == 0);
  }
}

TEMPLATE_LIST_TEST_CASE("tight retry_after, meaningful remaining and reset_after", "[properties]",
                        AllCases) {
  using P = typename TestType::Policy;
  const P p = make_policy<P>(kLimit, kW);
  const std::uint64_t seed = quota::testing::test_seed(0x7167'0001);
  INFO("seed " << seed);
  Traffic traffic{std::mt19937_64(seed), kW.count(), kLimit};
  typename TestType::Store store;
  std::int64_t now = 0;
  int denials = 0;
  for (int i = 0; i < 3'000; ++i) {
    now += traffic.step();
    const std::int64_t cost = traffic.cost();
    const auto before = snapshot(store, p, "k", now);
    const Decision d = must(store, p, "k", now, cost);
    const auto after = snapshot(store, p, "k", now);
    INFO("step " << i << " now " << now << " cost " << cost << " decision "
                 << Catch::StringMaker<Decision>::convert(d));
    // remaining: exactly `remaining` more passes now, one more unit does not.
    if (d.remaining >= 1) {
      restore(store, p, "probe", now, after);
      CHECK(must(store, p, "probe", now, d.remaining).allowed);
    }
    if (d.remaining < kLimit) {
      restore(store, p, "probe", now, after);
      CHECK_FALSE(must(store, p, "probe", now, d.remaining + 1).allowed);
    }
    // reset_after: the whole limit passes then, and not 1 ns earlier.
    REQUIRE(d.reset_after != kNever);
    restore(store, p, "probe", now, after);
    CHECK(must(store, p, "probe", now + d.reset_after.count(), kLimit).allowed);
    if (d.reset_after > Nanos{0}) {
      restore(store, p, "probe", now, after);
      CHECK_FALSE(must(store, p, "probe", now + d.reset_after.count() - 1, kLimit).allowed);
    }
    if (!d.allowed) {
      ++denials;
      REQUIRE(d.reason == Reason::kOverLimit);
      REQUIRE(d.retry_after > Nanos{0});
      REQUIRE(d.retry_after != kNever);
      // The denial changed nothing a retry depends on; replay it from `before`.
      restore(store, p, "probe", now, before);
      CHECK_FALSE(must(store, p, "probe", now + d.retry_after.count() - 1, cost).allowed);
      restore(store, p, "probe", now, before);
      CHECK(must(store, p, "probe", now + d.retry_after.count(), cost).allowed);
    }
  }
  CHECK(denials > 100);
}

TEMPLATE_LIST_TEST_CASE("8 threads on a ShardedStore with a frozen clock admit exactly the limit",
                        "[properties][threads]", ShardedCases) {
  using P = typename TestType::Policy;
  constexpr std::int64_t kN = 1'000;
  const P p = make_policy<P>(kN, std::chrono::seconds(1));
  typename TestType::Store store({.max_keys = 1'000, .shards = 8});
  constexpr int kThreads = 8;
  constexpr int kPerThread = 500;  // 4,000 attempts for 1,000 units
  std::atomic<std::int64_t> admitted{0};
  std::atomic<std::int64_t> errors{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i) {
    threads.emplace_back([&, i] {
      for (int j = 0; j < kPerThread; ++j) {
        // Two keys racing: each must admit exactly its own limit.
        const auto d = store.apply(p, (i + j) % 2 == 0 ? "even" : "odd", Nanos{42}, 1);
        if (!d.ok()) {
          errors.fetch_add(1);
        } else if (d->allowed) {
          admitted.fetch_add(1);
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  CHECK(errors.load() == 0);
  CHECK(admitted.load() == 2 * kN);
  CHECK(store.size() == 2);
}

TEMPLATE_LIST_TEST_CASE("a Limiter runs every policy on every in-process store", "[properties]",
                        AllCases) {
  TestType::limiter_roundtrip();
}
