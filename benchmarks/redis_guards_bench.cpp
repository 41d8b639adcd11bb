// redis_guards_bench — what each of the Redis guards that are on by default costs in
// decisions per second: `Gateway` on one tenant level (a random tenant of
// 10,000, a generous token bucket: every decision admitted, one script call each) against
// a real redis-server on loopback (started by this program, or the one at
// QUOTA_REDIS_PORT), closed loop, 1 and 8 client threads over a pool of as many
// connections.
//
// Configurations (the same keys; each row's store is built afresh):
//   none        every guard off: failover_safety false, no clock guard, no breaker, no
//               in-flight guard, maxmemory-policy read at connect only
//   failover    GatewayStoreOptions::failover_safety
//   clock       GatewayStoreOptions::clock_guard (tolerance 1 s)
//   breaker     ConnectionConfig::breaker {5 failures, 250 ms}
//   in_flight   CallLimits::in_flight, 4 per connection
//   recheck     ConnectionConfig::eviction_recheck 1 s (one CONFIG GET per second)
//   all         every one of them (quota-server's defaults)
// Each configuration runs in pairs with `none` (--rounds pairs, default 3; which of the two
// goes first alternates), so that a drift of the shared machine cancels in the pair's
// ratio. Per configuration: the medians of decisions per second (wall clock: moves with
// the machine's load) and of the client's CPU time per decision (the client threads' own
// CLOCK_THREAD_CPUTIME_ID), and the medians of the pairs' ratios. What the guards cost the
// server is redis_instructions_bench's (--node_guards).
//
// Run (release build):
//   build/release/benchmarks/redis_guards_bench [--seconds S] [--rounds N]
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <functional>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "common/cli.hpp"
#include "quota/clock.hpp"
#include "quota/gateway/gateway.hpp"
#include "quota/redis/gateway_store.hpp"
#include "redis/support/redis_server.hpp"
#include "support/redis_info.hpp"

using namespace std::chrono_literals;

ABSL_FLAG(double, seconds, 1.0, "how long each row runs, seconds");
ABSL_FLAG(std::int64_t, rounds, 3, "rounds of every configuration");
ABSL_FLAG(std::string, configs, "", "only these configurations (comma-separated names)");

namespace {

constexpr const char* kUsage = R"(usage: redis_guards_bench [--seconds S] [--rounds N]

Decisions per second of Gateway (one tenant level) with each Redis guard
on alone, all of them, and none, 1 and 8 client threads, in interleaved rounds.

