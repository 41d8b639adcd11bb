// Tests for quota/lease/leased_limiter.hpp: the overshoot bound r·T + B + H·q_max on the
// union of 8 gateways' logs (checked by the envelope verifier), round trips per unit at
// saturation, expiry after a pause, an unavailable authority, idempotent grant ids
// across a lost reply, a restart with a new incarnation, and q adapting to the load.
#include <algorithm>
#include <atomic>
#include <barrier>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "quota/clock.hpp"
#include "quota/lease/leased_limiter.hpp"
#include "quota/verify/envelope.hpp"
#include "support/printers.hpp"
#include "support/seed.hpp"

using namespace std::chrono_literals;
using quota::ManualClock;
using quota::Nanos;
using quota::TokenBucket;
using quota::verify::AdmittedEvent;

namespace {

using Authority = quota::StoreAuthority<quota::ShardedStore, ManualClock>;

// An authority that really fails on demand: kUp answers, kDown fails without taking
// anything, kLoseReply takes the grant and then fails (the reply lost on the way back).
class FlakyAuthority {
 public:
  enum Mode { kUp, kDown, kLoseReply };
  explicit FlakyAuthority(Authority& inner) : inner_(inner) {}
  absl::StatusOr<quota::Decision> grant(std::string_view key, std::int64_t units,
                                        std::string_view id) {
    calls_.fetch_add(1);
    switch (mode_.load()) {
      case kDown:
        return absl::UnavailableError("authority down (test)");
      case kLoseReply: {
        auto d = inner_.grant(key, units, id);
        (void)d;
        return absl::UnavailableError("reply lost (test)");
      }
      default:
        return inner_.grant(key, units, id);
    }
  }
  void set(Mode m) { mode_.store(m); }
  int calls() const { return calls_.load(); }

 private:
  Authority& inner_;
  std::atomic<int> mode_{kUp};
  std::atomic<int> calls_{0};
};

template <class A>
std::unique_ptr<quota::LeasedLimiter<A, ManualClock>> make(A& authority, quota::LeaseOptions o,
                                                           ManualClock clock) {
  auto l = quota::LeasedLimiter<A, ManualClock>::create(authority, o, clock);
  REQUIRE(l.ok());
  return std::move(*l);
}

}  // namespace

