// gateway_sim — G gateways, T tenants, skewed traffic, one table: why a shared budget.
//
// The same seeded request stream (traffic.hpp) is replayed through each strategy:
//
//   local-full   every gateway enforces the tenant's whole contract (r, B) on its own:
//                the classic overshoot, up to G times the contract;
//   local-split  every gateway enforces r/G and B/G: never over, but under skew it
//                denies requests that the tenant's budget could have served;
//   shared       one in-process quota::ShardedStore shared by all gateway threads;
//   leases       each gateway a quota::LeasedLimiter: grants of up to q_max units from
//                the tenant's central bucket (an in-process authority), spent locally;
//                promises r·T + B + G·q_max, with far fewer authority round trips;
//   redis        the shared Redis store (with --redis HOST:PORT), deciding on the
//                simulated time (TimeSource::kCaller) rounded down to its tick;
//   redis-leases leases whose authority is that Redis store (with --redis);
//   redis-coalesced  the Redis store with coalescing (RedisStoreOptions::coalesce): the
//                gateways' concurrent decisions of one tick go together in one script
//                call, each decided as if alone (with --redis).
//
// Gateways are threads. They move through simulated time in lock-step ticks (--tick-ms):
// each gateway decides its requests of one tick, stamped with their own simulated time,
// then waits for the others. So a run takes as long as the decisions take, not as long
// as the simulated duration, and local strategies give the same result on every run.
// (The shared ones admit nearly the same amount, but which gateway wins a race within a
// tick varies from run to run.) Decisions per second are measured apart from that: a
// fresh instance of the strategy, all G threads deciding flat out for 250 ms, unchecked.
//
// For every strategy the decisions are then checked:
//   - the envelope verifier (quota/verify/envelope.hpp) gives each tenant's worst excess
//     of admitted cost over r·T + B, over every interval, with the witness interval. Each
//     admission is logged at the time the bucket decided it (its state's time, which a
//     thread that lost a race within a tick may see slightly later than its own stamp);
//   - a reference: one exact token bucket per tenant, charged with every request the
//     strategy admitted (it may go below zero), in time order. A request the strategy
//     denied while the reference held enough tokens for it is a FALSE denial: the
//     tenant's contract had room. (Admissions at the same instant are charged first, so
//     this never overcounts.)
//
// --scenario noisy-neighbour runs another scenario instead (noisy.hpp, noisy_report.hpp):
// one tenant's 200,000-token requests and 1,000 small tenants against a global 4,000,000
// tokens per minute, first come first served and with fair share (quota/fair/).
// --scenario regions (regions.hpp, regions_report.hpp): three regions lease one global
// budget from a central authority (quota/region/), one cut off from it for a while.
//
// Exit status: 0 when every strategy that promises an envelope keeps it for every tenant
// (shared, redis: r·T + B; leases: r·T + B + G·q_max); 1 when one breaks it; 2 for a bad command
// line; 3 when the run failed (e.g. Redis unreachable).
//
// --scenario global-lease: one global budget shared by 10,000 tenants through 8 gateway
// processes, with the global level leased and without (global_lease.hpp,
// global_lease_report.hpp).
//
// Build and run:  bash cmake/run.sh demo            (release build, default scenario)
//                 ./build/release/examples/gateway_sim/gateway_sim --help
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "analysis.hpp"
#include "common/cli.hpp"
#include "global_lease_report.hpp"
#include "noisy_report.hpp"
#include "options.hpp"
#include "regions_report.hpp"
#include "report.hpp"
#include "run.hpp"
#include "strategies.hpp"
#include "traffic.hpp"

#ifdef QUOTA_SIM_HAVE_REDIS
#include "redis/support/redis_server.hpp"
#endif

