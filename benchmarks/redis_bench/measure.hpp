// benchmarks/redis_bench/measure.hpp — what every row measures and records: server CPU and script
// time, the machine's CPU and run-queue waits, the closed/open-loop thread runner, the rows and the
// JSON file. (Part of redis_bench: see the top of benchmarks/redis_bench.cpp.)
#pragma once

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "quota/policy/token_bucket.hpp"
#include "quota/redis/redis_store.hpp"
#include "redis/support/redis_server.hpp"
#include "support/client_threads.hpp"
#include "support/json_out.hpp"
#include "support/redis_info.hpp"
#include "support/redis_scripts.hpp"
#include "support/speed_probe.hpp"

namespace redis_bench {

using namespace std::chrono_literals;
using quota::Nanos;
using quota::RedisStore;
using quota::TokenBucket;
using quota::bench::loopback;
using Clock = std::chrono::steady_clock;

// usec of the script commands since the last CONFIG RESETSTAT; -1 when INFO fails.
inline double server_script_usec(quota::redis::Connection& admin) {
  auto r = admin.command({"INFO", "commandstats"});
  if (!r.ok() || (*r)->type != REDIS_REPLY_STRING) return -1;
  return quota::bench::info_script_usec(std::string(quota::redis::reply_string(**r)));
}

// The server process's user+sys CPU seconds (INFO cpu); -1 when INFO fails.
inline double server_cpu_seconds(quota::redis::Connection& admin) {
  auto r = admin.command({"INFO", "cpu"});
  if (!r.ok() || (*r)->type != REDIS_REPLY_STRING) return -1;
  return quota::bench::info_cpu_seconds(std::string(quota::redis::reply_string(**r)));
}

// The machine's CPU time from /proc/stat's "cpu" line, in seconds: busy (everything but
// idle and iowait) and steal (taken by the hypervisor).
struct MachineCpu {
  double busy = 0, steal = 0;
};
inline MachineCpu machine_cpu() {
  std::ifstream in("/proc/stat");
  std::string cpu;
  double v[8] = {};
  in >> cpu;
  for (double& x : v) in >> x;
  const double hz = static_cast<double>(::sysconf(_SC_CLK_TCK));
  // user nice system idle iowait irq softirq steal
  return {.busy = (v[0] + v[1] + v[2] + v[5] + v[6]) / hz, .steal = v[7] / hz};
}

// A thread's time waiting on a run queue (runnable, not running), in ms, from
// /proc/<path>/schedstat ("run ns, wait ns, slices"); NaN if unavailable.
inline double run_queue_wait_ms(const std::string& path) {
  std::ifstream in(path);
  double run = 0, wait = 0;
  if (!(in >> run >> wait)) return std::numeric_limits<double>::quiet_NaN();
  return wait / 1e6;
}

// The schedstat files of the kernel's softirq threads (ksoftirqd/N). Network work that
// the interrupted code leaves over (loopback packets too) waits for these threads, which
// compete for a CPU like any other: while they are runnable but not running, replies
// sit in the kernel with neither the server nor the client behind.
inline std::vector<std::string> softirq_thread_schedstats() {
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator("/proc", ec)) {
    const std::string pid = e.path().filename().string();
    if (pid.empty() || std::isdigit(static_cast<unsigned char>(pid[0])) == 0) continue;
    std::ifstream comm(e.path() / "comm");
    std::string name;
    if (std::getline(comm, name) && name.rfind("ksoftirqd/", 0) == 0) {
      out.push_back((e.path() / "schedstat").string());
    }
  }
  return out;
}

inline double run_queue_wait_ms(const std::vector<std::string>& paths) {
  double sum = 0;
  for (const auto& p : paths) sum += run_queue_wait_ms(p);
  return sum;
}

inline std::string load_average() {
  std::ifstream in("/proc/loadavg");
  std::string a, b, c;
  in >> a >> b >> c;
  return a + " " + b + " " + c;
}

// The latency percentiles per call (quota::bench::Latency: p50_us, p99_us, p90_us,
// p999_us, max_us) and the rest.
struct Result : quota::bench::Latency {
  double decisions_per_s = 0;
  double server_us_per_decision = 0;      // INFO commandstats (script commands)
  double server_cpu_us_per_decision = 0;  // INFO cpu (the whole server process)
  double calls = 0;
  double mean_call_us = 0;
  std::int64_t errors = 0;
  // Open loop only (run_loop with a rate; target_rate is also set for run's paced row):
  double target_rate = 0;          // requests/s scheduled
  double send_wait_p99_us = 0;     // due time -> written: queueing behind busy connections
                                   // and the client's own lateness
  std::int64_t max_backlog = 0;    // most requests due but not yet sent at one time
  std::int64_t unfinished = 0;     // unsent or unanswered when the drain gave up
  double client_stall_max_us = 0;  // the loop thread's longest gap beyond its own wait
                                   // (descheduled or slow), as a cause of the tail; blind
                                   // while all connections are busy (it then waits 100 ms)
  // When in the window the tail happened: requests slower than 10 ms, and the first and
  // last of their due times (ms after the start).
  std::int64_t slow_10ms = 0;
  double slow_first_ms = 0, slow_last_ms = 0;
  double client_cpu_us_per_request = 0;  // the event-loop thread's own CPU (user + sys)
};

