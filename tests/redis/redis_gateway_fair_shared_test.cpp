// Fair shares computed over every holder of a leased global budget through Redis
// (redis::RedisFairAsksExchange in the Gateway's FairLimits; a real redis-server): three
// holders on their own threads, each with its own store, connections, incarnation and
// exchange, in step per allocation period (a barrier, so that every report of a period
// lands before the period is sealed). Checked: a tenant at ONE holder alone reaches the
// whole budget (not budget / 3); with demand spread unevenly over the holders, every
// active tenant gets at least its fair share of budget − reserve per period over all
// holders; Σ over holders of the shares ≤ budget − reserve at every allocation; the global
// envelope r·T + B + Σ outstanding grants (the verifier); the seal (the same view for
// every reader, a late report dropped and said so); with Redis unreachable, the fallback
// to the fixed part ⌊budget / holders⌋ (never more).
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <barrier>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "quota/fair/weighted_max_min.hpp"
#include "quota/gateway/fair_share/fair_metrics.hpp"
#include "quota/gateway/gateway.hpp"
#include "quota/redis/fair_asks_exchange.hpp"
#include "quota/redis/gateway_store.hpp"
#include "support/fair_holders.hpp"
#include "support/gateway_fixtures.hpp"

using namespace std::chrono_literals;
using quota::Nanos;
using quota::Reason;
using quota::TokenBucket;
using quota::gateway::FairShareSpec;
using quota::gateway::LeaseMetrics;
using quota::gateway::Level;
using quota::redis::GatewayStore;
using quota::redis::RedisFairAsksExchange;
using quota::redis::RedisGrantLedger;
using quota::testing::fair_call;

namespace {

constexpr int kHolders = 3;
constexpr std::int64_t kBudget = 3'000;
constexpr std::int64_t kCapacity = kBudget - kBudget / 10;  // reserve 10 %
constexpr Nanos kPeriod = 100ms;
// A unit a minute: next to nothing over the tests' 1.4 s, and the store's refill bound holds.
constexpr quota::Rate kTrickle{.units = 1, .per = std::chrono::minutes(1)};

// Fair shares of kBudget units per 100 ms, weighted by `weights`, on a leased global
// budget (support/fair_holders.hpp).
quota::gateway::RuleSetSpec spec(TokenBucket global, quota::fair::TenantWeights weights = {}) {
  return quota::testing::fair_holders_spec(
      global,
      FairShareSpec{
          .enabled = true, .period = kPeriod, .budget = kBudget, .weights = std::move(weights)});
}

// kHolders processes with a fair asks exchange each (over `exchange_pool`, the store's
// own pool when null).
std::vector<std::unique_ptr<quota::testing::FairHolder>> processes(
    const std::string& test, const quota::gateway::RuleSetSpec& s,
    std::shared_ptr<quota::redis::ConnectionPool> exchange_pool = nullptr) {
  return quota::testing::fair_holders(test, s, kHolders, 0x300,
                                      {.enabled = true, .pool = std::move(exchange_pool)});
}

// A loopback port bound but not listening while it lives: connections are refused.
struct RefusingPort {
  RefusingPort() {
    fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t n = sizeof a;
    if (fd >= 0 && ::bind(fd, reinterpret_cast<sockaddr*>(&a), n) == 0 &&
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &n) == 0)
      port = ntohs(a.sin_port);
  }
  ~RefusingPort() {
    if (fd >= 0) ::close(fd);
  }
  int fd = -1;
  int port = 0;
};

}  // namespace