// The flags, as --gateways, --hot-gateways, ... (common/cli.hpp spells _ as -).
ABSL_FLAG(std::int64_t, gateways, 8, "gateway threads");
ABSL_FLAG(std::int64_t, tenants, 8, "tenants; tenant-0 is hot");
ABSL_FLAG(std::int64_t, hot_gateways, 3, "gateways carrying most of the hot tenant's traffic");
ABSL_FLAG(double, hot_share, 0.8, "share of the hot tenant's traffic on them");
ABSL_FLAG(std::int64_t, shift_every, 10, "the balancer moves the hot set every S seconds");
ABSL_FLAG(std::int64_t, seconds, 60, "simulated duration in seconds");
ABSL_FLAG(std::int64_t, rate, 1000, "hot tenant's contract rate, units per second");
ABSL_FLAG(std::int64_t, burst, 200, "hot tenant's contract burst, units");
ABSL_FLAG(double, load, 1.8, "hot tenant's offered cost as a multiple of its rate");
ABSL_FLAG(std::int64_t, quiet_rate, 100, "each quiet tenant's rate, units per second");
ABSL_FLAG(std::int64_t, quiet_burst, 50, "each quiet tenant's burst, units");
ABSL_FLAG(double, quiet_load, 0.4, "each quiet tenant's offered cost / its rate");
ABSL_FLAG(std::int64_t, tick_ms, 10, "lock-step granularity of simulated time");
ABSL_FLAG(std::uint64_t, seed, 1, "traffic seed");
ABSL_FLAG(std::string, strategies, "", "comma-separated strategies; empty: the defaults");
ABSL_FLAG(std::int64_t, lease_q, 50, "leases: the largest grant a gateway holds, units");
ABSL_FLAG(std::string, redis, "", "HOST:PORT of a Redis server, or 'local'");
ABSL_FLAG(std::int64_t, verify_burst, -1, "check the hot tenant against this burst");
ABSL_FLAG(std::string, svg, "", "where to write the chart");
ABSL_FLAG(bool, no_progress, false, "no progress line on stderr");
ABSL_FLAG(std::string, scenario, "gateways", "gateways, noisy-neighbour, global-lease or regions");
ABSL_FLAG(std::int64_t, noisy_requests, 20, "noisy-neighbour: the noisy tenant's requests");
ABSL_FLAG(std::int64_t, small_permille, 600,
          "noisy-neighbour: the small tenants' load, permille of the budget's rate");

