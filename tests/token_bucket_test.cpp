// Tests for quota/policy/token_bucket.hpp: the exact semantics, decision by decision
// against an independent rational model, the DESIGN §2 exactness properties on random
// traces, and the boundary cases that rate limiters get wrong.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <limits>
#include <optional>
#include <random>
#include <vector>

#include <catch2/catch.hpp>

#include "absl/numeric/int128.h"
#include "quota/policy/token_bucket.hpp"
#include "support/exact_token_bucket.hpp"
#include "support/printers.hpp"
#include "support/seed.hpp"

using namespace std::chrono_literals;
using quota::Decision;
using quota::Nanos;
using quota::Reason;
using quota::TokenBucket;

namespace {

struct Step {
  std::int64_t now;
  std::int64_t cost;
  Decision decision;
};

// Random policies spanning tiny and huge rates, periods from 1 ns to a year.
TokenBucket random_policy(std::mt19937_64& rng) {
  static const std::int64_t periods[] = {
      1, 7, 1'000, 1'000'000, 1'000'000'000, 3'000'000'000, 60'000'000'000, 31'536'000'000'000'000};
  TokenBucket p;
  p.burst = std::uniform_int_distribution<std::int64_t>(1, 50)(rng);
  p.rate.per = Nanos{periods[rng() % std::size(periods)]};
  p.rate.units = std::uniform_int_distribution<std::int64_t>(0, 40)(rng);
  if (!p.validate().ok()) p.rate.per = 1s;  // e.g. a rate too slow for the burst
  return p;
}

// A trace of requests with non-decreasing times (steps sized to the policy's period).
std::vector<Step> run_trace(const TokenBucket& p, std::mt19937_64& rng, int n) {
  std::vector<Step> steps;
  auto state = p.init(Nanos{0});
  std::int64_t now = 0;
  const std::int64_t per = p.rate.per.count();
  for (int i = 0; i < n; ++i) {
    switch (rng() % 4) {
      case 0:
        break;  // same instant
      case 1:
        now += static_cast<std::int64_t>(rng() % 3);
        break;
      case 2:
        now += static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(per / 3 + 1));
        break;
      default:
        now += static_cast<std::int64_t>(
            rng() % static_cast<std::uint64_t>(std::min<std::int64_t>(per, 1'000'000'000'000) + 1));
        break;
    }
    const std::int64_t cost = std::uniform_int_distribution<std::int64_t>(1, p.burst)(rng);
    steps.push_back({now, cost, p.apply(state, Nanos{now}, cost)});
  }
  return steps;
}

// admitted(s..t) <= r·(t_t − t_s) + B over every pair of admitted events, exactly.
bool envelope_holds(const TokenBucket& p, const std::vector<Step>& steps) {
  const absl::int128 per = p.rate.per.count();
  for (std::size_t i = 0; i < steps.size(); ++i) {
    absl::int128 sum = 0;
    for (std::size_t j = i; j < steps.size(); ++j) {
      if (!steps[j].decision.allowed) continue;
      sum += steps[j].cost;
      // sum <= units·dt/per + B  <=>  sum·per <= units·dt + B·per
      const absl::int128 dt = steps[j].now - steps[i].now;
      if (sum * per > absl::int128(p.rate.units) * dt + absl::int128(p.burst) * per) return false;
    }
  }
  return true;
}

}  // namespace

TEST_CASE("token bucket decisions equal the exact rational model on random traces",
          "[token_bucket][property]") {
  const auto seed = quota::testing::test_seed(20261129);
  std::mt19937_64 rng(seed);
  INFO("seed " << seed);
  for (int trace = 0; trace < 1500; ++trace) {
    const TokenBucket p = random_policy(rng);
    REQUIRE(p.validate().ok());
    quota::testing::ExactTokenBucket model(p);
    std::int64_t now = static_cast<std::int64_t>(rng() % 1000) - 500;
    std::optional<TokenBucket::State> state;
    for (int i = 0; i < 200; ++i) {
      // Mostly forward, sometimes backwards (which must refill nothing).
      const auto r = rng() % 10;
      if (r < 6)
        now += static_cast<std::int64_t>(rng() %
                                         static_cast<std::uint64_t>(p.rate.per.count() / 2 + 2));
      else if (r < 8)
        now -= static_cast<std::int64_t>(rng() % 1000);
      const std::int64_t cost = std::uniform_int_distribution<std::int64_t>(-1, p.burst + 2)(rng);
      // As stores do: the key is created at its first request.
      if (!state) state = p.init(Nanos{now});
      const Decision got = p.apply(*state, Nanos{now}, cost);
      const Decision want = model.apply(now, cost);
      INFO("trace " << trace << " step " << i << " now " << now << " cost " << cost << " rate "
                    << p.rate.units << "/" << p.rate.per.count() << "ns burst " << p.burst);
      REQUIRE(got == want);
    }
  }
}

