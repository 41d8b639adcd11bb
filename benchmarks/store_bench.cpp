// benchmarks/store_bench.cpp — ns per decision for LocalStore and ShardedStore, with the
// primitives they are built from measured beside them in the same run, so every figure
// has a ratio: a bare std::mutex-guarded increment, a std::atomic CAS loop, one
// steady_clock::now(), and a bare absl::flat_hash_map<std::string, …> lookup over the
// same 10^6 keys and the same access sequence.
//
//   bash cmake/run.sh bench          # or:
//   build/release/benchmarks/store_bench --benchmark_format=json
// The README's table (the "_min" rows, see `least` below):
//   build/release/benchmarks/store_bench --benchmark_repetitions=12
//       --benchmark_min_time=0.05 --benchmark_report_aggregates_only=true
//
// Counters: bytes_per_key = heap bytes the store holds per key (table slack included),
// measured with mallinfo2 around filling 10^6 keys; record_bytes = one key's record in
// the stores' arena (state, key size and the 10-byte key; the index adds 5 bytes per
// table position).

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include <benchmark/benchmark.h>

#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "quota/quota.hpp"
#include "support/keys.hpp"

namespace {

using quota::bench::heap_in_use;
using quota::bench::keys;
using quota::bench::kKeys;
using quota::bench::sequence;

using quota::Nanos;
using quota::TokenBucket;
using namespace std::chrono_literals;

// On a shared machine other work only ever adds time, so the least of several
// repetitions is the closest to what the code itself costs: every benchmark reports it as
// its "_min" aggregate (run with --benchmark_repetitions). For the rows with
// items_per_second, read the time: a statistic is taken of each field separately.
double least(const std::vector<double>& v) { return *std::min_element(v.begin(), v.end()); }

const TokenBucket kPolicy{.rate = {.units = 1'000'000, .per = 1s}, .burst = 1'000'000};

// ---- primitives --------------------------------------------------------------------

void BM_MutexIncrement(benchmark::State& state) {
  static std::mutex mu;
  static std::int64_t counter = 0;
  for (auto _ : state) {
    std::lock_guard<std::mutex> lock(mu);
    benchmark::DoNotOptimize(++counter);
  }
}
BENCHMARK(BM_MutexIncrement)->ComputeStatistics("min", least);

// absl::Mutex as Debian ships it (built without NDEBUG: deadlock detection on every
// lock). Shown for the choice in quota/detail/mutex.hpp.
void BM_AbslMutexIncrement(benchmark::State& state) {
  static absl::Mutex mu;
  static std::int64_t counter = 0;
  for (auto _ : state) {
    absl::MutexLock lock(&mu);
    benchmark::DoNotOptimize(++counter);
  }
}
BENCHMARK(BM_AbslMutexIncrement)->ComputeStatistics("min", least);

void BM_AtomicCasLoop(benchmark::State& state) {
  static std::atomic<std::int64_t> tokens{0};
  for (auto _ : state) {
    std::int64_t cur = tokens.load(std::memory_order_relaxed);
    while (!tokens.compare_exchange_weak(cur, cur + 1, std::memory_order_acq_rel)) {
    }
  }
}
BENCHMARK(BM_AtomicCasLoop)->ComputeStatistics("min", least);

void BM_SteadyClockNow(benchmark::State& state) {
  for (auto _ : state) benchmark::DoNotOptimize(std::chrono::steady_clock::now());
}
BENCHMARK(BM_SteadyClockNow)->ComputeStatistics("min", least);

void BM_FlatHashMapLookup_1M(benchmark::State& state) {
  absl::flat_hash_map<std::string, TokenBucket::State> map;
  for (const auto& k : keys()) map.try_emplace(k);
  const auto& seq = sequence();
  std::size_t i = 0;
  for (auto _ : state) {
    auto it = map.find(keys()[seq[i++ & (seq.size() - 1)]]);
    benchmark::DoNotOptimize(it->second.tokens += 1);
  }
}
BENCHMARK(BM_FlatHashMapLookup_1M)->ComputeStatistics("min", least);

// The same lookup followed by the token-bucket transition the stores run (time advancing
// 1 µs per decision as in BM_RandomKeys_1M): what a decision costs with no store
// overhead at all, so the stores' ratio splits into the policy's share and the store's.
void BM_FlatHashMapLookupAndPolicy_1M(benchmark::State& state) {
  absl::flat_hash_map<std::string, TokenBucket::State> map;
  for (const auto& k : keys()) map.try_emplace(k, kPolicy.init(Nanos{0}));
  const auto& seq = sequence();
  std::size_t i = 0;
  std::int64_t now = 0;
  for (auto _ : state) {
    now += 1000;
    auto it = map.find(keys()[seq[i++ & (seq.size() - 1)]]);
    benchmark::DoNotOptimize(kPolicy.apply(it->second, Nanos{now}, 1));
  }
}
BENCHMARK(BM_FlatHashMapLookupAndPolicy_1M)->ComputeStatistics("min", least);

// ---- stores ------------------------------------------------------------------------

template <template <quota::Policy> class Store>
void BM_HotKeySteadyClock(benchmark::State& state) {
  Store<TokenBucket> store;
  quota::SteadyClock clock;
  for (auto _ : state)
    benchmark::DoNotOptimize(store.apply(kPolicy, "tenant-7:read", clock.now(), 1));
}
BENCHMARK_TEMPLATE(BM_HotKeySteadyClock, quota::LocalStore)->ComputeStatistics("min", least);
BENCHMARK_TEMPLATE(BM_HotKeySteadyClock, quota::ShardedStore)->ComputeStatistics("min", least);

// The whole limiter: key check, clock read, store.
void BM_LimiterHotKey(benchmark::State& state) {
  auto limiter = quota::Limiter<TokenBucket>::create(kPolicy);
  for (auto _ : state) benchmark::DoNotOptimize(limiter->acquire("tenant-7:read", 1));
}
BENCHMARK(BM_LimiterHotKey)->ComputeStatistics("min", least);

// The same with a key the compiler cannot see through (a caller's string read at run
// time): no constant key length or bytes to fold into the lookup and the hash.
void BM_LimiterHotKeyOpaqueKey(benchmark::State& state) {
  auto limiter = quota::Limiter<TokenBucket>::create(kPolicy);
  std::string key = "tenant-7:read";
  for (auto _ : state) {
    benchmark::DoNotOptimize(key);
    benchmark::DoNotOptimize(limiter->acquire(key, 1));
  }
}
BENCHMARK(BM_LimiterHotKeyOpaqueKey)->ComputeStatistics("min", least);

// Random keys with time advancing by 1 µs per decision (no clock read, so the ratio to
// the bare lookup isolates what the store adds to the lookup).
template <template <quota::Policy> class Store>
void BM_RandomKeys_1M(benchmark::State& state) {
  const std::size_t before = heap_in_use();
  auto store = std::make_unique<Store<TokenBucket>>(quota::StoreOptions{.max_keys = 2 * kKeys});
  for (const auto& k : keys()) benchmark::DoNotOptimize(store->apply(kPolicy, k, Nanos{0}, 1));
  const std::size_t after = heap_in_use();
  const auto& seq = sequence();
  std::size_t i = 0;
  std::int64_t now = 0;
  for (auto _ : state) {
    now += 1000;
    benchmark::DoNotOptimize(
        store->apply(kPolicy, keys()[seq[i++ & (seq.size() - 1)]], Nanos{now}, 1));
  }
  state.counters["bytes_per_key"] = static_cast<double>(after - before) / kKeys;
  state.counters["record_bytes"] =
      quota::detail::KeyedStates<TokenBucket>::record_bytes(keys()[0].size());
}
BENCHMARK_TEMPLATE(BM_RandomKeys_1M, quota::LocalStore)->ComputeStatistics("min", least);
BENCHMARK_TEMPLATE(BM_RandomKeys_1M, quota::ShardedStore)->ComputeStatistics("min", least);

// What two threads can gain on this machine at all: private arithmetic and a clock read,
// no shared memory. The store's 2-thread scaling is judged against this, since on a
// shared or hyperthreaded 2-vCPU machine even this does not reach 2x.
void BM_Baseline_PrivateWork(benchmark::State& state) {
  quota::SteadyClock clock;
  std::uint64_t x = static_cast<std::uint64_t>(state.thread_index()) + 1;
  for (auto _ : state) {
    for (int i = 0; i < 8; ++i) x = x * 6364136223846793005ULL + 1442695040888963407ULL;
    benchmark::DoNotOptimize(x);
    benchmark::DoNotOptimize(clock.now());
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_Baseline_PrivateWork)
    ->Threads(1)
    ->Threads(2)
    ->UseRealTime()
    ->ComputeStatistics("min", least);

// Threads on distinct keys (each its own hot key) and on one shared key, with the steady
// clock. Compare items_per_second of threads:2 with threads:1.
void BM_Sharded_DistinctKeys(benchmark::State& state) {
  static quota::ShardedStore<TokenBucket> store;
  quota::SteadyClock clock;
  const std::string key = "tenant-" + std::to_string(state.thread_index()) + ":read";
  for (auto _ : state) benchmark::DoNotOptimize(store.apply(kPolicy, key, clock.now(), 1));
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_Sharded_DistinctKeys)
    ->Threads(1)
    ->Threads(2)
    ->UseRealTime()
    ->ComputeStatistics("min", least);

void BM_Sharded_OneKey(benchmark::State& state) {
  static quota::ShardedStore<TokenBucket> store;
  quota::SteadyClock clock;
  for (auto _ : state)
    benchmark::DoNotOptimize(store.apply(kPolicy, "tenant-0:read", clock.now(), 1));
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_Sharded_OneKey)
    ->Threads(1)
    ->Threads(2)
    ->UseRealTime()
    ->ComputeStatistics("min", least);

}  // namespace

BENCHMARK_MAIN();
