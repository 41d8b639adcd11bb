// gateway_redis_bench — the gateway over Redis (`Gateway`)
// under client threads: what one Gateway::decide costs when Redis is the authority.
//
// Against a real redis-server on loopback (started by this program through
// cmake/redis_server.sh, or the one at QUOTA_REDIS_PORT), one Gateway shared by N client
// threads with a pool of N connections, route "read" (cost 1), plan "free":
//   gw 1 level      the tenant level only; each decision for a random tenant of 10,000;
//                   generous rules (10^6 units/s, burst 10^6), so every decision is
//                   admitted: one script call per decision;
//   gw 3 levels     user + tenant + global levels (a random tenant of 10,000, a random user
//                   of 4 per tenant; every level generous): two script calls per decision,
//                   the tenant's slot (user and tenant levels together), then the global
//                   key (one key shared by every tenant);
//   gw 1 level hot  one tenant only, limited to 10,000 units/s (burst 1,000), so demand
//                   exceeds it: admitted and denied decisions mixed (the admitted fraction
//                   is reported);
//   gw 1 level co,  the first two with GatewayStoreOptions::coalesce = 64 (8 and 50
//   gw 3 levels co  threads): script calls made while two round trips are in flight go
//                   together in one pipelined write; calls_per_round_trip is reported.
// 1, 8 and 50 threads (the hot tenant: 8 and 50), each row `--seconds` long (default 2),
// closed loop. Per row: decisions per second, p50 and p99 latency per decision, server µs
// per decision from INFO commandstats (usec of EVALSHA/EVAL: time inside the scripts,
// wall clock) and from INFO cpu (the server process's user+sys CPU: also reading,
// parsing and replying), script calls per decision (commandstats calls of EVALSHA/EVAL
// over decisions), and errors.
//
// Keys exist before a row is measured: each workload has its own key prefix, every key of
// it is decided once first (warm-up), and the keys are kept between rows
// (GatewayStoreOptions::ttl_margin 60 s; with the default 1 s a key of these fast-refilling
// rules expires a second after its last decision, and a row would measure creations).
//
// Errors: a decide() that returns a non-OK status, or a decision with reason kUnavailable
// (the store failed and the route fails closed), counts as an error; the messages are
// printed with their counts, and a run with errors says so and exits 1.
//
// Run (release build):
//   build/release/benchmarks/gateway_redis_bench [--seconds S] [--json FILE]
// `--benchmark_out=FILE` (what `bash cmake/run.sh bench` passes) also names the JSON
// file; other --benchmark_* arguments are ignored. The JSON is shaped like
// google-benchmark's (support/json_out.hpp).
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "common/cli.hpp"
#include "quota/clock.hpp"
#include "quota/gateway/gateway.hpp"
#include "quota/redis/gateway_store.hpp"
#include "redis/support/redis_server.hpp"
#include "support/client_threads.hpp"
#include "support/json_out.hpp"
#include "support/redis_info.hpp"

using namespace std::chrono_literals;
using quota::Nanos;
using quota::Reason;
using quota::TokenBucket;
using quota::bench::loopback;
using quota::gateway::Gateway;
using quota::gateway::Level;
using quota::gateway::Request;
using quota::gateway::RuleRegistry;
using quota::gateway::RuleSet;
using quota::gateway::RuleSetSpec;
using quota::redis::ConnectionPool;
using quota::redis::GatewayStore;
using quota::redis::GatewayStoreOptions;