TEST_CASE("8 gateways with skewed load stay within r*T + B + H*q_max", "[lease][concurrency]") {
  const auto seed = quota::testing::test_seed(424242);
  INFO("seed " << seed);
  // Central: 2,000 units/s, burst 200. Leases of up to 50 units, 8 holders.
  const TokenBucket central{.rate = {.units = 2000, .per = 1s}, .burst = 200};
  const std::int64_t q_max = 50;
  constexpr int kGateways = 8;
  ManualClock clock;
  Authority authority(central, clock);
  std::vector<std::unique_ptr<quota::LeasedLimiter<Authority, ManualClock>>> gateways;
  for (int g = 0; g < kGateways; ++g) {
    gateways.push_back(make(authority, {.q_min = 1, .q_max = q_max, .grant_ttl = 200ms}, clock));
  }
  // Time advances in steps of 1 ms; within a step the clock is frozen and all gateway
  // threads run concurrently, so each admission's time is exact. Gateways 0-2 carry the
  // hot load until the balancer shifts it to 3-5 every 500 steps.
  constexpr int kSteps = 3000;
  std::vector<std::vector<AdmittedEvent>> logs(kGateways);
  std::atomic<int> errors{0};
  std::barrier step_done(kGateways, [&]() noexcept { clock.advance(1ms); });
  std::vector<std::thread> threads;
  for (int g = 0; g < kGateways; ++g) {
    threads.emplace_back([&, g] {
      std::mt19937_64 rng(seed + static_cast<std::uint64_t>(g));
      for (int step = 0; step < kSteps; ++step) {
        const int hot_base = (step / 500) % 2 == 0 ? 0 : 3;
        const bool hot = g >= hot_base && g < hot_base + 3;
        const int requests = hot ? 3 : static_cast<int>(rng() % 2);
        for (int i = 0; i < requests; ++i) {
          const std::int64_t cost = 1 + static_cast<std::int64_t>(rng() % 3);
          auto d = gateways[static_cast<std::size_t>(g)]->acquire("{acme}read", cost);
          if (!d.ok()) {
            errors.fetch_add(1);
          } else if (d->allowed) {
            logs[static_cast<std::size_t>(g)].push_back({clock.now().count(), cost});
          }
        }
        step_done.arrive_and_wait();
      }
    });
  }
  for (auto& t : threads) t.join();
  REQUIRE(errors.load() == 0);
  std::vector<AdmittedEvent> all;
  for (const auto& l : logs) all.insert(all.end(), l.begin(), l.end());
  std::stable_sort(all.begin(), all.end(), [](const AdmittedEvent& a, const AdmittedEvent& b) {
    return a.time_ns < b.time_ns;
  });
  std::int64_t admitted = 0;
  for (const auto& e : all) admitted += e.cost;
  // The hot load (9 requests, ~18 units per ms) far exceeds 2 units per ms: saturated.
  REQUIRE(admitted > 5'000);
  auto report =
      quota::verify::verify_token_bucket(all, central.rate, central.burst, kGateways * q_max);
  REQUIRE(report.ok());
  // Against the plain envelope (no allowance) the leased log may go over: by how much is
  // the measured cost of leasing, printed for the record.
  auto plain = quota::verify::verify_token_bucket(all, central.rate, central.burst);
  REQUIRE(plain.ok());
  std::printf("leases, 8 gateways: %lld units admitted; vs r*T+B+H*q_max: %s; vs r*T+B: %s\n",
              static_cast<long long>(admitted), quota::verify::to_string(*report).c_str(),
              quota::verify::to_string(*plain).c_str());
  INFO(quota::verify::to_string(*report));
  CHECK(report->holds());
  // Nor can leasing admit more in total than the central bucket granted.
  std::int64_t granted = 0;
  for (const auto& g : gateways) granted += g->granted_units();
  CHECK(admitted <= granted);
  CHECK(granted <= central.burst + 2 * 3000 + 1);  // r·3 s + B
}

TEST_CASE("the worst case for leases: held grants spent on top of a refilled burst", "[lease]") {
  // 8 holders each take a grant of q and spend 1 of it; the central bucket refills to
  // full; then everyone spends everything at once. The log exceeds r*T + B by nearly
  // H*q (the bound is tight) and stays within r*T + B + H*q_max.
  const TokenBucket central{.rate = {.units = 100, .per = 1s}, .burst = 100};
  const std::int64_t q = 10;
  ManualClock clock;
  Authority authority(central, clock);
  std::vector<std::unique_ptr<quota::LeasedLimiter<Authority, ManualClock>>> holders;
  std::vector<AdmittedEvent> log;
  auto spend_all = [&](quota::LeasedLimiter<Authority, ManualClock>& h, int max) {
    for (int i = 0; i < max; ++i) {
      auto d = h.acquire("{acme}read", 1);
      REQUIRE(d.ok());
      if (!d->allowed) break;
      log.push_back({clock.now().count(), 1});
    }
  };
  for (int g = 0; g < 8; ++g) {
    holders.push_back(make(authority, {.q_min = q, .q_max = q, .grant_ttl = 10s}, clock));
    spend_all(*holders.back(), 1);
  }
  clock.advance(2s);  // the central bucket is full again; the holders still hold 9 each
  for (auto& h : holders) spend_all(*h, 1000);
  auto plain = quota::verify::verify_token_bucket(log, central.rate, central.burst);
  auto leased = quota::verify::verify_token_bucket(log, central.rate, central.burst, 8 * q);
  REQUIRE(plain.ok());
  REQUIRE(leased.ok());
  INFO(quota::verify::to_string(*plain));
  CHECK_FALSE(plain->holds());
  CHECK(plain->excess_micro() == quota::to_micro(8 * (q - 1)));
  CHECK(leased->holds());
}

TEST_CASE("at saturation each authority round trip brings q units", "[lease]") {
  const TokenBucket central{.rate = {.units = 1000, .per = 1s}, .burst = 100};
  const std::int64_t q = 50;
  ManualClock clock;
  Authority authority(central, clock);
  auto leased =
      make(authority, {.q_min = q, .q_max = q, .grant_ttl = 1s, .central = central}, clock);
  // 8 threads, frozen 1 ms steps, 20 requests per thread per step: 160 units/ms asked,
  // 1 unit/ms supplied.
  constexpr int kThreads = 8;
  std::atomic<std::int64_t> admitted{0};
  std::atomic<int> errors{0};
  std::barrier step_done(kThreads, [&]() noexcept { clock.advance(1ms); });
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      for (int step = 0; step < 2000; ++step) {
        for (int i = 0; i < 20; ++i) {
          auto d = leased->acquire("{acme}read", 1);
          if (!d.ok())
            errors.fetch_add(1);
          else if (d->allowed)
            admitted.fetch_add(1);
        }
        step_done.arrive_and_wait();
      }
    });
  }
  for (auto& t : threads) t.join();
  REQUIRE(errors.load() == 0);
  std::printf("saturation: %lld admitted, %lld authority round trips, q = %lld\n",
              static_cast<long long>(admitted.load()),
              static_cast<long long>(authority.round_trips()), static_cast<long long>(q));
  INFO("admitted " << admitted.load() << ", round trips " << authority.round_trips());
  REQUIRE(admitted.load() >= 2000);
  // round trips per admitted unit <= 1/q (one grant may still be partly held).
  CHECK(authority.round_trips() * q <= admitted.load() + q);
}

