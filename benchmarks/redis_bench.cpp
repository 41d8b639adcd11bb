// redis_bench — the Redis store's load generator (issue 5's benchmark table).
//
// Against a real redis-server on loopback (started by this program through
// cmake/redis_server.sh, or the one at QUOTA_REDIS_PORT), for 1, 8 and 50 connections
// (one thread each), it measures decisions per second, p50/p99 latency per call and the
// server CPU per decision for:
//   quota d1      RedisStore<TokenBucket>::apply, one EVALSHA per decision
//   quota p16     apply_pipelined: 16 EVALSHAs pipelined in one write
//   quota b16/b64 apply_batch: 16 / 64 decisions in ONE EVALSHA
//   naive-lua d1  the straightforward published script (HMGET, TIME, floating refill,
//                 HSET, PEXPIRE) with EVALSHA
//   noop-lua d1   EVALSHA of `return 1` with the same arguments: the ceiling of ANY
//                 one-script-call design (what Redis spends before the script does work)
//   INCR          redis-benchmark INCR at the same connections and depth (the ceiling of
//                 any one-round-trip design)
// Server CPU per decision, two ways: `server_us_per_decision` from INFO commandstats
// (usec of the script commands — time inside the script, wall clock, so a descheduled
// server inflates it) and `server_cpu_us_per_decision` from INFO cpu (the server
// process's user+sys CPU, so it also counts reading, parsing and replying, but not time
// spent descheduled). Then:
//   - "... loop" rows: quota d1, naive-lua d1, noop-lua d1 and INCR d1 from ONE
//     event-loop thread driving 50 connections (run_loop, like redis-benchmark), so that
//     the client's 50 threads do not take the server's CPU on a small machine, and INCR
//     goes through the same client as the scripts;
//   - p99 at HALF the peak: open-loop, 50 connections, depth 1, twice — "quota d1 @50%":
//     50 client threads through RedisStore::apply at 50 % of "quota d1" (50 connections);
//     "quota d1 loop @50%" (and @25%): the event-loop client, one thread, 50 non-blocking
//     connections, the same EVALSHA, at 50 % of "quota d1 loop" — both peaks of this run.
//     Latency from each request's SCHEDULED send time (no coordinated omission: a request
//     due while every connection is busy waits in a queue, and the wait counts); p50, p90,
//     p99, p99.9, the achieved rate, and whether the client fell behind the schedule
//     (achieved rate more than 3 % under the target, or requests left unanswered).
//     Target: p99 < 1 ms, met only on schedule. Under each paced row, what shaped its
//     tail: the machine's CPU busy and steal (/proc/stat), how long the server's main
//     thread, the event-loop thread and the kernel's softirq threads (which carry
//     loopback packets the interrupted code left over) were runnable but waiting for a
//     CPU (schedstat), the server's latency monitor (>= 2 ms), the loop thread's own CPU
//     per request and longest stall, and when the requests slower than 10 ms were due.
//   - MEMORY USAGE of one (non-idle) bucket;
//   - a naive client-side GET-compute-SET limiter under 8 threads on one key, with its
//     over-admission against the envelope r·T + B.
// The targets of issue 5 are checked at the end (table and JSON); the machine is shared,
// so the load average (/proc/loadavg) is recorded at the start and the end.
//
// Run (release build):  ./build/release/benchmarks/redis_bench [--seconds S] [--json FILE]
// `--benchmark_out=FILE` (what `bash cmake/run.sh bench` passes) also names the JSON
// file; other --benchmark_* arguments are ignored.
//
// This file: the flags and main. redis_bench/: measure.hpp (what a row measures, the rows,
// the JSON), event_loop.hpp (the one-thread client), workloads.hpp (the closed-loop rows,
// MEMORY USAGE, the naive client-side limiter), paced.hpp (the event-loop and open-loop
// rows), targets.hpp (issue 5's targets). The JSON is shaped like
// google-benchmark's: {"context": {...}, "benchmarks": [{"name", "run_type",
// "iterations", "real_time", "time_unit", counters...}], "targets": [...]}.
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "common/cli.hpp"
#include "quota/redis/redis_store.hpp"
#include "redis/support/redis_server.hpp"
#include "redis_bench/measure.hpp"
#include "redis_bench/paced.hpp"
#include "redis_bench/targets.hpp"
#include "redis_bench/workloads.hpp"

