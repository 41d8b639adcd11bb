// benchmarks/gateway_bench.cpp — ns per Gateway decision on the in-process stores, and
// heap allocations per decision.
//
// One hot tenant (plan "free", route "read", cost 1) on a warmed-up Gateway: every
// iteration is one `Gateway::decide` that is admitted (the clock advances 1 µs per
// decision and the buckets refill 10^6 units/s), with 1 level (tenant) or 3 levels
// (user, tenant, global). "short" ids keep every key and name within std::string's
// inline capacity (15 bytes in libstdc++); "long" ids (a 17-byte tenant, an 18-byte user)
// do not, to show what longer keys cost. BM_GatewayLimits: one tenant with 1 or 3
// named limits on the same scope, all paid by the route.
//
//   cmake --preset release -B build/release && cmake --build build/release --target gateway_bench
//   build/release/benchmarks/gateway_bench --benchmark_format=json
//
// Counters: allocs_per_decision = calls of the global operator new per decision, counted
// by the replacement operators below (this executable only).

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <new>
#include <string>

#include <benchmark/benchmark.h>

#include "quota/gateway/gateway.hpp"
#include "quota/policy/fixed_window.hpp"
#include "quota/store/local_store.hpp"
#include "quota/store/sharded_store.hpp"
// Counts allocations (it replaces the global operator new of this executable).
#include "support/count_new.hpp"

namespace {

using namespace std::chrono_literals;
using quota::Nanos;
using quota::TokenBucket;
using quota::gateway::Gateway;
using quota::gateway::KeyPolicy;
using quota::gateway::Level;
using quota::gateway::Request;
using quota::gateway::RuleRegistry;
using quota::gateway::RuleSet;
using quota::gateway::RuleSetSpec;

const TokenBucket kPolicy{.rate = {.units = 1'000'000, .per = 1s}, .burst = 1'000};

std::shared_ptr<const RuleSet> rules(bool three_levels) {
  RuleSetSpec spec{.version = 1, .routes = {{.name = "read", .cost = 1}}, .rules = {}};
  spec.rules.push_back({.level = Level::kTenant,
                        .plan = "free",
                        .route = "read",
                        .name = "free",
                        .policy = kPolicy});
  if (three_levels) {
    spec.rules.push_back({.level = Level::kUser,
                          .plan = "free",
                          .route = "read",
                          .name = "free-user",
                          .policy = kPolicy});
    spec.rules.push_back(
        {.level = Level::kGlobal, .route = "read", .name = "global", .policy = kPolicy});
  }
  auto set = RuleSet::create(std::move(spec));
  if (!set.ok()) std::abort();
  return *set;
}

// One `decide` of `req` per iteration, the clock 1 µs on each time, after 1000 to warm
// up (the keys exist, the store's tables are sized); counts allocations and denials.
void measure(benchmark::State& state, Gateway& gw, const Request& req) {
  std::int64_t now = 0;
  for (int i = 0; i < 1000; ++i) {
    now += 1000;
    if (!gw.decide(req, Nanos{now}).ok()) std::abort();
  }
  std::int64_t denied = 0;
  const std::int64_t allocs = quota::testing::allocations_in([&] {
    for (auto _ : state) {
      now += 1000;
      auto r = gw.decide(req, Nanos{now});
      if (!r.ok()) std::abort();
      denied += r->decision.allowed ? 0 : 1;
      benchmark::DoNotOptimize(r);
    }
  });
  state.counters["allocs_per_decision"] =
      benchmark::Counter(static_cast<double>(allocs) / static_cast<double>(state.iterations()));
  state.counters["denied"] = static_cast<double>(denied);
}

// args: [0] levels (1 or 3), [1] long ids (0/1).
template <class Store>
void BM_GatewayDecide(benchmark::State& state) {
  const bool three = state.range(0) == 3;
  const bool long_ids = state.range(1) != 0;
  RuleRegistry registry(rules(three));
  Store store;
  Gateway gw(store, registry);
  const Request req{.who = {.tenant = long_ids ? "tenant-0000000042" : "acme",
                            .plan = "free",
                            .user = !three     ? ""
                                    : long_ids ? "user-0000000000001"
                                               : "u1"},
                    .route = "read"};
  measure(state, gw, req);
}

void Args(benchmark::internal::Benchmark* b) {
  b->ArgNames({"levels", "long_ids"});
  for (std::int64_t levels : {1, 3}) {
    for (std::int64_t long_ids : {0, 1}) b->Args({levels, long_ids});
  }
}

BENCHMARK_TEMPLATE(BM_GatewayDecide, quota::LocalStore<KeyPolicy>)->Apply(Args);
BENCHMARK_TEMPLATE(BM_GatewayDecide, quota::ShardedStore<KeyPolicy>)->Apply(Args);

// One tenant's `limits` named limits (1: requests; 3: requests, tokens per minute, tokens
// per day — a token bucket and two fixed windows), shared by the route, which pays 1 on
// each: the cost of several limits on one scope.
std::shared_ptr<const RuleSet> limit_rules(int limits) {
  const char* names[] = {"requests", "tokens-min", "tokens-day"};
  RuleSetSpec spec{.version = 1, .routes = {{.name = "read"}}, .rules = {}};
  for (int i = 0; i < limits; ++i) {
    spec.routes[0].costs.push_back({.limit = names[i], .units = 1});
    const quota::gateway::RulePolicy policy =
        i == 0 ? quota::gateway::RulePolicy(kPolicy)
               : quota::gateway::RulePolicy(quota::FixedWindow{
                     .limit = 1'000'000'000, .window = i == 1 ? Nanos{1min} : Nanos{24h}});
    spec.rules.push_back({.level = Level::kTenant,
                          .plan = "free",
                          .name = names[i],
                          .policy = policy,
                          .limit = names[i]});
  }
  auto set = RuleSet::create(std::move(spec));
  if (!set.ok()) std::abort();
  return *set;
}

// args: [0] limits of the tenant (1 or 3).
template <class Store>
void BM_GatewayLimits(benchmark::State& state) {
  RuleRegistry registry(limit_rules(static_cast<int>(state.range(0))));
  Store store;
  Gateway gw(store, registry);
  const Request req{.who = {.tenant = "acme", .plan = "free"}, .route = "read"};
  measure(state, gw, req);
}

BENCHMARK_TEMPLATE(BM_GatewayLimits, quota::LocalStore<KeyPolicy>)
    ->ArgName("limits")
    ->Arg(1)
    ->Arg(3);
BENCHMARK_TEMPLATE(BM_GatewayLimits, quota::ShardedStore<KeyPolicy>)
    ->ArgName("limits")
    ->Arg(1)
    ->Arg(3);

}  // namespace

BENCHMARK_MAIN();