TEST_CASE("a holder woken after a pause longer than the expiry spends nothing of the old grant",
          "[lease]") {
  const TokenBucket central{.rate = {.units = 1, .per = 1s}, .burst = 100};
  ManualClock clock;
  Authority authority(central, clock);
  FlakyAuthority flaky(authority);
  auto leased = make(flaky, {.q_min = 10, .q_max = 10, .grant_ttl = 1s}, clock);
  for (int i = 0; i < 3; ++i) REQUIRE(leased->acquire("{acme}read", 1)->allowed);
  CHECK(flaky.calls() == 1);
  // The process is paused (its clock keeps counting) past the expiry ...
  clock.advance(1500ms);
  SECTION("with the authority down, the 7 units still held are not spent") {
    flaky.set(FlakyAuthority::kDown);
    auto d = leased->acquire("{acme}read", 1);
    REQUIRE_FALSE(d.ok());
    CHECK(d.status().code() == absl::StatusCode::kUnavailable);
  }
  SECTION("with the authority up, it takes a new grant: 9 left, not 6") {
    auto d = leased->acquire("{acme}read", 1);
    REQUIRE(d.ok());
    CHECK(d->allowed);
    CHECK(d->remaining == 9);
    CHECK(flaky.calls() == 2);
  }
}

TEST_CASE(
    "authority unavailable: holders spend what they hold, then answer unavailable, with backoff",
    "[lease]") {
  const TokenBucket central{.rate = {.units = 1, .per = 1s}, .burst = 100};
  ManualClock clock;
  Authority authority(central, clock);
  FlakyAuthority flaky(authority);
  auto leased = make(
      flaky, {.q_min = 10, .q_max = 10, .grant_ttl = 10s, .backoff_min = 100ms, .backoff_max = 1s},
      clock);
  REQUIRE(leased->acquire("{acme}read", 1)->allowed);
  flaky.set(FlakyAuthority::kDown);
  for (int i = 0; i < 9; ++i) REQUIRE(leased->acquire("{acme}read", 1)->allowed);
  const int calls = flaky.calls();
  auto d = leased->acquire("{acme}read", 1);
  REQUIRE_FALSE(d.ok());
  CHECK(d.status().code() == absl::StatusCode::kUnavailable);
  CHECK(flaky.calls() == calls + 1);
  // Within the backoff (at least backoff_min / 2) the authority is not asked again.
  for (int i = 0; i < 100; ++i) REQUIRE_FALSE(leased->acquire("{acme}read", 1).ok());
  CHECK(flaky.calls() == calls + 1);
  // After it, it is, and once the authority is back the holder recovers.
  flaky.set(FlakyAuthority::kUp);
  clock.advance(1s);
  auto ok = leased->acquire("{acme}read", 1);
  REQUIRE(ok.ok());
  CHECK(ok->allowed);
}

TEST_CASE("a grant whose reply was lost is replayed by its id, not charged twice", "[lease]") {
  // The central bucket holds 10 and refills 1 per hour: a second charge of 10 would fail.
  const TokenBucket central{.rate = {.units = 1, .per = 1h}, .burst = 10};
  ManualClock clock;
  Authority authority(central, clock);
  FlakyAuthority flaky(authority);
  auto leased = make(
      flaky, {.q_min = 10, .q_max = 10, .grant_ttl = 1h, .backoff_min = 1ms, .backoff_max = 1ms},
      clock);
  flaky.set(FlakyAuthority::kLoseReply);
  auto lost = leased->acquire("{acme}read", 1);
  REQUIRE_FALSE(lost.ok());
  flaky.set(FlakyAuthority::kUp);
  clock.advance(1ms);
  auto d = leased->acquire("{acme}read", 1);
  REQUIRE(d.ok());
  CHECK(d->allowed);
  CHECK(d->remaining == 9);
  CHECK(leased->granted_units() == 10);
  // And the central bucket was charged once: 0 left there, so a new id is denied.
  auto other = authority.grant("{acme}read", 1, "other-id");
  REQUIRE(other.ok());
  CHECK_FALSE(other->allowed);
}

