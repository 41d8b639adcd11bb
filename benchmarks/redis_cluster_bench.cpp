// benchmarks/redis_cluster_bench.cpp — the Redis store on a 3-master Redis Cluster:
// decisions per second and server CPU per decision for single calls against batches
// pipelined per node.
//
//   single     RedisStore::apply: one EVALSHA, one round trip per decision
//   many/N     apply_pipelined of N decisions: one pipelined write per node (up to 3),
//              every node written before any reply is read
//   batch/N    apply_batch of N decisions: one EVALSHA per slot (a script may only
//              declare keys of one slot), the calls pipelined per node like many/N
// each with 1, 8 and 32 client threads (one connection per node each), keys drawn at
// random from 10,000 tenants ("{tenant-i}read": 10,000 slots spread over the 3 nodes);
// and FewTenants: apply_pipelined (batch:0) against apply_batch (batch:1) when a batch
// holds several keys per slot (8 tenants x 16 routes), 8 threads.
//
// Counters: decisions_per_second; server_cpu_us_per_decision (user + system CPU of the
// three redis-server processes, INFO cpu, over the run — what the nodes spend on
// reading, parsing, running and replying); server_script_us_per_decision (INFO
// commandstats usec of EVALSHA/EVAL only); p50_us / p99_us per call; writes_per_call
// (pipelined writes of batches, ClusterPool::pipelines); errors.
//
//   build/release/benchmarks/redis_cluster_bench [--seconds S] [--benchmark_format=json]
//
// Starts its own cluster with cmake/redis_cluster.sh (on free loopback ports, under
// /tmp/quota-cluster-bench-<pid>) and stops it at exit; or uses the cluster whose ports
// are in $QUOTA_REDIS_CLUSTER_DIR/ports (one a line), as the tests' fixture writes them.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <benchmark/benchmark.h>

#include "absl/flags/flag.h"
#include "common/cli.hpp"
#include "quota/policy/token_bucket.hpp"
#include "quota/redis/redis_store.hpp"
#include "quota/redis/transport/cluster.hpp"
#include "support/client_threads.hpp"
#include "support/redis_info.hpp"

namespace {

using namespace std::chrono_literals;
using quota::Nanos;
using quota::RedisStore;
using quota::TokenBucket;
using quota::bench::loopback;
using Item = RedisStore<TokenBucket>::BatchItem;

double g_seconds = 1.5;
constexpr int kTenants = 10'000;
const TokenBucket kPolicy{.rate = {.units = 1'000'000, .per = 1s}, .burst = 1'000'000};

class Cluster {
 public:
  Cluster() {
    if (const char* d = std::getenv("QUOTA_REDIS_CLUSTER_DIR"); d != nullptr && *d != '\0') {
      read_ports(d);
      return;
    }
    const auto root = std::filesystem::path(__FILE__).parent_path().parent_path();
    script_ = (root / "cmake" / "redis_cluster.sh").string();
    dir_ = (std::filesystem::temp_directory_path() /
            ("quota-cluster-bench-" + std::to_string(::getpid())))
               .string();
    if (std::system(("bash '" + script_ + "' start '" + dir_ + "' >/dev/null").c_str()) != 0) {
      std::fprintf(stderr, "redis_cluster_bench: could not start a cluster (see %s)\n",
                   dir_.c_str());
      stop();
      std::exit(2);
    }
    read_ports(dir_);
  }
  ~Cluster() { stop(); }
  Cluster(const Cluster&) = delete;
  Cluster& operator=(const Cluster&) = delete;

  const std::vector<int>& ports() const { return ports_; }

 private:
  void read_ports(const std::string& dir) {
    std::ifstream in(dir + "/ports");
    int p = 0;
    while (in >> p) ports_.push_back(p);
    if (ports_.empty()) {
      std::fprintf(stderr, "redis_cluster_bench: no ports in %s/ports\n", dir.c_str());
      std::exit(2);
    }
  }
  void stop() {
    if (script_.empty()) return;
    if (std::system(("bash '" + script_ + "' stop '" + dir_ + "' >/dev/null 2>&1").c_str()) != 0) {
      std::fprintf(stderr, "redis_cluster_bench: could not stop the cluster in %s\n", dir_.c_str());
    }
    std::filesystem::remove_all(dir_);
    script_.clear();
  }

