// Tests for quota/verify/monitor.hpp: the online monitor agrees with the offline
// verifier key by key, wraps a limiter, keeps bounded memory (ring, key cap), counts
// clamped times, and is safe under 8 threads.
#include <chrono>
#include <cstdint>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "quota/clock.hpp"
#include "quota/limiter.hpp"
#include "quota/policy/token_bucket.hpp"
#include "quota/store/local_store.hpp"
#include "quota/store/sharded_store.hpp"
#include "quota/verify/envelope.hpp"
#include "quota/verify/monitor.hpp"
#include "support/seed.hpp"

using namespace std::chrono_literals;
using quota::Nanos;
using quota::TokenBucket;
using quota::verify::AdmittedEvent;
using quota::verify::EnvelopeMonitor;
using quota::verify::TokenBucketEnvelope;
using quota::verify::TokenBucketReport;
using quota::verify::WindowEnvelope;
using quota::verify::WindowReport;

TEST_CASE("monitor equals the offline verifier key by key on random logs", "[verify][monitor]") {
  const auto seed = quota::testing::test_seed(4201);
  std::mt19937_64 rng(seed);
  INFO("seed " << seed);
  for (int trial = 0; trial < 300; ++trial) {
    const bool window = trial % 2 == 1;
    const TokenBucketEnvelope tb{.rate = {.units = static_cast<std::int64_t>(rng() % 10),
                                          .per = Nanos{static_cast<std::int64_t>(rng() % 100) + 1}},
                                 .burst = static_cast<std::int64_t>(rng() % 15),
                                 .extra = static_cast<std::int64_t>(rng() % 3)};
    const WindowEnvelope w{.limit = static_cast<std::int64_t>(rng() % 20),
                           .window = Nanos{static_cast<std::int64_t>(rng() % 100) + 1}};
    auto monitor = window ? EnvelopeMonitor::create(w) : EnvelopeMonitor::create(tb);
    REQUIRE(monitor.ok());
    std::map<std::string, std::vector<AdmittedEvent>> logs;
    std::int64_t now = 0;
    for (int i = 0; i < 60; ++i) {
      now += static_cast<std::int64_t>(rng() % 30);
      const std::string key = "k" + std::to_string(rng() % 3);
      const std::int64_t cost = static_cast<std::int64_t>(rng() % 5);
      REQUIRE((*monitor)->record(key, Nanos{now}, cost).ok());
      logs[key].push_back({now, cost});
    }
    INFO("trial " << trial << (window ? " window" : " token bucket"));
    const auto report = (*monitor)->report();
    CHECK(report.events == 60);
    CHECK(report.keys == logs.size());
    CHECK(report.complete());
    quota::MicroUnits worst = std::numeric_limits<quota::MicroUnits>::min();
    for (const auto& [key, log] : logs) {
      const auto got = (*monitor)->key_report(key);
      REQUIRE(got.ok());
      quota::MicroUnits excess = 0;
      if (window) {
        const auto want = quota::verify::verify_window(log, w.limit, w.window);
        REQUIRE(want.ok());
        const auto& r = std::get<WindowReport>(*got);
        REQUIRE(r.peak == want->peak);
        REQUIRE(r.witness.first == want->witness.first);
        REQUIRE(r.witness.last == want->witness.last);
        excess = static_cast<quota::MicroUnits>(want->excess) * quota::kMicrosPerUnit;
      } else {
        const auto want = quota::verify::verify_token_bucket(log, tb.rate, tb.burst, tb.extra);
        REQUIRE(want.ok());
        const auto& r = std::get<TokenBucketReport>(*got);
        REQUIRE(r.excess_scaled == want->excess_scaled);
        REQUIRE(r.witness.first == want->witness.first);
        REQUIRE(r.witness.last == want->witness.last);
        excess = want->excess_micro();
      }
      worst = std::max(worst, excess);
    }
    REQUIRE(report.worst_excess_micro == worst);
    REQUIRE(report.holds() == (worst <= 0));
    REQUIRE(report.worst.has_value());
  }
}

