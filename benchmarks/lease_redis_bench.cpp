// benchmarks/lease_redis_bench.cpp — one hot tenant, 8 gateway threads, a real
// redis-server as the authority: decisions per second and authority round trips per
// decision with leases and without (one EVALSHA per decision), in the same run. The
// leased run also checks its admitted log against r·T + B + H·q_max with the envelope
// verifier (counter excess_units: <= 0 means the bound held).
//
//   build/release/benchmarks/lease_redis_bench --benchmark_format=json
//
// Uses the redis-server at 127.0.0.1:$QUOTA_REDIS_PORT if set; otherwise starts one on a
// free loopback port with cmake/redis_server.sh and stops it at exit.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <benchmark/benchmark.h>

#include "quota/clock.hpp"
#include "quota/lease/leased_limiter.hpp"
#include "quota/limiter.hpp"
#include "quota/redis/lease_authority.hpp"
#include "quota/redis/redis_store.hpp"
#include "quota/verify/envelope.hpp"
#include "support/scratch_redis.hpp"

namespace {

using namespace std::chrono_literals;
using quota::TokenBucket;

constexpr int kGateways = 8;
constexpr auto kRunFor = 2s;
// The hot tenant's contract: 1,000,000 units/s, burst 10,000. Demand exceeds it.
const TokenBucket kCentral{.rate = {.units = 1'000'000, .per = 1s}, .burst = 10'000};
constexpr std::int64_t kQMax = 2'000;

// The server at QUOTA_REDIS_PORT, or a throw-away one (support/scratch_redis.hpp).
int server_port() { return quota::bench::redis_port("quota-bench-redis"); }

std::shared_ptr<quota::RedisStore<TokenBucket>> make_store(const std::string& prefix) {
  auto pool = std::make_shared<quota::redis::ConnectionPool>(
      quota::redis::ConnectionConfig{.host = "127.0.0.1", .port = server_port(), .deadline = 1s},
      kGateways);
  return std::make_shared<quota::RedisStore<TokenBucket>>(
      quota::RedisStoreOptions{.pool = pool, .prefix = prefix});
}

std::string unique_prefix(const char* what) {
  return std::string("bench:") + what + ":" + std::to_string(::getpid()) + ":" +
         std::to_string(quota::SteadyClock{}.now().count()) + ":";
}

struct Totals {
  std::atomic<std::int64_t> decisions{0}, admitted{0}, errors{0};
};

void report(benchmark::State& state, const Totals& t, double seconds, std::int64_t round_trips) {
  state.SetIterationTime(seconds);
  state.counters["decisions_per_second"] = static_cast<double>(t.decisions) / seconds;
  state.counters["admitted_per_second"] = static_cast<double>(t.admitted) / seconds;
  state.counters["round_trips_per_decision"] =
      static_cast<double>(round_trips) /
      static_cast<double>(std::max<std::int64_t>(1, t.decisions));
  state.counters["errors"] = static_cast<double>(t.errors);
}

void BM_HotTenant_Leases(benchmark::State& state) {
  for (auto _ : state) {
    quota::redis::LeaseAuthority authority(make_store(unique_prefix("leases")), kCentral);
    Totals totals;
    std::vector<std::vector<quota::verify::AdmittedEvent>> logs(kGateways);
    quota::SteadyClock clock;
    const auto start = clock.now();
    const auto end = start + kRunFor;
    std::vector<std::thread> threads;
    for (int g = 0; g < kGateways; ++g) {
      threads.emplace_back([&, g] {
        auto leased = quota::LeasedLimiter<quota::redis::LeaseAuthority>::create(
            authority, {.q_min = 16, .q_max = kQMax, .grant_ttl = 1s, .central = kCentral});
        auto& log = logs[static_cast<std::size_t>(g)];
        log.reserve(1 << 21);
        std::int64_t decisions = 0, admitted = 0, errors = 0;
        // The clock is read once per 64 decisions to end the run; admissions are logged
        // with a clock read each, as the verifier needs their times.
        while (clock.now() < end) {
          for (int i = 0; i < 64; ++i) {
            auto d = (*leased)->acquire("{hot}read", 1);
            ++decisions;
            if (!d.ok()) {
              ++errors;
            } else if (d->allowed) {
              ++admitted;
              log.push_back({clock.now().count(), 1});
            }
          }
        }
        totals.decisions += decisions;
        totals.admitted += admitted;
        totals.errors += errors;
      });
    }
    for (auto& t : threads) t.join();
    const double seconds = std::chrono::duration<double>(clock.now() - start).count();
    std::vector<quota::verify::AdmittedEvent> all;
    for (const auto& l : logs) all.insert(all.end(), l.begin(), l.end());
    std::stable_sort(all.begin(), all.end(),
                     [](const auto& a, const auto& b) { return a.time_ns < b.time_ns; });
    // One unit per holder for the logging delay (see tests/redis/redis_lease_test.cpp).
    auto r = quota::verify::verify_token_bucket(all, kCentral.rate, kCentral.burst,
                                                kGateways * (kQMax + 1));
    report(state, totals, seconds, authority.round_trips());
    state.counters["excess_units"] = r.ok() ? static_cast<double>(r->excess_micro()) / 1e6 : 1e18;
    state.counters["bound_units_H_qmax"] = static_cast<double>(kGateways * kQMax);
  }
}
BENCHMARK(BM_HotTenant_Leases)->Iterations(1)->UseManualTime()->Unit(benchmark::kMillisecond);

void BM_HotTenant_NoLeases(benchmark::State& state) {
  for (auto _ : state) {
    auto store = make_store(unique_prefix("direct"));
    Totals totals;
    quota::SteadyClock clock;
    const auto start = clock.now();
    const auto end = start + kRunFor;
    std::vector<std::thread> threads;
    for (int g = 0; g < kGateways; ++g) {
      threads.emplace_back([&] {
        std::int64_t decisions = 0, admitted = 0, errors = 0;
        while (clock.now() < end) {
          auto d = store->apply(kCentral, "{hot}read", quota::Nanos{0}, 1);
          ++decisions;
          if (!d.ok())
            ++errors;
          else if (d->allowed)
            ++admitted;
        }
        totals.decisions += decisions;
        totals.admitted += admitted;
        totals.errors += errors;
      });
    }
    for (auto& t : threads) t.join();
    const double seconds = std::chrono::duration<double>(clock.now() - start).count();
    report(state, totals, seconds, totals.decisions);  // one EVALSHA per decision
  }
}
BENCHMARK(BM_HotTenant_NoLeases)->Iterations(1)->UseManualTime()->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
