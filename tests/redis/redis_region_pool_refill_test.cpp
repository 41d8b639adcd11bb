// A region's pool refilled under steady load over real Redis (quota/region/
// regional_pool.hpp): a central redis-server with a global budget that always has room
// (20,000 units/s for 8,000 requests/s), two regions of two gateway processes each (a
// thread per process, a redis-server per region), each region's path to the central
// server slowed to 3 ms per command by a proxy, so that a refill takes longer than the
// low-water mark lasts. Every denial is then a false denial: the central authority
// granted every refill (checked). Without waiting (refill_wait 0) a request that finds
// the pool empty while another process refills is denied; with the default wait it is
// served when the refill lands. The false denials of both are counted and printed, and
// the global envelope r·T + B + R·(units + low_water) is verified on what was admitted.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "quota/region/regional_pool.hpp"
#include "quota/verify/envelope.hpp"
#include "support/gateway_fixtures.hpp"
#include "support/gateway_rules.hpp"
#include "support/lossy_proxy.hpp"
#include "support/redis_server.hpp"
#include "support/region_fixtures.hpp"

using namespace std::chrono_literals;
using quota::Nanos;
using quota::TokenBucket;
using quota::region::PoolOptions;

namespace {

constexpr int kRegions = 2;
constexpr int kProcesses = 2;
constexpr auto kPeriod = 500us;  // per process: 2,000 requests/s, 8,000/s in all
constexpr int kRequests = 2400;  // per process: 1.2 s
const TokenBucket kGlobal{.rate = {.units = 20'000, .per = 1s}, .burst = 2'000};
const TokenBucket kTenant{.rate = {.units = 100'000, .per = 1s}, .burst = 100'000};

struct RegionTally {
  std::int64_t admitted = 0, over_limit = 0, unavailable = 0, errors = 0;
};

struct Run {
  std::vector<RegionTally> regions = std::vector<RegionTally>(kRegions);
  std::int64_t grants = 0, grant_denials = 0, waits = 0;
  std::int64_t false_denials() const {
    std::int64_t n = 0;
    for (const auto& r : regions) n += r.over_limit + r.unavailable + r.errors;
    return n;
  }
};

// Every process sends one request per kPeriod (not catching up when late) and logs its
// admissions at the time of the answer.
Run drive(Nanos refill_wait, const std::string& name) {
  quota::testing::ScratchServer central(quota::testing::scratch_dir("quota-refill-" + name));
  REQUIRE(central.started());
  auto rules =
      quota::testing::build(quota::testing::levels_spec(1, kTenant, std::nullopt, kGlobal));
  std::vector<std::unique_ptr<quota::testing::LossyProxy>> far;
  std::vector<std::unique_ptr<quota::testing::PoolRegion>> regions;
  for (int i = 0; i < kRegions; ++i) {
    far.push_back(std::make_unique<quota::testing::LossyProxy>(central.port()));
    far.back()->set_delay(3ms);
    const PoolOptions options{.region = 0x700u + static_cast<std::uint64_t>(i),
                              .units = 100,
                              .expiry = 10s,
                              .low_water = 10,
                              .max_grants = 4,
                              .lock_ttl = 5s,
                              .backoff_min = 1ms,
                              .backoff_max = 50ms,
                              .refill_wait = refill_wait};
    regions.push_back(std::make_unique<quota::testing::PoolRegion>(
        name + "-" + std::to_string(i), far.back()->port(), 2s, rules, options, kProcesses));
    REQUIRE(regions.back()->server.started());
  }
  Run run;
  std::vector<quota::verify::AdmittedEvent> log;
  std::mutex mu;
  const auto start = std::chrono::steady_clock::now();
  std::vector<std::thread> threads;
  for (int i = 0; i < kRegions; ++i) {
    for (int p = 0; p < kProcesses; ++p) {
      threads.emplace_back([&, i, p] {
        auto& gateway = regions[i]->processes[p]->gateway;
        RegionTally mine;
        std::vector<quota::verify::AdmittedEvent> admitted;
        auto next = std::chrono::steady_clock::now();
        for (int k = 0; k < kRequests; ++k) {
          std::this_thread::sleep_until(next);
          next = std::max(next + kPeriod, std::chrono::steady_clock::now());
          auto r = gateway.decide(
              {.who = {.tenant = "t" + std::to_string(k % 7), .plan = "free"}, .route = "read"},
              Nanos{0});
          const Nanos at = std::chrono::steady_clock::now() - start;
          if (!r.ok()) {
            if (mine.errors++ == 0) std::printf("  %s\n", r.status().ToString().c_str());
          } else if (r->decision.allowed) {
            ++mine.admitted;
            admitted.push_back({at.count(), 1});
          } else {
            ++(r->decision.reason == quota::Reason::kUnavailable ? mine.unavailable
                                                                 : mine.over_limit);
          }
        }
        std::lock_guard<std::mutex> lock(mu);
        run.regions[i].admitted += mine.admitted;
        run.regions[i].over_limit += mine.over_limit;
        run.regions[i].unavailable += mine.unavailable;
        run.regions[i].errors += mine.errors;
        log.insert(log.end(), admitted.begin(), admitted.end());
      });
    }
  }
  for (auto& t : threads) t.join();
  for (const auto& region : regions) {
    for (const auto& p : region->processes) {
      run.grants += p->pool.grant_requests();
      run.grant_denials += p->pool.grant_denials();
      run.waits += p->pool.refill_waits();
    }
  }
  std::printf("refill_wait %lld ms: %lld central grants (%lld denied), %lld requests waited\n",
              static_cast<long long>(refill_wait / 1ms), static_cast<long long>(run.grants),
              static_cast<long long>(run.grant_denials), static_cast<long long>(run.waits));
  for (int i = 0; i < kRegions; ++i) {
    const RegionTally& t = run.regions[i];
    std::printf(
        "  region %d: admitted %lld, false denials %lld (%lld over_limit, %lld unavailable, %lld "
        "errors)\n",
        i, static_cast<long long>(t.admitted),
        static_cast<long long>(t.over_limit + t.unavailable + t.errors),
        static_cast<long long>(t.over_limit), static_cast<long long>(t.unavailable),
        static_cast<long long>(t.errors));
  }
  // The bound, with every region holding at most units + low_water.
  std::sort(log.begin(), log.end(),
            [](const auto& a, const auto& b) { return a.time_ns < b.time_ns; });
  auto report =
      quota::verify::verify_token_bucket(log, kGlobal.rate, kGlobal.burst, kRegions * (100 + 10));
  REQUIRE(report.ok());
  std::printf("  global envelope: %s\n", quota::verify::to_string(*report).c_str());
  CHECK(report->holds());
  return run;
}

}  // namespace

TEST_CASE("under steady load a request that finds the pool empty during a refill waits for it",
          "[redis][region][pool]") {
  const Run before = drive(Nanos{0}, "nowait");
  const Run after = drive(PoolOptions{}.refill_wait, "wait");
  std::printf("false denials: %lld without waiting, %lld with refill_wait %lld ms\n",
              static_cast<long long>(before.false_denials()),
              static_cast<long long>(after.false_denials()),
              static_cast<long long>(PoolOptions{}.refill_wait / 1ms));
  // The central budget had room for every refill: every denial was false.
  CHECK(before.grant_denials == 0);
  CHECK(after.grant_denials == 0);
  CHECK(before.grants > 0);
  CHECK(before.false_denials() > 0);  // the slow refill does run the pool dry
  CHECK(after.waits > 0);             // and then requests wait for it
  CHECK(after.false_denials() * 10 <= before.false_denials());
  for (const auto& r : after.regions) CHECK(r.admitted > 0);
}
