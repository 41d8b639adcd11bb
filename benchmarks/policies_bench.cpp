// benchmarks/policies_bench.cpp — ns per decision for the four policies side by side
// (TokenBucket, FixedWindow, SlidingLog, SlidingWindowEstimate), all through LocalStore,
// in one binary so that the ratios come from one run:
//
//   BM_HotKey<P>/N        one key, offered load twice the limit (one request of cost 1
//                         every W/2N), so about half the decisions are denials;
//   BM_ManyKeys<P>/N      10^6 keys, one random key per decision (the same sequence for
//                         every policy), time advancing 1 µs per decision;
//   BM_SlidingLogDenyBig  a full log of N unit events denying a request of cost N/2:
//                         the galloping search for the retry time (O(log N));
//
// with the window policies and the token bucket at N = 1,000 and SlidingLog also at
// N = 100,000, where an exact log gets expensive (W = 1 s; TokenBucket: burst N,
// rate N per W).
//
//   cmake --preset release -B build/release && cmake --build build/release --target policies_bench
//   build/release/benchmarks/policies_bench --benchmark_format=json
//
// Counters: bytes_per_key = heap bytes held per key after 10^6 keys each admitted one
// request (table slack and the SlidingLog ring included; mallinfo2 around the fill);
// state_bytes = sizeof(P::State); for the hot SlidingLog key, ring_bytes_per_event =
// heap bytes of its ring / ring slots, and key_bytes = sizeof(State) + its ring once
// the log is full (N events in the window).

#include <chrono>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include <benchmark/benchmark.h>

#include "quota/policy/fixed_window.hpp"
#include "quota/policy/sliding_log.hpp"
#include "quota/policy/sliding_window_estimate.hpp"
#include "quota/policy/token_bucket.hpp"
#include "quota/store/local_store.hpp"
#include "support/keys.hpp"

namespace {

using quota::bench::heap_in_use;
using quota::bench::keys;
using quota::bench::kKeys;
using quota::bench::sequence;

using quota::Nanos;
using namespace std::chrono_literals;

constexpr Nanos kWindow = 1s;

template <class P>
P make_policy(std::int64_t n) {
  if constexpr (std::is_same_v<P, quota::TokenBucket>) {
    return quota::TokenBucket{.rate = {.units = n, .per = kWindow}, .burst = n};
  } else {
    return P{.limit = n, .window = kWindow};
  }
}

template <class P>
void BM_HotKey(benchmark::State& state) {
  const std::int64_t n = state.range(0);
  const P policy = make_policy<P>(n);
  if (!policy.validate().ok()) {
    state.SkipWithError("invalid policy");
    return;
  }
  quota::LocalStore<P> store;
  const std::int64_t step = kWindow.count() / (2 * n);  // offered load = twice the limit
  std::int64_t now = 0;
  std::int64_t admitted = 0;
  for (auto _ : state) {
    now += step;
    const auto d = store.apply(policy, "tenant-7:read", Nanos{now}, 1);
    admitted += d->allowed ? 1 : 0;
    benchmark::DoNotOptimize(d);
  }
  state.counters["admitted_fraction"] =
      static_cast<double>(admitted) / static_cast<double>(state.iterations());
  state.counters["state_bytes"] = static_cast<double>(sizeof(typename P::State));
  if constexpr (std::is_same_v<P, quota::SlidingLog>) {
    // A key whose log is full: N events in the window.
    const std::size_t before = heap_in_use();
    auto s = policy.init(Nanos{0});
    for (std::int64_t i = 0; i < n; ++i) policy.apply(s, Nanos{i}, 1);
    const std::size_t ring = heap_in_use() - before;
    state.counters["ring_slots"] = static_cast<double>(s.capacity());
    state.counters["ring_bytes_per_event"] =
        static_cast<double>(ring) / static_cast<double>(s.capacity());
    state.counters["key_bytes"] = static_cast<double>(sizeof(s) + ring);
  }
}

template <class P>
void BM_ManyKeys(benchmark::State& state) {
  const std::int64_t n = state.range(0);
  const P policy = make_policy<P>(n);
  const auto& k = keys();
  const auto& seq = sequence();
  const std::size_t before = heap_in_use();
  std::size_t bytes = 0;
  {
    quota::LocalStore<P> store;
    std::int64_t now = 0;
    for (std::size_t i = 0; i < kKeys; ++i) {
      now += 1'000;
      benchmark::DoNotOptimize(store.apply(policy, k[i], Nanos{now}, 1));
    }
    bytes = heap_in_use() - before;
    std::size_t i = 0;
    for (auto _ : state) {
      now += 1'000;
      const auto d = store.apply(policy, k[seq[i]], Nanos{now}, 1);
      benchmark::DoNotOptimize(d);
      if (++i == seq.size()) i = 0;
    }
  }
  state.counters["bytes_per_key"] = static_cast<double>(bytes) / static_cast<double>(kKeys);
  state.counters["state_bytes"] = static_cast<double>(sizeof(typename P::State));
}

void BM_SlidingLogDenyBig(benchmark::State& state) {
  const std::int64_t n = state.range(0);
  const quota::SlidingLog policy{.limit = n, .window = kWindow};
  auto s = policy.init(Nanos{0});
  for (std::int64_t i = 0; i < n; ++i) policy.apply(s, Nanos{i}, 1);
  for (auto _ : state) {
    const auto d = policy.apply(s, Nanos{n}, n / 2);
    benchmark::DoNotOptimize(d);
  }
}

constexpr std::int64_t kSmall = 1'000;
constexpr std::int64_t kLarge = 100'000;
constexpr std::int64_t kManyIterations = 2'000'000;

BENCHMARK_TEMPLATE(BM_HotKey, quota::TokenBucket)->Arg(kSmall);
BENCHMARK_TEMPLATE(BM_HotKey, quota::FixedWindow)->Arg(kSmall);
BENCHMARK_TEMPLATE(BM_HotKey, quota::SlidingWindowEstimate)->Arg(kSmall);
BENCHMARK_TEMPLATE(BM_HotKey, quota::SlidingLog)->Arg(kSmall)->Arg(kLarge);
BENCHMARK_TEMPLATE(BM_ManyKeys, quota::TokenBucket)->Arg(kSmall)->Iterations(kManyIterations);
BENCHMARK_TEMPLATE(BM_ManyKeys, quota::FixedWindow)->Arg(kSmall)->Iterations(kManyIterations);
BENCHMARK_TEMPLATE(BM_ManyKeys, quota::SlidingWindowEstimate)
    ->Arg(kSmall)
    ->Iterations(kManyIterations);
BENCHMARK_TEMPLATE(BM_ManyKeys, quota::SlidingLog)
    ->Arg(kSmall)
    ->Arg(kLarge)
    ->Iterations(kManyIterations);
BENCHMARK(BM_SlidingLogDenyBig)->Arg(kSmall)->Arg(kLarge);

}  // namespace

BENCHMARK_MAIN();