namespace {

constexpr int kTenants = 10'000;
constexpr int kUsersPerTenant = 4;
// Generous: no decision of the 1- and 3-level rows is denied (a row makes far fewer than
// 10^6 decisions per second, even on the one global key).
const TokenBucket kGenerous{.rate = {.units = 1'000'000, .per = 1s}, .burst = 1'000'000};
// The hot tenant's rule: less than the demand of 8 threads, so some decisions are denied.
const TokenBucket kHotRule{.rate = {.units = 10'000, .per = 1s}, .burst = 1'000};

enum class Shape { kOneLevel, kThreeLevels, kHot };

// Route "read" (cost 1); plan "free" gets the tenant level, and for kThreeLevels a user
// and a global level too.
std::shared_ptr<const RuleSet> rules(Shape shape) {
  RuleSetSpec spec{.version = 1, .routes = {{.name = "read", .cost = 1}}, .rules = {}};
  spec.rules.push_back({.level = Level::kTenant,
                        .plan = "free",
                        .route = "read",
                        .name = "tenant",
                        .policy = shape == Shape::kHot ? kHotRule : kGenerous});
  if (shape == Shape::kThreeLevels) {
    spec.rules.push_back({.level = Level::kUser,
                          .plan = "free",
                          .route = "read",
                          .name = "user",
                          .policy = kGenerous});
    spec.rules.push_back(
        {.level = Level::kGlobal, .route = "read", .name = "global", .policy = kGenerous});
  }
  auto set = RuleSet::create(std::move(spec));
  if (!set.ok()) {
    std::fprintf(stderr, "gateway_redis_bench: bad rules: %s\n", set.status().ToString().c_str());
    std::exit(2);
  }
  return *set;
}

// One workload: its rules, thread counts and store options. `options` is everything but
// the pool, which each row makes with as many connections as threads (make_store); a row
// of another configuration (e.g. coalescing) is another Workload with other options.
struct Workload {
  std::string name;  // "gw 1 level"
  Shape shape = Shape::kOneLevel;
  std::vector<int> threads;
  GatewayStoreOptions options;
  // Optional: more counters for the row, read from the store after it ran (e.g. a
  // coalescing store's decisions per round trip).
  std::function<void(const GatewayStore&, std::vector<std::pair<std::string, double>>&)> counters =
      nullptr;
};

// The store of one row: `options` over `pool`.
std::unique_ptr<GatewayStore> make_store(std::shared_ptr<ConnectionPool> pool,
                                         GatewayStoreOptions options) {
  options.pool = std::move(pool);
  return std::make_unique<GatewayStore>(std::move(options));
}

// The tenants and users of every request (Request holds views into them).
struct Ids {
  std::vector<std::string> tenants, users;
  Ids() {
    for (int i = 0; i < kTenants; ++i) tenants.push_back("tenant-" + std::to_string(10'000 + i));
    for (int i = 0; i < kUsersPerTenant; ++i) users.push_back("u" + std::to_string(i));
  }
};

// The request of a random draw `x` (hot: always the one tenant).
Request request(const Ids& ids, Shape shape, std::uint64_t x) {
  if (shape == Shape::kHot) {
    return {.who = {.tenant = "hot", .plan = "free"}, .route = "read"};
  }
  const std::string& tenant = ids.tenants[x % kTenants];
  const std::string_view user = shape == Shape::kThreeLevels
                                    ? std::string_view(ids.users[(x / kTenants) % kUsersPerTenant])
                                    : std::string_view();
  return {.who = {.tenant = tenant, .plan = "free", .user = user}, .route = "read"};
}

// Failures seen by the client threads, by message (they are rare: a mutex is fine).
class Errors {
 public:
  void add(const std::string& what) {
    std::lock_guard<std::mutex> lock(mu_);
    ++by_message_[what];
  }
  std::map<std::string, std::int64_t> take() {
    std::lock_guard<std::mutex> lock(mu_);
    return std::exchange(by_message_, {});
  }

 private:
  std::mutex mu_;
  std::map<std::string, std::int64_t> by_message_;
};

// 0 when `r` is a decision of the store, else 1 (and the cause goes to `errors`).
std::int64_t check(const absl::StatusOr<quota::gateway::Result>& r, Errors& errors) {
  if (!r.ok()) {
    errors.add(r.status().ToString());
    return 1;
  }
  if (r->decision.reason == Reason::kUnavailable) {
    errors.add("decision kUnavailable: the store failed and the route fails closed");
    return 1;
  }
  return 0;
}

// Decides every key of `w` once (8 threads), so that the measured rows find them.
std::int64_t warm_up(int port, const Workload& w, const Ids& ids, Errors& errors) {
  constexpr int kThreads = 8;
  auto store = make_store(std::make_shared<ConnectionPool>(loopback(port), kThreads), w.options);
  RuleRegistry registry(rules(w.shape));
  Gateway gw(*store, registry);
  const int n = w.shape == Shape::kHot           ? 1
                : w.shape == Shape::kThreeLevels ? kTenants * kUsersPerTenant
                                                 : kTenants;
  std::atomic<std::int64_t> failed{0};
  std::vector<std::thread> pool;
  for (int t = 0; t < kThreads; ++t) {
    pool.emplace_back([&, t] {
      for (int i = t; i < n; i += kThreads) {
        failed += check(gw.decide(request(ids, w.shape, static_cast<std::uint64_t>(i)),
                                  quota::SteadyClock{}.now()),
                        errors);
      }
    });
  }
  for (auto& th : pool) th.join();
  return failed;
}

// What one row measured.
struct Measured : quota::bench::Latency {
  double decisions = 0, elapsed_s = 0;
  double decisions_per_s = 0;
  double admitted_fraction = 0;
  double server_us_per_decision = 0;      // INFO commandstats (script commands)
  double server_cpu_us_per_decision = 0;  // INFO cpu (the whole server process)
  double script_calls_per_decision = 0;   // INFO commandstats calls of EVALSHA/EVAL
  std::int64_t errors = 0;
  std::vector<std::pair<std::string, double>> counters;  // Workload::counters
};

// INFO `section` as text; empty when INFO fails.
std::string info(quota::redis::Connection& admin, const char* section) {
  auto r = admin.command({"INFO", section});
  if (!r.ok() || (*r)->type != REDIS_REPLY_STRING) return {};
  return std::string(quota::redis::reply_string(**r));
}

// Runs `w` at `threads` threads for `seconds`: one Gateway shared by the threads, over a
// store with a pool of `threads` connections.
Measured measure(int port, const Workload& w, int threads, double seconds, const Ids& ids,
                 Errors& errors) {
  auto store = make_store(
      std::make_shared<ConnectionPool>(loopback(port), static_cast<std::size_t>(threads)),
      w.options);
  RuleRegistry registry(rules(w.shape));
  Gateway gw(*store, registry);
  // Counted per thread, on a cache line each, and summed after the run.
  struct alignas(64) Admitted {
    std::int64_t n = 0;
  };
  std::vector<Admitted> admitted(static_cast<std::size_t>(threads));
  quota::redis::Connection admin(loopback(port));
  (void)admin.command({"CONFIG", "RESETSTAT"});
  const double cpu0 = quota::bench::info_cpu_seconds(info(admin, "cpu"));
  quota::bench::ThreadsRun run =
      quota::bench::run_threads(threads, seconds, [&](int t, std::mt19937_64& rng) -> std::int64_t {
        auto r = gw.decide(request(ids, w.shape, rng()), quota::SteadyClock{}.now());
        if (r.ok() && r->decision.allowed) ++admitted[static_cast<std::size_t>(t)].n;
        return check(r, errors);
      });
  const double cpu1 = quota::bench::info_cpu_seconds(info(admin, "cpu"));
  const std::string stats = info(admin, "commandstats");
  Measured m;
  static_cast<quota::bench::Latency&>(m) = quota::bench::latency_of(run.latency_us);
  m.decisions = static_cast<double>(run.calls);
  m.elapsed_s = run.elapsed_s;
  m.decisions_per_s = m.decisions / run.elapsed_s;
  std::int64_t yes = 0;
  for (const Admitted& a : admitted) yes += a.n;
  const double d = std::max(1.0, m.decisions);
  m.admitted_fraction = static_cast<double>(yes) / d;
  m.server_us_per_decision = quota::bench::info_script_usec(stats) / d;
  m.server_cpu_us_per_decision = (cpu1 - cpu0) * 1e6 / d;
  m.script_calls_per_decision = quota::bench::info_script_calls(stats) / d;
  m.errors = run.errors;
  if (w.counters) w.counters(*store, m.counters);
  return m;
}

quota::bench::JsonRow json_row(const Workload& w, int threads, const Measured& m) {
  std::string id = w.name;
  std::replace(id.begin(), id.end(), ' ', '_');
  quota::bench::JsonRow row{
      .name = id + "/threads:" + std::to_string(threads),
      .threads = threads,
      .iterations = m.decisions,
      .real_time_us = m.elapsed_s * 1e6 * threads / std::max(1.0, m.decisions),
      .counters = {{"connections", static_cast<double>(threads)},
                   {"decisions_per_s", m.decisions_per_s},
                   {"p50_us", m.p50_us},
                   {"p90_us", m.p90_us},
                   {"p99_us", m.p99_us},
                   {"p999_us", m.p999_us},
                   {"max_us", m.max_us},
                   {"server_us_per_decision", m.server_us_per_decision},
                   {"server_cpu_us_per_decision", m.server_cpu_us_per_decision},
                   {"script_calls_per_decision", m.script_calls_per_decision},
                   {"admitted_fraction", m.admitted_fraction},
                   {"errors", static_cast<double>(m.errors)}}};
  row.counters.insert(row.counters.end(), m.counters.begin(), m.counters.end());
  return row;
}

// The server's version (INFO server), or "" when INFO fails.
std::string redis_version(int port) {
  quota::redis::Connection c(loopback(port));
  const std::string text = info(c, "server");
  const auto at = text.find("redis_version:");
  if (at == std::string::npos) return {};
  return text.substr(at + 14, text.find('\r', at) - at - 14);
}

}  // namespace

ABSL_FLAG(double, seconds, 2, "how long each row runs, seconds");
ABSL_FLAG(std::string, json, "", "also write the rows as JSON to this file");

constexpr const char* kUsage = R"(usage: gateway_redis_bench [--seconds S] [--json FILE]

  --seconds S           how long each row runs, in (0, 3600] seconds (default 2)
  --json FILE           also write the rows as JSON to FILE
  --benchmark_out=FILE  the same as --json FILE (what `bash cmake/run.sh bench` passes);
                        other --benchmark_* arguments are ignored
  --help                this text
QUOTA_REDIS_PORT=N uses the redis-server on 127.0.0.1:N instead of starting one.
)";

int main(int argc, char** argv) {
  const auto args = quota::cli::parse({.name = "gateway_redis_bench",
                                       .usage = kUsage,
                                       .checks = {quota::cli::real("seconds", 1e-3, 3600)},
                                       .benchmark_flags = true},
                                      argc, argv);
  const double seconds = absl::GetFlag(FLAGS_seconds);
  std::string json = absl::GetFlag(FLAGS_json);
  for (const std::string a : args.benchmark) {
    if (a.rfind("--benchmark_out=", 0) == 0) json = a.substr(std::strlen("--benchmark_out="));
  }
  // The server at QUOTA_REDIS_PORT, or one of our own for this run.
  const char* env_port = std::getenv("QUOTA_REDIS_PORT");
  std::optional<quota::testing::ScratchServer> server;
  if (env_port == nullptr || *env_port == '\0') {
    server.emplace(quota::testing::scratch_dir("quota-gateway-redis-bench"));
  }
  const int port = server ? server->port() : std::atoi(env_port);
  if (port <= 0) {
    std::fprintf(stderr,
                 "gateway_redis_bench: no redis-server (set QUOTA_REDIS_PORT or install it)\n");
    return 1;
  }
  const std::string version = redis_version(port);
  if (version.empty()) {
    // Otherwise every decision would be a fail-closed kUnavailable, counted as an error.
    std::fprintf(stderr, "gateway_redis_bench: no answer to INFO from 127.0.0.1:%d\n", port);
    return 1;
  }

  // Each workload has its own key space; the options are the defaults but for the prefix
  // and ttl_margin (see the header comment).
  auto options = [](const char* prefix) {
    GatewayStoreOptions o;
    o.prefix = std::string("bench:gw:") + prefix + ":";
    o.ttl_margin = 60s;
    return o;
  };
  auto coalesced = [&](const char* prefix) {
    GatewayStoreOptions o = options(prefix);
    o.coalesce = 64;
    o.coalesce_calls = 2;
    return o;
  };
  auto per_round_trip = [](const GatewayStore& store,
                           std::vector<std::pair<std::string, double>>& out) {
    const auto st = store.coalesce_stats();
    out.emplace_back("calls_per_round_trip",
                     st.round_trips == 0
                         ? 0.0
                         : static_cast<double>(st.decisions) / static_cast<double>(st.round_trips));
  };
  const std::vector<Workload> workloads = {
      {.name = "gw 1 level",
       .shape = Shape::kOneLevel,
       .threads = {1, 8, 50},
       .options = options("l1")},
      {.name = "gw 3 levels",
       .shape = Shape::kThreeLevels,
       .threads = {1, 8, 50},
       .options = options("l3")},
      {.name = "gw 1 level hot",
       .shape = Shape::kHot,
       .threads = {8, 50},
       .options = options("hot")},
      // The same with GatewayStoreOptions::coalesce: script calls of threads that find two
      // round trips in flight go together, up to 64 in one pipelined write.
      {.name = "gw 1 level co",
       .shape = Shape::kOneLevel,
       .threads = {8, 50},
       .options = coalesced("l1c"),
       .counters = per_round_trip},
      {.name = "gw 3 levels co",
       .shape = Shape::kThreeLevels,
       .threads = {8, 50},
       .options = coalesced("l3c"),
       .counters = per_round_trip},
  };

  const Ids ids;
  Errors errors;
  std::int64_t total_errors = 0;
  std::vector<quota::bench::JsonRow> rows;
  std::printf(
      "gateway_redis_bench on 127.0.0.1:%d (redis %s), %.1f s per row, %d tenants, route "
      "read cost 1\n",
      port, version.c_str(), seconds, kTenants);
  std::printf("%-16s %7s %12s %9s %9s %11s %12s %10s %9s %7s\n", "workload", "threads",
              "decisions/s", "p50 us", "p99 us", "server us/d", "server cpu/d", "scripts/d",
              "admitted", "errors");
  auto print_errors = [&] {
    for (const auto& [what, n] : errors.take()) {
      std::printf("    error x%" PRId64 ": %s\n", n, what.c_str());
    }
  };
  for (const Workload& w : workloads) {
    if (const std::int64_t failed = warm_up(port, w, ids, errors); failed > 0) {
      std::printf("%-16s warm-up: %" PRId64 " errors\n", w.name.c_str(), failed);
      total_errors += failed;
      print_errors();
    }
    for (int threads : w.threads) {
      const Measured m = measure(port, w, threads, seconds, ids, errors);
      std::printf("%-16s %7d %12.0f %9.1f %9.1f %11.2f %12.2f %10.3f %9.4f %7" PRId64 "\n",
                  w.name.c_str(), threads, m.decisions_per_s, m.p50_us, m.p99_us,
                  m.server_us_per_decision, m.server_cpu_us_per_decision,
                  m.script_calls_per_decision, m.admitted_fraction, m.errors);
      for (const auto& [k, v] : m.counters) std::printf("    %s %.3f\n", k.c_str(), v);
      print_errors();
      std::fflush(stdout);
      total_errors += m.errors;
      rows.push_back(json_row(w, threads, m));
    }
  }
  if (!json.empty()) {
    auto context = quota::bench::json_context(argv[0]);
    context["redis_version"] = version;
    context["seconds_per_row"] = std::to_string(seconds);
    context["tenants"] = std::to_string(kTenants);
    context["errors"] = std::to_string(total_errors);
    if (quota::bench::write_benchmark_json(json, context, rows)) {
      std::printf("JSON: %s\n", json.c_str());
    } else {
      std::fprintf(stderr, "gateway_redis_bench: could not write %s\n", json.c_str());
      return 1;
    }
  }
  if (total_errors > 0) {
    std::printf("RUN HAD ERRORS: %" PRId64 " decisions failed (see above)\n", total_errors);
    return 1;
  }
  return 0;
}
