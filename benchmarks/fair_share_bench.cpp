// benchmarks/fair_share_bench.cpp — the cost of FairShare's decisions against the number
// of tenants, in one binary so that the ratios come from one run:
//
//   BM_RequestExpire/N  one request of 1 unit by a random one of N tenants, then its expiry,
//                       above the share threshold (every tenant constrained): the per-
//                       request path, O(1) against the cached shares plus the tenant
//                       lookup (O(log N) in the map);
//   BM_Allocate/N       one allocate() over N tenants with reported demands: the
//                       once-per-period recomputation, O(N log N);
//
// at N = 10, 1,000 and 100,000. The ratio BM_RequestExpire/100000 : BM_RequestExpire/10
// shows what the request path pays for many tenants; BM_Allocate/N : BM_RequestExpire/N
// what one recomputation per request would cost.
//
//   cmake --preset release && cmake --build --preset release --target fair_share_bench -j1
//   build/release/benchmarks/fair_share_bench --benchmark_format=json

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include <benchmark/benchmark.h>

#include "quota/fair/fair_share.hpp"

namespace {

using quota::fair::FairShare;
using quota::fair::FairShareConfig;

constexpr std::int64_t kBudget = 1'000'000'000;

// N tenants, each reporting twice its equal part of the budget (so every one is
// constrained), and one allocation.
struct Fixture {
  explicit Fixture(std::int64_t n) : fs(*FairShareConfig{.budget = kBudget}.checked()) {
    for (std::int64_t i = 0; i < n; ++i) {
      names.push_back("tenant-" + std::to_string(i));
      (void)fs.report(names.back(), {.weight = 1 + i % 3, .demand = 2 * kBudget / n + 1});
    }
    (void)fs.allocate();
    std::mt19937_64 rng(7);
    for (int k = 0; k < (1 << 16); ++k) order.push_back(rng() % static_cast<std::uint64_t>(n));
  }
  FairShare fs;
  std::vector<std::string> names;
  std::vector<std::uint64_t> order;  // a fixed random sequence of tenants
};

void BM_RequestExpire(benchmark::State& state) {
  Fixture f(state.range(0));
  std::size_t k = 0;
  std::int64_t allowed = 0;
  for (auto _ : state) {
    const std::string& name = f.names[f.order[k++ & 0xffff]];
    auto d = f.fs.request(name, 1);
    allowed += d.ok() && d->allowed ? 1 : 0;
    benchmark::DoNotOptimize(f.fs.expire(name, 1));
  }
  state.counters["allowed_fraction"] =
      static_cast<double>(allowed) / static_cast<double>(state.iterations());
}
BENCHMARK(BM_RequestExpire)->Arg(10)->Arg(1'000)->Arg(100'000);

void BM_Allocate(benchmark::State& state) {
  Fixture f(state.range(0));
  for (auto _ : state) {
    auto a = f.fs.allocate();
    benchmark::DoNotOptimize(a);
  }
}
BENCHMARK(BM_Allocate)->Arg(10)->Arg(1'000)->Arg(100'000)->Unit(benchmark::kMicrosecond);

}  // namespace

BENCHMARK_MAIN();