namespace {

using gateway_sim::Options;

constexpr const char* kUsage = R"(usage: gateway_sim [flags]

Replays one seeded, skewed request stream through several rate-limiting strategies and
prints, per strategy, the hot tenant's admitted rate, the verifier's worst excess over
r*T + B, false denials, quiet tenants' denials and decisions per second; writes an SVG
chart of cumulative admitted cost against the r*T + B envelope.

Flags (--flag VALUE or --flag=VALUE):
  --gateways N       gateway threads (default 8)
  --tenants N        tenants; tenant-0 is hot, the others quiet (default 8)
  --hot-gateways N   gateways carrying most of the hot tenant's traffic (default 3)
  --hot-share F      share of the hot tenant's traffic on them, 0..1 (default 0.8)
  --shift-every S    the balancer moves the hot set every S simulated seconds; 0 never
                     (default 10)
  --seconds S        simulated duration in seconds (default 60)
  --rate R           hot tenant's contract rate, units per second (default 1000)
  --burst B          hot tenant's contract burst, units (default 200)
  --load F           hot tenant's offered cost as a multiple of its rate (default 1.8)
  --quiet-rate R     each quiet tenant's rate, units per second (default 100)
  --quiet-burst B    each quiet tenant's burst, units (default 50)
  --quiet-load F     each quiet tenant's offered cost / its rate (default 0.4)
  --tick-ms MS       lock-step granularity of simulated time, 1..100 (default 10);
                     within one tick the gateways race each other
  --seed N           traffic seed (default 1)
  --strategies LIST  comma-separated, from local-full, local-split, shared, leases,
                     redis, redis-leases, redis-coalesced (default: local-full,
                     local-split,shared,leases, plus redis,redis-leases,redis-coalesced
                     with --redis)
  --lease-q Q        leases: the largest grant a gateway holds, units (default 50,
                     at most the tenant's burst); they promise r*T + B + G*Q
  --redis HOST:PORT  also run the shared Redis store at HOST:PORT, directly (redis),
                     as the authority of leases (redis-leases) and coalescing the
                     gateways' calls (redis-coalesced)
  --redis local      the same against a throw-away redis-server this run starts on a
                     free loopback port (redis-server must be on PATH) and stops
  --verify-burst B   check the hot tenant against r*T + B with this B instead of its
                     contract's (to watch the checker fail: exit status 1)
  --svg PATH         where to write the chart (default: gateway_sim.svg in the
                     directory of this executable, i.e. the build tree)
  --no-progress      no progress line on stderr
  --scenario NAME    gateways (default: the above), noisy-neighbour or regions.
                     noisy-neighbour: one tenant sends 20 requests of 200,000
                     tokens in 30 s against a global
                     4,000,000 tokens per minute while 1,000 small tenants keep
                     sending, first come first served and with fair share
                     (noisy.hpp); uses --seed, --seconds and --svg (default:
                     gateway_sim_noisy.svg beside this executable); or
                     global-lease: one global budget shared by 10,000 tenants
                     through 8 gateway processes, leased and not
                     (global_lease.hpp); uses --seed, --seconds and --svg
                     (default: gateway_sim_global_lease.svg); or
                     regions: three regions lease one global budget from a
                     central authority, one cut off from it during the middle
                     third (regions.hpp); uses --seed, --seconds and --svg
                     (default: gateway_sim_regions.svg beside this executable)
  --noisy-requests N noisy-neighbour: the noisy tenant's requests in its 30 s, 0 for
                     none (default 20)
  --small-permille P noisy-neighbour: the small tenants' load together, permille of
                     the budget's rate (default 600)
  --help             this text

Requests are reads (cost 1) or, one in ten, creates (cost 5).
Exit status: 0 ok; 1 a strategy broke the envelope it promises (shared, redis,
redis-coalesced:
r*T + B; leases, redis-leases: r*T + B + G*Q);
2 bad flags; 3 the run failed (e.g. Redis unreachable).
)";

// The command line (common/cli.hpp: --help exits 0, a usage error 2) as Options.
Options parse_options(int argc, char** argv) {
  using quota::cli::integer;
  using quota::cli::real;
  const auto args = quota::cli::parse(
      {.name = "gateway_sim",
       .usage = kUsage,
       .checks = {integer("gateways", 1, 256),
                  integer("tenants", 1, 10000),
                  integer("hot_gateways", 1, 256),
                  real("hot_share", 0, 1),
                  integer("shift_every", 0, 1'000'000),
                  integer("seconds", 1, 86'400),
                  integer("rate", 1, 100'000'000),
                  integer("burst", 1, 1'000'000'000),
                  real("load", 0, 1000),
                  integer("quiet_rate", 1, 100'000'000),
                  integer("quiet_burst", 1, 1'000'000'000),
                  real("quiet_load", 0, 1000),
                  integer("tick_ms", 1, 100),
                  integer("lease_q", 1, 1'000'000'000),
                  integer("verify_burst", 0, 1'000'000'000),
                  integer("noisy_requests", 0, 1'000),
                  integer("small_permille", 1, 5'000),
                  quota::cli::host_port("redis", "local"),
                  quota::cli::custom("scenario",
                                     "gateways, noisy-neighbour, global-lease or regions",
                                     [](std::string_view v) {
                                       return v == "gateways" || v == "noisy-neighbour" ||
                                              v == "global-lease" || v == "regions";
                                     }),
                  quota::cli::custom("svg", "a path",
                                     [](std::string_view v) { return !v.empty(); })}},
      argc, argv);
  Options o;
  o.traffic.gateways = static_cast<int>(absl::GetFlag(FLAGS_gateways));
  o.traffic.tenants = static_cast<int>(absl::GetFlag(FLAGS_tenants));
  o.traffic.hot_gateways = static_cast<int>(absl::GetFlag(FLAGS_hot_gateways));
  o.traffic.hot_share = absl::GetFlag(FLAGS_hot_share);
  o.traffic.shift_every_s = absl::GetFlag(FLAGS_shift_every);
  o.traffic.seconds = absl::GetFlag(FLAGS_seconds);
  o.traffic.seed = absl::GetFlag(FLAGS_seed);
  o.rate = absl::GetFlag(FLAGS_rate);
  o.burst = absl::GetFlag(FLAGS_burst);
  o.load = absl::GetFlag(FLAGS_load);
  o.quiet_rate = absl::GetFlag(FLAGS_quiet_rate);
  o.quiet_burst = absl::GetFlag(FLAGS_quiet_burst);
  o.quiet_load = absl::GetFlag(FLAGS_quiet_load);
  o.tick_ms = absl::GetFlag(FLAGS_tick_ms);
  o.lease_q = absl::GetFlag(FLAGS_lease_q);
  o.verify_burst = absl::GetFlag(FLAGS_verify_burst);
  o.strategies = absl::StrSplit(absl::GetFlag(FLAGS_strategies), ',', absl::SkipEmpty());
  o.redis = absl::GetFlag(FLAGS_redis);
  o.svg = absl::GetFlag(FLAGS_svg);
  o.progress = !absl::GetFlag(FLAGS_no_progress);
  for (const auto& s : o.strategies) {
    if (s != "local-full" && s != "local-split" && s != "shared" && s != "leases" && s != "redis" &&
        s != "redis-leases" && s != "redis-coalesced") {
      quota::cli::usage_error(
          "gateway_sim",
          absl::StrFormat("unknown strategy '%s' (known: local-full, local-split, shared, leases, "
                          "redis, redis-leases, redis-coalesced)",
                          s));
    }
  }
  if (args.has("strategies") && o.strategies.empty()) {
    quota::cli::usage_error("gateway_sim", "--strategies needs at least one strategy");
  }
  if (o.traffic.hot_gateways > o.traffic.gateways) {
    quota::cli::usage_error("gateway_sim",
                            absl::StrFormat("--hot-gateways (%d) cannot exceed --gateways (%d)",
                                            o.traffic.hot_gateways, o.traffic.gateways));
  }
  if (o.strategies.empty()) {
    o.strategies = {"local-full", "local-split", "shared", "leases"};
    if (!o.redis.empty()) {
      o.strategies.push_back("redis");
      o.strategies.push_back("redis-leases");
      o.strategies.push_back("redis-coalesced");
    }
  }
  for (const char* r : {"redis", "redis-leases", "redis-coalesced"}) {
    if (std::find(o.strategies.begin(), o.strategies.end(), r) != o.strategies.end() &&
        o.redis.empty()) {
      quota::cli::usage_error("gateway_sim",
                              absl::StrFormat("strategy '%s' needs --redis HOST:PORT", r));
    }
  }
  o.traffic.hot_units_per_s = o.load * static_cast<double>(o.rate);
  o.traffic.quiet_units_per_s = o.quiet_load * static_cast<double>(o.quiet_rate);
  return o;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace gateway_sim;
  Options o = parse_options(argc, argv);
  if (absl::GetFlag(FLAGS_scenario) == "global-lease") {
    global_lease::GlobalLeaseConfig c;
    c.seed = o.traffic.seed;
    c.seconds = o.traffic.seconds;
    return global_lease::run_global_lease_scenario(c, o.svg);
  }
  if (absl::GetFlag(FLAGS_scenario) == "noisy-neighbour") {
    noisy::NoisyConfig c;
    c.seed = o.traffic.seed;
    c.seconds = o.traffic.seconds;
    c.noisy_requests = absl::GetFlag(FLAGS_noisy_requests);
    c.small_permille = absl::GetFlag(FLAGS_small_permille);
    return noisy::run_noisy_scenario(c, o.svg);
  }
  if (absl::GetFlag(FLAGS_scenario) == "regions") {
    regions::RegionsConfig c;
    c.seed = o.traffic.seed;
    c.seconds = o.traffic.seconds;
    return regions::run_regions_scenario(c, o.svg);
  }
#ifdef QUOTA_SIM_HAVE_REDIS
  // --redis local: a throw-away redis-server (cmake/redis_server.sh, in a directory of
  // its own), stopped when the run ends.
  std::optional<quota::testing::ScratchServer> local_redis;
  if (o.redis == "local") {
    local_redis.emplace(quota::testing::scratch_dir("quota-gateway-sim"));
    if (!local_redis->started()) {
      std::fprintf(stderr,
                   "gateway_sim: --redis local: could not start redis-server (is it on PATH?)\n");
      return 3;
    }
    o.redis = absl::StrCat("127.0.0.1:", local_redis->port());
    std::printf("  started a throw-away redis-server on %s for this run\n", o.redis.c_str());
  }
#endif
  Tenants tenants(o);
  for (const auto& c : tenants.contract) {
    if (auto s = c.validate(); !s.ok()) {
      std::fprintf(stderr, "gateway_sim: bad contract: %s\n", s.ToString().c_str());
      return 2;
    }
  }
  const auto& tc = o.traffic;
  std::printf("quota gateway simulator: %d gateways, %d tenants, %lld s simulated, seed %llu\n",
              tc.gateways, tc.tenants, static_cast<long long>(tc.seconds),
              static_cast<unsigned long long>(tc.seed));
  std::printf(
      "  hot tenant-0: contract r = %lld units/s, B = %lld; offers %.0f units/s (%.1fx), "
      "%.0f%% of it on %d of %d gateways, rebalanced every %lld s\n",
      static_cast<long long>(o.rate), static_cast<long long>(o.burst), tc.hot_units_per_s, o.load,
      tc.hot_share * 100, tc.hot_gateways, tc.gateways, static_cast<long long>(tc.shift_every_s));
  if (tc.tenants > 1) {
    std::printf(
        "  quiet tenant-1..%d: contract r = %lld units/s, B = %lld each; offer %.0f units/s "
        "each, spread evenly\n",
        tc.tenants - 1, static_cast<long long>(o.quiet_rate), static_cast<long long>(o.quiet_burst),
        tc.quiet_units_per_s);
  }
  std::printf(
      "  requests: reads cost 1, creates (1 in 10) cost 5; time in lock-step ticks of %lld ms\n",
      static_cast<long long>(o.tick_ms));
  if (o.verify_burst >= 0) {
    std::printf(
        "  NOTE: the hot tenant is checked against B = %lld (--verify-burst), not its contract's\n",
        static_cast<long long>(o.verify_burst));
  }
  std::fflush(stdout);

  // Every strategy twice (one for the checked run, a fresh one for the throughput
  // measurement), all before anything runs: an unreachable Redis fails at once.
  std::vector<std::pair<std::unique_ptr<Strategy>, std::unique_ptr<Strategy>>> strategies;
  for (const std::string& name : o.strategies) {
    auto sim = make_strategy(name, o, tenants);
    auto bench = sim.ok() ? make_strategy(name, o, tenants) : sim.status();
    if (!sim.ok() || !bench.ok()) {
      const absl::Status st = sim.ok() ? bench.status() : sim.status();
      std::fprintf(stderr, "gateway_sim: %s: %s\n", name.c_str(),
                   std::string(st.message()).c_str());
      return st.code() == absl::StatusCode::kInvalidArgument ||
                     st.code() == absl::StatusCode::kUnimplemented
                 ? 2
                 : 3;
    }
    strategies.emplace_back(std::move(*sim), std::move(*bench));
  }
  const auto traffic = generate(tc);

  std::vector<Row> rows;
  for (auto& [sim, bench] : strategies) {
    Row row{sim->name(), {}, "", run(*sim, traffic, o), {}};
    for (std::uint32_t t = 0; t < static_cast<std::uint32_t>(tc.tenants); ++t) {
      row.allowance.push_back(sim->allowance(t));
    }
    row.a = analyze(row.run, tenants, o);
    row.note = sim->note(row.a.decisions);
    row.decisions_per_s = throughput(*bench, traffic, o);
    rows.push_back(std::move(row));
  }

  int exit_code = print_table(rows, o);
  exit_code = std::max(exit_code, write_chart(rows, traffic, o));
  return exit_code;
}
