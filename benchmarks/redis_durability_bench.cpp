// benchmarks/redis_durability_bench.cpp — what durability across a failover costs
// (RedisStoreOptions::replicas): the same decisions with no WAIT and with `WAIT 1` after
// every write, against a master and a replica of this run's own on loopback (both
// started with cmake/redis_server.sh, the replica following the master). Rows, one
// thread each: one decision per round trip (d1) and 16 decisions per script call (b16);
// the ratio of the two rows of one shape is the price of WAIT.
//
//   build/release/benchmarks/redis_durability_bench --benchmark_format=json
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include <benchmark/benchmark.h>

#include "quota/policy/token_bucket.hpp"
#include "quota/redis/redis_store.hpp"
#include "support/redis_info.hpp"
#include "redis/support/redis_server.hpp"

namespace {

using namespace std::chrono_literals;
using quota::Nanos;
using quota::RedisStore;
using quota::TokenBucket;

// Generous: decisions are measured, not denials.
const TokenBucket kPolicy{.rate = {.units = 1'000'000, .per = 1s}, .burst = 1'000'000};

quota::redis::Reply must(absl::StatusOr<quota::redis::Reply> r, const char* what) {
  if (!r.ok()) {
    std::fprintf(stderr, "redis_durability_bench: %s: %s\n", what, r.status().ToString().c_str());
    std::exit(2);
  }
  return *std::move(r);
}

// A master and a replica following it, started on first use and stopped at exit; the
// master's port. Exits when the replica does not acknowledge a write within 10 s.
int master_port() {
  static const int port = [] {
    static quota::testing::ScratchServer master(quota::testing::scratch_dir("quota-bench-master"));
    static quota::testing::ScratchServer replica(quota::testing::scratch_dir("quota-bench-replica"));
    if (!master.started() || !replica.started()) {
      std::fprintf(stderr, "redis_durability_bench: could not start redis-server\n");
      std::exit(2);
    }
    quota::redis::Connection m(quota::bench::loopback(master.port()));
    quota::redis::Connection r(quota::bench::loopback(replica.port()));
    must(m.command({"CONFIG", "SET", "repl-diskless-sync-delay", "0"}), "CONFIG SET");
    const std::string mport = std::to_string(master.port());
    must(r.command({"REPLICAOF", "127.0.0.1", mport}), "REPLICAOF");
    // Following once it acknowledges a write of this connection (after its first report
    // to the master, within about a second of its synchronization).
    for (int i = 0; i < 100; ++i) {
      const std::string n = std::to_string(i);
      must(m.command({"SET", "durability-probe", n}), "SET");
      auto acks = must(m.command({"WAIT", "1", "100"}), "WAIT");
      if (acks->type == REDIS_REPLY_INTEGER && acks->integer >= 1) return master.port();
    }
    std::fprintf(stderr, "redis_durability_bench: the replica acknowledged nothing\n");
    std::exit(2);
  }();
  return port;
}

std::unique_ptr<RedisStore<TokenBucket>> store(int replicas) {
  static int runs = 0;
  return std::make_unique<RedisStore<TokenBucket>>(quota::RedisStoreOptions{
      .pool =
          std::make_shared<quota::redis::ConnectionPool>(quota::bench::loopback(master_port()), 1),
      .prefix = "bench:" + std::to_string(++runs) + ":",
      .replicas = replicas,
      .replica_timeout = 1000ms});
}

// One decision per round trip; replicas = state.range(0).
void BM_Decision(benchmark::State& state) {
  auto s = store(static_cast<int>(state.range(0)));
  std::int64_t i = 0;
  for (auto _ : state) {
    auto d = s->apply(kPolicy, "{tenant-" + std::to_string(i++ % 1000) + "}read", Nanos{0}, 1);
    if (!d.ok() || !d->allowed) {
      state.SkipWithError(d.ok() ? "denied" : std::string(d.status().message()).c_str());
      return;
    }
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_Decision)
    ->Arg(0)
    ->Arg(1)
    ->ArgName("replicas")
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);

// 16 decisions per script call (apply_batch): time per call; items_per_second counts
// decisions.
void BM_Batch16(benchmark::State& state) {
  auto s = store(static_cast<int>(state.range(0)));
  std::vector<std::string> keys;
  for (int k = 0; k < 16; ++k) keys.push_back("{tenant-1}route-" + std::to_string(k));
  std::vector<RedisStore<TokenBucket>::BatchItem> items;
  for (const auto& k : keys) items.push_back({.key = k, .cost = 1});
  for (auto _ : state) {
    auto r = s->apply_batch(kPolicy, items, Nanos{0});
    if (!r.ok() || !(*r)[0].ok()) {
      state.SkipWithError("batch failed");
      return;
    }
  }
  state.SetItemsProcessed(state.iterations() * 16);
}
BENCHMARK(BM_Batch16)
    ->Arg(0)
    ->Arg(1)
    ->ArgName("replicas")
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);

}  // namespace

BENCHMARK_MAIN();