  std::string script_, dir_;
  std::vector<int> ports_;
};

Cluster& cluster() {
  static Cluster c;
  return c;
}

const std::vector<std::string>& keys() {
  static const std::vector<std::string> k = [] {
    std::vector<std::string> v;
    for (int i = 0; i < kTenants; ++i) v.push_back("{tenant-" + std::to_string(i) + "}read");
    return v;
  }();
  return k;
}

// What the nodes have spent since `reset`: CPU seconds (INFO cpu) and script usec
// (INFO commandstats).
struct ServerUse {
  double cpu_s = 0;
  double script_us = 0;
};

ServerUse server_use() {
  ServerUse u;
  for (int port : cluster().ports()) {
    quota::redis::Connection c(loopback(port));
    auto r = c.command({"INFO", "all"});
    if (!r.ok() || (*r)->type != REDIS_REPLY_STRING) continue;
    const std::string info(quota::redis::reply_string(**r));
    u.cpu_s += quota::bench::info_cpu_seconds(info);
    u.script_us += quota::bench::info_script_usec(info);
  }
  return u;
}

void reset_stats() {
  for (int port : cluster().ports()) {
    quota::redis::Connection c(loopback(port));
    (void)c.command({"CONFIG", "RESETSTAT"});
  }
}

// Runs `threads` threads for g_seconds (quota::bench::run_threads, closed loop); each
// call of `one(rng)` makes `per_call` decisions and returns how many of them failed.
// Reports the counters.
void run(benchmark::State& state, int threads, int per_call,
         const std::shared_ptr<quota::redis::ClusterPool>& pool,
         const std::function<std::int64_t(std::mt19937_64&)>& one) {
  // Warm: map, scripts on every node, connections.
  {
    std::mt19937_64 rng(99);
    for (int i = 0; i < 4 * threads; ++i) (void)one(rng);
  }
  reset_stats();
  const ServerUse before = server_use();
  const auto writes0 = pool->pipelines();
  quota::bench::ThreadsRun r = quota::bench::run_threads(
      threads, g_seconds, [&](int, std::mt19937_64& rng) { return one(rng); }, 0, 1 << 16);
  const ServerUse after = server_use();
  const quota::bench::Latency lat = quota::bench::latency_of(r.latency_us);
  const double decisions = static_cast<double>(r.calls) * per_call;
  state.SetIterationTime(r.elapsed_s);
  state.counters["decisions_per_second"] = decisions / r.elapsed_s;
  state.counters["server_cpu_us_per_decision"] = (after.cpu_s - before.cpu_s) * 1e6 / decisions;
  state.counters["server_script_us_per_decision"] = after.script_us / decisions;
  state.counters["p50_us"] = lat.p50_us;
  state.counters["p99_us"] = lat.p99_us;
  state.counters["writes_per_call"] =
      static_cast<double>(pool->pipelines() - writes0) / static_cast<double>(r.calls);
  state.counters["errors"] = static_cast<double>(r.errors);
  state.counters["threads"] = threads;
}

std::shared_ptr<quota::redis::ClusterPool> make_pool(int threads) {
  return std::make_shared<quota::redis::ClusterPool>(loopback(cluster().ports().front()),
                                                     static_cast<std::size_t>(threads));
}

RedisStore<TokenBucket> make_store(std::shared_ptr<quota::redis::ClusterPool> pool) {
  quota::RedisStoreOptions opts;
  opts.prefix = "cbench:";
  opts.cluster = std::move(pool);
  return RedisStore<TokenBucket>(opts);
}

const std::string& random_key(std::mt19937_64& rng) { return keys()[rng() % keys().size()]; }

// n items of cost 1, each a key drawn from `from`.
std::vector<Item> random_items(std::mt19937_64& rng, int n, const std::vector<std::string>& from) {
  std::vector<Item> items;
  items.reserve(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) items.push_back({from[rng() % from.size()], 1});
  return items;
}

// The items apply_pipelined or apply_batch left undecided (errors), or all n when the call
// failed.
std::int64_t many_errors(const absl::StatusOr<std::vector<absl::StatusOr<quota::Decision>>>& r,
                         int n) {
  if (!r.ok()) return n;
  return std::count_if(r->begin(), r->end(), [](const auto& d) { return !d.ok(); });
}

// args: threads
void BM_Cluster_Single(benchmark::State& state) {
  const int threads = static_cast<int>(state.range(0));
  for (auto _ : state) {
    auto pool = make_pool(threads);
    auto store = make_store(pool);
    run(state, threads, 1, pool, [&](std::mt19937_64& rng) -> std::int64_t {
      return store.apply(kPolicy, random_key(rng), Nanos{0}, 1).ok() ? 0 : 1;
    });
  }
}

// Runs calls of n decisions of cost 1, keys drawn from `from`, through apply_batch
// (`batch`) or apply_pipelined, on a fresh pool and store.
void run_items(benchmark::State& state, int n, int threads, bool batch,
               const std::vector<std::string>& from) {
  for (auto _ : state) {
    auto pool = make_pool(threads);
    auto store = make_store(pool);
    run(state, threads, n, pool, [&](std::mt19937_64& rng) -> std::int64_t {
      const std::vector<Item> items = random_items(rng, n, from);
      if (batch) return many_errors(store.apply_batch(kPolicy, items, Nanos{0}), n);
      return many_errors(store.apply_pipelined(kPolicy, items, Nanos{0}), n);
    });
  }
}

// args: decisions per call, threads
void BM_Cluster_Many(benchmark::State& state) {
  run_items(state, static_cast<int>(state.range(0)), static_cast<int>(state.range(1)), false,
            keys());
}

void BM_Cluster_Batch(benchmark::State& state) {
  run_items(state, static_cast<int>(state.range(0)), static_cast<int>(state.range(1)), true,
            keys());
}

// Few tenants, many routes each: 8 tenants x 16 routes ("{hot-t}route-r"), so a batch
// has several keys per slot and apply_batch decides several of them per EVALSHA.
// args: decisions per call, threads; range(2): 1 = apply_batch, 0 = apply_pipelined.
void BM_Cluster_FewTenants(benchmark::State& state) {
  std::vector<std::string> hot;
  for (int t = 0; t < 8; ++t) {
    for (int r = 0; r < 16; ++r) {
      hot.push_back("{hot-" + std::to_string(t) + "}route-" + std::to_string(r));
    }
  }
  run_items(state, static_cast<int>(state.range(0)), static_cast<int>(state.range(1)),
            state.range(2) != 0, hot);
}

BENCHMARK(BM_Cluster_Single)
    ->ArgName("threads")
    ->Arg(1)
    ->Arg(8)
    ->Arg(32)
    ->Iterations(1)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);
