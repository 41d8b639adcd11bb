// Tests of the Redis store's Lua twins past 2^53 (twin/range.hpp: bursts up to 10^12
// units, times to fill and windows up to 10^17 ns, ~1157 days): random traces through
// quota::TokenBucket and quota::FixedWindow with manual times and through RedisStore in
// caller-time mode must give identical decisions, in the compact reply and in the full
// one (an attempt, stored and replayed); the bounds themselves, exactly at and one past
// them, are accepted and rejected naming the bound; and a monthly token budget of a
// large tenant (1,000,000 tokens per minute, 4.32·10^10 and 10^11 tokens) is spent and
// refilled over 30 days exactly as in-process.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "quota/policy/fixed_window.hpp"
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
using quota::redis::kMaxWideCapacity;
using quota::redis::kMaxWideSpanNs;

namespace {

std::int64_t uniform(std::mt19937_64& rng, std::int64_t lo, std::int64_t hi) {
  return std::uniform_int_distribution<std::int64_t>(lo, hi)(rng);
}

std::int64_t fill_ns(const TokenBucket& p) {
  if (p.rate.units == 0) return p.rate.per.count();
  return static_cast<std::int64_t>(quota::detail::ceil_div(
      absl::int128(quota::to_micro(p.burst)) * p.rate.per.count(), quota::to_micro(p.rate.units)));
}

// Random token buckets past the narrow range: bursts up to 10^12 units, times to fill up
// to 10^17 ns, on periods that reduce to small rate terms and on coprime ones.
TokenBucket random_wide_policy(std::mt19937_64& rng) {
  static const std::int64_t periods[] = {
      1'000'000, 1'000'000'000, 60'000'000'000, 3'600'000'000'000, 86'400'000'000'000,
      7,         999'983,       413'339,        1'000'000'007};
  for (int attempt = 0; attempt < 10'000; ++attempt) {
    TokenBucket p;
    p.burst = rng() % 3 == 0 ? uniform(rng, 9'007'199'255, kMaxWideCapacity)
                             : uniform(rng, 1, 9'007'199'254);
    p.rate.per = Nanos{periods[rng() % std::size(periods)]};
    // a rate that fills the burst in 1 to ~1157 days
    const std::int64_t fill = uniform(rng, 86'400'000'000'000, kMaxWideSpanNs);
    const absl::int128 units = absl::int128(p.burst) * p.rate.per.count() / fill;
    p.rate.units = std::max<std::int64_t>(1, static_cast<std::int64_t>(units));
    if (rng() % 4 == 0) p.rate.units += static_cast<std::int64_t>(rng() % 7);
    if (rng() % 12 == 0) p.rate.units = 0;
    if (RedisStore<TokenBucket>::check(p).ok() &&
        (p.burst > 9'007'199'254 || fill_ns(p) > quota::redis::kMaxFillNs)) {
      return p;
    }
  }
  return TokenBucket{.rate = {.units = 1'000'000, .per = 60s}, .burst = 43'200'000'000};
}

std::int64_t random_cost(std::mt19937_64& rng, std::int64_t capacity) {
  switch (rng() % 8) {
    case 0:
      return static_cast<std::int64_t>(rng() % 2) - 1;
    case 1:
      return capacity + 1;
    case 2:
      return capacity;
    default:
      return uniform(rng, 1, std::max<std::int64_t>(1, capacity / 3));
  }
}

// Times: the same, backwards, a little later, around the time to fill, and gaps past
// 2^53 ns (refilled in several steps).
std::int64_t next_time(std::mt19937_64& rng, std::int64_t span, std::int64_t now) {
  switch (rng() % 7) {
    case 0:
      return now;
    case 1:
      return now - static_cast<std::int64_t>(rng() % 1'000'000'000);
    case 2:
      return now + span - 1 + static_cast<std::int64_t>(rng() % 3);
    case 3:
      return now + 9'000'000'000'000'000 + uniform(rng, 0, span);
    default:
      return now + uniform(rng, 0, span / 5 + 1);
  }
}

}  // namespace

TEST_CASE("token buckets past 2^53 micro-units and ns decide bit-identically to the C++") {
  const std::uint64_t seed = quota::testing::test_seed(20261202);
  INFO("seed " << seed);
  std::mt19937_64 rng(seed);
  RedisStore<TokenBucket> store(
      quota::RedisStoreOptions{.pool = quota::testing::redis_pool(1),
                               .prefix = quota::testing::unique_prefix("wide-tb"),
                               .time = quota::redis::TimeSource::kCaller});
  std::vector<TokenBucket> policies = {
      // both bounds at once: 10^12 units refilled in exactly 10^17 ns
      {.rate = {.units = 1, .per = 100us}, .burst = kMaxWideCapacity},
      // the largest rate term m = 9·10^9 past the narrow range
      {.rate = {.units = 9'000, .per = 1ns}, .burst = 10'000'000'000},
      // the monthly budgets
      {.rate = {.units = 1'000'000, .per = 60s}, .burst = 43'200'000'000},
      {.rate = {.units = 1'000'000, .per = 60s}, .burst = 100'000'000'000},
      // 400 days to fill a small burst
      {.rate = {.units = 1, .per = 24h}, .burst = 400},
  };
  while (policies.size() < 40) policies.push_back(random_wide_policy(rng));
  int requests = 0, allowed = 0, strings = 0;
  for (std::size_t trace = 0; trace < policies.size(); ++trace) {
    const TokenBucket& p = policies[trace];
    REQUIRE(RedisStore<TokenBucket>::check(p).ok());
    const std::string key = "{wide}" + std::to_string(trace);
    std::int64_t now = static_cast<std::int64_t>(rng() >> 8);
    TokenBucket::State state = p.init(Nanos{now});
    for (int i = 0; i < 250; ++i) {
      if (i > 0) now = std::max<std::int64_t>(0, next_time(rng, fill_ns(p), now));
      const std::int64_t cost = random_cost(rng, p.burst);
      const Decision expected = p.apply(state, Nanos{now}, cost);
      INFO("trace " << trace << " request " << i << " burst=" << p.burst
                    << " rate=" << quota::to_string(p.rate) << " now=" << now << " cost=" << cost);
      if (i % 3 == 2) {
        // the full reply, stored with the attempt and replayed from it
        const std::string id = "a" + std::to_string(trace) + "-" + std::to_string(i);
        auto got = store.apply_attempt(p, key, Nanos{now}, cost, id);
        REQUIRE(got.ok());
        REQUIRE(got->decision == expected);
        auto replay = store.apply_attempt(p, key, Nanos{now}, cost, id);
        REQUIRE(replay.ok());
        CHECK(replay->replayed);
        REQUIRE(replay->decision == expected);
        strings += expected.reset_after.count() >= quota::redis::kLuaExact;
      } else {
        auto got = store.apply(p, key, Nanos{now}, cost);
        REQUIRE(got.ok());
        REQUIRE(*got == expected);
      }
      ++requests;
      allowed += expected.allowed;
    }
  }
  std::printf("wide token buckets: %d requests, %d allowed, %d full replies past 2^53 ns\n",
              requests, allowed, strings);
  CHECK(requests >= 10'000);
  CHECK(allowed > requests / 10);
  CHECK(allowed < requests);
  CHECK(strings > 20);
}

TEST_CASE("fixed windows up to 10^8 s decide bit-identically to the C++") {
  const std::uint64_t seed = quota::testing::test_seed(20261203);
  INFO("seed " << seed);
  std::mt19937_64 rng(seed);
  RedisStore<FixedWindow> store(
      quota::RedisStoreOptions{.pool = quota::testing::redis_pool(1),
                               .prefix = quota::testing::unique_prefix("wide-fw"),
                               .time = quota::redis::TimeSource::kCaller});
  int requests = 0, allowed = 0, strings = 0;
  for (int trace = 0; trace < 24; ++trace) {
    // whole seconds from 9·10^6 s (~104 days) up to the bound 10^8 s
    const std::int64_t w =
        trace == 0 ? kMaxWideSpanNs / 1'000'000'000 : uniform(rng, 9'000'000, 100'000'000);
    const FixedWindow p{
        .limit = trace % 3 == 0 ? uniform(rng, 1, 20) : uniform(rng, 1, 1'000'000'000'000),
        .window = Nanos{w * 1'000'000'000}};
    INFO(RedisStore<FixedWindow>::check(p));
    REQUIRE(RedisStore<FixedWindow>::check(p).ok());
    const std::string key = "{wide}w" + std::to_string(trace);
    std::int64_t now = static_cast<std::int64_t>(rng() >> 8);
    FixedWindow::State state = p.init(Nanos{now});
    for (int i = 0; i < 250; ++i) {
      if (i > 0) now = std::max<std::int64_t>(0, next_time(rng, p.window.count(), now));
      const std::int64_t cost = random_cost(rng, p.limit);
      const Decision expected = p.apply(state, Nanos{now}, cost);
      INFO("trace " << trace << " request " << i << " limit=" << p.limit << " window=" << w
                    << " s now=" << now << " cost=" << cost);
      auto got = store.apply_attempt(p, key, Nanos{now}, cost);
      REQUIRE(got.ok());
      REQUIRE(got->decision == expected);
      ++requests;
      allowed += expected.allowed;
      strings += expected.reset_after.count() >= quota::redis::kLuaExact;
    }
  }
  std::printf("wide fixed windows: %d requests, %d allowed, %d resets past 2^53 ns\n", requests,
              allowed, strings);
  CHECK(allowed > requests / 10);
  CHECK(allowed < requests);
  CHECK(strings > 100);
}

TEST_CASE("the wide bounds: exactly at them accepted, one past them rejected naming them") {
  using S = RedisStore<TokenBucket>;
  // burst 10^12 units refilled in exactly 10^17 ns
  CHECK(S::check({.rate = {.units = 1, .per = 100us}, .burst = kMaxWideCapacity}).ok());
  const absl::Status burst =
      S::check({.rate = {.units = 1, .per = 100us}, .burst = kMaxWideCapacity + 1});
  CHECK(absl::IsInvalidArgument(burst));
  CHECK(burst.message().find("burst=1000000000001") != absl::string_view::npos);
  CHECK(burst.message().find("at most 1000000000000 units") != absl::string_view::npos);
  // 241,932,167,059 units at 1 per 413,339 ns: 10^17 + 1 ns to fill
  const absl::Status span =
      S::check({.rate = {.units = 1, .per = Nanos{413'339}}, .burst = 241'932'167'059});
  CHECK(absl::IsInvalidArgument(span));
  CHECK(span.message().find("takes 100000000000000001 ns") != absl::string_view::npos);
  CHECK(span.message().find("bound is 100000000000000000 ns (~1157 days)") !=
        absl::string_view::npos);
  CHECK(S::check({.rate = {.units = 1, .per = Nanos{413'339}}, .burst = 241'932'167'058}).ok());
  // past the narrow range the reduced rate terms are at most 9·10^9
  CHECK(S::check({.rate = {.units = 9'000, .per = 1ns}, .burst = 10'000'000'000}).ok());
  const absl::Status term =
      S::check({.rate = {.units = 9'001, .per = 1ns}, .burst = 10'000'000'000});
  CHECK(absl::IsInvalidArgument(term));
  CHECK(term.message().find("at most 9000000000") != absl::string_view::npos);
  // (in the narrow range the same rate is exact)
  CHECK(S::check({.rate = {.units = 9'001, .per = 1ns}, .burst = 9'000'000'000}).ok());
  // fixed windows: 10^8 s accepted, 10^8 s + 1 s rejected naming the bound
  using F = RedisStore<FixedWindow>;
  CHECK(F::check({.limit = 10, .window = Nanos{kMaxWideSpanNs}}).ok());
  const absl::Status window =
      F::check({.limit = 10, .window = Nanos{kMaxWideSpanNs + 1'000'000'000}});
  CHECK(absl::IsInvalidArgument(window));
  CHECK(window.message().find("up to 100000000 s (~1157 days)") != absl::string_view::npos);
}

TEST_CASE("a monthly token budget of a large tenant: spent, then refilled over 30 days") {
  RedisStore<TokenBucket> store(
      quota::RedisStoreOptions{.pool = quota::testing::redis_pool(1),
                               .prefix = quota::testing::unique_prefix("monthly"),
                               .time = quota::redis::TimeSource::kCaller});
  constexpr std::int64_t kDay = 86'400'000'000'000;
  for (const std::int64_t burst : {std::int64_t{43'200'000'000}, std::int64_t{100'000'000'000}}) {
    const TokenBucket p{.rate = {.units = 1'000'000, .per = 60s}, .burst = burst};
    INFO("burst " << burst);
    REQUIRE(RedisStore<TokenBucket>::check(p).ok());
    const std::string key = "{tenant}tokens" + std::to_string(burst);
    const std::int64_t t0 = 1'700'000'000'000'000'000;
    TokenBucket::State state = p.init(Nanos{t0});
    std::int64_t now = t0;
    auto both = [&](std::int64_t cost) {
      const Decision want = p.apply(state, Nanos{now}, cost);
      auto got = store.apply(p, key, Nanos{now}, cost);
      REQUIRE(got.ok());
      CHECK(*got == want);
      return want;
    };
    // the whole budget in one request, then 1 token more: the retry is one token's time
    const Decision all = both(burst);
    CHECK(all.allowed);
    CHECK(all.reset_after == Nanos{burst * 60'000});  // 60 s per 10^6 tokens
    const Decision more = both(1);
    CHECK_FALSE(more.allowed);
    CHECK(more.retry_after == Nanos{60'000});
    // refilled in steps of 1 ms to 7 days over 30 days, spending a little each time
    std::mt19937_64 rng(quota::testing::test_seed(20261204));
    while (now < t0 + 30 * kDay) {
      now += uniform(rng, 1'000'000, 7 * kDay);
      const Decision d = both(uniform(rng, 1, 1'000'000));
      CHECK(d.remaining <= burst);
    }
    // 30 days refill 4.32·10^10 tokens: the smaller budget is full again, the larger not
    now = t0 + 400 * kDay;
    const Decision full = both(burst);
    CHECK(full.allowed);
    CHECK(full.reset_after == Nanos{burst * 60'000});
    // the retry of a whole budget, from empty, is its time to fill
    const Decision retry = both(burst);
    CHECK_FALSE(retry.allowed);
    CHECK(retry.retry_after == Nanos{burst * 60'000});
  }
}