TEST_CASE("envelope: admitted cost in any interval is at most r*T + B",
          "[token_bucket][property]") {
  const auto seed = quota::testing::test_seed(7001);
  std::mt19937_64 rng(seed);
  INFO("seed " << seed);
  for (int trace = 0; trace < 1000; ++trace) {
    const TokenBucket p = random_policy(rng);
    const auto steps = run_trace(p, rng, 120);
    INFO("trace " << trace);
    REQUIRE(envelope_holds(p, steps));
  }
}

TEST_CASE("no loss: a client that always asks gets at least r*T + B - c_max",
          "[token_bucket][property]") {
  const auto seed = quota::testing::test_seed(7002);
  std::mt19937_64 rng(seed);
  INFO("seed " << seed);
  for (int trace = 0; trace < 1000; ++trace) {
    TokenBucket p = random_policy(rng);
    // The client asks on the nanosecond grid. Between two grid points the bucket gains up
    // to ceil(r·1 ns) units; if that could push it past the burst, the overflow is lost to
    // the clock's granularity, not to the policy. Keep that headroom below every cost.
    const std::int64_t per_ns = (p.rate.units + p.rate.per.count() - 1) / p.rate.per.count();
    if (p.rate.units == 0 || p.burst - per_ns < 1)
      p = {.rate = {.units = 3, .per = 7s}, .burst = 1 + p.burst};
    const std::int64_t max_cost =
        p.burst - (p.rate.units + p.rate.per.count() - 1) / p.rate.per.count();
    REQUIRE(p.validate().ok());
    REQUIRE(max_cost >= 1);
    auto state = p.init(Nanos{0});
    // T is the time of the last denial: then the bucket holds less than c_max.
    std::int64_t now = 0, admitted = 0, c_max = 0, denied_at = 0, admitted_by_denial = p.burst;
    // Ask again at once after an admission, and exactly at retry_after after a denial:
    // the bucket never sits full, so nothing is wasted.
    for (int i = 0; i < 300; ++i) {
      const std::int64_t cost = std::uniform_int_distribution<std::int64_t>(1, max_cost)(rng);
      c_max = std::max(c_max, cost);
      const Decision d = p.apply(state, Nanos{now}, cost);
      if (d.allowed) {
        admitted += cost;
        continue;
      }
      denied_at = now;
      admitted_by_denial = admitted;
      // Stop before the clock would leave int64 (slow rates wait for years).
      if (d.retry_after.count() > std::numeric_limits<std::int64_t>::max() / 4 - now) break;
      now += d.retry_after.count();
    }
    REQUIRE(denied_at > 0);  // the client was denied at least once after asking a while
    // admitted >= units·now/per + B − c_max  <=>  (admitted + c_max − B)·per >= units·now
    const absl::int128 per = p.rate.per.count();
    INFO("trace " << trace << " admitted " << admitted_by_denial << " by t=" << denied_at
                  << " rate " << p.rate.units << "/" << p.rate.per.count() << "ns burst "
                  << p.burst);
    REQUIRE((absl::int128(admitted_by_denial) + c_max - p.burst) * per >=
            absl::int128(p.rate.units) * denied_at);
  }
}

TEST_CASE("tight retry: admitted at now + retry_after, denied 1 ns earlier",
          "[token_bucket][property]") {
  const auto seed = quota::testing::test_seed(7003);
  std::mt19937_64 rng(seed);
  INFO("seed " << seed);
  int denials_checked = 0;
  for (int trace = 0; trace < 1000; ++trace) {
    TokenBucket p = random_policy(rng);
    if (p.rate.units == 0) p.rate.units = 1;
    REQUIRE(p.validate().ok());
    auto state = p.init(Nanos{0});
    std::int64_t now = 0;
    for (int i = 0; i < 100; ++i) {
      now +=
          static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(p.rate.per.count() / 4 + 1));
      const std::int64_t cost = std::uniform_int_distribution<std::int64_t>(1, p.burst)(rng);
      const Decision d = p.apply(state, Nanos{now}, cost);
      if (d.allowed) continue;
      REQUIRE(d.reason == Reason::kOverLimit);
      REQUIRE(d.retry_after > Nanos{0});
      auto early = state, on_time = state;
      INFO("trace " << trace << " now " << now << " cost " << cost << " retry "
                    << d.retry_after.count());
      CHECK_FALSE(p.apply(early, Nanos{now} + d.retry_after - Nanos{1}, cost).allowed);
      CHECK(p.apply(on_time, Nanos{now} + d.retry_after, cost).allowed);
      ++denials_checked;
    }
  }
  REQUIRE(denials_checked > 1000);
}

