// benchmarks/gateway_settle_redis_bench.cpp — what one Gateway::settle costs: settles per
// second and CPU per settle, in process and with the budgets and tickets in Redis.
//
// One tenant level (plan "free", route "chat", a token bucket of 10^9 units refilled at
// 10^9/s: every estimate is admitted), estimates of 100 units settled with actual 40 (a
// surplus of 60 given back). Tickets are made in batches of 256 outside the timed part
// (acquire_estimate), then the batch is settled inside it, one settle after the other on
// one thread:
//   BM_SettleInProcess  a LocalStore and the Gateway's own TicketBook (tickets kept 1 ms
//                       on a clock that moves 1 µs per call, so the book stays small);
//                       CPU per settle is this process's (google-benchmark's cpu_time);
//   BM_SettleRedis      a GatewayStore and a RedisTickets on a redis-server this program
//                       starts on a free loopback port: each settle takes the ticket, gives
//                       the surplus back and closes the ticket — three script calls;
//   BM_DecideRedis      the yardstick in the same run: one 1-unit Gateway::decide on the
//                       same budget (one script call).
// Counters of the Redis rows, per settle (or decision): server_cpu_us_per_call (INFO cpu,
// the server process's user+sys, read before and after each timed batch),
// server_script_us_per_call (INFO commandstats: time inside the scripts) and
// script_calls_per_call. items_per_second is settles (decisions) per second.
//
//   cmake --preset release && cmake --build build/release --target gateway_settle_redis_bench
//   build/release/benchmarks/gateway_settle_redis_bench --benchmark_format=json
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include <benchmark/benchmark.h>

#include "quota/gateway/gateway.hpp"
#include "quota/redis/gateway_store.hpp"
#include "quota/redis/tickets.hpp"
#include "quota/store/local_store.hpp"
#include "redis/support/redis_server.hpp"
#include "support/redis_info.hpp"

namespace {

using namespace std::chrono_literals;
using quota::Nanos;
using quota::gateway::Gateway;
using quota::gateway::RuleRegistry;
using quota::gateway::TicketId;

constexpr int kBatch = 256;
constexpr std::int64_t kEstimate = 100, kActual = 40;

std::shared_ptr<const quota::gateway::RuleSet> rules() {
  quota::gateway::RuleSetSpec spec{.version = 1, .routes = {{.name = "chat"}}, .rules = {}};
  spec.rules.push_back(
      {.level = quota::gateway::Level::kTenant,
       .plan = "free",
       .route = "chat",
       .name = "tokens",
       .policy = quota::TokenBucket{.rate = {1'000'000'000, 1s}, .burst = 1'000'000'000}});
  auto set = quota::gateway::RuleSet::create(spec);
  if (!set.ok()) std::abort();
  return *set;
}

const quota::gateway::Request kChat{.who = {.tenant = "acme", .plan = "free"}, .route = "chat"};

// Settles batches of tickets made by `gw`, the making untimed (with `settle` false: times
// batches of 1-unit decisions instead); `around(before)` is called before (true) and after
// (false) each timed batch.
template <class Around>
void timed_batches(benchmark::State& state, Gateway& gw, bool settle, Around around) {
  std::vector<TicketId> tickets;
  std::int64_t settled = 0;
  Nanos now{0};  // 1 µs per call: the book forgets settled tickets as it goes
  while (state.KeepRunningBatch(kBatch)) {
    state.PauseTiming();
    tickets.clear();
    for (int i = 0; settle && i < kBatch; ++i) {
      now += 1us;
      auto e = gw.acquire_estimate(kChat, kEstimate, now);
      if (!e.ok() || !e->ticket) {
        state.SkipWithError("an estimate was not admitted");
        return;
      }
      tickets.push_back(*e->ticket);
    }
    around(true);
    state.ResumeTiming();
    for (int i = 0; !settle && i < kBatch; ++i) {
      now += 1us;
      auto d = gw.decide(kChat, now);
      if (!d.ok() || !d->decision.allowed) {
        state.SkipWithError("a decision failed");
        return;
      }
    }
    for (TicketId t : tickets) {
      now += 1us;
      auto s = gw.settle("acme", t, kActual, now);
      if (!s.ok() || s->surplus != kEstimate - kActual) {
        state.SkipWithError("a settle failed");
        return;
      }
    }
    state.PauseTiming();
    around(false);
    settled += kBatch;
    state.ResumeTiming();
  }
  state.SetItemsProcessed(settled);
}

void BM_SettleInProcess(benchmark::State& state) {
  RuleRegistry registry(rules());
  quota::LocalStore<quota::gateway::KeyPolicy> store;
  // Tickets kept 1 ms (then forgotten after another): the book holds a few thousand.
  Gateway gw(store, registry, {.ticket_ttl = 1ms});
  timed_batches(state, gw, true, [](bool) {});
}
BENCHMARK(BM_SettleInProcess)->UseRealTime();

// A settle (or with `settle` false a decision) on Redis, with the server's counters.
void on_redis(benchmark::State& state, bool settle) {
  static quota::testing::ScratchServer server(quota::testing::scratch_dir("quota-settle-bench"));
  if (!server.started()) {
    state.SkipWithError("redis-server did not start");
    return;
  }
  auto pool =
      std::make_shared<quota::redis::ConnectionPool>(quota::bench::loopback(server.port()), 2);
  const quota::redis::GatewayStoreOptions options{.pool = pool, .prefix = "settle-bench:"};
  quota::redis::GatewayStore store(options);
  RuleRegistry registry(rules());
  Gateway gw(store, registry,
             {.tickets = std::make_shared<quota::redis::RedisTickets>(options, 10min)});
  double cpu = 0, calls = 0, usec = 0, cpu_at = 0, calls_at = 0, usec_at = 0;
  // INFO `section`'s text. The CPU is read in its own call, last before a timed batch and
  // first after it, so the other section's text is made outside the window measured.
  auto info = [&](const char* section) {
    auto lease = pool->acquire();
    if (!lease.ok()) return std::string();
    auto r = (*lease)->command({"INFO", section});
    return r.ok() ? std::string((*r)->str, (*r)->len) : std::string();
  };
  std::int64_t settled = 0;
  timed_batches(state, gw, settle, [&](bool before) {
    std::string stats, cpu_text;
    if (before) {
      stats = info("commandstats");
      cpu_text = info("cpu");
    } else {
      cpu_text = info("cpu");
      stats = info("commandstats");
    }
    const double c = quota::bench::info_cpu_seconds(cpu_text);
    const double n = quota::bench::info_script_calls(stats);
    const double u = quota::bench::info_script_usec(stats);
    if (before) {
      cpu_at = c;
      calls_at = n;
      usec_at = u;
    } else {
      cpu += c - cpu_at;
      calls += n - calls_at;
      usec += u - usec_at;
      settled += kBatch;
    }
  });
  if (settled > 0) {
    state.counters["server_cpu_us_per_call"] = cpu * 1e6 / static_cast<double>(settled);
    state.counters["script_calls_per_call"] = calls / static_cast<double>(settled);
    state.counters["server_script_us_per_call"] = usec / static_cast<double>(settled);
  }
}

void BM_SettleRedis(benchmark::State& state) { on_redis(state, true); }
BENCHMARK(BM_SettleRedis)->UseRealTime();
// The yardstick, in the same run: one decision of 1 unit on the same budget.
void BM_DecideRedis(benchmark::State& state) { on_redis(state, false); }
BENCHMARK(BM_DecideRedis)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