TEST_CASE("monitor wraps a limiter: a correct one holds, a too-generous one is caught",
          "[verify][monitor]") {
  quota::ManualClock clock;
  const TokenBucket quota_{.rate = {.units = 10, .per = 1s}, .burst = 5};
  auto monitor =
      EnvelopeMonitor::create(TokenBucketEnvelope{.rate = quota_.rate, .burst = quota_.burst});
  REQUIRE(monitor.ok());
  auto good =
      quota::Limiter<TokenBucket, quota::LocalStore, quota::ManualClock>::create(quota_, {}, clock);
  // Misconfigured: twice the burst of the quota it is meant to enforce.
  auto generous = quota::Limiter<TokenBucket, quota::LocalStore, quota::ManualClock>::create(
      {.rate = quota_.rate, .burst = 2 * quota_.burst}, {}, clock);
  REQUIRE(good.ok());
  REQUIRE(generous.ok());
  int allowed = 0;
  for (int i = 0; i < 200; ++i) {
    auto d = (*monitor)->acquire(*good, "tenant-good", 1);
    REQUIRE(d.ok());
    allowed += d->allowed ? 1 : 0;
    clock.advance(37ms);
  }
  auto r = (*monitor)->report();
  INFO(r.summary);
  CHECK(r.holds());
  CHECK(r.events == static_cast<std::size_t>(allowed));
  CHECK(r.summary.find("envelope holds") == 0);

  for (int i = 0; i < 12; ++i) REQUIRE((*monitor)->acquire(*generous, "tenant-bad", 1).ok());
  r = (*monitor)->report();
  INFO(r.summary);
  CHECK_FALSE(r.holds());
  CHECK(r.worst_key == "tenant-bad");
  CHECK(r.worst_excess_micro == quota::to_micro(quota_.burst));  // 10 at once vs burst 5
  CHECK(r.summary.find("ENVELOPE VIOLATED") == 0);
  const auto bad = (*monitor)->key_report("tenant-bad");
  REQUIRE(bad.ok());
  CHECK(std::get<TokenBucketReport>(*bad).witness.admitted == 2 * quota_.burst);
  CHECK_FALSE((*monitor)->key_report("nobody").ok());
}

TEST_CASE("monitor memory is bounded: ring of recent events and a key cap", "[verify][monitor]") {
  auto monitor = EnvelopeMonitor::create(WindowEnvelope{.limit = 3, .window = 10ns},
                                         {.max_keys = 2, .recent_events = 4});
  REQUIRE(monitor.ok());
  for (int i = 0; i < 10; ++i) REQUIRE((*monitor)->record("a", Nanos{i * 10}, i).ok());
  auto recent = (*monitor)->recent();
  REQUIRE(recent.size() == 4);
  for (int i = 0; i < 4; ++i) {
    CHECK(recent[static_cast<std::size_t>(i)].time_ns == (6 + i) * 10);
    CHECK(recent[static_cast<std::size_t>(i)].cost == 6 + i);
  }
  REQUIRE((*monitor)->record("b", Nanos{0}, 1).ok());
  REQUIRE((*monitor)->record("c", Nanos{0}, 100).ok());  // a third key: untracked
  const auto r = (*monitor)->report();
  CHECK(r.keys == 2);
  CHECK(r.untracked_events == 1);
  CHECK_FALSE(r.complete());
  CHECK(r.worst_key == "a");
  CHECK(r.worst_excess_micro == quota::to_micro(9 - 3));
  CHECK(r.summary.find("(incomplete)") != std::string::npos);
}

TEST_CASE("monitor clamps a time that goes backwards and counts it", "[verify][monitor]") {
  auto monitor =
      EnvelopeMonitor::create(TokenBucketEnvelope{.rate = {.units = 1, .per = 1s}, .burst = 1});
  REQUIRE(monitor.ok());
  REQUIRE((*monitor)->record(Nanos{5'000'000'000}, 1).ok());
  REQUIRE((*monitor)->record(Nanos{1'000'000'000}, 1).ok());  // counted at 5 s
  const auto r = (*monitor)->report();
  CHECK(r.clamped_times == 1);
  CHECK_FALSE(r.complete());
  CHECK_FALSE(r.holds());  // two units at one instant, burst 1
  CHECK((*monitor)->recent().back().time_ns == 5'000'000'000);
  CHECK_FALSE((*monitor)->record(Nanos{6}, -1).ok());
  CHECK(EnvelopeMonitor::create(TokenBucketEnvelope{.rate = {.units = 1, .per = 0s}, .burst = 1})
            .status()
            .code() == absl::StatusCode::kInvalidArgument);
  CHECK_FALSE(EnvelopeMonitor::create(WindowEnvelope{.limit = 1, .window = 0s}).ok());
  auto empty = EnvelopeMonitor::create(WindowEnvelope{.limit = 1, .window = 1s});
  REQUIRE(empty.ok());
  CHECK((*empty)->report().holds());
  CHECK((*empty)->report().summary == "no admissions recorded");
}

TEST_CASE("monitor shared by 8 threads around a ShardedStore limiter",
          "[verify][monitor][threads]") {
  quota::ManualClock clock;
  // No refill: exactly `burst` units can ever be admitted.
  const TokenBucket p{.rate = {.units = 0, .per = 1s}, .burst = 100};
  auto limiter =
      quota::Limiter<TokenBucket, quota::ShardedStore, quota::ManualClock>::create(p, {}, clock);
  REQUIRE(limiter.ok());
  auto monitor = EnvelopeMonitor::create(TokenBucketEnvelope{.rate = p.rate, .burst = p.burst});
  REQUIRE(monitor.ok());
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 50; ++i) (void)(*monitor)->acquire(*limiter, "hot", 1);
    });
  }
  for (auto& th : threads) th.join();
  const auto r = (*monitor)->report();
  INFO(r.summary);
  CHECK(r.events == static_cast<std::size_t>(p.burst));
  CHECK(r.holds());
  CHECK(r.worst_excess_micro == 0);  // exactly the burst: on the envelope, not over it
  CHECK(r.complete());
}
