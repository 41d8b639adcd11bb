// Fair shares of a leased global budget over Redis (quota/gateway/fair_share/fair_limits.hpp in the
// Gateway, LeasedBackend over quota::redis::GatewayStore with RedisGrantLedger; a real
// redis-server): several holders on their own threads, each with its own store,
// connections, incarnation and allocator of ⌊budget / holders⌋. Checked on what the
// holders admitted: the global envelope r·T + B + Σ outstanding grants (the verifier),
// every granted unit spent or held and listed at the authority; Σ shares ≤ budget −
// reserve at every allocation of every holder (and Σ over the holders ≤ the budget − the
// reserve); a lone tenant reaching the whole budget through every holder; every active
// tenant at its fair share in every period of a steady overload.
#include <algorithm>
#include <atomic>
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
#include "quota/gateway/gateway.hpp"
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
using quota::redis::RedisGrantLedger;
using quota::testing::fair_call;
using quota::testing::kFairLeaseUnits;
using quota::testing::kSlow;

namespace {

constexpr int kHolders = 3;
// Fair shares of `budget` units per 100 ms (reserve 10 %, shares above 70 %, pause above
// 90 %) on a leased global budget (support/fair_holders.hpp).
quota::gateway::RuleSetSpec spec(TokenBucket global, std::int64_t budget) {
  return quota::testing::fair_holders_spec(
      global, FairShareSpec{.enabled = true, .period = 100ms, .budget = budget});
}

// kHolders processes, each dividing its fixed part ⌊budget / kHolders⌋ (no exchange).
std::vector<std::unique_ptr<quota::testing::FairHolder>> processes(
    const std::string& test, const quota::gateway::RuleSetSpec& s) {
  return quota::testing::fair_holders(test, s, kHolders, 0x200, {});
}

}  // namespace

TEST_CASE("over Redis, a lone tenant reaches the whole fair-share budget through every holder",
          "[redis][fair][lease][concurrency]") {
  auto ps = processes("gw-fair-lone", spec({.rate = kSlow, .burst = 20'000}, 3'000));
  std::atomic<std::int64_t> admitted{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < kHolders; ++i) {
    threads.emplace_back([&, i] {
      for (int k = 0; k < 15; ++k) {
        auto r = ps[i]->gateway.decide(fair_call("solo", 100), Nanos{0});
        if (r.ok() && r->decision.allowed) admitted += 100;
      }
    });
  }
  for (auto& t : threads) t.join();
  CHECK(admitted.load() == 3'000);  // each holder's ⌊3,000 / 3⌋, no cap below it
  for (const auto& p : ps) {
    const auto stats = p->gateway.fair_shares();
    REQUIRE(stats.size() == 1);
    CHECK(stats[0].config.budget == 1'000);
    CHECK(stats[0].paused == 5);
  }
}

TEST_CASE("over Redis, holders of a leased global budget keep fair shares and the envelope",
          "[redis][fair][lease][concurrency]") {
  // Four tenants ask 100, 200, 400 and 800 units per 100 ms period at every holder, in
  // requests of 50 (1,500 > each holder's 900 of budget − reserve): max-min 100, 200, 300,
  // 300. The global bucket (26,000, no refill) runs out after about ten periods.
  const TokenBucket global{.rate = kSlow, .burst = 26'000};
  auto ps = processes("gw-fair-steady", spec(global, 3'000));
  const std::vector<std::pair<std::string, std::int64_t>> asks = {
      {"t100", 100}, {"t200", 200}, {"t400", 400}, {"t800", 800}};
  constexpr int kPeriods = 14;
  std::mutex mu;
  std::vector<quota::verify::AdmittedEvent> log;
  // [holder][period][tenant] → admitted; [holder][period] → a global over_limit was seen.
  std::vector<std::vector<std::map<std::string, std::int64_t>>> got(
      kHolders, std::vector<std::map<std::string, std::int64_t>>(kPeriods));
  std::vector<std::vector<bool>> exhausted(kHolders, std::vector<bool>(kPeriods, false));
  std::atomic<int> errors{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < kHolders; ++i) {
    threads.emplace_back([&, i] {
      std::vector<quota::verify::AdmittedEvent> mine;
      for (int p = 0; p < kPeriods; ++p) {
        for (int step = 0; step < 16; ++step) {
          const Nanos t = Nanos{p * 100'000'000LL + step * 1'000'000LL};
          for (const auto& [who, n] : asks) {
            if (step * 50 >= n) continue;
            auto r = ps[i]->gateway.decide(fair_call(who, 50), t);
            if (!r.ok()) {
              if (errors++ == 0) std::printf("first error: %s\n", r.status().ToString().c_str());
              continue;
            }
            if (r->decision.allowed) {
              got[i][p][who] += 50;
              mine.push_back({t.count(), 50});
            } else if (r->decision.reason == Reason::kOverLimit) {
              exhausted[i][p] = true;
            }
          }
        }
      }
      std::lock_guard<std::mutex> lock(mu);
      log.insert(log.end(), mine.begin(), mine.end());
    });
  }
  for (auto& t : threads) t.join();
  CHECK(errors.load() == 0);

  // The envelope on what the holders admitted.
  const std::int64_t granted = quota::testing::check_fair_envelope(log, global, ps);
  CHECK(granted >= global.burst - kFairLeaseUnits);  // the bucket was run down
  auto listed = ps[0]->ledger.outstanding("{~global}call");
  REQUIRE(listed.ok());
  std::int64_t listed_units = 0;
  for (const auto& g : *listed) listed_units += g.units;
  CHECK(listed_units == granted);

  // Σ shares ≤ budget − reserve at every allocation of every holder, and over the holders.
  std::int64_t capacities = 0;
  for (const auto& p : ps) {
    const auto stats = p->gateway.fair_shares();
    REQUIRE(stats.size() == 1);
    CHECK(stats[0].allocations == kPeriods);
    CHECK(stats[0].allocation_errors == 0);
    CHECK(stats[0].max_share_sum <= stats[0].config.share_capacity());
    capacities += stats[0].config.share_capacity();
  }
  CHECK(capacities <= 3'000 - 300);

  // Every tenant at its fair share (in whole requests of 50) in every period of every
  // holder, once the estimates have settled (3 periods) and while the bucket lasts.
  std::vector<std::int64_t> demands, weights;
  for (const auto& [who, n] : asks) {
    demands.push_back(n);
    weights.push_back(1);
  }
  auto fair = quota::fair::weighted_max_min(900, demands, weights);
  REQUIRE(fair.ok());
  int windows = 0;
  for (int i = 0; i < kHolders; ++i) {
    for (int p = 3; p < kPeriods; ++p) {
      if (exhausted[i][p]) break;
      ++windows;
      for (std::size_t k = 0; k < asks.size(); ++k) {
        INFO("holder " << i << " period " << p << " " << asks[k].first);
        CHECK(got[i][p][asks[k].first] >= std::min(asks[k].second, (*fair)[k]) - 49);
      }
    }
  }
  std::printf("%d holder-periods at their fair share checked\n", windows);
  CHECK(windows >= kHolders * 5);
}
