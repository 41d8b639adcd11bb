// Tests for quota/verify/envelope.hpp: the O(n) verifiers against quadratic brute force
// on random logs, exact rational edge cases (a violation of 1/3000 of a micro-unit is
// reported), input validation, and logs produced by every in-process policy through
// LocalStore and ShardedStore: TokenBucket and SlidingLog show zero excess (TokenBucket
// exactly the burst for a greedy client), FixedWindow the 2N boundary burst, and
// SlidingWindowEstimate stays within the 2N − 1 its header documents.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <random>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "absl/numeric/int128.h"
#include "quota/clock.hpp"
#include "quota/detail/mutex.hpp"
#include "quota/policy/fixed_window.hpp"
#include "quota/policy/sliding_log.hpp"
#include "quota/policy/sliding_window_estimate.hpp"
#include "quota/policy/token_bucket.hpp"
#include "quota/store/local_store.hpp"
#include "quota/store/sharded_store.hpp"
#include "quota/verify/envelope.hpp"
#include "support/brute_envelope.hpp"
#include "support/seed.hpp"

using namespace std::chrono_literals;
using quota::Nanos;
using quota::Rate;
using quota::TokenBucket;
using quota::verify::AdmittedEvent;

namespace {

std::vector<AdmittedEvent> random_log(std::mt19937_64& rng, std::int64_t per) {
  std::vector<AdmittedEvent> log;
  const int n = static_cast<int>(rng() % 13);
  std::int64_t t = static_cast<std::int64_t>(rng() % 2000) - 1000;
  for (int i = 0; i < n; ++i) {
    switch (rng() % 4) {
      case 0:
        break;  // same instant
      case 1:
        t += static_cast<std::int64_t>(rng() % 4);
        break;
      case 2:
        t += static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(per / 2 + 2));
        break;
      default:
        t += static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(3 * per + 2));
    }
    log.push_back({t, static_cast<std::int64_t>(rng() % 11)});
  }
  return log;
}

// The independent check of a token-bucket witness: the interval it names really has
// the reported peak.
absl::int128 witness_value(const std::vector<AdmittedEvent>& log, const quota::verify::Witness& w,
                           Rate rate) {
  absl::int128 sum = 0;
  for (std::size_t k = w.first; k <= w.last; ++k) sum += log[k].cost;
  REQUIRE(sum == w.admitted);
  REQUIRE(w.first_time_ns == log[w.first].time_ns);
  REQUIRE(w.last_time_ns == log[w.last].time_ns);
  return sum * rate.per.count() - absl::int128(rate.units) * (w.last_time_ns - w.first_time_ns);
}

}  // namespace