TEST_CASE("over Redis, a tenant at one holder alone reaches the whole budget",
          "[redis][fair][shared][concurrency]") {
  // Of weight 1 (the default) or 3 (the rule's): alone, its weight does not cap it.
  for (const std::int64_t weight : {1, 3}) {
    INFO("weight " << weight);
    auto ps =
        processes("gw-fairshared-lone-w" + std::to_string(weight),
                  spec({.rate = kTrickle, .burst = 100'000}, {.by_tenant = {{"solo", weight}}}));
    constexpr int kPeriods = 6;
    std::vector<std::int64_t> got(kPeriods, 0);
    std::barrier sync(kHolders);
    std::vector<std::thread> threads;
    for (int i = 0; i < kHolders; ++i) {
      threads.emplace_back([&, i] {
        for (int p = 0; p < kPeriods; ++p) {
          // Only holder 0 serves "solo", 40 requests of 100 per period (4,000 > 3,000);
          // the others stay idle, at their own pace.
          for (int step = 0; i == 0 && step < 40; ++step) {
            auto r = ps[0]->gateway.decide(fair_call("solo", 100), p * kPeriod + step * 1ms);
            if (r.ok() && r->decision.allowed) got[p] += 100;
          }
          sync.arrive_and_wait();
        }
      });
    }
    for (auto& t : threads) t.join();
    // Period 0: each unit admitted at step s leaves at step s of the next period, so from
    // period 1 on the whole budget turns over at the pace it frees up.
    for (int p = 0; p < kPeriods; ++p) {
      INFO("period " << p);
      CHECK(got[p] == kBudget);  // the whole budget, not ⌊budget / 3⌋
    }
    const auto stats = ps[0]->gateway.fair_shares();
    REQUIRE(stats.size() == 1);
    CHECK(stats[0].config.budget == kBudget);
    CHECK(stats[0].exchange_failures == 0);
    CHECK(stats[0].late_reports == 0);
    CHECK(stats[0].allocations == kPeriods);
    REQUIRE(stats[0].tenants.size() == 1);
    CHECK(stats[0].tenants[0].weight == weight);
  }
}

TEST_CASE("over Redis, what a lone tenant borrowed is back once a newcomer elsewhere is seen",
          "[redis][fair][shared][concurrency]") {
  // "a" alone at h0 asks 4,000 per period and holds the whole budget; from period 4 "b"
  // asks 1,500 per period at h1. b's asks of period 4 are in the view of period 6: from
  // then on a is held to its share (1,350 of 2,700), and from period 7 (a's units of
  // period 5 expired) both get their shares per period.
  auto ps = processes("gw-fairshared-reclaim", spec({.rate = kTrickle, .burst = 100'000}));
  constexpr int kPeriods = 10, kArrival = 4;
  std::vector<std::vector<std::int64_t>> got(kPeriods, std::vector<std::int64_t>(2, 0));
  std::barrier sync(kHolders);
  std::vector<std::thread> threads;
  for (int i = 0; i < kHolders; ++i) {
    threads.emplace_back([&, i] {
      for (int p = 0; p < kPeriods; ++p) {
        const int requests = i == 0 ? 80 : (i == 1 && p >= kArrival ? 30 : 0);
        for (int step = 0; step < requests; ++step) {
          auto r =
              ps[i]->gateway.decide(fair_call(i == 0 ? "a" : "b", 50), p * kPeriod + step * 1ms);
          if (r.ok() && r->decision.allowed) got[p][i] += 50;
        }
        sync.arrive_and_wait();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int p = 0; p < kArrival; ++p) CHECK(got[p][0] == kBudget);  // alone: all of it
  for (int p = kArrival + 2; p < kPeriods; ++p) {
    INFO("period " << p << ": a " << got[p][0] << ", b " << got[p][1]);
    CHECK(got[p][0] <= kCapacity / 2);  // a no more than its share
    if (p >= kArrival + 3) {
      CHECK(got[p][0] >= kCapacity / 2 - 49);
      CHECK(got[p][1] >= kCapacity / 2 - 49);
    }
  }
}

TEST_CASE("over Redis, fair shares over all holders and the envelope",
          "[redis][fair][shared][concurrency]") {
  // Per period: a asks 300 at h0; b 300 at h0 and h1; c 1,200 at h2; d 800 at each
  // (requests of 50). Totals 300, 600, 1,200, 2,400 (4,500 > 2,700 = budget − reserve):
  // max-min 300, 600, 900, 900; parts: a 300 at h0, b 300 at h0 and h1, c 900 at h2, d
  // 300 at each. The global bucket (40,000, a unit a minute) runs out after about twelve periods.
  const TokenBucket global{.rate = kTrickle, .burst = 40'000};
  auto ps = processes("gw-fairshared-steady", spec(global));
  const std::vector<std::string> tenants = {"a", "b", "c", "d"};
  const std::vector<std::vector<std::int64_t>> asks = {// [holder][tenant]
                                                       {300, 300, 0, 800},
                                                       {0, 300, 0, 800},
                                                       {0, 0, 1'200, 800}};
  constexpr int kPeriods = 14;
  std::mutex mu;
  std::vector<quota::verify::AdmittedEvent> log;
  // [period][holder][tenant] → admitted; [period][holder] → Σ shares of its allocation.
  std::vector<std::vector<std::vector<std::int64_t>>> got(
      kPeriods, std::vector<std::vector<std::int64_t>>(kHolders, std::vector<std::int64_t>(4)));
  std::vector<std::vector<std::int64_t>> share_sums(kPeriods, std::vector<std::int64_t>(kHolders));
  std::vector<std::atomic<bool>> exhausted(kPeriods);
  std::atomic<int> errors{0};
  std::barrier sync(kHolders);
  std::vector<std::thread> threads;
  for (int i = 0; i < kHolders; ++i) {
    threads.emplace_back([&, i] {
      std::vector<quota::verify::AdmittedEvent> mine;
      for (int p = 0; p < kPeriods; ++p) {
        for (int step = 0; step < 24; ++step) {
          const Nanos t = p * kPeriod + step * 1ms;
          for (std::size_t k = 0; k < tenants.size(); ++k) {
            if (step * 50 >= asks[i][k]) continue;
            auto r = ps[i]->gateway.decide(fair_call(tenants[k], 50), t);
            if (!r.ok()) {
              if (errors++ == 0) std::printf("first error: %s\n", r.status().ToString().c_str());
              continue;
            }
            if (r->decision.allowed) {
              got[p][i][k] += 50;
              mine.push_back({t.count(), 50});
            } else if (r->decision.reason == Reason::kOverLimit) {
              exhausted[p] = true;
            }
          }
        }
        const auto stats = ps[i]->gateway.fair_shares();
        if (stats.size() == 1 && stats[0].last) share_sums[p][i] = stats[0].last->share_sum;
        sync.arrive_and_wait();
      }
      std::lock_guard<std::mutex> lock(mu);
      log.insert(log.end(), mine.begin(), mine.end());
    });
  }
  for (auto& t : threads) t.join();
  CHECK(errors.load() == 0);

  // The envelope on what the holders admitted.
  (void)quota::testing::check_fair_envelope(log, global, ps);

  // Σ over the holders of the shares ≤ budget − reserve at every allocation.
  for (int p = 0; p < kPeriods; ++p) {
    std::int64_t sum = 0;
    for (int i = 0; i < kHolders; ++i) sum += share_sums[p][i];
    INFO("period " << p);
    CHECK(sum <= kCapacity);
  }
  for (const auto& p : ps) {
    const auto stats = p->gateway.fair_shares();
    REQUIRE(stats.size() == 1);
    CHECK(stats[0].allocations == kPeriods);
    CHECK(stats[0].allocation_errors == 0);
    CHECK(stats[0].exchange_failures == 0);
    CHECK(stats[0].late_reports == 0);
  }

  // Every tenant at least at its fair share per period over all holders (in whole
  // requests of 50 at each holder it uses), once the view has the asks (from period 2;
  // one more to settle) and while the bucket lasts.
  std::vector<std::int64_t> demands(4, 0), weights(4, 1);
  for (const auto& h : asks)
    for (std::size_t k = 0; k < 4; ++k) demands[k] += h[k];
  auto fair = quota::fair::weighted_max_min(kCapacity, demands, weights);
  REQUIRE(fair.ok());
  CHECK(*fair == std::vector<std::int64_t>{300, 600, 900, 900});
  int windows = 0;
  for (int p = 3; p < kPeriods && !exhausted[p]; ++p) {
    ++windows;
    for (std::size_t k = 0; k < 4; ++k) {
      std::int64_t sum = 0, at = 0;
      for (int i = 0; i < kHolders; ++i) {
        sum += got[p][i][k];
        at += asks[i][k] > 0 ? 1 : 0;
      }
      INFO("period " << p << " tenant " << tenants[k] << " got " << sum);
      CHECK(sum >= (*fair)[k] - 49 * at);
    }
  }
  std::printf("%d periods at their fair share over all holders checked\n", windows);
  CHECK(windows >= 5);
}

TEST_CASE("over Redis, the rule's weights 1 : 2 : 3 give shares in that ratio at every holder",
          "[redis][fair][shared][concurrency]") {
  // w1, w2, w3 (weights 1, 2, 3 from the rule) each ask 500 per period at every holder
  // (requests of 50): totals 1,500 each, 4,500 > 2,700. Every holder computes the same
  // weighted max-min shares 450, 900, 1,350 from the sealed view, and holds each tenant
  // to a third of it: 150, 300, 450 per holder and period.
  const TokenBucket global{.rate = kTrickle, .burst = 60'000};
  auto ps = processes("gw-fairshared-weights",
                      spec(global, {.by_tenant = {{"w1", 1}, {"w2", 2}, {"w3", 3}}}));
  const std::vector<std::string> tenants = {"w1", "w2", "w3"};
  const std::vector<std::int64_t> weights = {1, 2, 3};
  constexpr int kPeriods = 10;
  std::mutex mu;
  std::vector<quota::verify::AdmittedEvent> log;
  // [period][holder][tenant] → admitted; [period][holder] → Σ shares of its allocation.
  std::vector<std::vector<std::vector<std::int64_t>>> got(
      kPeriods, std::vector<std::vector<std::int64_t>>(kHolders, std::vector<std::int64_t>(3)));
  std::vector<std::vector<std::int64_t>> share_sums(kPeriods, std::vector<std::int64_t>(kHolders));
  std::atomic<int> errors{0};
  std::barrier sync(kHolders);
  std::vector<std::thread> threads;
  for (int i = 0; i < kHolders; ++i) {
    threads.emplace_back([&, i] {
      std::vector<quota::verify::AdmittedEvent> mine;
      for (int p = 0; p < kPeriods; ++p) {
        for (int step = 0; step < 10; ++step) {
          const Nanos t = p * kPeriod + step * 1ms;
          for (std::size_t k = 0; k < tenants.size(); ++k) {
            auto r = ps[i]->gateway.decide(fair_call(tenants[k], 50), t);
            if (!r.ok()) {
              if (errors++ == 0) std::printf("first error: %s\n", r.status().ToString().c_str());
              continue;
            }
            if (r->decision.allowed) {
              got[p][i][k] += 50;
              mine.push_back({t.count(), 50});
            }
          }
        }
        const auto stats = ps[i]->gateway.fair_shares();
        if (stats.size() == 1 && stats[0].last) share_sums[p][i] = stats[0].last->share_sum;
        sync.arrive_and_wait();
      }
      std::lock_guard<std::mutex> lock(mu);
      log.insert(log.end(), mine.begin(), mine.end());
    });
  }
  for (auto& t : threads) t.join();
  CHECK(errors.load() == 0);
  (void)quota::testing::check_fair_envelope(log, global, ps);

  const std::vector<std::int64_t> demands(3, 1'500);
  auto fair = quota::fair::weighted_max_min(kCapacity, demands, weights);
  REQUIRE(fair.ok());
  CHECK(*fair == std::vector<std::int64_t>{450, 900, 1'350});
  for (int p = 0; p < kPeriods; ++p) {
    std::int64_t sum = 0;
    for (int i = 0; i < kHolders; ++i) sum += share_sums[p][i];
    INFO("period " << p);
    CHECK(sum <= kCapacity);  // Σ over holders of the shares ≤ budget − reserve
  }
  // From period 3 (the view of period 1 has every holder's asks; one more to settle).
  for (int p = 3; p < kPeriods; ++p) {
    for (int i = 0; i < kHolders; ++i) {
      INFO("period " << p << " holder " << i);
      CHECK(got[p][i] == std::vector<std::int64_t>{150, 300, 450});
    }
  }
  for (const auto& p : ps) {
    const auto stats = p->gateway.fair_shares();
    REQUIRE(stats.size() == 1);
    CHECK(stats[0].exchange_failures == 0);
    CHECK(stats[0].late_reports == 0);
    REQUIRE(stats[0].tenants.size() == 3);
    for (std::size_t k = 0; k < 3; ++k) {
      CHECK(stats[0].tenants[k].weight == weights[k]);
      CHECK(stats[0].tenants[k].share == (*fair)[k] / kHolders);
    }
  }
}

TEST_CASE(
    "over Redis, a sealed period gives every reader the same view; a late report is "
    "dropped",
    "[redis][fair][shared]") {
  GatewayStore store({.pool = quota::testing::redis_pool(2),
                      .prefix = quota::testing::unique_prefix("gw-fairshared-seal")});
  RedisFairAsksExchange h0(store, "h0"), h1(store, "h1"), h2(store, "h2");
  using Asks = std::vector<std::pair<std::string, std::int64_t>>;
  const Asks a0{{"x", 10}, {"y", 5}}, a1{{"x", 30}}, a2{{"y", 100}};
  REQUIRE(h0.exchange("{~global}call", 100ms, 7, a0, 5).ok());
  auto v1 = h1.exchange("{~global}call", 100ms, 7, a1, 5);
  REQUIRE(v1.ok());
  CHECK(!v1->late);
  auto v0 = h0.exchange("{~global}call", 100ms, 8, {}, 7);  // reads and seals period 7
  REQUIRE(v0.ok());
  REQUIRE(v0->tenants.size() == 2);
  CHECK(v0->tenants[0] == quota::fair::HolderDemand{.tenant = "x", .total = 40, .local = 10});
  CHECK(v0->tenants[1] == quota::fair::HolderDemand{.tenant = "y", .total = 5, .local = 5});
  auto v2 = h2.exchange("{~global}call", 100ms, 7, a2, 7);  // too late for period 7
  REQUIRE(v2.ok());
  CHECK(v2->late);
  REQUIRE(v2->tenants.size() == 2);
  CHECK(v2->tenants[0] == quota::fair::HolderDemand{.tenant = "x", .total = 40, .local = 0});
  CHECK(v2->tenants[1] == quota::fair::HolderDemand{.tenant = "y", .total = 5, .local = 0});
  RedisFairAsksExchange bad(store, "h|3");
  CHECK(bad.exchange("{~global}call", 100ms, 9, a0, 7).status().code() ==
        absl::StatusCode::kInvalidArgument);
}

TEST_CASE("with Redis unreachable for the exchange, a holder falls back to its fixed part",
          "[redis][fair][shared]") {
  RefusingPort refusing;
  REQUIRE(refusing.port > 0);
  auto dead = std::make_shared<quota::redis::ConnectionPool>(
      quota::redis::ConnectionConfig{
          .host = "127.0.0.1", .port = refusing.port, .deadline = std::chrono::milliseconds(200)},
      1);
  auto ps = processes("gw-fairshared-down", spec({.rate = kTrickle, .burst = 100'000}), dead);
  constexpr int kPeriods = 3;
  for (int p = 0; p < kPeriods; ++p) {
    std::int64_t got = 0;
    for (int step = 0; step < 40; ++step) {
      auto r = ps[0]->gateway.decide(fair_call("solo", 100), p * kPeriod + step * 1ms);
      REQUIRE(r.ok());  // the store itself is up
      if (r->decision.allowed) got += 100;
    }
    INFO("period " << p);
    CHECK(got == kBudget / kHolders);  // the fixed part: bounded, never more
  }
  const auto stats = ps[0]->gateway.fair_shares();
  REQUIRE(stats.size() == 1);
  CHECK(stats[0].exchange_failures == kPeriods);
  CHECK(stats[0].allocations == kPeriods);
  const std::string text = quota::gateway::render_prometheus(stats);
  CHECK(text.find("quota_fair_share_fallback_periods_total{rule=\"global\",budget=\"{~global}"
                  "call\"} 3\n") != std::string::npos);
}