TEST_CASE("a restart has a new incarnation and drops the old grant", "[lease]") {
  const TokenBucket central{.rate = {.units = 10, .per = 1s}, .burst = 20};
  const std::int64_t q = 10;
  ManualClock clock;
  Authority authority(central, clock);
  std::vector<AdmittedEvent> log;
  auto run = [&](quota::LeasedLimiter<Authority, ManualClock>& l, int n) {
    for (int i = 0; i < n; ++i) {
      auto d = l.acquire("{acme}read", 1);
      REQUIRE(d.ok());
      if (d->allowed) log.push_back({clock.now().count(), 1});
    }
  };
  auto first = make(authority, {.q_min = q, .q_max = q, .grant_ttl = 1h}, clock);
  CHECK_FALSE(first->held("{acme}read").has_value());
  run(*first, 2);
  const auto old_incarnation = first->incarnation();
  // The grant carries its id (naming the incarnation), the units left and the expiry.
  const auto grant = first->held("{acme}read");
  REQUIRE(grant.has_value());
  CHECK(grant->incarnation == old_incarnation);
  CHECK(grant->grant_id.rfind(absl::StrCat(absl::Hex(old_incarnation), "-"), 0) == 0);
  CHECK(grant->units == q - 2);
  CHECK(grant->expires_at == clock.now() + 1h);
  first.reset();  // the process dies holding 8 units: they are never refunded
  auto second = make(authority, {.q_min = q, .q_max = q, .grant_ttl = 1h}, clock);
  CHECK(second->incarnation() != old_incarnation);
  CHECK_FALSE(second->held("{acme}read").has_value());  // nothing carried over
  run(*second, 30);
  // The central bucket had 20: 10 went to the dead process, 10 to the new one.
  CHECK(second->granted_units() == 10);
  CHECK(log.size() == 12);
  auto report = quota::verify::verify_token_bucket(log, central.rate, central.burst, 2 * q);
  REQUIRE(report.ok());
  CHECK(report->holds());
}

TEST_CASE("q adapts to the local rate between q_min and q_max", "[lease]") {
  const TokenBucket central{.rate = {.units = 1'000'000, .per = 1s}, .burst = 1'000'000};
  ManualClock clock;
  Authority authority(central, clock);
  auto quiet = make(authority, {.q_min = 1, .q_max = 1000, .grant_ttl = 1s}, clock);
  auto busy = make(authority, {.q_min = 1, .q_max = 1000, .grant_ttl = 1s}, clock);
  for (int ms = 0; ms < 5000; ++ms) {
    if (ms % 500 == 0) REQUIRE(quiet->acquire("{quiet}read", 1)->allowed);          // 2 units/s
    for (int i = 0; i < 10; ++i) REQUIRE(busy->acquire("{busy}read", 1)->allowed);  // 10,000/s
    clock.advance(1ms);
  }
  // The quiet gateway's grants stay small (about half a second of its rate).
  INFO("quiet: " << quiet->grants() << " grants, " << quiet->granted_units() << " units");
  CHECK(quiet->granted_units() <= 2 * quiet->grants());
  // The busy one's grow to the ceiling: a few dozen grants for 50,000 units.
  INFO("busy: " << busy->grants() << " grants, " << busy->granted_units() << " units");
  CHECK(busy->grants() <= 80);
}

TEST_CASE("invalid lease options are rejected with the field named", "[lease]") {
  const TokenBucket central{.rate = {.units = 1, .per = 1s}, .burst = 10};
  Authority authority(central, ManualClock{});
  auto bad =
      quota::LeasedLimiter<Authority, ManualClock>::create(authority, {.q_min = 5, .q_max = 4});
  REQUIRE_FALSE(bad.ok());
  CHECK_THAT(std::string(bad.status().message()), Catch::Contains("q_min"));
  auto bad_ttl =
      quota::LeasedLimiter<Authority, ManualClock>::create(authority, {.grant_ttl = Nanos{0}});
  REQUIRE_FALSE(bad_ttl.ok());
  CHECK_THAT(std::string(bad_ttl.status().message()), Catch::Contains("grant_ttl"));
}

