// benchmarks/gateway_global_lease_redis_bench.cpp — one global budget shared by 10,000
// tenants through leases, 8 gateway processes (one thread each) over a real redis-server:
// decisions per second and authority round trips per decision with the global level
// leased and without, and the envelope A(T) <= r·T + B + Σ outstanding grants checked
// with the verifier on what the gateways actually admitted.
//
// Each gateway process is a Gateway over its own LeasedBackend (own incarnation) over a
// region::ScopeRouter (quota/region/scope_router.hpp): the tenants' own limits (1,000/s, burst
// 1,000 each) are decided in that process's own store, the global budget at Redis.
// Tenants are routed to one gateway each (tenant i to gateway i mod 8), so each tenant's
// limit is enforced by exactly one process; the only budget at the authority is the one
// every tenant shares. With `lease: on` on it, a decision costs Redis nothing but the
// grants; without, it costs one script call.
//
// Counters (google-benchmark JSON): decisions_per_second, admitted_per_second,
// round_trips_per_decision (the server's count of script calls, INFO commandstats: a
// grant is three: the revocation check, its decision and its record),
// decisions_per_round_trip, excess_units (the verifier's worst excess over r·T + B + H·(units +
// low_water): <= 0 means the bound held), over_rT_B_units (the same over r·T + B alone: what the
// grants out added), held_at_end_units (what the holders still held at the end,
// LeasedBackend::holdings: at most H·(units + low_water)), listed_at_end_units (the grants the
// authority's ledger lists as not expired at the end: whole grants, spent or not). The benchmark's
// argument is the global rate, units/s (burst a tenth of it).
//
//   build/release/benchmarks/gateway_global_lease_redis_bench --benchmark_format=json
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
#include "quota/gateway/gateway.hpp"
#include "quota/gateway/leases/leased_backend.hpp"
#include "quota/redis/gateway_store.hpp"
#include "quota/redis/grant_ledger.hpp"
#include "quota/region/scope_router.hpp"
#include "quota/store/local_store.hpp"
#include "quota/verify/envelope.hpp"
#include "support/redis_info.hpp"
#include "support/scratch_redis.hpp"