TEST_CASE("a new key starts full and a denial keeps the refilled state", "[token_bucket]") {
  const TokenBucket p{.rate = {.units = 10, .per = 1s}, .burst = 5};
  auto s = p.init(Nanos{100});
  Decision d = p.apply(s, Nanos{100}, 5);
  CHECK(d.allowed);
  CHECK(d.remaining == 0);
  CHECK(d.reset_after == 500ms);
  d = p.apply(s, Nanos{100} + 250ms, 3);  // 2.5 tokens present
  CHECK_FALSE(d.allowed);
  CHECK(d.reason == Reason::kOverLimit);
  CHECK(d.remaining == 2);
  CHECK(d.retry_after == 50ms);
  CHECK(p.apply(s, Nanos{100} + 300ms, 3).allowed);
}

TEST_CASE("time that goes back refills nothing and is not stored", "[token_bucket]") {
  const TokenBucket p{.rate = {.units = 1, .per = 1s}, .burst = 10};
  auto s = p.init(Nanos{0});
  s = p.init(10s);
  REQUIRE(p.apply(s, 10s, 10).allowed);
  // Back 5 s: nothing refills and the stored time stays at 10 s ...
  CHECK_FALSE(p.apply(s, 5s, 1).allowed);
  CHECK(s.last == Nanos{10s}.count());
  // ... so forward to 11 s yields exactly 1 token, not 6.
  CHECK(p.apply(s, 11s, 1).allowed);
  CHECK_FALSE(p.apply(s, 11s, 1).allowed);
}

