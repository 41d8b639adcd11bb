// Tests of quota/fair/fair_share.hpp with reported demands: free drawing below the share
// threshold, weighted max-min shares above it, the pause with its own verdict, a lone
// tenant reaching the whole budget, borrowed capacity reclaimed after one lease expiry,
// the invariants over random runs (printed seeds), concurrent callers, and the config
// errors. Decayed demands, cached shares and periods: fair_share_period_test.cpp.
#include <cstddef>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "quota/fair/fair_share.hpp"
#include "support/seed.hpp"

using quota::fair::FairShare;
using quota::fair::FairShareConfig;
using quota::fair::FairShareVerdict;
using quota::fair::weighted_max_min;

namespace {

FairShareConfig config(std::int64_t budget) { return *FairShareConfig{.budget = budget}.checked(); }

std::int64_t share_sum(const FairShare& fs) {
  std::int64_t sum = 0;
  for (const auto& t : fs.snapshot()) sum += t.share;
  return sum;
}

}  // namespace

TEST_CASE("FairShare: the levels of the default config", "[fair]") {
  const FairShareConfig c = config(1'000);
  CHECK(c.share_capacity() == 900);
  CHECK(c.share_level() == 700);
  CHECK(c.pause_level() == 900);
  // The reserve rounds up, so the shares never reach into it.
  CHECK(config(1'001).share_capacity() == 900);
}

TEST_CASE("FairShare: a lone tenant reaches the whole budget", "[fair]") {
  FairShare fs(config(1'000));
  for (int i = 0; i < 10; ++i) {
    auto d = fs.request("solo", 100);
    REQUIRE(d.ok());
    CHECK(d->allowed);
    CHECK(d->verdict == FairShareVerdict::kFree);
  }
  CHECK(fs.total_used() == 1'000);
  auto d = fs.request("solo", 1);
  REQUIRE(d.ok());
  CHECK_FALSE(d->allowed);
  CHECK(d->verdict == FairShareVerdict::kOverBudget);
  CHECK(d->used == 1'000);
}

TEST_CASE("FairShare: below the share threshold tenants draw freely", "[fair]") {
  FairShare fs(config(1'000));
  REQUIRE(fs.report("a", {.weight = 1, .demand = 300}).ok());
  REQUIRE(fs.report("b", {.weight = 1, .demand = 300}).ok());
  REQUIRE(fs.allocate().ok());
  // 600 wanted in all: free, even though a takes far more than half of what it will get
  // above the threshold.
  auto d = fs.request("a", 300);
  REQUIRE(d.ok());
  CHECK(d->verdict == FairShareVerdict::kFree);
  d = fs.request("b", 300);
  REQUIRE(d.ok());
  CHECK(d->verdict == FairShareVerdict::kFree);
  // 700 in use: at the threshold, still free.
  d = fs.request("b", 100);
  REQUIRE(d.ok());
  CHECK(d->verdict == FairShareVerdict::kFree);
  CHECK(d->total_used == 700);
}

TEST_CASE("FairShare: above the threshold each tenant is held to its weighted share", "[fair]") {
  FairShare fs(config(1'000));
  REQUIRE(fs.report("a", {.weight = 1, .demand = 1'000}).ok());
  REQUIRE(fs.report("b", {.weight = 2, .demand = 1'000}).ok());
  REQUIRE(fs.report("c", {.weight = 1, .demand = 50}).ok());
  REQUIRE(fs.allocate().ok());
  // 900 shared: c gets its 50, a and b split 850 as 1 : 2 → 283.33 and 566.67 → 283, 567.
  const auto snap = fs.snapshot();
  REQUIRE(snap.size() == 3);
  CHECK(snap[0].share == 283);
  CHECK(snap[1].share == 567);
  CHECK(snap[2].share == 50);
  auto d = fs.request("a", 283);
  REQUIRE(d.ok());
  CHECK(d->verdict == FairShareVerdict::kWithinShare);
  CHECK(d->share == 283);
  d = fs.request("a", 1);
  REQUIRE(d.ok());
  CHECK_FALSE(d->allowed);
  CHECK(d->verdict == FairShareVerdict::kOverShare);
  CHECK(d->used == 283);
  d = fs.request("b", 567);
  REQUIRE(d.ok());
  CHECK(d->verdict == FairShareVerdict::kWithinShare);
  d = fs.request("c", 50);
  REQUIRE(d.ok());
  CHECK(d->verdict == FairShareVerdict::kWithinShare);
  CHECK(d->total_used == 900);
  CHECK(share_sum(fs) <= fs.config().share_capacity());
}

TEST_CASE("FairShare: borrowed capacity is paused, then reclaimed after one expiry", "[fair]") {
  FairShare fs(config(1'000));
  // Alone, the borrower takes 950: above the pause level, allowed because nobody else is
  // active.
  auto d = fs.request("borrower", 950);
  REQUIRE(d.ok());
  REQUIRE(d->verdict == FairShareVerdict::kFree);
  // A newcomer arrives: the budget is past the pause threshold, a verdict of its own.
  d = fs.request("newcomer", 10);
  REQUIRE(d.ok());
  CHECK_FALSE(d->allowed);
  CHECK(d->verdict == FairShareVerdict::kPaused);
  CHECK(to_string(d->verdict) == "paused");
  // The borrower's own further requests are paused as well.
  d = fs.request("borrower", 10);
  REQUIRE(d.ok());
  CHECK(d->verdict == FairShareVerdict::kPaused);
  // One lease expiry later: the borrower's units are no longer held. Both want a lot.
  REQUIRE(fs.expire("borrower", 950).ok());
  REQUIRE(fs.report("borrower", {.weight = 1, .demand = 1'000}).ok());
  REQUIRE(fs.report("newcomer", {.weight = 1, .demand = 1'000}).ok());
  REQUIRE(fs.allocate().ok());
  // The borrower asks first and is held to its share: 450 of 900.
  d = fs.request("borrower", 600);
  REQUIRE(d.ok());
  CHECK(d->verdict == FairShareVerdict::kOverShare);
  d = fs.request("borrower", 450);
  REQUIRE(d.ok());
  CHECK(d->verdict == FairShareVerdict::kWithinShare);
  CHECK(d->share == 450);
  d = fs.request("newcomer", 450);
  REQUIRE(d.ok());
  CHECK(d->verdict == FairShareVerdict::kWithinShare);
  CHECK(d->total_used == 900);
}

TEST_CASE("FairShare: every tenant gets min(demand, its share) in every round", "[fair]") {
  // Each round stands for one lease period: every lease expires, every tenant reports a
  // demand, then the tenants ask one unit at a time in a random order until each has its
  // demand or is refused. None has borrowed, so each must end with exactly
  // min(demand, share), and the units in use never pass budget − reserve.
  std::mt19937_64 rng(quota::testing::test_seed(2203));
  for (int run = 0; run < 30; ++run) {
    const std::int64_t budget = 50 + static_cast<std::int64_t>(rng() % 400);
    FairShare fs(config(budget));
    const std::size_t n = 2 + rng() % 6;
    std::vector<std::string> names;
    std::vector<std::int64_t> weights(n);
    for (std::size_t i = 0; i < n; ++i) {
      names.push_back("t" + std::to_string(i));
      weights[i] = 1 + static_cast<std::int64_t>(rng() % 5);
    }
    std::vector<std::int64_t> used(n, 0);
    for (int round = 0; round < 5; ++round) {
      INFO("run " << run << " round " << round << " budget " << budget);
      std::vector<std::int64_t> demands(n);
      for (std::size_t i = 0; i < n; ++i) {
        REQUIRE(fs.expire(names[i], used[i]).ok());
        used[i] = 0;
        demands[i] = 1 + static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(budget / 2));
        REQUIRE(fs.report(names[i], {.weight = weights[i], .demand = demands[i]}).ok());
      }
      const auto a = fs.allocate();
      REQUIRE(a.ok());
      REQUIRE(a->share_sum <= a->capacity);
      std::int64_t wanted = 0;
      for (std::int64_t x : demands) wanted += x;
      const bool free = wanted <= fs.config().share_level();
      const auto shares = weighted_max_min(fs.config().share_capacity(), demands, weights);
      REQUIRE(shares.ok());
      std::vector<bool> done(n, false);
      std::size_t left = n;
      for (int step = 0; left > 0 && step < 100'000; ++step) {
        const std::size_t i = rng() % n;
        if (done[i]) continue;
        auto d = fs.request(names[i], 1);
        REQUIRE(d.ok());
        if (d->allowed) {
          ++used[i];
          REQUIRE(d->total_used <= fs.config().share_capacity());
          REQUIRE(d->verdict == (free ? FairShareVerdict::kFree : FairShareVerdict::kWithinShare));
        } else {
          // Over its share; when the others hold the rest up to the pause level, the
          // pause answers first.
          if (d->verdict == FairShareVerdict::kPaused) {
            REQUIRE(d->total_used + 1 > fs.config().pause_level());
          } else {
            REQUIRE(d->verdict == FairShareVerdict::kOverShare);
          }
        }
        REQUIRE(share_sum(fs) <= fs.config().share_capacity());
        if (!d->allowed || used[i] == demands[i]) {
          done[i] = true;
          --left;
        }
      }
      REQUIRE(left == 0);
      for (std::size_t i = 0; i < n; ++i) {
        INFO("tenant " << i << " demand " << demands[i] << " share " << (*shares)[i]);
        CHECK(used[i] == std::min(demands[i], (*shares)[i]));
      }
    }
  }
}

TEST_CASE("FairShare: invariants over random requests, reports and expiries", "[fair]") {
  std::mt19937_64 rng(quota::testing::test_seed(2204));
  const FairShareConfig c = config(10'000);
  FairShare fs(c);
  std::vector<std::int64_t> used(6, 0);
  for (int step = 0; step < 20'000; ++step) {
    const std::size_t i = rng() % used.size();
    const std::string name = "t" + std::to_string(i);
    switch (rng() % 9) {
      case 8: {
        const auto a = fs.allocate();
        REQUIRE(a.ok());
        REQUIRE(a->share_sum <= c.share_capacity());
        break;
      }
      case 0:
        REQUIRE(fs.report(name, {.weight = 1 + static_cast<std::int64_t>(rng() % 4),
                                 .demand = static_cast<std::int64_t>(rng() % 6'000)})
                    .ok());
        break;
      case 1: {
        const auto units = static_cast<std::int64_t>(rng() % 3'000);
        REQUIRE(fs.expire(name, units).ok());
        used[i] -= std::min(units, used[i]);
        break;
      }
      default: {
        const auto units = 1 + static_cast<std::int64_t>(rng() % 1'500);
        const std::int64_t before = fs.total_used();
        auto d = fs.request(name, units);
        REQUIRE(d.ok());
        if (d->allowed) used[i] += units;
        REQUIRE(d->used == used[i]);
        if (d->allowed && d->verdict == FairShareVerdict::kWithinShare) {
          REQUIRE(d->used <= d->share);
          REQUIRE(d->total_used <= c.pause_level());
        }
        if (d->allowed && d->verdict == FairShareVerdict::kBorrowed) {
          REQUIRE(d->used > d->share);
          REQUIRE(d->total_used <= c.pause_level());
        }
        if (d->verdict == FairShareVerdict::kPaused) REQUIRE(before + units > c.pause_level());
        REQUIRE(d->total_used <= c.budget);
      }
    }
    std::int64_t total = 0;
    for (std::int64_t u : used) total += u;
    REQUIRE(fs.total_used() == total);
    REQUIRE(share_sum(fs) <= c.share_capacity());
  }
}

TEST_CASE("FairShare: concurrent callers keep the books", "[fair]") {
  FairShare fs(config(100'000));
  std::vector<std::thread> threads;
  std::vector<std::int64_t> admitted(4, 0);
  for (std::size_t t = 0; t < admitted.size(); ++t) {
    threads.emplace_back([&fs, &admitted, t] {
      const std::string name = "t" + std::to_string(t);
      for (int k = 0; k < 2'000; ++k) {
        auto d = fs.request(name, 50);
        if (d.ok() && d->allowed) admitted[t] += 50;
        if (k % 10 == 9) {
          if (fs.expire(name, 200).ok()) admitted[t] -= std::min<std::int64_t>(200, admitted[t]);
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  std::int64_t total = 0;
  for (std::int64_t a : admitted) total += a;
  CHECK(fs.total_used() == total);
  CHECK(total <= fs.config().budget);
}

TEST_CASE("FairShare: invalid config and input name the field", "[fair]") {
  auto message = [](const FairShareConfig& c) {
    const absl::Status s = c.validate();
    REQUIRE(s.code() == absl::StatusCode::kInvalidArgument);
    return std::string(s.message());
  };
  CHECK_THAT(message({.budget = 0}), Catch::Contains("budget"));
  CHECK_THAT(message({.budget = quota::fair::kMaxBudget + 1}), Catch::Contains("budget"));
  CHECK(FairShareConfig{.budget = quota::fair::kMaxBudget}.validate().ok());
  CHECK_THAT(message({.budget = 10, .reserve_permille = 1'000}),
             Catch::Contains("reserve_permille"));
  CHECK_THAT(message({.budget = 10, .reserve_permille = -1}), Catch::Contains("reserve_permille"));
  CHECK_THAT(message({.budget = 10, .share_permille = 0}), Catch::Contains("share_permille"));
  CHECK_THAT(message({.budget = 10, .share_permille = 950}), Catch::Contains("pause_permille"));
  CHECK_THAT(message({.budget = 10, .pause_permille = 1'001}), Catch::Contains("pause_permille"));
  CHECK_THAT(message({.budget = 10, .reserve_permille = 50}),
             Catch::Contains("1000 - reserve_permille (950)"));
  CHECK(FairShareConfig{.budget = 10}.validate().ok());

  FairShare bad(FairShareConfig{.budget = 0});
  CHECK(bad.request("a", 1).status().code() == absl::StatusCode::kInvalidArgument);
  FairShare fs(config(100));
  CHECK_THAT(std::string(fs.request("a", 0).status().message()), Catch::Contains("units"));
  CHECK_THAT(std::string(fs.report("a", {.weight = 0}).message()), Catch::Contains("weight"));
  CHECK_THAT(std::string(fs.report("a", {.weight = 1, .demand = -1}).message()),
             Catch::Contains("demand"));
  CHECK_THAT(std::string(fs.expire("a", -1).message()), Catch::Contains("units"));
  // More than the budget never passes, and leaves no demand behind.
  auto d = fs.request("a", std::numeric_limits<std::int64_t>::max());
  REQUIRE(d.ok());
  CHECK(d->verdict == FairShareVerdict::kOverBudget);
  CHECK(fs.snapshot().empty());
  FairShare huge(*FairShareConfig{.budget = quota::fair::kMaxBudget}.checked());
  REQUIRE(huge.request("a", quota::fair::kMaxBudget).value().allowed);
  REQUIRE(huge.report("b", {.weight = 1, .demand = std::numeric_limits<std::int64_t>::max()}).ok());
  d = huge.request("b", quota::fair::kMaxBudget);
  REQUIRE(d.ok());
  CHECK(d->verdict == FairShareVerdict::kPaused);
}

TEST_CASE("FairShare: the example of docs/fair_share.md", "[fair]") {
  FairShare fs(*FairShareConfig{.budget = 4'000'000}.checked());
  REQUIRE(fs.report("acme", {.weight = 1, .demand = 3'000'000}).ok());
  REQUIRE(fs.report("globex", {.weight = 1, .demand = 2'000'000}).ok());
  REQUIRE(fs.allocate().ok());
  auto d = fs.request("acme", 2'000'000);
  REQUIRE(d.ok());
  CHECK(d->verdict == FairShareVerdict::kOverShare);
  CHECK(d->share == 1'800'000);
  d = fs.request("acme", 1'800'000);
  REQUIRE(d.ok());
  CHECK(d->verdict == FairShareVerdict::kWithinShare);
  REQUIRE(fs.expire("acme", 1'800'000).ok());
  CHECK(fs.total_used() == 0);
}