TEST_CASE("token-bucket verifier equals brute force over all intervals on random logs",
          "[verify][property]") {
  const auto seed = quota::testing::test_seed(4001);
  std::mt19937_64 rng(seed);
  INFO("seed " << seed);
  static const std::int64_t periods[] = {1, 3, 7, 1'000, 1'000'000'000, 60'000'000'000};
  int violated = 0, held = 0;
  for (int trial = 0; trial < 12'000; ++trial) {
    const Rate rate{.units = static_cast<std::int64_t>(rng() % 30),
                    .per = Nanos{periods[rng() % std::size(periods)]}};
    const std::int64_t burst = static_cast<std::int64_t>(rng() % 25);
    const std::int64_t extra = static_cast<std::int64_t>(rng() % 4);
    const auto log = random_log(rng, rate.per.count());
    INFO("trial " << trial << " rate " << rate.units << "/" << rate.per.count() << "ns burst "
                  << burst << " extra " << extra << " events " << log.size());
    const auto r = quota::verify::verify_token_bucket(log, rate, burst, extra);
    REQUIRE(r.ok());
    const absl::int128 per = rate.per.count();
    const absl::int128 want = quota::testing::brute_token_bucket_peak_scaled(log, rate);
    REQUIRE(r->peak_scaled == want);
    REQUIRE(r->excess_scaled == want - (absl::int128(burst) + extra) * per);
    REQUIRE(r->holds() == (want <= (absl::int128(burst) + extra) * per));
    REQUIRE(r->events == log.size());
    // excess_micro is the least integer m with m·per >= excess·10^6 (rounded up).
    const absl::int128 m = r->excess_micro();
    REQUIRE(m * per >= r->excess_scaled * quota::kMicrosPerUnit);
    REQUIRE((m - 1) * per < r->excess_scaled * quota::kMicrosPerUnit);
    REQUIRE(r->slack_micro() == -r->excess_micro());
    // The smallest burst that makes the log conform.
    const absl::int128 b = r->required_burst();
    REQUIRE(want <= b * per);
    if (!log.empty()) REQUIRE(want > (b - 1) * per);
    if (log.empty()) {
      REQUIRE(r->witness.empty);
    } else {
      REQUIRE_FALSE(r->witness.empty);
      REQUIRE(witness_value(log, r->witness, rate) == want);
      // Without explicit tags the witness is labelled with event indices.
      REQUIRE(r->witness.first_tag == r->witness.first);
      REQUIRE(r->witness.last_tag == r->witness.last);
    }
    (r->holds() ? held : violated)++;
  }
  // The generator covers both verdicts in bulk.
  REQUIRE(violated > 1000);
  REQUIRE(held > 1000);
}

TEST_CASE("window verifier equals brute force over all window positions on random logs",
          "[verify][property]") {
  const auto seed = quota::testing::test_seed(4002);
  std::mt19937_64 rng(seed);
  INFO("seed " << seed);
  int violated = 0, held = 0;
  for (int trial = 0; trial < 12'000; ++trial) {
    const Nanos window{static_cast<std::int64_t>(rng() % 40) + 1};
    const std::int64_t limit = static_cast<std::int64_t>(rng() % 30);
    const auto log = random_log(rng, window.count());
    INFO("trial " << trial << " limit " << limit << " window " << window.count() << "ns events "
                  << log.size());
    const auto r = quota::verify::verify_window(log, limit, window);
    REQUIRE(r.ok());
    const absl::int128 want = quota::testing::brute_window_peak(log, window);
    REQUIRE(r->peak == want);
    REQUIRE(r->excess == want - limit);
    REQUIRE(r->holds() == (want <= limit));
    if (!log.empty()) {
      const auto& w = r->witness;
      REQUIRE_FALSE(w.empty);
      absl::int128 sum = 0;
      for (std::size_t k = w.first; k <= w.last; ++k) sum += log[k].cost;
      REQUIRE(sum == want);
      REQUIRE(w.admitted == want);
      // All the witness's events count together at now = t_last.
      REQUIRE(w.last_time_ns - w.first_time_ns < window.count());
    }
    (r->holds() ? held : violated)++;
  }
  REQUIRE(violated > 1000);
  REQUIRE(held > 1000);
}

TEST_CASE("token-bucket verifier: closed intervals and exact fractions", "[verify]") {
  const Rate one_per_3s{.units = 1, .per = 3s};
  SECTION("the example of the header") {
    const std::vector<AdmittedEvent> log = {{0, 20}, {10'000'000, 1}};
    const auto r = quota::verify::verify_token_bucket(log, {.units = 100, .per = 1s}, 20);
    REQUIRE(r.ok());
    CHECK(r->holds());
    CHECK(r->slack_micro() == 0);  // 21 units in 10 ms = 100/s · 10 ms + 20 exactly
    const auto w = quota::verify::verify_window(log, 20, 1s);
    REQUIRE(w.ok());
    CHECK_FALSE(w->holds());
    CHECK(w->peak == 21);
  }
  SECTION("a violation of 1/3000 micro-unit is reported, rounded up to 1 micro-unit") {
    // Two units 1 ns less than one refill apart: 2 > 1 + (3s - 1ns)/3s.
    const std::vector<AdmittedEvent> log = {{0, 1}, {3'000'000'000 - 1, 1}};
    const auto r = quota::verify::verify_token_bucket(log, one_per_3s, 1);
    REQUIRE(r.ok());
    CHECK_FALSE(r->holds());
    CHECK(r->excess_scaled == 1);  // 1/3e9 units
    CHECK(r->excess_micro() == 1);
    CHECK(r->slack_micro() == -1);
    CHECK(r->required_burst() == 2);
    CHECK(r->witness.first == 0);
    CHECK(r->witness.last == 1);
    CHECK(r->witness.admitted == 2);
  }
  SECTION("exactly one refill apart holds with zero slack") {
    const std::vector<AdmittedEvent> log = {{0, 1}, {3'000'000'000, 1}};
    const auto r = quota::verify::verify_token_bucket(log, one_per_3s, 1);
    REQUIRE(r.ok());
    CHECK(r->holds());
    CHECK(r->excess_scaled == 0);
    CHECK(r->slack_micro() == 0);
    CHECK(r->required_burst() == 1);
  }
  SECTION("events at one instant all count together") {
    const std::vector<AdmittedEvent> log = {{5, 1}, {10, 1}, {10, 1}, {10, 1}};
    const auto r = quota::verify::verify_token_bucket(log, {.units = 1, .per = 1s}, 3);
    REQUIRE(r.ok());
    CHECK_FALSE(r->holds());
    CHECK(r->witness.first == 0);
    CHECK(r->witness.last == 3);
    CHECK(r->witness.admitted == 4);
  }
  SECTION("the extra allowance and the slack") {
    // 100/s, burst 20: 30 units at one instant exceed by 10.
    const std::vector<AdmittedEvent> log = {{7, 30}};
    const Rate r100{.units = 100, .per = 1s};
    auto r = quota::verify::verify_token_bucket(log, r100, 20, 0);
    REQUIRE(r.ok());
    CHECK(r->excess_micro() == 10'000'000);
    r = quota::verify::verify_token_bucket(log, r100, 20, 10);
    REQUIRE(r.ok());
    CHECK(r->holds());
    CHECK(r->slack_micro() == 0);
    r = quota::verify::verify_token_bucket(log, r100, 20, 12);
    REQUIRE(r.ok());
    CHECK(r->slack_micro() == 2'000'000);
    CHECK(quota::verify::to_string(*r).find("holds") == 0);
  }
  SECTION("an empty log holds with the whole burst as slack") {
    const auto r = quota::verify::verify_token_bucket({}, {.units = 5, .per = 1s}, 4, 1);
    REQUIRE(r.ok());
    CHECK(r->holds());
    CHECK(r->witness.empty);
    CHECK(r->slack_micro() == 5'000'000);
  }
  SECTION("a huge log saturates instead of overflowing, and stays a violation") {
    const Rate slow{.units = 0, .per = Nanos::max()};
    quota::verify::TokenBucketVerifier v(slow, 1);
    for (int i = 0; i < 20'000; ++i) REQUIRE(v.add({0, quota::kMaxUnits}).ok());
    const auto r = v.report();
    CHECK(r.saturated);
    CHECK_FALSE(r.holds());
    CHECK(r.peak_scaled == quota::verify::kScaledCap);
    CHECK(r.excess_micro() == std::numeric_limits<std::int64_t>::max());
  }
}

TEST_CASE("window verifier: half-open windows", "[verify]") {
  // An event at e counts for now in [e, e + W): events exactly W apart never meet.
  const std::vector<AdmittedEvent> apart = {{0, 10}, {1000, 10}};
  auto r = quota::verify::verify_window(apart, 10, Nanos{1000});
  REQUIRE(r.ok());
  CHECK(r->holds());
  CHECK(r->peak == 10);
  const std::vector<AdmittedEvent> close = {{0, 10}, {999, 10}};
  r = quota::verify::verify_window(close, 10, Nanos{1000});
  REQUIRE(r.ok());
  CHECK_FALSE(r->holds());
  CHECK(r->excess == 10);
  CHECK(r->witness.first == 0);
  CHECK(r->witness.last == 1);
  CHECK(quota::verify::to_string(*r).find("VIOLATED") == 0);
  // Times across the whole int64 range do not overflow.
  const std::vector<AdmittedEvent> wide = {{std::numeric_limits<std::int64_t>::min(), 1},
                                           {std::numeric_limits<std::int64_t>::max(), 1}};
  r = quota::verify::verify_window(wide, 1, Nanos::max());
  REQUIRE(r.ok());
  CHECK(r->peak == 1);
}

TEST_CASE("verifiers reject invalid logs and parameters, naming the event", "[verify]") {
  const Rate rate{.units = 1, .per = 1s};
  const std::vector<AdmittedEvent> backwards = {{10, 1}, {20, 1}, {19, 1}};
  auto tb = quota::verify::verify_token_bucket(backwards, rate, 5);
  REQUIRE_FALSE(tb.ok());
  CHECK(tb.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(tb.status().message().find("event 2") != absl::string_view::npos);
  auto w = quota::verify::verify_window(backwards, 5, 1s);
  REQUIRE_FALSE(w.ok());
  CHECK(w.status().message().find("event 2") != absl::string_view::npos);

  const std::vector<AdmittedEvent> negative = {{0, -1}};
  CHECK_FALSE(quota::verify::verify_token_bucket(negative, rate, 5).ok());
  CHECK_FALSE(quota::verify::verify_window(negative, 5, 1s).ok());
  const std::vector<AdmittedEvent> huge = {{0, quota::kMaxUnits + 1}};
  CHECK_FALSE(quota::verify::verify_token_bucket(huge, rate, 5).ok());

  const std::vector<AdmittedEvent> ok = {{0, 1}};
  auto bad = quota::verify::verify_token_bucket(ok, rate, -1);
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.status().message().find("burst") != absl::string_view::npos);
  bad = quota::verify::verify_token_bucket(ok, rate, 1, -2);
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.status().message().find("extra") != absl::string_view::npos);
  bad = quota::verify::verify_token_bucket(ok, {.units = 1, .per = Nanos{0}}, 1);
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.status().message().find("rate.per") != absl::string_view::npos);
  auto badw = quota::verify::verify_window(ok, 1, Nanos{0});
  REQUIRE_FALSE(badw.ok());
  CHECK(badw.status().message().find("window") != absl::string_view::npos);
  badw = quota::verify::verify_window(ok, -1, 1s);
  REQUIRE_FALSE(badw.ok());
  CHECK(badw.status().message().find("limit") != absl::string_view::npos);

  // A streaming verifier keeps its state after a rejected event.
  quota::verify::TokenBucketVerifier v(rate, 5);
  REQUIRE(v.add({10, 1}).ok());
  REQUIRE_FALSE(v.add({9, 1}).ok());
  REQUIRE(v.add({10, 1}).ok());
  CHECK(v.report().events == 2);
  CHECK(v.report().witness.admitted == 2);
}

namespace {

// Random traffic against `store`, logging what it admitted at the time it decided.
template <class Store>
std::vector<AdmittedEvent> drive_store(Store& store, const TokenBucket& p, std::mt19937_64& rng,
                                       int requests, std::int64_t max_cost) {
  std::vector<AdmittedEvent> log;
  std::int64_t now = 0;
  const std::int64_t per = p.rate.per.count();
  for (int i = 0; i < requests; ++i) {
    if (rng() % 3 == 0)
      now += static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(per / 4 + 1));
    const std::int64_t cost = std::uniform_int_distribution<std::int64_t>(1, max_cost)(rng);
    const auto d = store.apply(p, "tenant:read", Nanos{now}, cost);
    REQUIRE(d.ok());
    if (d->allowed) log.push_back({now, cost});
  }
  return log;
}

}  // namespace

TEMPLATE_TEST_CASE("logs of quota::TokenBucket through a store show zero excess",
                   "[verify][token_bucket]", quota::LocalStore<TokenBucket>,
                   quota::ShardedStore<TokenBucket>) {
  const auto seed = quota::testing::test_seed(4003);
  std::mt19937_64 rng(seed);
  INFO("seed " << seed);
  for (int trial = 0; trial < 300; ++trial) {
    const TokenBucket p{.rate = {.units = static_cast<std::int64_t>(rng() % 50) + 1,
                                 .per = Nanos{static_cast<std::int64_t>(rng() % 5'000'000) + 1}},
                        .burst = static_cast<std::int64_t>(rng() % 30) + 1};
    REQUIRE(p.validate().ok());
    TestType store;
    const auto log = drive_store(store, p, rng, 400, p.burst);
    const auto r = quota::verify::verify_token_bucket(log, p.rate, p.burst);
    REQUIRE(r.ok());
    INFO("trial " << trial << " " << quota::verify::to_string(*r));
    REQUIRE(r->holds());
    // A client that starts by asking for more than the burst in unit requests gets the
    // whole burst at its first instant: the envelope is tight, not merely respected.
    TestType greedy;
    std::vector<AdmittedEvent> g;
    for (std::int64_t i = 0; i < p.burst + 3; ++i) {
      const auto d = greedy.apply(p, "k", Nanos{100}, 1);
      REQUIRE(d.ok());
      if (d->allowed) g.push_back({100, 1});
    }
    const auto rg = quota::verify::verify_token_bucket(g, p.rate, p.burst);
    REQUIRE(rg.ok());
    REQUIRE(rg->holds());
    REQUIRE(rg->required_burst() == p.burst);
  }
}

TEST_CASE("a ShardedStore shared by 4 threads stays inside the envelope", "[verify][threads]") {
  const TokenBucket p{.rate = {.units = 1000, .per = 1s}, .burst = 50};
  quota::ShardedStore<TokenBucket> store;
  quota::SteadyClock clock;
  quota::detail::Mutex mu;
  std::vector<AdmittedEvent> log;
  std::int64_t last = std::numeric_limits<std::int64_t>::min();
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 3000; ++i) {
        const Nanos now = clock.now();
        // Inside the shard lock: log the time the bucket really decided at (a thread
        // that read the clock earlier but got the lock later decides at the stored time).
        auto d = store.update(p, "hot", now, [&](TokenBucket::State& s) {
          const auto decision = p.apply(s, now, 1);
          quota::detail::MutexLock lock(mu);
          last = std::max(last, now.count());
          if (decision.allowed) log.push_back({last, 1});
          return decision;
        });
        if (!d.ok()) return;
      }
    });
  }
  for (auto& th : threads) th.join();
  const auto r = quota::verify::verify_token_bucket(log, p.rate, p.burst);
  REQUIRE(r.ok());
  INFO(quota::verify::to_string(*r));
  CHECK(r->holds());
  CHECK(r->events >= static_cast<std::size_t>(p.burst));
}