// The calling thread's CPU time (user + sys), in seconds.
inline double thread_cpu_seconds() {
  rusage u{};
  ::getrusage(RUSAGE_THREAD, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec) * 1e-6;
}

// Runs `threads` threads for `seconds` (quota::bench::run_threads: closed loop, or open
// loop at `rate` calls per second with latency from each call's scheduled start); each
// call of `one(thread, rng)` makes `per_call` decisions (returns false on error).
inline Result run(int port, int threads, double seconds, int per_call,
                  const std::function<bool(int, std::mt19937_64&)>& one, double rate = 0) {
  quota::redis::Connection admin(loopback(port));
  (void)admin.command({"CONFIG", "RESETSTAT"});
  const double cpu0 = server_cpu_seconds(admin);
  quota::bench::ThreadsRun measured = quota::bench::run_threads(
      threads, seconds,
      [&](int t, std::mt19937_64& rng) -> std::int64_t { return one(t, rng) ? 0 : 1; }, rate);
  const double cpu1 = server_cpu_seconds(admin);
  Result r;
  const double decisions = static_cast<double>(measured.calls) * per_call;
  r.decisions_per_s = decisions / measured.elapsed_s;
  static_cast<quota::bench::Latency&>(r) = quota::bench::latency_of(measured.latency_us);
  r.server_us_per_decision = server_script_usec(admin) / decisions;
  r.server_cpu_us_per_decision = (cpu1 - cpu0) * 1e6 / decisions;
  r.calls = static_cast<double>(measured.calls);
  r.mean_call_us = measured.elapsed_s * 1e6 * threads / std::max(1.0, r.calls);
  r.errors = measured.errors;
  return r;
}

// Every measured row, for the JSON file and the target checks.
struct Row {
  std::string name;  // e.g. "quota_d1/conns:50"
  std::string workload;
  int conns = 0;
  Result r;
  std::map<std::string, double> extra;  // more counters (fractions, ratios)
};
inline std::vector<Row> g_rows;

inline Row& record(const std::string& workload, int conns, const Result& r) {
  std::string id = workload;
  std::replace(id.begin(), id.end(), ' ', '_');
  g_rows.push_back(Row{id + "/conns:" + std::to_string(conns), workload, conns, r, {}});
  return g_rows.back();
}

inline void print(const char* name, int conns, const Result& r) {
  std::printf("%-20s %5d %12.0f %9.1f %9.1f %12.2f %12.2f %7" PRId64 "\n", name, conns,
              r.decisions_per_s, r.p50_us, r.p99_us, r.server_us_per_decision,
              r.server_cpu_us_per_decision, r.errors);
  std::fflush(stdout);
  record(name, conns, r);
}

// The coalescing store of the "coalesced" rows: up to 64 decisions per round trip, two
// calls in flight.
inline quota::RedisStoreOptions coalesced_options(
    std::shared_ptr<quota::redis::ConnectionPool> pool) {
  quota::RedisStoreOptions o{.pool = std::move(pool), .prefix = "bench:"};
  o.coalesce = 64;
  o.coalesce_calls = 2;
  return o;
}

// The mean number of decisions a coalescing store's round trips carried.
inline double per_round_trip(const RedisStore<TokenBucket>::CoalesceStats& s) {
  return static_cast<double>(s.decisions) / std::max<double>(1, static_cast<double>(s.round_trips));
}

struct Target {
  std::string name, what;
  double value = 0, bound = 0;
  bool at_most = true;  // value <= bound (else value >= bound)
  bool valid = true;    // false: the measurement did not hold (an open loop fell behind)
  bool met() const { return valid && (at_most ? value <= bound : value >= bound); }
};

using quota::bench::json_escape;
using quota::bench::json_number;

