// benchmarks/c_interface_bench.cpp — ns per decision through the C interface
// (quota_decide, libquota_c.so) against the same decision through the C++ call it wraps.
//
// The same rules on both sides (kRules: one route, one tenant rule, a token bucket of
// 10^9 units refilled at 10^9/s, so every call is admitted), loaded by quota::rules into
// a Metrics as the C limiter loads them; the same store (ShardedStore<KeyPolicy>, 10^6
// keys, budgets full from the start: QUOTA_OPT_OUT_RESTART_SAFETY); the same 1,000
// tenants ("tenant-0000" ... "tenant-0999", plan "free", route "read") cycled, each
// thread from its own offset; the same times (QUOTA_REQUEST_NOW on the C side, each
// side's clock advancing 1 µs per call per thread). Both sides are built once per process
// and warmed with every tenant before the first run.
//   - C++: Gateway::decide(req, now); with http:1 then http::answer(decision, policy),
//     the rule's PolicyInfo described once (what a C++ host keeps);
//   - C: quota_decide(h, &r, &d, &e); with http:1 QUOTA_REQUEST_HTTP (the library finds
//     the deciding rule's policy and copies the header values into the decision).
// Paired: each iteration is a block of kBlock C++ calls and a block of kBlock C calls, in
// alternating order, the threads entering each block together, so that both sides are
// timed on the same (shared, noisy) machine within a millisecond of each other.
//
//   cmake -S . -B build/bench-c -DCMAKE_BUILD_TYPE=Release -DQUOTA_BUILD_SERVER=OFF
//         -DQUOTA_BUILD_TESTS=OFF   (one command)
//   cmake --build build/bench-c --target c_interface_bench -j1
//   build/bench-c/benchmarks/c_interface_bench --benchmark_repetitions=5
//
// Counters (over the threads' calls): cpp_ns and c_ns = ns per call of each side (each
// thread's wall time in its blocks); c_over_cpp = c_ns / cpp_ns (the target: <= 1.2);
// denied = denials (0). The Time column is per pair of blocks (2 × kBlock calls).

#include <atomic>
#include <barrier>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <benchmark/benchmark.h>

#include "absl/strings/str_format.h"
#include "quota/c/quota.h"
#include "quota/gateway/gateway.hpp"
#include "quota/gateway/metrics.hpp"
#include "quota/http.hpp"
#include "quota/rules/rule_file.hpp"
#include "quota/store/sharded_store.hpp"

namespace {

using quota::Nanos;

constexpr int kTenants = 1'000;
constexpr std::int64_t kStepNs = 1'000;
constexpr int kBlock = 256;  // calls of one side between two switches

constexpr std::string_view kRules =
    "version: 1\n"
    "routes:\n"
    "  - name: read\n"
    "rules:\n"
    "  - name: free-read\n"
    "    level: tenant\n"
    "    plan: free\n"
    "    route: read\n"
    "    token_bucket: {rate: 1000000000/1s, burst: 1000000000}\n";

const std::vector<std::string>& tenants() {
  static const auto* out = [] {
    auto* v = new std::vector<std::string>();
    for (int i = 0; i < kTenants; ++i) v->push_back(absl::StrFormat("tenant-%04d", i));
    return v;
  }();
  return *out;
}

// The C++ side: what Limiter (src/c/limiter.hpp) builds for an in-process store.
struct Cpp {
  quota::gateway::Metrics metrics;
  quota::ShardedStore<quota::gateway::KeyPolicy> store{
      quota::StoreOptions{.max_keys = 1'000'000, .assume_spent_at = Nanos::min()}};
  std::unique_ptr<quota::gateway::RuleRegistry> registry;
  std::unique_ptr<quota::gateway::Gateway> gateway;
  quota::http::PolicyInfo policy;