  --seconds S   how long each row runs, in (0, 3600] seconds (default 1)
  --rounds N    rounds of every configuration, in [1, 100] (default 3)
  --configs a,b only these configurations (none is always run: the ratios' base)
  --help        this text
)";

constexpr int kTenants = 10'000;
const quota::TokenBucket kGenerous{.rate = {.units = 1'000'000, .per = 1s}, .burst = 1'000'000};

struct Config {
  const char* name;
  bool failover = false, clock = false, breaker = false, in_flight = false, recheck = false;
};

const Config kConfigs[] = {{.name = "none"},
                           {.name = "failover", .failover = true},
                           {.name = "clock", .clock = true},
                           {.name = "breaker", .breaker = true},
                           {.name = "in_flight", .in_flight = true},
                           {.name = "recheck", .recheck = true},
                           {.name = "all",
                            .failover = true,
                            .clock = true,
                            .breaker = true,
                            .in_flight = true,
                            .recheck = true}};

std::shared_ptr<const quota::gateway::RuleSet> rules() {
  quota::gateway::RuleSetSpec spec{
      .version = 1, .routes = {{.name = "read", .cost = 1}}, .rules = {}};
  spec.rules.push_back({.level = quota::gateway::Level::kTenant,
                        .plan = "free",
                        .route = "read",
                        .name = "tenant",
                        .policy = kGenerous});
  auto set = quota::gateway::RuleSet::create(std::move(spec));
  if (!set.ok()) {
    std::fprintf(stderr, "redis_guards_bench: bad rules: %s\n", set.status().ToString().c_str());
    std::exit(2);
  }
  return *set;
}

std::unique_ptr<quota::redis::GatewayStore> make_store(int port, const Config& c, int threads) {
  quota::redis::ConnectionConfig cc = quota::bench::loopback(port);
  cc.deadline = 50ms;  // quota-server's --redis-deadline-ms
  cc.breaker.failures = c.breaker ? 5 : 0;
  cc.breaker.cool_down = 250ms;
  cc.eviction_recheck = c.recheck ? std::chrono::microseconds(1s) : std::chrono::microseconds(0);
  quota::redis::GatewayStoreOptions o;
  o.pool = std::make_shared<quota::redis::ConnectionPool>(cc, static_cast<std::size_t>(threads));
  o.prefix = "bench:guards:";
  o.ttl_margin = 60s;  // the keys stay between rows (a row measures updates, not creations)
  o.failover_safety = c.failover;
  if (c.clock) o.clock_guard = quota::redis::ClockGuard{.tolerance = 1s};
  if (c.in_flight) o.limits.in_flight = std::make_shared<quota::redis::InFlightGuard>(4 * threads);
  return std::make_unique<quota::redis::GatewayStore>(std::move(o));
}

// A thread's CPU time, ns.
std::int64_t thread_cpu_ns() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<std::int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

struct Row {
  double per_s = 0;   // decisions per second
  double cpu_us = 0;  // client CPU µs per decision
};

// `threads` closed-loop threads for `seconds`; errors counted.
Row measure(int port, const Config& c, int threads, double seconds, std::int64_t& errors) {
  auto store = make_store(port, c, threads);
  quota::gateway::RuleRegistry registry(rules());
  quota::gateway::Gateway gw(*store, registry);
  std::vector<std::string> tenants;
  for (int i = 0; i < kTenants; ++i) tenants.push_back("tenant-" + std::to_string(10'000 + i));
  std::atomic<bool> stop{false};
  std::atomic<std::int64_t> done{0}, failed{0}, cpu_ns{0};
  std::vector<std::thread> pool;
  const auto start = std::chrono::steady_clock::now();
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      std::mt19937_64 rng(static_cast<std::uint64_t>(t) * 7919 + 1);
      std::int64_t n = 0, bad = 0;
      const std::int64_t cpu0 = thread_cpu_ns();
      while (!stop.load(std::memory_order_relaxed)) {
        const std::string& tenant = tenants[rng() % kTenants];
        auto r = gw.decide({.who = {.tenant = tenant, .plan = "free"}, .route = "read"},
                           quota::SteadyClock{}.now());
        if (!r.ok() || r->decision.reason == quota::Reason::kUnavailable) ++bad;
        ++n;
      }
      cpu_ns += thread_cpu_ns() - cpu0;
      done += n;
      failed += bad;
    });
  }
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
  stop = true;
  for (auto& th : pool) th.join();
  const double elapsed =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  errors += failed.load();
  const double n = static_cast<double>(done.load());
  return {.per_s = n / elapsed, .cpu_us = n > 0 ? static_cast<double>(cpu_ns.load()) / n / 1e3 : 0};
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  quota::cli::parse(
      {.name = "redis_guards_bench",
       .usage = kUsage,
       .checks = {quota::cli::real("seconds", 1e-3, 3600), quota::cli::integer("rounds", 1, 100)}},
      argc, argv);
  const double seconds = absl::GetFlag(FLAGS_seconds);
  const int rounds = static_cast<int>(absl::GetFlag(FLAGS_rounds));
  const char* env_port = std::getenv("QUOTA_REDIS_PORT");
  std::optional<quota::testing::ScratchServer> server;
  if (env_port == nullptr || *env_port == '\0') {
    server.emplace(quota::testing::scratch_dir("quota-redis-guards-bench"));
  }
  const int port = server ? server->port() : std::atoi(env_port);
  if (port <= 0) {
    std::fprintf(stderr, "redis_guards_bench: no redis-server (set QUOTA_REDIS_PORT)\n");
    return 1;
  }
  const int thread_counts[] = {1, 8};
  constexpr std::size_t kN = std::size(kConfigs);
  std::vector<double> per_s[2][kN], cpu_us[2][kN];
  std::int64_t errors = 0;
  for (int t = 0; t < 2; ++t) {  // warm-up: every key exists before the first row
    measure(port, kConfigs[0], thread_counts[t], seconds, errors);
  }
  const std::string only = "," + absl::GetFlag(FLAGS_configs) + ",";
  auto chosen = [&](std::size_t c) {
    return c == 0 || only == ",," ||
           only.find("," + std::string(kConfigs[c].name) + ",") != std::string::npos;
  };
  // Each configuration is measured in pairs with `none` next to it in time (which of the
  // two first alternates), so that the machine's drift cancels in the pair's ratio.
  std::vector<double> ratio[2][kN], cpu_ratio[2][kN];
  for (int round = 0; round < rounds; ++round) {
    for (int t = 0; t < 2; ++t) {
      for (std::size_t c = 1; c < kN; ++c) {
        if (!chosen(c)) continue;
        Row base, with;
        if ((round + static_cast<int>(c)) % 2 == 0) {
          base = measure(port, kConfigs[0], thread_counts[t], seconds, errors);
          with = measure(port, kConfigs[c], thread_counts[t], seconds, errors);
        } else {
          with = measure(port, kConfigs[c], thread_counts[t], seconds, errors);
          base = measure(port, kConfigs[0], thread_counts[t], seconds, errors);
        }
        per_s[t][0].push_back(base.per_s);
        cpu_us[t][0].push_back(base.cpu_us);
        per_s[t][c].push_back(with.per_s);
        cpu_us[t][c].push_back(with.cpu_us);
        ratio[t][c].push_back(base.per_s > 0 ? with.per_s / base.per_s : 0);
        cpu_ratio[t][c].push_back(base.cpu_us > 0 ? with.cpu_us / base.cpu_us : 0);
      }
    }
  }
  std::printf(
      "redis_guards_bench on 127.0.0.1:%d, %.1f s per row, %d rounds (medians; ratios: of "
      "each pair with none)\n",
      port, seconds, rounds);
  std::printf("%-10s %8s %14s %8s %18s %8s\n", "guards", "threads", "decisions/s", "ratio",
              "client CPU us/dec", "ratio");
  for (int t = 0; t < 2; ++t) {
    for (std::size_t c = 0; c < kN; ++c) {
      if (!chosen(c)) continue;
      const double m = median(per_s[t][c]), cpu = median(cpu_us[t][c]);
      const double r = c == 0 ? 1.0 : median(ratio[t][c]);
      const double rc = c == 0 ? 1.0 : median(cpu_ratio[t][c]);
      std::printf("%-10s %8d %14.0f %8.3f %18.2f %8.3f\n", kConfigs[c].name, thread_counts[t], m, r,
                  cpu, rc);
    }
  }
  if (errors > 0) {
    std::printf("errors: %lld decisions failed\n", static_cast<long long>(errors));
    return 1;
  }
  return 0;
}