inline void write_json(const std::string& path, const std::map<std::string, std::string>& context,
                       const std::vector<Target>& targets) {
  std::ofstream out(path);
  out << "{\n  \"context\": {";
  bool first = true;
  for (const auto& [k, v] : context) {
    out << (first ? "\n" : ",\n") << "    \"" << k << "\": \"" << json_escape(v) << "\"";
    first = false;
  }
  out << "\n  },\n  \"benchmarks\": [";
  first = true;
  for (const Row& row : g_rows) {
    const Result& r = row.r;
    out << (first ? "\n" : ",\n") << "    {\"name\": \"" << json_escape(row.name)
        << "\", \"run_name\": \"" << json_escape(row.name)
        << "\", \"run_type\": \"iteration\", \"repetitions\": 1, \"threads\": " << row.conns
        << ", \"iterations\": " << json_number(r.calls)
        << ", \"real_time\": " << json_number(r.mean_call_us)
        << ", \"cpu_time\": " << json_number(r.mean_call_us) << ", \"time_unit\": \"us\""
        << ", \"connections\": " << row.conns
        << ", \"decisions_per_s\": " << json_number(r.decisions_per_s)
        << ", \"p50_us\": " << json_number(r.p50_us) << ", \"p90_us\": " << json_number(r.p90_us)
        << ", \"p99_us\": " << json_number(r.p99_us) << ", \"p999_us\": " << json_number(r.p999_us)
        << ", \"max_us\": " << json_number(r.max_us)
        << ", \"server_us_per_decision\": " << json_number(r.server_us_per_decision)
        << ", \"server_cpu_us_per_decision\": " << json_number(r.server_cpu_us_per_decision)
        << ", \"errors\": " << r.errors;
    for (const auto& [k, v] : row.extra) out << ", \"" << k << "\": " << json_number(v);
    out << "}";
    first = false;
  }
  out << "\n  ],\n  \"targets\": [";
  first = true;
  for (const Target& t : targets) {
    out << (first ? "\n" : ",\n") << "    {\"name\": \"" << json_escape(t.name)
        << "\", \"what\": \"" << json_escape(t.what) << "\", \"value\": " << json_number(t.value)
        << ", \"bound\": " << json_number(t.bound)
        << ", \"at_most\": " << (t.at_most ? "true" : "false")
        << ", \"valid\": " << (t.valid ? "true" : "false")
        << ", \"met\": " << (t.met() ? "true" : "false") << "}";
    first = false;
  }
  out << "\n  ]\n}\n";
}

using quota::bench::kNaiveLua;
using quota::bench::kNoopLua;

// redis-benchmark INCR: requests per second and p50 (its own numbers), server µs per
// INCR (commandstats) and server CPU per INCR (INFO cpu).
inline Result redis_benchmark_incr(int port, int conns, int depth) {
  quota::redis::Connection admin(loopback(port));
  (void)admin.command({"CONFIG", "RESETSTAT"});
  const double cpu0 = server_cpu_seconds(admin);
  constexpr int kRequests = 200000;
  const std::string cmd = "redis-benchmark -h 127.0.0.1 -p " + std::to_string(port) + " -c " +
                          std::to_string(conns) + " -P " + std::to_string(depth) + " -n " +
                          std::to_string(kRequests) + " -t incr -q 2>/dev/null";
  Result r;
  FILE* f = ::popen(cmd.c_str(), "r");
  if (f == nullptr) return r;
  char buf[4096];
  std::string out;
  while (std::fgets(buf, sizeof buf, f) != nullptr) out += buf;
  ::pclose(f);
  // "INCR: 123456.79 requests per second, p50=0.711 msec" (the last \r-separated segment)
  const auto at = out.rfind("INCR:");
  if (at == std::string::npos) return r;
  r.decisions_per_s = std::atof(out.c_str() + at + 5);
  if (const auto p = out.find("p50=", at); p != std::string::npos) {
    r.p50_us = std::atof(out.c_str() + p + 4) * 1000;
  }
  r.p99_us = std::numeric_limits<double>::quiet_NaN();
  r.calls = kRequests;
  r.mean_call_us = r.decisions_per_s > 0 ? 1e6 * conns / r.decisions_per_s : 0;
  r.server_cpu_us_per_decision = (server_cpu_seconds(admin) - cpu0) * 1e6 / kRequests;
  auto info = admin.command({"INFO", "commandstats"});
  if (info.ok() && (*info)->type == REDIS_REPLY_STRING) {
    const std::string s(quota::redis::reply_string(**info));
    if (const auto c = s.find("cmdstat_incr:"); c != std::string::npos) {
      r.server_us_per_decision = std::atof(s.c_str() + s.find("usec=", c) + 5) / kRequests;
    }
  }
  return r;
}

// Whether an open-loop result kept to its schedule: every scheduled request answered,
// and the achieved rate within kRateTolerance of the target.
inline constexpr double kRateTolerance = 0.03;
inline bool fell_behind(const Result& r) {
  return r.unfinished > 0 || r.decisions_per_s < (1 - kRateTolerance) * r.target_rate;
}
}  // namespace redis_bench
