// benchmarks/gateway_attempts_bench.cpp — ns per Gateway decision with an attempt id, by
// how many live attempt records the in-process attempt cache holds, and the heap bytes
// each record costs.
//
// One tenant (plan "free", route "read", cost 1, tenant level only) on a
// `ShardedStore<KeyPolicy>`; every call is one `Gateway::decide` with a fresh 24-byte
// attempt id, so every call adds one record. The cache is held in a steady state at
// `live` records: max_attempts = live, attempt_ttl = live × 1 µs and the clock advancing
// 1 µs per call, so the oldest record expires exactly as the next one arrives. Before the
// timed loop the cache is filled to `live` (the fill is not timed). live = 0 means at most
// one record: the previous call's, expired at the next (ttl 1 µs, max_attempts 1). Every
// decision is admitted (10^6 units/s refill); an error aborts.
//
// The gateway for each `live` is built once and reused across the benchmark's runs (time
// and ids carry on), so the fill is paid once per row.
//
//   cmake --preset release && cmake --build build/release --target gateway_attempts_bench -j1
//   build/release/benchmarks/gateway_attempts_bench --benchmark_repetitions=10
//       --benchmark_min_time=0.2 --benchmark_report_aggregates_only=true
//       --benchmark_format=json      # the "_min" rows: see `least` below
//
// Counters: bytes_per_record = heap bytes in use (mallinfo2) after the fill minus before,
// over `live` (0 for live = 0); live_records = the cache's size after the run (the
// steady state held: it equals `live`, or 1 for live = 0); denied = denials (0).

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <benchmark/benchmark.h>

#include "quota/gateway/gateway.hpp"
#include "quota/store/sharded_store.hpp"
#include "support/keys.hpp"

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
using Store = quota::ShardedStore<KeyPolicy>;

constexpr std::int64_t kStepNs = 1'000;  // the clock per call

std::shared_ptr<const RuleSet> rules() {
  RuleSetSpec spec{.version = 1, .routes = {{.name = "read", .cost = 1}}, .rules = {}};
  spec.rules.push_back(
      {.level = Level::kTenant,
       .plan = "free",
       .route = "read",
       .name = "free",
       .policy = TokenBucket{.rate = {.units = 1'000'000, .per = 1s}, .burst = 1'000}});
  auto set = RuleSet::create(std::move(spec));
  if (!set.ok()) std::abort();
  return *set;
}

// A gateway whose attempt cache holds `live` records in a steady state, and the clock and
// id counter that carry on from one run of the benchmark to the next.
struct SteadyCache {
  explicit SteadyCache(std::int64_t live)
      : registry(rules()),
        gw(store, registry,
           {.attempt_ttl = Nanos{std::max<std::int64_t>(live, 1) * kStepNs},
            .max_attempts = static_cast<std::size_t>(std::max<std::int64_t>(live, 1))}) {}

  // One decide with a fresh id, the clock one step on; false on a denial.
  bool next() {
    now += kStepNs;
    std::snprintf(id, sizeof id, "attempt-%016llx", static_cast<unsigned long long>(++ids));
    auto r = gw.decide(
        {.who = {.tenant = "acme", .plan = "free"}, .route = "read", .attempt_id = id}, Nanos{now});
    if (!r.ok() || r->replayed) std::abort();
    return r->decision.allowed;
  }

  Store store;
  RuleRegistry registry;
  Gateway gw;
  std::int64_t now = 0;
  std::uint64_t ids = 0;
  char id[32] = {};
  double bytes_per_record = 0;
};

SteadyCache& steady_cache(std::int64_t live) {
  static std::map<std::int64_t, std::unique_ptr<SteadyCache>> caches;
  auto& c = caches[live];
  if (c == nullptr) {
    c = std::make_unique<SteadyCache>(live);
    for (int i = 0; i < 1000; ++i) c->next();  // the tenant's key and the tables exist
    const std::size_t before = quota::bench::heap_in_use();
    for (std::int64_t i = 0; i < live; ++i) c->next();
    const std::size_t after = quota::bench::heap_in_use();
    if (live > 0) {
      c->bytes_per_record =
          (static_cast<double>(after) - static_cast<double>(before)) / static_cast<double>(live);
    }
  }
  return *c;
}

// args: [0] live records.
void BM_DecideFreshAttempt(benchmark::State& state) {
  SteadyCache& c = steady_cache(state.range(0));
  std::int64_t denied = 0;
  for (auto _ : state) denied += c.next() ? 0 : 1;
  state.counters["bytes_per_record"] = c.bytes_per_record;
  state.counters["live_records"] = static_cast<double>(c.gw.attempts().size());
  state.counters["denied"] = static_cast<double>(denied);
}

// On a shared machine other work only ever adds time: the least of several repetitions
// is the closest to what the code costs ("_min", with --benchmark_repetitions).
double least(const std::vector<double>& v) { return *std::min_element(v.begin(), v.end()); }

BENCHMARK(BM_DecideFreshAttempt)
    ->ArgName("live")
    ->Arg(0)
    ->Arg(100'000)
    ->Arg(1'000'000)
    ->ComputeStatistics("min", least);

}  // namespace

BENCHMARK_MAIN();