// The rows of many/N and batch/N: n 16 and 64, each with 1, 8 and 32 threads.
void ManyRows(benchmark::internal::Benchmark* b) {
  b->ArgNames({"n", "threads"})
      ->ArgsProduct({{16, 64}, {1, 8, 32}})
      ->Iterations(1)
      ->UseManualTime()
      ->Unit(benchmark::kMillisecond);
}
BENCHMARK(BM_Cluster_Many)->Apply(ManyRows);
BENCHMARK(BM_Cluster_Batch)->Apply(ManyRows);

BENCHMARK(BM_Cluster_FewTenants)
    ->ArgNames({"n", "threads", "batch"})
    ->ArgsProduct({{16, 64}, {8}, {0, 1}})
    ->Iterations(1)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);

}  // namespace

ABSL_FLAG(double, seconds, 1.5, "how long each row runs, seconds");

namespace {

constexpr const char* kUsage = R"(usage: redis_cluster_bench [--seconds S] [--benchmark_...]

RedisStore on a Redis Cluster of its own (cmake/redis_cluster.sh, on loopback).

  --seconds S        how long each row runs, in (0, 3600] seconds (default 1.5)
  --benchmark_*      google-benchmark's own flags (--benchmark_filter=REGEX,
                     --benchmark_format=console|json|csv, --benchmark_out=FILE, ...)
  --help             this text
)";

}  // namespace

int main(int argc, char** argv) {
  // --seconds is ours (common/cli.hpp); the --benchmark_* flags go to google-benchmark.
  auto cli = quota::cli::parse({.name = "redis_cluster_bench",
                                .usage = kUsage,
                                .checks = {quota::cli::real("seconds", 1e-3, 3600)},
                                .benchmark_flags = true},
                               argc, argv);
  g_seconds = absl::GetFlag(FLAGS_seconds);
  std::vector<char*>& args = cli.benchmark;
  int n = static_cast<int>(args.size());
  benchmark::Initialize(&n, args.data());
  if (benchmark::ReportUnrecognizedArguments(n, args.data())) return 2;
  std::printf("redis cluster on 127.0.0.1 ports");
  for (int p : cluster().ports()) std::printf(" %d", p);
  std::printf(", %.1f s per row, %d tenants, token bucket\n", g_seconds, kTenants);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