TEST_CASE("10 years idle: no overflow, a full bucket", "[token_bucket]") {
  const TokenBucket p{.rate = {.units = 1'000'000'000, .per = 1s}, .burst = 1'000'000'000'000};
  REQUIRE(p.validate().ok());
  auto s = p.init(Nanos{0});
  REQUIRE(p.apply(s, Nanos{0}, p.burst).allowed);
  const Nanos ten_years = std::chrono::hours(24 * 3653);
  const Decision d = p.apply(s, ten_years, 1);
  CHECK(d.allowed);
  CHECK(d.remaining == p.burst - 1);
  CHECK(s.carry == 0);
}

TEST_CASE("10^9 units/s with burst 10^12 is exact", "[token_bucket]") {
  const TokenBucket p{.rate = {.units = 1'000'000'000, .per = 1s}, .burst = 1'000'000'000'000};
  auto s = p.init(Nanos{0});
  REQUIRE(p.apply(s, Nanos{0}, p.burst).allowed);
  // 1 ns refills exactly one unit.
  CHECK(p.apply(s, Nanos{1}, 1).allowed);
  CHECK_FALSE(p.apply(s, Nanos{1}, 1).allowed);
  const Decision d = p.apply(s, Nanos{1}, p.burst);
  CHECK(d.retry_after == 1000s);
  CHECK(d.reset_after == 1000s);
}

TEST_CASE("fractional rates lose nothing over 10^6 requests", "[token_bucket]") {
  SECTION("1 unit per 3 s") {
    const TokenBucket p{.rate = {.units = 1, .per = 3s}, .burst = 1};
    auto s = p.init(Nanos{0});
    std::int64_t admitted = 0;
    // Ask every second for 3·10^6 s: exactly one admission per 3 s, plus the initial one.
    for (std::int64_t t = 0; t <= 3'000'000; ++t)
      admitted += p.apply(s, std::chrono::seconds(t), 1).allowed;
    CHECK(admitted == 1'000'001);
  }
  SECTION("1 unit per 3 ns asked every 1 ns (1/3 per ns, carried remainder)") {
    const TokenBucket p{.rate = {.units = 1, .per = Nanos{3}}, .burst = 1};
    auto s = p.init(Nanos{0});
    std::int64_t admitted = 0;
    for (std::int64_t t = 0; t <= 3'000'000; ++t) admitted += p.apply(s, Nanos{t}, 1).allowed;
    CHECK(admitted == 1'000'001);
  }
  SECTION("7 units per 3 s in odd steps") {
    const TokenBucket p{.rate = {.units = 7, .per = 3s}, .burst = 7};
    auto s = p.init(Nanos{0});
    REQUIRE(p.apply(s, Nanos{0}, 7).allowed);
    std::int64_t admitted = 0;
    Nanos t{0};
    for (int i = 0; i < 1'000'000; ++i) {
      t += Nanos{333'333'337};
      admitted += p.apply(s, t, 1).allowed;
    }
    // floor(7 · t / 3 s) units were refilled by t; all but at most one were taken.
    const std::int64_t refilled =
        static_cast<std::int64_t>(absl::int128(7) * t.count() / 3'000'000'000);
    CHECK(admitted <= refilled);
    CHECK(admitted >= refilled - 1);
  }
}

TEST_CASE("one token per 2 years", "[token_bucket]") {
  const Nanos two_years = std::chrono::hours(24 * 365 * 2);
  const TokenBucket p{.rate = {.units = 1, .per = two_years}, .burst = 1};
  REQUIRE(p.validate().ok());
  auto s = p.init(Nanos{0});
  REQUIRE(p.apply(s, Nanos{0}, 1).allowed);
  const Decision d = p.apply(s, 1s, 1);
  CHECK_FALSE(d.allowed);
  CHECK(d.retry_after == two_years - 1s);
  CHECK_FALSE(p.apply(s, two_years - Nanos{1}, 1).allowed);
  CHECK(p.apply(s, two_years, 1).allowed);
}

TEST_CASE("cost above the burst is a configuration error, not a retry", "[token_bucket]") {
  const TokenBucket p{.rate = {.units = 10, .per = 1s}, .burst = 5};
  auto s = p.init(Nanos{0});
  const auto before = s;
  const Decision d = p.apply(s, Nanos{0}, 6);
  CHECK_FALSE(d.allowed);
  CHECK(d.reason == Reason::kCostExceedsBurst);
  CHECK(d.retry_after == quota::kNever);
  CHECK(d.remaining == 5);
  CHECK(s.tokens == before.tokens);
}

TEST_CASE("cost 0 and negative costs are invalid and deduct nothing", "[token_bucket]") {
  const TokenBucket p{.rate = {.units = 10, .per = 1s}, .burst = 5};
  auto s = p.init(Nanos{0});
  for (std::int64_t cost : {std::int64_t{0}, std::int64_t{-3}}) {
    const Decision d = p.apply(s, Nanos{0}, cost);
    CHECK_FALSE(d.allowed);
    CHECK(d.reason == Reason::kInvalidCost);
    CHECK(d.remaining == 5);
  }
}

TEST_CASE("rate 0 is a one-off budget whose denials say never", "[token_bucket]") {
  const TokenBucket p{.rate = {.units = 0, .per = 1s}, .burst = 3};
  REQUIRE(p.validate().ok());
  auto s = p.init(Nanos{0});
  for (int i = 0; i < 3; ++i) CHECK(p.apply(s, std::chrono::hours(i), 1).allowed);
  const Decision d = p.apply(s, std::chrono::hours(1000), 1);
  CHECK_FALSE(d.allowed);
  CHECK(d.reason == Reason::kOverLimit);
  CHECK(d.retry_after == quota::kNever);
  CHECK(d.reset_after == quota::kNever);
  CHECK(p.idle_at(s) == quota::kNever);
}

TEST_CASE("invalid parameters are rejected with the field named", "[token_bucket]") {
  auto message = [](const TokenBucket& p) { return std::string(p.validate().message()); };
  CHECK_THAT(message({.rate = {.units = 1, .per = Nanos{0}}, .burst = 1}),
             Catch::Contains("rate.per"));
  CHECK_THAT(message({.rate = {.units = -1, .per = 1s}, .burst = 1}),
             Catch::Contains("rate.units"));
  CHECK_THAT(message({.rate = {.units = 1, .per = 1s}, .burst = 0}), Catch::Contains("burst"));
  CHECK_THAT(message({.rate = {.units = 1, .per = 1s}, .burst = quota::kMaxUnits + 1}),
             Catch::Contains("burst") && Catch::Contains("9223372036854"));
  CHECK_THAT(message({.rate = {.units = quota::kMaxUnits + 1, .per = 1s}, .burst = 1}),
             Catch::Contains("rate.units"));
  // One unit per 2^62 ns with a burst of 4: refilling takes 2^64 ns, past int64.
  CHECK_THAT(message({.rate = {.units = 1, .per = Nanos{std::int64_t{1} << 62}}, .burst = 4}),
             Catch::Contains("burst/rate") && Catch::Contains("292 years"));
  CHECK(TokenBucket{.rate = {.units = 1, .per = Nanos{std::int64_t{1} << 62}}, .burst = 1}
            .validate()
            .ok());
}

TEST_CASE("idle_at is when the bucket is full again", "[token_bucket]") {
  const TokenBucket p{.rate = {.units = 2, .per = 1s}, .burst = 4};
  auto s = p.init(Nanos{0});
  CHECK(p.idle_at(s) == Nanos{0});
  REQUIRE(p.apply(s, 1s, 3).allowed);
  CHECK(p.idle_at(s) == 2500ms);
  // At idle_at the refilled state equals a fresh one.
  p.refill(s, Nanos{2500ms}.count());
  const auto fresh = p.init(2500ms);
  CHECK(s.tokens == fresh.tokens);
  CHECK(s.carry == fresh.carry);
}
