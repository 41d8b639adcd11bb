// benchmarks/gateway_lease_redis_bench.cpp — a global budget shared by 10,000 tenants,
// through the gateway over a real redis-server, 8 threads of one gateway process:
// decisions per second and authority round trips per decision without leases (the
// tenant's script and the global key's script on every request), with the global level
// leased, and with it leased and the tenant levels on `lease: auto`, in the same run. Round trips
// are the server's own count of script calls (INFO commandstats: evalsha + eval), so grant records
// count too.
//
//   build/release/benchmarks/gateway_lease_redis_bench --benchmark_format=json
//
// Uses the redis-server at 127.0.0.1:$QUOTA_REDIS_PORT if set; otherwise starts one on a
// free loopback port with cmake/redis_server.sh and stops it at exit.
#include <unistd.h>

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
#include "quota/gateway/gateway.hpp"
#include "quota/gateway/leases/leased_backend.hpp"
#include "quota/redis/gateway_store.hpp"
#include "quota/redis/grant_ledger.hpp"
#include "support/redis_info.hpp"
#include "support/scratch_redis.hpp"

namespace {

using namespace std::chrono_literals;
using quota::TokenBucket;
namespace gw = quota::gateway;

constexpr int kThreads = 8;
constexpr int kTenants = 10'000;
constexpr auto kRunFor = 2s;
// Everyone's budget: 1,000,000 units/s, burst 100,000; each tenant's: 1,000/s, burst 1,000.
const TokenBucket kGlobal{.rate = {.units = 1'000'000, .per = 1s}, .burst = 100'000};
const TokenBucket kTenant{.rate = {.units = 1'000, .per = 1s}, .burst = 1'000};

// The server at QUOTA_REDIS_PORT, or a throw-away one (support/scratch_redis.hpp).
int server_port() { return quota::bench::redis_port("quota-bench-gw-lease"); }

std::shared_ptr<quota::redis::ConnectionPool> make_pool() {
  return std::make_shared<quota::redis::ConnectionPool>(
      quota::redis::ConnectionConfig{.host = "127.0.0.1", .port = server_port(), .deadline = 1s},
      kThreads + 2);
}

gw::RuleSetSpec spec(gw::LeaseSpec tenant_lease, gw::LeaseSpec global_lease) {
  gw::RuleSetSpec s;
  s.routes = {{.name = "read", .cost = 1}};
  s.rules.push_back({.level = gw::Level::kTenant,
                     .plan = "free",
                     .route = "read",
                     .name = "tenant",
                     .policy = kTenant,
                     .lease = tenant_lease});
  s.rules.push_back({.level = gw::Level::kGlobal,
                     .route = "read",
                     .name = "global",
                     .policy = kGlobal,
                     .lease = global_lease});
  return s;
}

const gw::LeaseSpec kNoLease{};
const gw::LeaseSpec kGlobalLease{
    .mode = gw::LeaseMode::kOn, .units = 5'000, .expiry = 1s, .low_water = 1'000};
// Tenants leased only while one decides at >= 500 units/s: none does here (10,000 share
// the load), so each stays at one script call per decision and nothing is hoarded.
const gw::LeaseSpec kTenantAuto{
    .mode = gw::LeaseMode::kAuto, .units = 200, .expiry = 1s, .low_water = 20, .auto_rate = 500};

// Decides for kRunFor on kThreads threads, tenant t{i % 10,000} by thread-local counter.
// `grant_requests`: the leased backend's grant calls so far (each also writes its record).
template <class G, class Grants>
void drive(benchmark::State& state, G& gateway, quota::redis::ConnectionPool& pool,
           Grants grant_requests) {
  const std::int64_t calls_before = quota::bench::script_calls(pool);
  std::atomic<std::int64_t> decisions{0}, admitted{0}, errors{0};
  quota::SteadyClock clock;
  const auto start = clock.now();
  const auto end = start + kRunFor;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::vector<std::string> tenants;
      for (int i = t; i < kTenants; i += kThreads) tenants.push_back("t" + std::to_string(i));
      std::int64_t n = 0, ok = 0, err = 0;
      for (std::size_t i = 0; clock.now() < end; ++i) {
        auto r = gateway.decide(
            {.who = {.tenant = tenants[i % tenants.size()], .plan = "free"}, .route = "read"},
            clock.now());
        ++n;
        if (!r.ok()) {
          ++err;
        } else if (r->decision.allowed) {
          ++ok;
        }
      }
      decisions += n;
      admitted += ok;
      errors += err;
    });
  }
  for (auto& th : threads) th.join();
  const double seconds = std::chrono::duration<double>(clock.now() - start).count();
  const std::int64_t calls = quota::bench::script_calls(pool) - calls_before;
  state.SetIterationTime(seconds);
  state.counters["decisions_per_second"] = static_cast<double>(decisions) / seconds;
  state.counters["admitted_per_second"] = static_cast<double>(admitted) / seconds;
  state.counters["round_trips_per_decision"] =
      static_cast<double>(calls) / static_cast<double>(std::max<std::int64_t>(1, decisions));
  // Script calls for leases: a grant's decision and its record.
  state.counters["lease_round_trips_per_decision"] =
      static_cast<double>(2 * grant_requests()) /
      static_cast<double>(std::max<std::int64_t>(1, decisions));
  state.counters["errors"] = static_cast<double>(errors);
}

void run(benchmark::State& state, gw::LeaseSpec tenant_lease, gw::LeaseSpec global_lease) {
  for (auto _ : state) {
    auto pool = make_pool();
    const std::string prefix = "bench:gwlease:" + std::to_string(::getpid()) + ":" +
                               std::to_string(quota::SteadyClock{}.now().count()) + ":";
    quota::redis::GatewayStore store({.pool = pool, .prefix = prefix});
    auto rules = gw::RuleSet::create(spec(tenant_lease, global_lease));
    if (!rules.ok()) {
      state.SkipWithError(std::string(rules.status().message()).c_str());
      return;
    }
    gw::RuleRegistry registry(*rules);
    if (!tenant_lease.enabled() && !global_lease.enabled()) {
      gw::Gateway gateway(store, registry);
      drive(state, gateway, *pool, [] { return std::int64_t{0}; });
    } else {
      quota::redis::RedisGrantLedger ledger(store);
      gw::LeasedBackend<quota::redis::GatewayStore, quota::redis::RedisGrantLedger> leased(store,
                                                                                           ledger);
      gw::Gateway gateway(leased, registry);
      drive(state, gateway, *pool, [&] { return leased.grant_requests(); });
    }
  }
}

void BM_Global10kTenants_NoLeases(benchmark::State& state) { run(state, kNoLease, kNoLease); }
void BM_Global10kTenants_GlobalLeased(benchmark::State& state) {
  run(state, kNoLease, kGlobalLease);
}
void BM_Global10kTenants_GlobalLeasedTenantsAuto(benchmark::State& state) {
  run(state, kTenantAuto, kGlobalLease);
}
BENCHMARK(BM_Global10kTenants_NoLeases)
    ->Iterations(1)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Global10kTenants_GlobalLeased)
    ->Iterations(1)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Global10kTenants_GlobalLeasedTenantsAuto)
    ->Iterations(1)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
