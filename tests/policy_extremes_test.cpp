// Tests for the policies at the extremes of their contracts (quota/policy/*.hpp): times
// anywhere in int64 — two times more than 2^63 ns apart, backwards, equal — the largest
// and smallest parameters validate() accepts, any cost, and the bounds that keep every
// finite wait below kNever. Each decision is checked against the independent exact
// models (128-bit, by definition) and against the contract directly: a denied request
// passes at now + retry_after and not 1 ns earlier.
#include <cstdint>
#include <limits>
#include <vector>

#include <catch2/catch.hpp>

#include "absl/numeric/int128.h"
#include "quota/policy/fixed_window.hpp"
#include "quota/policy/sliding_log.hpp"
#include "quota/policy/sliding_window_estimate.hpp"
#include "quota/policy/token_bucket.hpp"
#include "support/exact_token_bucket.hpp"
#include "support/exact_windows.hpp"
#include "support/printers.hpp"

using quota::Decision;
using quota::FixedWindow;
using quota::kNever;
using quota::Nanos;
using quota::Reason;
using quota::SlidingLog;
using quota::SlidingWindowEstimate;
using quota::TokenBucket;

namespace {

constexpr std::int64_t kMin = std::numeric_limits<std::int64_t>::min();
constexpr std::int64_t kMax = std::numeric_limits<std::int64_t>::max();

// Time pairs (earlier, later) whose distance is at least 2^63 ns: later − earlier does
// not fit in int64.
const std::vector<std::pair<std::int64_t, std::int64_t>> kFarApart = {
    {kMin, kMax},
    {kMin, 0},
    {-1, kMax},
    {kMin + 1, 0},
    {-(std::int64_t{1} << 62), std::int64_t{1} << 62},
    {kMin, kMax - 12345},
    {kMin / 2 - 7, kMax / 2 + 9}};

// Token buckets spanning the accepted range: tiny and huge rates, the longest period.
std::vector<TokenBucket> token_buckets() {
  std::vector<TokenBucket> out = {
      {.rate = {.units = 1, .per = Nanos{1}}, .burst = 1},
      {.rate = {.units = quota::kMaxUnits, .per = Nanos{1}}, .burst = quota::kMaxUnits},
      {.rate = {.units = 1, .per = Nanos{1'000'000'000}}, .burst = 20},
      {.rate = {.units = 3, .per = Nanos{7}}, .burst = 1'000},
      {.rate = {.units = 1, .per = Nanos{std::int64_t{1} << 61}}, .burst = 3},
      {.rate = {.units = 1, .per = Nanos{kMax - 1}}, .burst = 1},
      {.rate = {.units = quota::kMaxUnits, .per = Nanos{kMax}}, .burst = 1},
  };
  for (const TokenBucket& p : out) REQUIRE(p.validate().ok());
  return out;
}

// Runs `p` and the exact model on the same (now, cost) trace; every decision agrees.
void same_as_model(const TokenBucket& p,
                   const std::vector<std::pair<std::int64_t, std::int64_t>>& trace) {
  quota::testing::ExactTokenBucket model(p);
  auto s = p.init(Nanos{trace.front().first});
  for (const auto& [now, cost] : trace) {
    INFO("policy " << quota::to_string(p.rate) << " burst " << p.burst << " now " << now << " cost "
                   << cost);
    const Decision want = model.apply(now, cost);
    const Decision got = p.apply(s, Nanos{now}, cost);
    CHECK(got == want);
    CHECK(s.tokens >= 0);
    CHECK(s.tokens <= quota::to_micro(p.burst));
  }
}

// The contract of a denial, checked on a copy of the state: the same request is admitted
// at t + retry_after and denied 1 ns earlier (when t + retry_after is a time in int64).
template <class P>
void denial_is_exact(const P& p, const typename P::State& s, std::int64_t t, std::int64_t cost,
                     const Decision& d) {
  REQUIRE(d.reason == Reason::kOverLimit);
  REQUIRE(d.retry_after > Nanos{0});
  const absl::int128 pass = absl::int128(t) + d.retry_after.count();
  if (pass > absl::int128(kMax)) return;
  auto later = s;
  CHECK(p.apply(later, Nanos{static_cast<std::int64_t>(pass)}, cost).allowed);
  if (d.retry_after > Nanos{1}) {
    auto before = s;
    CHECK_FALSE(p.apply(before, Nanos{static_cast<std::int64_t>(pass) - 1}, cost).allowed);
  }
}

}  // namespace

TEST_CASE("token bucket: an idle gap of 2^63 ns or more refills a positive rate to full",
          "[policy_extremes][token_bucket]") {
  for (const TokenBucket& p : token_buckets()) {
    for (const auto& [t0, t1] : kFarApart) {
      INFO(quota::to_string(p.rate) << " burst " << p.burst << ", " << t0 << " -> " << t1);
      // Spent whole at t0, half spent, and one unit spent: at t1 the bucket is full.
      for (const std::int64_t spent : {p.burst, p.burst / 2 + 1, std::int64_t{1}}) {
        auto s = p.init(Nanos{t0});
        REQUIRE(p.apply(s, Nanos{t0}, spent).allowed);
        const Decision d = p.apply(s, Nanos{t1}, p.burst);
        CHECK(d.allowed);
        CHECK(d.remaining == 0);
        CHECK(s.last == t1);
      }
      same_as_model(p, {{t0, p.burst}, {t1, 1}, {t1, p.burst}, {t0, 1}, {t1, p.burst}});
    }
  }
}

TEST_CASE("token bucket at rate 0: no gap, however long, refills anything",
          "[policy_extremes][token_bucket]") {
  for (const std::int64_t per : {std::int64_t{1}, std::int64_t{1'000'000'000}, kMax}) {
    const TokenBucket p{.rate = {.units = 0, .per = Nanos{per}}, .burst = 5};
    REQUIRE(p.validate().ok());
    for (const auto& [t0, t1] : kFarApart) {
      auto s = p.init(Nanos{t0});
      REQUIRE(p.apply(s, Nanos{t0}, 4).allowed);
      const Decision d = p.apply(s, Nanos{t1}, 2);
      CHECK_FALSE(d.allowed);
      CHECK(d.remaining == 1);
      CHECK(d.retry_after == kNever);
      CHECK(p.apply(s, Nanos{t1}, 1).allowed);
      same_as_model(p, {{t0, 4}, {t1, 2}, {t1, 1}, {t0, 1}});
    }
  }
}

TEST_CASE("token bucket: backwards and equal times refill nothing and are not stored",
          "[policy_extremes][token_bucket]") {
  for (const TokenBucket& p : token_buckets()) {
    for (const auto& [t0, t1] : kFarApart) {
      auto s = p.init(Nanos{t1});
      REQUIRE(p.apply(s, Nanos{t1}, p.burst).allowed);
      for (const std::int64_t back : {t1, t0, kMin, t1 - 1}) {
        CHECK_FALSE(p.apply(s, Nanos{back}, 1).allowed);
        CHECK(s.last == t1);
        CHECK(s.tokens == 0);
      }
      same_as_model(p, {{t1, p.burst}, {t0, 1}, {t1, 1}, {kMin, p.burst}});
    }
  }
}

// The bound chosen for the token bucket: validate() rejects a time to fill the burst of
// 2^63 − 1 ns or more, so the longest wait (a whole burst) is at most 2^63 − 2 ns and
// kNever means "never" only.
TEST_CASE(
    "token bucket: a fill time of exactly 2^63 - 1 ns is rejected; every accepted wait is "
    "finite",
    "[policy_extremes][token_bucket]") {
  // burst·per / units = 2^63 − 1 exactly (2^63 − 1 = 7 · 1317624576693539401).
  const std::vector<TokenBucket> at_bound = {
      {.rate = {.units = 1, .per = Nanos{kMax}}, .burst = 1},
      {.rate = {.units = 2, .per = Nanos{kMax}}, .burst = 2},
      {.rate = {.units = 1, .per = Nanos{kMax / 7}}, .burst = 7},
  };
  for (const TokenBucket& p : at_bound) {
    INFO(quota::to_string(p.rate) << " burst " << p.burst);
    CHECK_THAT(std::string(p.validate().message()), Catch::Contains("burst/rate"));
  }
  // One below the bound: accepted, and the longest wait is the fill time itself.
  const std::vector<std::pair<TokenBucket, std::int64_t>> below = {
      {{.rate = {.units = 1, .per = Nanos{kMax - 1}}, .burst = 1}, kMax - 1},
      {{.rate = {.units = 2, .per = Nanos{kMax - 1}}, .burst = 2}, kMax - 1},
      {{.rate = {.units = 1, .per = Nanos{kMax / 7 - 1}}, .burst = 7}, kMax - 7},
  };
  for (const auto& [p, fill] : below) {
    INFO(quota::to_string(p.rate) << " burst " << p.burst);
    REQUIRE(p.validate().ok());
    for (const std::int64_t t : {kMin, std::int64_t{0}, kMax}) {
      auto s = p.exhausted(Nanos{t});
      const Decision d = p.apply(s, Nanos{t}, p.burst);
      CHECK(d.reason == Reason::kOverLimit);
      CHECK(d.retry_after == Nanos{fill});
      CHECK(d.reset_after == Nanos{fill});
      CHECK(d.retry_after != kNever);
      denial_is_exact(p, s, t, p.burst, d);
      CHECK(p.idle_at(s) == quota::detail::saturating_add(Nanos{t}, Nanos{fill}));
    }
  }
  // Every accepted policy: a finite wait is never kNever.
  for (const TokenBucket& p : token_buckets()) {
    auto s = p.exhausted(Nanos{kMin});
    const Decision d = p.apply(s, Nanos{kMin}, p.burst);
    CHECK(d.retry_after != kNever);
    CHECK(d.reset_after != kNever);
    denial_is_exact(p, s, kMin, p.burst, d);
  }
}

TEMPLATE_TEST_CASE("window policies: the longest accepted window keeps every wait below kNever",
                   "[policy_extremes]", FixedWindow, SlidingLog, SlidingWindowEstimate) {
  const std::int64_t w = quota::kMaxWindow.count();
  for (const std::int64_t limit : {std::int64_t{1}, std::int64_t{2}, quota::kMaxUnits}) {
    const TestType p{.limit = limit, .window = quota::kMaxWindow};
    REQUIRE(p.validate().ok());
    // Aligned window starts (where a wait of two whole windows begins), their
    // neighbours, and the ends of the timeline.
    std::vector<std::int64_t> times = {kMin, kMin + 1, -1, 0, 1, kMax - 1, kMax};
    for (std::int64_t k = -2; k <= 1; ++k) {
      const absl::int128 start = absl::int128(k) * w;
      for (int d = -1; d <= 1; ++d) {
        const absl::int128 t = start + d;
        if (t >= absl::int128(kMin) && t <= absl::int128(kMax)) {
          times.push_back(static_cast<std::int64_t>(t));
        }
      }
    }
    for (const std::int64_t t : times) {
      INFO("limit " << limit << " at " << t);
      quota::testing::ExactWindowModel model(p);
      auto s = p.init(Nanos{t});
      const Decision first = p.apply(s, Nanos{t}, limit);
      CHECK(first == model.apply(t, limit));
      CHECK(first.allowed);
      CHECK(first.reset_after != kNever);
      for (const std::int64_t cost : {std::int64_t{1}, limit}) {
        const Decision d = p.apply(s, Nanos{t}, cost);
        CHECK(d == model.apply(t, cost));
        CHECK(d.retry_after != kNever);
        CHECK(d.reset_after != kNever);
        denial_is_exact(p, s, t, cost, d);
      }
    }
  }
}

TEMPLATE_TEST_CASE("window policies: times 2^63 ns or more apart, backwards and equal",
                   "[policy_extremes]", FixedWindow, SlidingLog, SlidingWindowEstimate) {
  for (const std::int64_t w :
       {std::int64_t{1}, std::int64_t{3}, std::int64_t{1'000'000'000}, quota::kMaxWindow.count()}) {
    for (const std::int64_t limit : {std::int64_t{1}, std::int64_t{3}, quota::kMaxUnits}) {
      const TestType p{.limit = limit, .window = Nanos{w}};
      REQUIRE(p.validate().ok());
      for (const auto& [t0, t1] : kFarApart) {
        INFO("window " << w << " limit " << limit << ", " << t0 << " -> " << t1);
        quota::testing::ExactWindowModel model(p);
        auto s = p.init(Nanos{t0});
        const std::vector<std::pair<std::int64_t, std::int64_t>> trace = {
            {t0, limit}, {t0, 1}, {t1, limit}, {t0, 1}, {t1, 1}, {t1 - 1, 1}, {kMin, limit}};
        for (const auto& [now, cost] : trace) {
          const Decision want = model.apply(now, cost);
          const Decision got = p.apply(s, Nanos{now}, cost);
          CHECK(got == want);
          CHECK(got.retry_after != kNever);
          CHECK(got.reset_after != kNever);
        }
        // Spent whole at t0: the whole limit is there again at t1.
        auto fresh = p.init(Nanos{t0});
        REQUIRE(p.apply(fresh, Nanos{t0}, limit).allowed);
        CHECK(p.apply(fresh, Nanos{t1}, limit).allowed);
      }
    }
  }
}
