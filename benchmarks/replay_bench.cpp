// replay_bench — what quota_replay does per request: a CSV trace line read
// (quota/testing/trace.hpp), decided by a Gateway in virtual time over a 3-level rule set
// (user, tenant, global), and every budget it paid fed to its key's envelope verifier
// (quota/testing/replay.hpp). The trace is 1,000,000 requests of 1,000 tenants × 10 users,
// 1 ms apart, in memory (fmemopen): items_per_second is requests per second of the whole
// path. Target: at least 1,000,000 (docs/benchmarks.md). The verifiers' memory is one per
// key (11,001 keys), whatever the trace's length.
//
//   build/release/benchmarks/replay_bench --benchmark_repetitions=3
#include <benchmark/benchmark.h>

#include <chrono>
#include <cstdio>
#include <string>

#include "absl/strings/str_cat.h"
#include "quota/store/local_store.hpp"
#include "quota/testing/replay.hpp"
#include "quota/testing/trace.hpp"

namespace {

using namespace std::chrono_literals;
namespace gw = quota::gateway;

constexpr int kRequests = 1'000'000;

std::shared_ptr<const gw::RuleSet> three_levels() {
  gw::RuleSetSpec s;
  s.version = 1;
  s.routes = {{.name = "read"}};
  const quota::TokenBucket bucket{.rate = {1'000'000, 1s}, .burst = 1'000'000};
  s.rules.push_back({.level = gw::Level::kUser,
                     .plan = "free",
                     .route = "read",
                     .name = "user",
                     .policy = bucket});
  s.rules.push_back({.level = gw::Level::kTenant,
                     .plan = "free",
                     .route = "read",
                     .name = "tenant",
                     .policy = bucket});
  s.rules.push_back(
      {.level = gw::Level::kGlobal,
       .route = "read",
       .name = "global",
       .policy = quota::TokenBucket{.rate = {1'000'000'000, 1s}, .burst = 1'000'000'000}});
  return *gw::RuleSet::create(s);
}

const std::string& trace_csv() {
  static const std::string text = [] {
    std::string out = "time_ns,tenant,plan,user,route\n";
    for (int i = 0; i < kRequests; ++i) {
      absl::StrAppend(&out, static_cast<std::int64_t>(i) * 1'000'000, ",t", i % 1000, ",free,u",
                      i % 10, ",read\n");
    }
    return out;
  }();
  return text;
}

void BM_ReplayCsvThreeLevels(benchmark::State& state) {
  const std::string& csv = trace_csv();
  std::int64_t requests = 0;
  for (auto _ : state) {
    const auto rules = three_levels();
    quota::LocalStore<gw::KeyPolicy> store;
    gw::RuleRegistry registry(rules);
    gw::Gateway g(store, registry);
    quota::testing::EnvelopeBook book(rules);
    std::FILE* f = fmemopen(const_cast<char*>(csv.data()), csv.size(), "r");
    quota::testing::TraceReader in(f, "trace");
    for (;;) {
      auto next = in.next();
      if (!next.ok() || *next == nullptr) break;
      const quota::testing::TraceRequest& r = **next;
      auto d = g.decide(quota::testing::to_request(r), r.time);
      if (!d.ok() || !book.record(r, d, static_cast<std::uint64_t>(in.line())).ok()) {
        state.SkipWithError("a request failed");
        break;
      }
      ++requests;
    }
    std::fclose(f);
    const auto verdicts = book.verdicts();
    if (verdicts.size() != 3 || !verdicts[0].holds) state.SkipWithError("unexpected verdicts");
    benchmark::DoNotOptimize(verdicts);
  }
  state.SetItemsProcessed(requests);
}

BENCHMARK(BM_ReplayCsvThreeLevels)->Unit(benchmark::kMillisecond)->Iterations(1);

}  // namespace

BENCHMARK_MAIN();