  Cpp() {
    auto rules = quota::rules::load_rules(kRules, "rules", &metrics);
    if (!rules.ok()) std::abort();
    registry = std::make_unique<quota::gateway::RuleRegistry>(*std::move(rules));
    gateway = std::make_unique<quota::gateway::Gateway>(store, *registry);
    auto info = quota::http::describe(
        "free-read", quota::TokenBucket{.rate = {1'000'000'000, std::chrono::seconds(1)},
                                        .burst = 1'000'000'000});
    if (!info.ok()) std::abort();
    policy = *info;
  }
};

Cpp& cpp() {
  static auto* c = [] {
    auto* c = new Cpp();
    for (const std::string& t : tenants()) {
      const quota::gateway::Request req{.who = {.tenant = t, .plan = "free"}, .route = "read"};
      if (!c->gateway->decide(req, Nanos{0}).ok()) std::abort();
    }
    return c;
  }();
  return *c;
}

// The C side: one limiter in process, opened once.
quota_handle c_limiter() {
  static const quota_handle h = [] {
    quota_config c{};
    c.size = sizeof c;
    c.rules_text = {kRules.data(), kRules.size()};
    c.store = QUOTA_STORE_IN_PROCESS;
    c.opt_out = QUOTA_OPT_OUT_RESTART_SAFETY;
    quota_error e{};
    e.size = sizeof e;
    quota_handle out = 0;
    if (quota_open(&c, &out, &e) != QUOTA_OK) {
      std::fprintf(stderr, "quota_open: %s\n", e.message);
      std::abort();
    }
    quota_request r{};
    r.size = sizeof r;
    r.plan = quota_s("free");
    r.route = quota_s("read");
    r.flags = QUOTA_REQUEST_NOW;
    quota_decision d{};
    d.size = sizeof d;
    for (const std::string& t : tenants()) {
      r.tenant = {t.data(), t.size()};
      if (quota_decide(out, &r, &d, &e) != QUOTA_OK) std::abort();
    }
    return out;
  }();
  return h;
}

// The calls of one side on one thread: its next tenant and time.
struct Cursor {
  std::size_t tenant = 0;
  std::int64_t now = 1'000'000'000;
  std::int64_t denied = 0;
};

// One block of kBlock calls of `call(tenant, now)` (true: admitted) on this thread's
// cursor; its wall time in ns.
template <class Call>
std::int64_t block(Cursor& c, Call&& call) {
  const auto& ts = tenants();
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < kBlock; ++i) {
    c.now += kStepNs;
    c.denied += call(ts[c.tenant], c.now) ? 0 : 1;
    if (++c.tenant == ts.size()) c.tenant = 0;
  }
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() -
                                                              start)
      .count();
}

// What the threads of one run add up (reset by thread 0 before the first barrier).
struct Totals {
  std::atomic<std::int64_t> cpp_ns{0}, c_ns{0}, calls{0}, denied{0};
};

// Args: [0] http (0/1). Each iteration is a block of kBlock C++ calls and a block of
// kBlock C calls, in alternating order, every thread in the same block at once (a
// barrier before each): both sides see the same machine, and with 2 threads the same
// contention.
void BM_Decide(benchmark::State& state) {
  const bool http = state.range(0) != 0;
  Cpp& cc = cpp();
  const quota_handle h = c_limiter();
  static std::barrier<> sync2(2);
  static Totals totals;
  const auto sync = [&] {
    if (state.threads() == 2) sync2.arrive_and_wait();
  };
  if (state.thread_index() == 0) {
    totals.cpp_ns = 0;
    totals.c_ns = 0;
    totals.calls = 0;
    totals.denied = 0;
  }
  sync();

  quota_request r{};
  r.size = sizeof r;
  r.plan = quota_s("free");
  r.route = quota_s("read");
  r.flags = QUOTA_REQUEST_NOW | (http ? QUOTA_REQUEST_HTTP : 0u);
  quota_decision d{};
  d.size = sizeof d;
  quota_error e{};
  e.size = sizeof e;
  const auto c_call = [&](const std::string& tenant, std::int64_t now) {
    r.tenant = {tenant.data(), tenant.size()};
    r.now_ns = now;
    if (quota_decide(h, &r, &d, &e) != QUOTA_OK) std::abort();
    benchmark::DoNotOptimize(d);
    return d.allowed == 1;
  };
  const auto cpp_call = [&](const std::string& tenant, std::int64_t now) {
    const quota::gateway::Request req{.who = {.tenant = tenant, .plan = "free"}, .route = "read"};
    auto res = cc.gateway->decide(req, Nanos{now});
    if (!res.ok()) std::abort();
    if (http) {
      quota::http::Answer a = quota::http::answer(res->decision, cc.policy);
      benchmark::DoNotOptimize(a);
    }
    benchmark::DoNotOptimize(res);
    return res->decision.allowed;
  };

  const std::size_t offset = static_cast<std::size_t>(state.thread_index()) * (kTenants / 2);
  Cursor on_cpp{.tenant = offset}, on_c{.tenant = offset};
  std::int64_t cpp_ns = 0, c_ns = 0, iterations = 0;
  for (auto _ : state) {
    const bool c_first = iterations++ % 2 == 1;
    for (int side = 0; side < 2; ++side) {
      sync();
      if ((side == 0) == c_first) {
        c_ns += block(on_c, c_call);
      } else {
        cpp_ns += block(on_cpp, cpp_call);
      }
    }
  }
  totals.cpp_ns += cpp_ns;
  totals.c_ns += c_ns;
  totals.calls += iterations * kBlock;
  totals.denied += on_cpp.denied + on_c.denied;
  sync();
  if (state.thread_index() != 0) return;
  const double calls = static_cast<double>(totals.calls.load());
  state.counters["cpp_ns"] = static_cast<double>(totals.cpp_ns.load()) / calls;
  state.counters["c_ns"] = static_cast<double>(totals.c_ns.load()) / calls;
  state.counters["c_over_cpp"] =
      static_cast<double>(totals.c_ns.load()) / static_cast<double>(totals.cpp_ns.load());
  state.counters["denied"] = static_cast<double>(totals.denied.load());
}

BENCHMARK(BM_Decide)->ArgName("http")->Arg(0)->Arg(1)->Threads(1)->Threads(2)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