namespace {

using namespace std::chrono_literals;
using quota::TokenBucket;
namespace gw = quota::gateway;

constexpr int kGateways = 8;  // gateway processes, one thread each
constexpr int kTenants = 10'000;
constexpr auto kRunFor = 2s;
const TokenBucket kTenant{.rate = {.units = 1'000, .per = 1s}, .burst = 1'000};
const gw::LeaseSpec kGlobalLease{
    .mode = gw::LeaseMode::kOn, .units = 5'000, .expiry = 1s, .low_water = 1'000};

TokenBucket global_policy(std::int64_t rate) {
  return {.rate = {.units = rate, .per = 1s}, .burst = rate / 10};
}

// The server at QUOTA_REDIS_PORT, or a throw-away one (support/scratch_redis.hpp).
int server_port() { return quota::bench::redis_port("quota-bench-global-lease"); }

gw::RuleSetSpec spec(const TokenBucket& global, bool leased) {
  gw::RuleSetSpec s;
  s.routes = {{.name = "read", .cost = 1}};
  s.rules.push_back({.level = gw::Level::kTenant,
                     .plan = "free",
                     .route = "read",
                     .name = "tenant",
                     .policy = kTenant});
  s.rules.push_back({.level = gw::Level::kGlobal,
                     .route = "read",
                     .name = "global",
                     .policy = global,
                     .lease = leased ? kGlobalLease : gw::LeaseSpec{}});
  return s;
}

using TenantStore = quota::LocalStore<gw::KeyPolicy>;
using Local = gw::StoreBackend<TenantStore>;
using Split = quota::region::ScopeRouter<Local, quota::redis::GatewayStore>;
using Leased = gw::LeasedBackend<Split, quota::redis::RedisGrantLedger>;

// One gateway process: its own tenants' store, its own incarnation, rules and Gateway.
struct Process {
  Process(quota::redis::GatewayStore& redis, quota::redis::RedisGrantLedger& ledger,
          std::shared_ptr<const gw::RuleSet> rules, bool leased)
      : local(tenants), split(local, redis), leased_backend(split, ledger), registry(rules) {
    if (leased) {
      leased_gateway = std::make_unique<gw::Gateway>(leased_backend, registry);
    } else {
      direct_gateway = std::make_unique<gw::Gateway>(split, registry);
    }
  }
  absl::StatusOr<gw::Result> decide(const gw::Request& r, quota::Nanos now) {
    return leased_gateway ? leased_gateway->decide(r, now) : direct_gateway->decide(r, now);
  }

  TenantStore tenants;
  Local local;
  Split split;
  Leased leased_backend;
  gw::RuleRegistry registry;
  std::unique_ptr<gw::Gateway> leased_gateway;
  std::unique_ptr<gw::Gateway> direct_gateway;
};

void run(benchmark::State& state, bool leased) {
  const TokenBucket global = global_policy(state.range(0));
  for (auto _ : state) {
    auto pool = std::make_shared<quota::redis::ConnectionPool>(
        quota::redis::ConnectionConfig{.host = "127.0.0.1", .port = server_port(), .deadline = 1s},
        kGateways + 2);
    const std::string prefix = "bench:gwglobal:" + std::to_string(::getpid()) + ":" +
                               std::to_string(quota::SteadyClock{}.now().count()) + ":";
    quota::redis::GatewayStore redis({.pool = pool, .prefix = prefix});
    quota::redis::RedisGrantLedger ledger(redis);
    auto rules = gw::RuleSet::create(spec(global, leased));
    if (!rules.ok()) {
      state.SkipWithError(std::string(rules.status().message()).c_str());
      return;
    }
    std::vector<std::unique_ptr<Process>> processes;
    for (int g = 0; g < kGateways; ++g) {
      processes.push_back(std::make_unique<Process>(redis, ledger, *rules, leased));
    }
    std::vector<std::vector<quota::verify::AdmittedEvent>> logs(kGateways);
    std::atomic<std::int64_t> decisions{0}, admitted{0}, errors{0};
    const std::int64_t calls_before = quota::bench::script_calls(*pool);
    quota::SteadyClock clock;
    const auto start = clock.now();
    const auto end = start + kRunFor;
    std::vector<std::thread> threads;
    for (int g = 0; g < kGateways; ++g) {
      threads.emplace_back([&, g] {
        Process& p = *processes[static_cast<std::size_t>(g)];
        std::vector<std::string> tenants;
        for (int i = g; i < kTenants; i += kGateways) tenants.push_back("t" + std::to_string(i));
        auto& log = logs[static_cast<std::size_t>(g)];
        log.reserve(1 << 20);
        std::int64_t n = 0, ok = 0, err = 0;
        for (std::size_t i = 0; clock.now() < end; ++i) {
          auto r = p.decide(
              {.who = {.tenant = tenants[i % tenants.size()], .plan = "free"}, .route = "read"},
              clock.now());
          ++n;
          if (!r.ok()) {
            ++err;
          } else if (r->decision.allowed) {
            ++ok;
            // Logged after the decision returned: a unit is never logged before it was
            // taken from a grant or from the authority.
            log.push_back({clock.now().count(), 1});
          }
        }
        decisions += n;
        admitted += ok;
        errors += err;
      });
    }
    for (auto& th : threads) th.join();
    const double seconds = std::chrono::duration<double>(clock.now() - start).count();
    const std::int64_t calls = quota::bench::script_calls(*pool) - calls_before;

    std::vector<quota::verify::AdmittedEvent> all;
    for (const auto& l : logs) all.insert(all.end(), l.begin(), l.end());
    std::stable_sort(all.begin(), all.end(),
                     [](const auto& a, const auto& b) { return a.time_ns < b.time_ns; });
    // Σ outstanding grants <= H·(units + low_water): each holder holds at most that.
    const std::int64_t grants_bound =
        leased ? kGateways * (kGlobalLease.units + kGlobalLease.low_water) : 0;
    auto bound = quota::verify::verify_token_bucket(all, global.rate, global.burst, grants_bound);
    auto plain = quota::verify::verify_token_bucket(all, global.rate, global.burst, 0);
    std::int64_t held = 0, listed = 0;
    if (leased) {
      for (auto& p : processes) {
        for (const gw::Holding& h : p->leased_backend.holdings(clock.now())) held += h.units;
      }
      auto grants = ledger.outstanding("{~global}read");
      if (grants.ok()) {
        for (const auto& g : *grants) listed += g.units;
      }
    }

    const double d = static_cast<double>(std::max<std::int64_t>(1, decisions));
    state.SetIterationTime(seconds);
    state.counters["decisions_per_second"] = static_cast<double>(decisions) / seconds;
    state.counters["admitted_per_second"] = static_cast<double>(admitted) / seconds;
    state.counters["round_trips_per_decision"] = static_cast<double>(calls) / d;
    state.counters["decisions_per_round_trip"] = calls > 0 ? d / static_cast<double>(calls) : 0.0;
    state.counters["grants_bound_units"] = static_cast<double>(grants_bound);
    state.counters["excess_units"] =
        bound.ok() ? static_cast<double>(bound->excess_micro()) / 1e6 : 1e18;
    state.counters["over_rT_B_units"] =
        plain.ok() ? static_cast<double>(plain->excess_micro()) / 1e6 : 1e18;
    state.counters["held_at_end_units"] = static_cast<double>(held);
    state.counters["listed_at_end_units"] = static_cast<double>(listed);
    state.counters["errors"] = static_cast<double>(errors);
    if (!bound.ok() || !bound->holds()) state.SkipWithError("the envelope did not hold");
  }
}

void BM_Global10kTenants8Gateways_NoLeases(benchmark::State& state) { run(state, false); }
void BM_Global10kTenants8Gateways_GlobalLeased(benchmark::State& state) { run(state, true); }
BENCHMARK(BM_Global10kTenants8Gateways_NoLeases)
    ->Arg(1'000'000)
    ->Arg(100'000)
    ->Iterations(1)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Global10kTenants8Gateways_GlobalLeased)
    ->Arg(1'000'000)
    ->Arg(100'000)
    ->Iterations(1)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