// ---- Logs of the window policies (quota/policy/*.hpp), through both in-process stores.

namespace {

// Random unit-cost traffic at random times; returns what the store admitted.
template <class Store, class Policy>
std::vector<AdmittedEvent> drive_window(Store& store, const Policy& p, std::mt19937_64& rng,
                                        int requests, std::int64_t max_cost) {
  std::vector<AdmittedEvent> log;
  std::int64_t now = static_cast<std::int64_t>(rng() % 1000);
  const std::int64_t w = p.window.count();
  for (int i = 0; i < requests; ++i) {
    switch (rng() % 3) {
      case 0:
        break;
      case 1:
        now += static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(w / 8 + 1));
        break;
      default:
        now += static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(w + 1));
    }
    const std::int64_t cost = std::uniform_int_distribution<std::int64_t>(1, max_cost)(rng);
    const auto d = store.apply(p, "tenant:read", Nanos{now}, cost);
    REQUIRE(d.ok());
    if (d->allowed) log.push_back({now, cost});
  }
  return log;
}

}  // namespace

TEMPLATE_TEST_CASE("logs of SlidingLog through a store show zero excess", "[verify][window]",
                   quota::LocalStore<quota::SlidingLog>, quota::ShardedStore<quota::SlidingLog>) {
  const auto seed = quota::testing::test_seed(4004);
  std::mt19937_64 rng(seed);
  INFO("seed " << seed);
  std::size_t admitted = 0;
  for (int trial = 0; trial < 300; ++trial) {
    const quota::SlidingLog p{.limit = static_cast<std::int64_t>(rng() % 20) + 1,
                              .window = Nanos{static_cast<std::int64_t>(rng() % 10'000) + 1}};
    REQUIRE(p.validate().ok());
    TestType store;
    const auto log = drive_window(store, p, rng, 300, p.limit);
    const auto r = quota::verify::verify_window(log, p.limit, p.window);
    REQUIRE(r.ok());
    INFO("trial " << trial << " " << quota::verify::to_string(*r));
    REQUIRE(r->holds());
    admitted += log.size();
  }
  REQUIRE(admitted > 10'000);
}

TEMPLATE_TEST_CASE("logs of FixedWindow: the 2N boundary burst, and never more", "[verify][window]",
                   quota::LocalStore<quota::FixedWindow>, quota::ShardedStore<quota::FixedWindow>) {
  SECTION("traffic built for it: N at the end of a window, N at the start of the next") {
    const quota::FixedWindow p{.limit = 100, .window = 1s};
    TestType store;
    std::vector<AdmittedEvent> log;
    for (const std::int64_t t : {999'999'999LL, 1'000'000'000LL}) {
      for (int i = 0; i < 150; ++i) {
        const auto d = store.apply(p, "tenant:read", Nanos{t}, 1);
        REQUIRE(d.ok());
        if (d->allowed) log.push_back({t, 1});
      }
    }
    const auto r = quota::verify::verify_window(log, p.limit, p.window);
    REQUIRE(r.ok());
    INFO(quota::verify::to_string(*r));
    CHECK_FALSE(r->holds());
    CHECK(r->peak == 2 * p.limit);
    CHECK(r->excess == p.limit);
    CHECK(r->witness.first_time_ns == 999'999'999);
    CHECK(r->witness.last_time_ns == 1'000'000'000);
    // Inside one aligned window it kept its promise: N.
    std::vector<AdmittedEvent> first(log.begin(), log.begin() + 100);
    CHECK(quota::verify::verify_window(first, p.limit, p.window)->holds());
  }
  SECTION("random traffic never exceeds 2N in a sliding window") {
    const auto seed = quota::testing::test_seed(4005);
    std::mt19937_64 rng(seed);
    INFO("seed " << seed);
    int over_n = 0;
    for (int trial = 0; trial < 300; ++trial) {
      const quota::FixedWindow p{.limit = static_cast<std::int64_t>(rng() % 20) + 1,
                                 .window = Nanos{static_cast<std::int64_t>(rng() % 10'000) + 1}};
      REQUIRE(p.validate().ok());
      TestType store;
      const auto log = drive_window(store, p, rng, 300, p.limit);
      const auto r = quota::verify::verify_window(log, 2 * p.limit, p.window);
      REQUIRE(r.ok());
      INFO("trial " << trial << " " << quota::verify::to_string(*r));
      REQUIRE(r->holds());
      if (r->peak > p.limit) ++over_n;
    }
    // Random traffic does cross boundaries with more than N: the overshoot is real.
    CHECK(over_n > 0);
  }
}

TEMPLATE_TEST_CASE("logs of SlidingWindowEstimate stay within its documented 2N - 1",
                   "[verify][window]", quota::LocalStore<quota::SlidingWindowEstimate>,
                   quota::ShardedStore<quota::SlidingWindowEstimate>) {
  // The header documents a worst case of 2N − 1 units in one true sliding window for
  // unit costs when W >= N (reached by sliding_window_estimate_test's adversary).
  const auto seed = quota::testing::test_seed(4006);
  std::mt19937_64 rng(seed);
  INFO("seed " << seed);
  absl::int128 worst_excess = 0;
  for (int trial = 0; trial < 300; ++trial) {
    const std::int64_t n = static_cast<std::int64_t>(rng() % 20) + 1;
    const quota::SlidingWindowEstimate p{
        .limit = n, .window = Nanos{n + static_cast<std::int64_t>(rng() % 10'000)}};
    REQUIRE(p.validate().ok());
    TestType store;
    const auto log = drive_window(store, p, rng, 300, 1);
    const auto r = quota::verify::verify_window(log, p.limit, p.window);
    REQUIRE(r.ok());
    INFO("trial " << trial << " " << quota::verify::to_string(*r));
    REQUIRE(r->peak <= 2 * n - 1);
    worst_excess = std::max(worst_excess, r->excess);
  }
  std::printf("SlidingWindowEstimate on random unit traffic: worst excess %lld units over N\n",
              static_cast<long long>(worst_excess));
}