TEST_CASE("a denial with a finite wait far in the future: the holder waits, and says so",
          "[lease]") {
  // One unit per 2^62 ns: after the burst of 1, the authority's wait is about 2^62 ns,
  // and now + wait is past the int64 range.
  const Nanos per{std::int64_t{1} << 62};
  const TokenBucket central{.rate = {.units = 1, .per = per}, .burst = 1};
  ManualClock clock(per);
  Authority authority(central, clock);
  FlakyAuthority counting(authority);
  auto leased = make(counting, {.q_min = 1, .q_max = 1, .grant_ttl = 1s}, clock);
  REQUIRE(leased->acquire("{acme}read", 1)->allowed);
  auto denied = leased->acquire("{acme}read", 1);
  REQUIRE(denied.ok());
  REQUIRE_FALSE(denied->allowed);
  CHECK(denied->reason == quota::Reason::kOverLimit);
  CHECK(denied->retry_after > Nanos{0});
  CHECK(denied->retry_after < quota::kNever);
  const int calls = counting.calls();
  CHECK(calls == 2);
  // Asked again (even a little later), the holder answers from the denial it holds: a
  // finite wait no longer than the authority's, and no round trip.
  for (int i = 0; i < 10; ++i) {
    clock.advance(1h);
    auto again = leased->acquire("{acme}read", 1);
    REQUIRE(again.ok());
    CHECK_FALSE(again->allowed);
    CHECK(again->retry_after > Nanos{0});
    CHECK(again->retry_after < quota::kNever);
    CHECK(again->retry_after <= denied->retry_after);
  }
  CHECK(counting.calls() == calls);
}

TEST_CASE("a one-off budget (rate 0): once spent, the holder denies with kNever, not per request",
          "[lease]") {
  // 10 units that never refill; grants of 4: 4 + 4 + the last 2 are all spendable.
  const TokenBucket central{.rate = {.units = 0, .per = 1s}, .burst = 10};
  ManualClock clock;
  Authority authority(central, clock);
  auto with_central = GENERATE(false, true);
  INFO("central policy known to the holder: " << with_central);
  quota::LeaseOptions o{.q_min = 4, .q_max = 4, .grant_ttl = 1s};
  if (with_central) o.central = central;
  auto leased = make(authority, o, clock);
  int admitted = 0;
  for (int i = 0; i < 20; ++i) {
    auto d = leased->acquire("{acme}read", 1);
    REQUIRE(d.ok());
    if (d->allowed) ++admitted;
  }
  CHECK(admitted == 10);
  // Spent: every later request is "never", and asks the authority at most once per
  // grant_ttl (so that a rule change still reaches the holder), not once per request.
  const std::int64_t trips = authority.round_trips();
  for (int round = 0; round < 3; ++round) {
    const std::int64_t before = authority.round_trips();
    for (int i = 0; i < 50; ++i) {
      auto d = leased->acquire("{acme}read", 1);
      REQUIRE(d.ok());
      CHECK_FALSE(d->allowed);
      CHECK(d->retry_after == quota::kNever);
    }
    CHECK(authority.round_trips() - before <= 2);
    clock.advance(1s);
  }
  CHECK(authority.round_trips() - trips <= 6);
}

TEST_CASE("a one-off budget: a denial of a large grant is not 'never' for a smaller request",
          "[lease]") {
  const TokenBucket central{.rate = {.units = 0, .per = 1s}, .burst = 10};
  ManualClock clock;
  Authority authority(central, clock);
  auto leased = make(authority, {.q_min = 1, .q_max = 8, .grant_ttl = 1s}, clock);
  // 8 units taken at once, 2 left centrally.
  REQUIRE(leased->acquire("{acme}read", 8)->allowed);
  auto big = leased->acquire("{acme}read", 3);
  REQUIRE(big.ok());
  CHECK_FALSE(big->allowed);
  CHECK(big->retry_after == quota::kNever);
  // 2 units are still there: a request of 2 passes although 3 was "never".
  auto small = leased->acquire("{acme}read", 2);
  REQUIRE(small.ok());
  CHECK(small->allowed);
}