ABSL_FLAG(double, seconds, 1.5, "how long each row runs, seconds");
ABSL_FLAG(std::string, json, "", "also write the rows and targets as JSON to this file");

namespace {

constexpr const char* kUsage = R"(usage: redis_bench [--seconds S] [--json FILE]

The Redis store's load generator against a redis-server on loopback (its own, started
through cmake/redis_server.sh, or the one at QUOTA_REDIS_PORT).

  --seconds S           how long each row runs, in (0, 3600] seconds (default 1.5)
  --json FILE           also write the rows and the targets as JSON to FILE
  --benchmark_out=FILE  the same as --json FILE (what `bash cmake/run.sh bench` passes);
                        other --benchmark_* arguments are ignored
  --help                this text
)";

}  // namespace

int main(int argc, char** argv) {
  using namespace redis_bench;
  const auto args = quota::cli::parse({.name = "redis_bench",
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
  if (env_port == nullptr) server.emplace(quota::testing::scratch_dir("quota-redis-bench"));
  const int port = env_port != nullptr ? std::atoi(env_port) : server->port();
  if (port <= 0) {
    std::fprintf(stderr, "redis_bench: no redis-server (set QUOTA_REDIS_PORT or install it)\n");
    return 1;
  }
  const std::string load_start = load_average();
  Bench b;
  b.port = port;
  b.seconds = seconds;
  constexpr int kKeys = 10'000;
  for (int i = 0; i < kKeys; ++i) b.keys.push_back("{tenant-" + std::to_string(i) + "}read");
  std::string version;
  {
    quota::redis::Connection c(loopback(port));
    auto r = c.command({"INFO", "server"});
    if (r.ok() && (*r)->type == REDIS_REPLY_STRING) {
      const std::string info(quota::redis::reply_string(**r));
      const auto at = info.find("redis_version:");
      if (at != std::string::npos) version = info.substr(at + 14, info.find('\r', at) - at - 14);
    }
  }

  std::printf(
      "redis_bench on 127.0.0.1:%d (redis %s), %.1f s per row, %d keys, token bucket; "
      "load average %s\n",
      port, version.c_str(), seconds, kKeys, load_start.c_str());
  std::printf("%-20s %5s %12s %9s %9s %12s %12s %7s\n", "workload", "conns", "decisions/s",
              "p50 us", "p99 us", "server us/d", "server cpu/d", "errors");
  closed_rows(b);
  loop_and_paced_rows(b);
  const double memory = memory_row(b);
  naive_client_row(b);
  const std::vector<Target> targets = issue5_targets(memory);
  const std::string load_end = load_average();
  std::printf("targets (issue 5), load average at the end %s:\n", load_end.c_str());
  for (const Target& t : targets) {
    std::printf("  %-28s %10.3f %s %-8g %s\n", t.name.c_str(), t.value,
                t.at_most ? "<=" : ">=", t.bound,
                t.met() ? "met" : (t.valid ? "NOT met" : "NOT met (fell behind)"));
  }
  if (!json.empty()) {
    char host[256] = {};
    (void)::gethostname(host, sizeof host - 1);
    const auto now = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
    char date[64];
    std::strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
    write_json(json,
               {{"date", date},
                {"host_name", host},
                {"executable", argv[0]},
                {"redis_version", version},
                {"seconds_per_row", std::to_string(seconds)},
                {"keys", std::to_string(kKeys)},
                {"policy", "TokenBucket rate 1000000/s burst 1000000, cost 1"},
                {"load_average_start", load_start},
                {"load_average_end", load_end},
                {"num_cpus", std::to_string(std::thread::hardware_concurrency())}},
               targets);
    std::printf("JSON: %s\n", json.c_str());
  }
  return 0;
}
