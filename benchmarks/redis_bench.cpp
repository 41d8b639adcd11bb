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
// file; other --benchmark_* arguments are ignored. The JSON is shaped like
// google-benchmark's: {"context": {...}, "benchmarks": [{"name", "run_type",
// "iterations", "real_time", "time_unit", counters...}], "targets": [...]}.
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
#include <span>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "quota/policy/token_bucket.hpp"
#include "quota/redis/redis_store.hpp"
#include "support/client_threads.hpp"
#include "support/json_out.hpp"
#include "support/redis_info.hpp"
#include "support/redis_scripts.hpp"
#include "support/redis_server.hpp"
#include "support/speed_probe.hpp"

using namespace std::chrono_literals;
using quota::Nanos;
using quota::RedisStore;
using quota::TokenBucket;
using quota::bench::loopback;
using Clock = std::chrono::steady_clock;

namespace {

// usec of the script commands since the last CONFIG RESETSTAT; -1 when INFO fails.
double server_script_usec(quota::redis::Connection& admin) {
  auto r = admin.command({"INFO", "commandstats"});
  if (!r.ok() || (*r)->type != REDIS_REPLY_STRING) return -1;
  return quota::bench::info_script_usec(std::string(quota::redis::reply_string(**r)));
}

// The server process's user+sys CPU seconds (INFO cpu); -1 when INFO fails.
double server_cpu_seconds(quota::redis::Connection& admin) {
  auto r = admin.command({"INFO", "cpu"});
  if (!r.ok() || (*r)->type != REDIS_REPLY_STRING) return -1;
  return quota::bench::info_cpu_seconds(std::string(quota::redis::reply_string(**r)));
}

// The machine's CPU time from /proc/stat's "cpu" line, in seconds: busy (everything but
// idle and iowait) and steal (taken by the hypervisor).
struct MachineCpu {
  double busy = 0, steal = 0;
};
MachineCpu machine_cpu() {
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
double run_queue_wait_ms(const std::string& path) {
  std::ifstream in(path);
  double run = 0, wait = 0;
  if (!(in >> run >> wait)) return std::numeric_limits<double>::quiet_NaN();
  return wait / 1e6;
}

// The schedstat files of the kernel's softirq threads (ksoftirqd/N). Network work that
// the interrupted code leaves over (loopback packets too) waits for these threads, which
// compete for a CPU like any other: while they are runnable but not running, replies
// sit in the kernel with neither the server nor the client behind.
std::vector<std::string> softirq_thread_schedstats() {
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

double run_queue_wait_ms(const std::vector<std::string>& paths) {
  double sum = 0;
  for (const auto& p : paths) sum += run_queue_wait_ms(p);
  return sum;
}

std::string load_average() {
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
double thread_cpu_seconds() {
  rusage u{};
  ::getrusage(RUSAGE_THREAD, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec) * 1e-6;
}

// Runs `threads` threads for `seconds` (quota::bench::run_threads: closed loop, or open
// loop at `rate` calls per second with latency from each call's scheduled start); each
// call of `one(thread, rng)` makes `per_call` decisions (returns false on error).
Result run(int port, int threads, double seconds, int per_call,
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
std::vector<Row> g_rows;

Row& record(const std::string& workload, int conns, const Result& r) {
  std::string id = workload;
  std::replace(id.begin(), id.end(), ' ', '_');
  g_rows.push_back(Row{id + "/conns:" + std::to_string(conns), workload, conns, r, {}});
  return g_rows.back();
}

void print(const char* name, int conns, const Result& r) {
  std::printf("%-20s %5d %12.0f %9.1f %9.1f %12.2f %12.2f %7" PRId64 "\n", name, conns,
              r.decisions_per_s, r.p50_us, r.p99_us, r.server_us_per_decision,
              r.server_cpu_us_per_decision, r.errors);
  std::fflush(stdout);
  record(name, conns, r);
}

// The coalescing store of the "coalesced" rows: up to 64 decisions per round trip, two
// calls in flight.
quota::RedisStoreOptions coalesced_options(std::shared_ptr<quota::redis::ConnectionPool> pool) {
  quota::RedisStoreOptions o{.pool = std::move(pool), .prefix = "bench:"};
  o.coalesce = 64;
  o.coalesce_calls = 2;
  return o;
}

// The mean number of decisions a coalescing store's round trips carried.
double per_round_trip(const RedisStore<TokenBucket>::CoalesceStats& s) {
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

void write_json(const std::string& path, const std::map<std::string, std::string>& context,
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
Result redis_benchmark_incr(int port, int conns, int depth) {
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
constexpr double kRateTolerance = 0.03;
bool fell_behind(const Result& r) {
  return r.unfinished > 0 || r.decisions_per_s < (1 - kRateTolerance) * r.target_rate;
}

// An event-loop client: ONE thread drives `conns` non-blocking connections, each with at
// most one command in flight (depth 1), like redis-benchmark — so that on a small machine
// the client does not take the server's CPU away with 50 threads. `make` gives the next
// command's arguments; `good` checks a reply.
//
// Closed loop (`rate` <= 0): every idle connection sends at once, for `seconds`; latency
// from send to reply.
//
// Open loop (`rate` > 0): request k is DUE at t0 + k / rate, for every k due before
// t0 + seconds, whatever the replies do. A due request goes out on the first idle
// connection; while all connections are busy, due requests wait in a FIFO queue (the
// requests [sent, k) whose due time has passed) and that wait is part of their latency,
// which counts from the DUE time to the reply — a slow reply cannot postpone the
// measurement of the requests behind it (no coordinated omission). After the window the
// queue is drained, for at most `seconds` more; a request still unsent or unanswered then
// counts with its latency so far (a lower bound) in `unfinished`. The achieved rate is
// replies / (last reply − t0); fell_behind() compares it with the target.
Result run_loop(int port, int conns, double seconds,
                const std::function<void(std::mt19937_64&, std::vector<std::string>&)>& make,
                const std::function<bool(const redisReply&)>& good, double rate = 0) {
  quota::redis::Connection admin(loopback(port));
  (void)admin.command({"CONFIG", "RESETSTAT"});
  const double cpu0 = server_cpu_seconds(admin);
  struct Conn {
    redisContext* ctx = nullptr;
    bool busy = false;     // a command is in flight
    bool writing = false;  // ... and not all of its bytes are written yet
    Clock::time_point due;
  };
  std::vector<Conn> cs(static_cast<std::size_t>(conns));
  auto fail = [&](const char* what) {
    std::fprintf(stderr, "redis_bench: %s\n", what);
    for (Conn& c : cs) {
      if (c.ctx != nullptr) redisFree(c.ctx);
    }
    return Result{};
  };
  // Non-blocking connects; then wait for each to complete.
  for (Conn& c : cs) {
    c.ctx = redisConnectNonBlock("127.0.0.1", port);
    if (c.ctx == nullptr || c.ctx->err != 0) return fail("connect failed");
  }
  for (Conn& c : cs) {
    pollfd p{.fd = c.ctx->fd, .events = POLLOUT, .revents = 0};
    int err = 0;
    socklen_t len = sizeof err;
    if (::poll(&p, 1, 2000) != 1 ||
        ::getsockopt(c.ctx->fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0 || err != 0) {
      return fail("connect failed");
    }
    const int one = 1;
    (void)::setsockopt(c.ctx->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  }
  const bool paced = rate > 0;
  // epoll_pwait2 sleeps until the next due time; the default timer slack (50 µs) would make
  // every wake-up up to 50 µs late, which the latency from the due time would count.
  const int old_slack = ::prctl(PR_GET_TIMERSLACK, 0, 0, 0, 0);
  if (paced) (void)::prctl(PR_SET_TIMERSLACK, 1000UL, 0, 0, 0);
  std::mt19937_64 rng(42);
  std::vector<std::string> args;
  std::vector<const char*> argv;
  std::vector<std::size_t> lens;
  std::vector<float> lat, waits;
  lat.reserve(1 << 20);
  if (paced) waits.reserve(1 << 20);
  std::int64_t done = 0, errors = 0, sent = 0, max_backlog = 0, unfinished = 0;
  auto us = [](Clock::duration d) { return std::chrono::duration<float, std::micro>(d).count(); };
  const auto t0 = Clock::now();
  const auto end =
      t0 + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
  const auto give_up = end + (end - t0);  // open loop: the drain's limit
  auto due_at = [&](std::int64_t k) {
    return t0 + std::chrono::duration_cast<Clock::duration>(
                    std::chrono::duration<double>(static_cast<double>(k) / rate));
  };
  // Open loop: the requests 0 .. scheduled-1 are due before `end`.
  std::int64_t scheduled = 0;
  if (paced) {
    scheduled = std::llround(seconds * rate);
    while (scheduled > 0 && due_at(scheduled - 1) >= end) --scheduled;
    while (due_at(scheduled) < end) ++scheduled;
  }
  Clock::time_point last_reply = t0;
  const double client_cpu0 = thread_cpu_seconds();
  Clock::time_point prev_iteration = t0;
  std::int64_t slow_count = 0;
  double slow_first = 0, slow_last = 0;
  Clock::duration prev_wait{}, max_stall{};
  auto send = [&](Conn& c, Clock::time_point due) {
    make(rng, args);
    argv.clear();
    lens.clear();
    for (const auto& a : args) {
      argv.push_back(a.data());
      lens.push_back(a.size());
    }
    redisAppendCommandArgv(c.ctx, static_cast<int>(argv.size()), argv.data(), lens.data());
    int written = 0;
    if (redisBufferWrite(c.ctx, &written) != REDIS_OK) return false;
    c.writing = written == 0;
    c.busy = true;
    c.due = due;
    ++sent;
    if (paced) waits.push_back(us(Clock::now() - due));
    return true;
  };
  // epoll: every connection is registered once for input (an idle one never becomes
  // readable unless it breaks), for output too only while a write is unfinished; a
  // wake-up costs what is ready, not a scan of all connections.
  struct EpollFd {
    int fd = ::epoll_create1(EPOLL_CLOEXEC);
    ~EpollFd() {
      if (fd >= 0) ::close(fd);
    }
  } ep;
  auto watch = [&](std::size_t i, bool out) {
    epoll_event ev{};
    ev.events = EPOLLIN | (out ? EPOLLOUT : 0U);
    ev.data.u64 = i;
    return ::epoll_ctl(ep.fd, EPOLL_CTL_MOD, cs[i].ctx->fd, &ev) == 0;
  };
  for (std::size_t i = 0; i < cs.size(); ++i) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u64 = i;
    if (ep.fd < 0 || ::epoll_ctl(ep.fd, EPOLL_CTL_ADD, cs[i].ctx->fd, &ev) != 0) {
      return fail("epoll failed");
    }
  }
  std::vector<std::size_t> idle(cs.size());  // a stack of idle connections
  for (std::size_t i = 0; i < cs.size(); ++i) idle[i] = cs.size() - 1 - i;
  std::size_t in_flight = 0;
  auto send_on_idle = [&](Clock::time_point due) {
    const std::size_t i = idle.back();
    idle.pop_back();
    ++in_flight;
    return send(cs[i], due) && (!cs[i].writing || watch(i, true));
  };
  std::vector<epoll_event> events(cs.size());
  while (true) {
    const auto now = Clock::now();
    max_stall = std::max(max_stall, now - prev_iteration - prev_wait);
    prev_iteration = now;
    if (paced && now >= give_up) break;
    // Send what is due, in order, on idle connections.
    while (!idle.empty()) {
      if (paced) {
        if (sent == scheduled || due_at(sent) > now) break;
        if (!send_on_idle(due_at(sent))) return fail("write failed");
      } else {
        if (now >= end) break;
        if (!send_on_idle(Clock::now())) return fail("write failed");
      }
    }
    if (paced && sent < scheduled && due_at(sent) <= now) {
      // All connections busy: the requests due by now wait in the queue.
      const auto due_by_now = std::min(
          scheduled,
          static_cast<std::int64_t>(std::chrono::duration<double>(now - t0).count() * rate) + 1);
      max_backlog = std::max(max_backlog, due_by_now - sent);
    }
    const bool left = paced ? sent < scheduled : now < end;
    if (!left && in_flight == 0) break;
    // Wait for a reply, or (with an idle connection) until the next request is due;
    // epoll_pwait2 to the nanosecond (a whole-ms epoll_wait would spin).
    std::chrono::nanoseconds wait = std::chrono::milliseconds(100);
    if (paced && left && !idle.empty()) {
      wait = std::clamp<std::chrono::nanoseconds>(due_at(sent) - Clock::now(),
                                                  std::chrono::nanoseconds(0), wait);
    }
    if (paced) {
      wait = std::clamp<std::chrono::nanoseconds>(give_up - now, std::chrono::nanoseconds(0), wait);
    }
    const timespec ts{.tv_sec = 0, .tv_nsec = static_cast<long>(wait.count())};
    prev_wait = std::chrono::duration_cast<Clock::duration>(wait);
    const int ready =
        ::epoll_pwait2(ep.fd, events.data(), static_cast<int>(events.size()), &ts, nullptr);
    if (ready < 0) {
      if (errno == EINTR) continue;
      return fail("epoll_pwait2 failed");
    }
    for (int e = 0; e < ready; ++e) {
      const std::size_t i = events[static_cast<std::size_t>(e)].data.u64;
      const std::uint32_t rev = events[static_cast<std::size_t>(e)].events;
      Conn& c = cs[i];
      if ((rev & EPOLLOUT) != 0 && c.writing) {
        int written = 0;
        if (redisBufferWrite(c.ctx, &written) != REDIS_OK) return fail("write failed");
        c.writing = written == 0;
        if (!c.writing && !watch(i, false)) return fail("epoll failed");
      }
      if ((rev & (EPOLLIN | EPOLLERR | EPOLLHUP)) == 0) continue;
      if (redisBufferRead(c.ctx) != REDIS_OK) return fail("read failed");
      void* raw = nullptr;
      while (c.busy && redisGetReplyFromReader(c.ctx, &raw) == REDIS_OK && raw != nullptr) {
        quota::redis::Reply reply(static_cast<redisReply*>(raw));
        last_reply = Clock::now();
        lat.push_back(us(last_reply - c.due));
        if (paced && lat.back() > 10'000) {
          const double at = std::chrono::duration<double, std::milli>(c.due - t0).count();
          if (slow_count == 0) slow_first = at;
          slow_last = std::max(slow_last, at);
          ++slow_count;
        }
        ++done;
        if (!good(*reply)) ++errors;
        c.busy = false;
        if (c.writing && !watch(i, false)) return fail("epoll failed");
        c.writing = false;
        idle.push_back(i);
        --in_flight;
        raw = nullptr;
      }
    }
  }
  const auto stop = Clock::now();
  const double client_cpu = thread_cpu_seconds() - client_cpu0;
  if (paced) {
    // Gave up draining: what is left counts with its latency so far (a lower bound).
    for (const Conn& c : cs) {
      if (!c.busy) continue;
      lat.push_back(us(stop - c.due));
      ++unfinished;
    }
    for (std::int64_t k = sent; k < scheduled; ++k) {
      lat.push_back(us(std::max(Clock::duration::zero(), stop - due_at(k))));
      ++unfinished;
    }
    (void)::prctl(PR_SET_TIMERSLACK, static_cast<unsigned long>(old_slack), 0, 0, 0);
  }
  const double elapsed = std::chrono::duration<double>((paced ? last_reply : stop) - t0).count();
  const double cpu1 = server_cpu_seconds(admin);
  for (Conn& c : cs) redisFree(c.ctx);
  Result r;
  r.decisions_per_s = elapsed > 0 ? static_cast<double>(done) / elapsed : 0;
  static_cast<quota::bench::Latency&>(r) = quota::bench::latency_of(lat);
  r.server_us_per_decision =
      server_script_usec(admin) / static_cast<double>(std::max<std::int64_t>(done, 1));
  if (r.server_us_per_decision == 0)
    r.server_us_per_decision = std::numeric_limits<double>::quiet_NaN();
  r.server_cpu_us_per_decision =
      (cpu1 - cpu0) * 1e6 / static_cast<double>(std::max<std::int64_t>(done, 1));
  r.calls = static_cast<double>(done);
  r.mean_call_us = elapsed * 1e6 * conns / std::max(1.0, r.calls);
  r.errors = errors;
  r.client_cpu_us_per_request =
      client_cpu * 1e6 / static_cast<double>(std::max<std::int64_t>(sent, 1));
  if (paced) {
    r.target_rate = rate;
    std::sort(waits.begin(), waits.end());
    if (!waits.empty()) r.send_wait_p99_us = waits[waits.size() * 99 / 100];
    r.max_backlog = max_backlog;
    r.unfinished = unfinished;
    r.client_stall_max_us = std::chrono::duration<double, std::micro>(max_stall).count();
    r.slow_10ms = slow_count;
    r.slow_first_ms = slow_first;
    r.slow_last_ms = slow_last;
  }
  return r;
}

const Row* find_row(const std::string& workload, int conns) {
  for (const Row& r : g_rows) {
    if (r.workload == workload && r.conns == conns) return &r;
  }
  return nullptr;
}

}  // namespace

int main(int argc, char** argv) {
  double seconds = 1.5;
  std::string json;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--seconds" && i + 1 < argc) seconds = std::atof(argv[++i]);
    if (a == "--json" && i + 1 < argc) json = argv[++i];
    if (a.rfind("--benchmark_out=", 0) == 0) json = a.substr(std::strlen("--benchmark_out="));
  }
  // The server at QUOTA_REDIS_PORT, or one of our own for this run.
  const char* env_port = std::getenv("QUOTA_REDIS_PORT");
  std::optional<quota::bench::ScratchServer> server;
  if (env_port == nullptr) server.emplace(quota::bench::scratch_dir("quota-redis-bench"));
  const int port = env_port != nullptr ? std::atoi(env_port) : server->port();
  if (port <= 0) {
    std::fprintf(stderr, "redis_bench: no redis-server (set QUOTA_REDIS_PORT or install it)\n");
    return 1;
  }
  const std::string load_start = load_average();
  const TokenBucket policy{.rate = {.units = 1'000'000, .per = 1s}, .burst = 1'000'000};
  constexpr int kKeys = 10'000;
  std::vector<std::string> keys;
  for (int i = 0; i < kKeys; ++i) keys.push_back("{tenant-" + std::to_string(i) + "}read");
  auto key = [&](std::mt19937_64& rng) -> const std::string& { return keys[rng() % kKeys]; };
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
  for (int conns : {1, 8, 50}) {
    auto pool = std::make_shared<quota::redis::ConnectionPool>(loopback(port),
                                                               static_cast<std::size_t>(conns));
    RedisStore<TokenBucket> store({.pool = pool, .prefix = "bench:"});
    print("quota d1", conns, run(port, conns, seconds, 1, [&](int, std::mt19937_64& rng) {
            return store.apply(policy, key(rng), Nanos{0}, 1).ok();
          }));
    if (conns > 1) {
      // The same callers, each with one decision at a time, through a coalescing store
      // (RedisStoreOptions::coalesce): calls that arrive while two are in flight go
      // together in one script call.
      RedisStore<TokenBucket> coalescing(coalesced_options(pool));
      print("quota d1 coalesced", conns,
            run(port, conns, seconds, 1, [&](int, std::mt19937_64& rng) {
              return coalescing.apply(policy, key(rng), Nanos{0}, 1).ok();
            }));
      g_rows.back().extra["decisions_per_round_trip"] = per_round_trip(coalescing.coalesce_stats());
      std::printf("  (%.1f decisions per round trip)\n",
                  g_rows.back().extra["decisions_per_round_trip"]);
    }
    using Item = RedisStore<TokenBucket>::BatchItem;
    for (int depth : {16}) {
      print("quota p16", conns, run(port, conns, seconds, depth, [&](int, std::mt19937_64& rng) {
              std::vector<Item> items;
              for (int i = 0; i < depth; ++i) items.push_back({key(rng), 1});
              auto r = store.apply_pipelined(policy, items, Nanos{0});
              return r.ok();
            }));
    }
    for (int batch : {16, 64}) {
      const std::string name = "quota b" + std::to_string(batch);
      print(name.c_str(), conns, run(port, conns, seconds, batch, [&](int, std::mt19937_64& rng) {
              std::vector<Item> items;
              for (int i = 0; i < batch; ++i) items.push_back({key(rng), 1});
              auto r = store.apply_batch(policy, items, Nanos{0});
              return r.ok() &&
                     std::all_of(r->begin(), r->end(), [](const auto& d) { return d.ok(); });
            }));
    }
    // The straightforward script and a script that does nothing, loaded once, one
    // EVALSHA per decision.
    std::string sha, noop_sha;
    {
      quota::redis::Connection c(loopback(port));
      auto r = c.command({"SCRIPT", "LOAD", kNaiveLua});
      if (r.ok() && (*r)->type == REDIS_REPLY_STRING) sha = quota::redis::reply_string(**r);
      r = c.command({"SCRIPT", "LOAD", kNoopLua});
      if (r.ok() && (*r)->type == REDIS_REPLY_STRING) noop_sha = quota::redis::reply_string(**r);
    }
    std::vector<std::unique_ptr<quota::redis::Connection>> conns_naive;
    for (int i = 0; i < conns; ++i) {
      conns_naive.push_back(std::make_unique<quota::redis::Connection>(loopback(port)));
    }
    print("naive-lua d1", conns, run(port, conns, seconds, 1, [&](int t, std::mt19937_64& rng) {
            const std::string k = "naive:" + key(rng);
            auto r = conns_naive[static_cast<std::size_t>(t)]->command(
                {"EVALSHA", sha, "1", k, "1000000", "1000000", "1"});
            return r.ok() && (*r)->type == REDIS_REPLY_INTEGER;
          }));
    // The same arguments as quota d1's EVALSHA (server time, one bucket).
    print("noop-lua d1", conns, run(port, conns, seconds, 1, [&](int t, std::mt19937_64& rng) {
            const std::string k = "bench:" + key(rng);
            auto r = conns_naive[static_cast<std::size_t>(t)]->command(
                {"EVALSHA", noop_sha, "1", k, "", "", "1000", "0", "", "1", "1", "1", "1000000",
                 "1000", "1", "1000000000", "1000000000"});
            return r.ok() && (*r)->type == REDIS_REPLY_INTEGER;
          }));
    for (int depth : {1, 16}) {
      const Result r = redis_benchmark_incr(port, conns, depth);
      std::printf(
          "%-20s %5d %12.0f %9.1f %9s %12.2f %12.2f   (redis-benchmark -c %d -P %d -t incr)\n",
          depth == 1 ? "INCR d1" : "INCR p16", conns, r.decisions_per_s, r.p50_us, "",
          r.server_us_per_decision, r.server_cpu_us_per_decision, conns, depth);
      record(depth == 1 ? "INCR d1" : "INCR p16", conns, r);
    }
    // Ratios within this run.
    const Row* incr = find_row("INCR d1", conns);
    const Row* naive = find_row("naive-lua d1", conns);
    for (Row& row : g_rows) {
      if (row.conns != conns || incr == nullptr || naive == nullptr) continue;
      if (row.workload.rfind("quota", 0) == 0 || row.workload.rfind("noop", 0) == 0) {
        row.extra["fraction_of_incr_d1"] = row.r.decisions_per_s / incr->r.decisions_per_s;
        // Decisions per Redis core, relative to the straightforward script: the inverse
        // ratio of server CPU per decision (both measures).
        row.extra["per_core_vs_naive"] =
            naive->r.server_us_per_decision / row.r.server_us_per_decision;
        row.extra["per_core_vs_naive_cpu"] =
            naive->r.server_cpu_us_per_decision / row.r.server_cpu_us_per_decision;
      }
    }
  }

  // The same d1 workloads from ONE event-loop thread with 50 connections (run_loop):
  // what the server sustains when the client is as light as redis-benchmark's. The
  // quota script gets exactly the arguments RedisStore::apply sends (server time).
  std::string quota_sha, naive_sha, noop_sha;
  {
    quota::redis::Connection c(loopback(port));
    for (auto [text, sha] :
         {std::pair{quota::redis::LuaTwin<TokenBucket>::script().c_str(), &quota_sha},
          std::pair{kNaiveLua, &naive_sha}, std::pair{kNoopLua, &noop_sha}}) {
      auto r = c.command({"SCRIPT", "LOAD", text});
      if (r.ok() && (*r)->type == REDIS_REPLY_STRING) *sha = quota::redis::reply_string(**r);
    }
  }
  auto quota_cmd = [&](std::mt19937_64& rng, std::vector<std::string>& a) {
    // Laid out as RedisStore::apply does (twin/call.hpp): server time, no attempt.
    const std::string k = key(rng);
    const quota::redis::BucketRequest<TokenBucket> req{&policy, k, 1};
    auto call = quota::redis::build_call(quota::redis::CallOptions{.prefix = "bench:"},
                                         std::span(&req, 1), Nanos{0}, {});
    a = {"EVALSHA", quota_sha, "1", call->keys[0]};
    a.insert(a.end(), call->args.begin(), call->args.end());
  };
  auto is_array = [](const redisReply& r) { return r.type == REDIS_REPLY_ARRAY; };
  auto is_int = [](const redisReply& r) { return r.type == REDIS_REPLY_INTEGER; };
  {
    const Result r = run_loop(port, 50, seconds, quota_cmd, is_array);
    print("quota d1 loop", 50, r);
    g_rows.back().extra["client_cpu_us_per_request"] = r.client_cpu_us_per_request;
    std::printf("  (the event-loop thread's CPU: %.1f us per request)\n",
                r.client_cpu_us_per_request);
  }
  print("naive-lua d1 loop", 50,
        run_loop(
            port, 50, seconds,
            [&](std::mt19937_64& rng, std::vector<std::string>& a) {
              a = {"EVALSHA", naive_sha, "1", "naive:" + key(rng), "1000000", "1000000", "1"};
            },
            is_int));
  print("noop-lua d1 loop", 50,
        run_loop(
            port, 50, seconds,
            [&](std::mt19937_64& rng, std::vector<std::string>& a) {
              quota_cmd(rng, a);
              a[1] = noop_sha;
            },
            is_int));
  print("INCR d1 loop", 50,
        run_loop(
            port, 50, seconds,
            [&](std::mt19937_64& rng, std::vector<std::string>& a) {
              a = {"INCR", "incr:" + key(rng)};
            },
            is_int));
  if (Row* q = const_cast<Row*>(find_row("quota d1 loop", 50)); q != nullptr) {
    const Row* incr = find_row("INCR d1 loop", 50);
    const Row* naive = find_row("naive-lua d1 loop", 50);
    if (incr != nullptr)
      q->extra["fraction_of_incr_d1"] = q->r.decisions_per_s / incr->r.decisions_per_s;
    if (naive != nullptr) {
      q->extra["per_core_vs_naive"] = naive->r.server_us_per_decision / q->r.server_us_per_decision;
      q->extra["per_core_vs_naive_cpu"] =
          naive->r.server_cpu_us_per_decision / q->r.server_cpu_us_per_decision;
    }
    if (const Row* noop = find_row("noop-lua d1 loop", 50); noop != nullptr && incr != nullptr) {
      const_cast<Row*>(noop)->extra["fraction_of_incr_d1"] =
          noop->r.decisions_per_s / incr->r.decisions_per_s;
    }
  }

  // p99 at half the peak: open-loop at 50 % of the quota d1 peak at 50 connections,
  // twice: from 50 threads through RedisStore::apply (peak: "quota d1", 50), and from the
  // event-loop client (peak: "quota d1 loop").
  // Wait for the keys of the rows above to expire first (naive-lua's expire after 1 s,
  // quota's after time to full + 1 s): while many keys expire at once, Redis's active
  // expiry cycle may take up to 25 ms of every 100 ms, which would be the tail measured.
  auto expired_keys = [&] {
    quota::redis::Connection c(loopback(port));
    auto r = c.command({"INFO", "stats"});
    if (!r.ok() || (*r)->type != REDIS_REPLY_STRING) return -1.0;
    const std::string info(quota::redis::reply_string(**r));
    const auto at = info.find("expired_keys:");
    return at == std::string::npos ? -1.0 : std::atof(info.c_str() + at + 13);
  };
  std::this_thread::sleep_for(3s);
  // What else happened during a paced row: the machine's CPU (other processes share the
  // two cores) and the server's own latency monitor (a command or expire cycle that took
  // >= 2 ms of wall time, e.g. descheduled in the middle).
  MachineCpu cpu_before;
  Clock::time_point paced_start;
  double server_wait_before = 0, client_wait_before = 0, softirq_wait_before = 0;
  const std::vector<std::string> softirq_threads = softirq_thread_schedstats();
  std::string server_schedstat;  // the server's main thread
  {
    quota::redis::Connection c(loopback(port));
    auto r = c.command({"INFO", "server"});
    if (r.ok() && (*r)->type == REDIS_REPLY_STRING) {
      const std::string info(quota::redis::reply_string(**r));
      if (const auto at = info.find("process_id:"); at != std::string::npos) {
        const long pid = std::atol(info.c_str() + at + 11);
        server_schedstat =
            "/proc/" + std::to_string(pid) + "/task/" + std::to_string(pid) + "/schedstat";
      }
    }
  }
  std::optional<quota::bench::SpeedProbe> probe;
  auto paced_begin = [&] {
    quota::redis::Connection c(loopback(port));
    (void)c.command({"CONFIG", "SET", "latency-monitor-threshold", "2"});
    (void)c.command({"LATENCY", "RESET"});
    cpu_before = machine_cpu();
    server_wait_before = run_queue_wait_ms(server_schedstat);
    client_wait_before = run_queue_wait_ms("/proc/thread-self/schedstat");
    softirq_wait_before = run_queue_wait_ms(softirq_threads);
    paced_start = Clock::now();
    probe.emplace();
  };
  // Lines under each paced row: the schedule kept or not, the latency percentiles (from
  // each request's due time) and the circumstances above; the same figures go to the JSON.
  auto paced_detail = [&](const char* how, double percent, const char* peak_row) {
    Row& row = g_rows.back();
    const Result& r = row.r;
    const MachineCpu cpu_after = machine_cpu();
    const double wall = std::chrono::duration<double>(Clock::now() - paced_start).count();
    const double cores = std::max(1U, std::thread::hardware_concurrency());
    row.extra["machine_busy_fraction"] = (cpu_after.busy - cpu_before.busy) / (wall * cores);
    row.extra["steal_ms"] = (cpu_after.steal - cpu_before.steal) * 1e3;
    // Time runnable but not running: the server's main thread, and this thread (the
    // event-loop client; in the 50-thread row an idle main thread, so not reported).
    const bool loop = row.workload.find("loop") != std::string::npos;
    row.extra["server_run_queue_wait_ms"] =
        run_queue_wait_ms(server_schedstat) - server_wait_before;
    const double client_wait =
        run_queue_wait_ms("/proc/thread-self/schedstat") - client_wait_before;
    if (loop) row.extra["client_run_queue_wait_ms"] = client_wait;
    row.extra["softirq_run_queue_wait_ms"] =
        softirq_threads.empty() ? std::numeric_limits<double>::quiet_NaN()
                                : run_queue_wait_ms(softirq_threads) - softirq_wait_before;
    std::string server_events;
    {
      quota::redis::Connection c(loopback(port));
      auto l = c.command({"LATENCY", "LATEST"});
      if (l.ok() && (*l)->type == REDIS_REPLY_ARRAY) {
        for (std::size_t i = 0; i < (*l)->elements; ++i) {
          const redisReply* e = (*l)->element[i];
          if (e->type != REDIS_REPLY_ARRAY || e->elements < 4) continue;
          const std::string event(e->element[0]->str, e->element[0]->len);
          const auto max_ms = static_cast<double>(e->element[3]->integer);
          row.extra["server_latency_max_ms:" + event] = max_ms;
          server_events += " " + event + " " + json_number(max_ms) + " ms;";
        }
      }
      (void)c.command({"CONFIG", "SET", "latency-monitor-threshold", "0"});
    }
    row.extra["expired_keys_during"] = expired_keys();  // (the run reset the stats)
    row.extra["paced_rate_per_s"] = r.target_rate;
    row.extra["target_rate_per_s"] = r.target_rate;
    row.extra["achieved_rate_per_s"] = r.decisions_per_s;
    row.extra["achieved_fraction"] = r.decisions_per_s / r.target_rate;
    row.extra["fell_behind"] = fell_behind(r) ? 1 : 0;
    std::printf(
        "  open loop, %s, at %.0f%% of %s's peak: target %.0f/s, achieved %.0f/s "
        "(%.1f%%)%s\n",
        how, percent, peak_row, r.target_rate, r.decisions_per_s,
        100 * r.decisions_per_s / r.target_rate,
        fell_behind(r) ? " -- FELL BEHIND the schedule" : ", on schedule");
    std::printf(
        "    latency from the scheduled send time: p50 %.0f, p90 %.0f, p99 %.0f, "
        "p99.9 %.0f, max %.0f us; %.0f keys expired meanwhile\n",
        r.p50_us, r.p90_us, r.p99_us, r.p999_us, r.max_us, row.extra["expired_keys_during"]);
    if (r.target_rate > 0 && row.workload.find("loop") != std::string::npos) {
      row.extra["send_wait_p99_us"] = r.send_wait_p99_us;
      row.extra["max_backlog"] = static_cast<double>(r.max_backlog);
      row.extra["unfinished"] = static_cast<double>(r.unfinished);
      row.extra["client_stall_max_us"] = r.client_stall_max_us;
      row.extra["client_cpu_us_per_request"] = r.client_cpu_us_per_request;
      row.extra["slower_than_10ms"] = static_cast<double>(r.slow_10ms);
      std::printf("    %" PRId64
                  " requests slower than 10 ms, due between %.0f and %.0f ms into "
                  "the %.0f ms window\n",
                  r.slow_10ms, r.slow_first_ms, r.slow_last_ms, 1e3 * std::max(seconds, 3.0));
      std::printf("    due -> sent p99 %.0f us, at most %" PRId64
                  " requests due and unsent, %" PRId64
                  " unfinished; the loop thread's longest stall %.0f us, its CPU %.1f us per "
                  "request\n",
                  r.send_wait_p99_us, r.max_backlog, r.unfinished, r.client_stall_max_us,
                  r.client_cpu_us_per_request);
    }
    const std::string client_waited =
        loop ? ", the event-loop client " + std::to_string(std::lround(client_wait)) + " ms" : "";
    std::printf(
        "    machine CPU busy %.0f%% of %.0f cores, steal %.0f ms; runnable but waiting "
        "for a CPU: server %.0f ms%s, the kernel's softirq threads %.0f ms; server latency "
        "monitor (>= 2 ms):%s\n",
        100 * row.extra["machine_busy_fraction"], cores, row.extra["steal_ms"],
        row.extra["server_run_queue_wait_ms"], client_waited.c_str(),
        row.extra["softirq_run_queue_wait_ms"],
        server_events.empty() ? " none" : server_events.c_str());
    // Whether the cores themselves ran slower for a while (no steal or run-queue wait
    // shows that on this machine): speed_probe.hpp.
    probe->stop();
    const auto speed = probe->summary();
    row.extra["speed_probe_median_us"] = speed.median_us;
    row.extra["speed_probe_slowest_ratio"] = speed.slowest_ratio;
    row.extra["speed_probe_slow_windows"] = speed.slow_windows;
    row.extra["speed_probe_slow_first_ms"] = speed.slow_first_ms;
    row.extra["speed_probe_slow_last_ms"] = speed.slow_last_ms;
    std::printf(
        "    CPU speed probe (a fixed chunk of arithmetic every 5 ms, median %.1f us): %d of "
        "the 100 ms windows ran it >= 1.4x slower",
        speed.median_us, speed.slow_windows);
    if (speed.slow_windows > 0) {
      std::printf(" (from %.0f to %.0f ms)", speed.slow_first_ms, speed.slow_last_ms);
    }
    std::printf(", the slowest %.2fx\n", speed.slowest_ratio);
    std::fflush(stdout);
  };
  // Open loop from 50 threads through RedisStore::apply with `opts`, at half the peak of
  // the row `peak_row` (50 connections).
  auto paced_threads = [&](const std::string& peak_row, const quota::RedisStoreOptions& opts,
                           const char* name, const char* how) {
    const Row* peak = find_row(peak_row, 50);
    if (peak == nullptr || peak->r.decisions_per_s <= 0) return;
    RedisStore<TokenBucket> store(opts);
    const double rate = peak->r.decisions_per_s / 2;
    paced_begin();
    Result r = run(
        port, 50, std::max(seconds, 3.0), 1,
        [&](int, std::mt19937_64& rng) { return store.apply(policy, key(rng), Nanos{0}, 1).ok(); },
        rate);
    r.target_rate = rate;
    print(name, 50, r);
    if (opts.coalesce > 1) {
      g_rows.back().extra["decisions_per_round_trip"] = per_round_trip(store.coalesce_stats());
    }
    paced_detail(how, 50, (peak_row + " (50 threads)").c_str());
  };
  paced_threads("quota d1",
                {.pool = std::make_shared<quota::redis::ConnectionPool>(loopback(port), 50),
                 .prefix = "bench:"},
                "quota d1 @50%", "50 client THREADS through RedisStore::apply");
  std::this_thread::sleep_for(3s);
  paced_threads(
      "quota d1 coalesced",
      coalesced_options(std::make_shared<quota::redis::ConnectionPool>(loopback(port), 50)),
      "quota d1 coalesced @50%", "50 client THREADS through a coalescing RedisStore::apply");
  if (const Row* lp = find_row("quota d1 loop", 50); lp != nullptr && lp->r.decisions_per_s > 0) {
    const double peak_rate = lp->r.decisions_per_s;
    // 50 % is the target's load; 25 % shows how the tail depends on the headroom.
    for (int percent : {50, 25}) {
      const double rate = peak_rate * percent / 100;
      std::this_thread::sleep_for(3s);
      paced_begin();
      const Result r = run_loop(port, 50, std::max(seconds, 3.0), quota_cmd, is_array, rate);
      const std::string name = "quota d1 loop @" + std::to_string(percent) + "%";
      print(name.c_str(), 50, r);
      paced_detail("ONE event-loop thread, 50 connections", percent, "quota d1 loop");
    }
  }

  // Bytes per bucket (spend first: an idle bucket of this fast policy has expired).
  double memory = -1;
  const std::string mem_key = "bench:{tenant-1}read";
  {
    auto pool = std::make_shared<quota::redis::ConnectionPool>(loopback(port), 1);
    RedisStore<TokenBucket> store({.pool = pool, .prefix = "bench:"});
    (void)store.apply(policy, "{tenant-1}read", Nanos{0}, 500'000);
    quota::redis::Connection c(loopback(port));
    auto r = c.command({"MEMORY", "USAGE", mem_key});
    auto len = c.command({"STRLEN", mem_key});
    if (r.ok() && (*r)->type == REDIS_REPLY_INTEGER) {
      memory = static_cast<double>((*r)->integer);
      std::printf(
          "MEMORY USAGE of one bucket (key \"%s\", %zu bytes; state %lld bytes): %lld bytes\n",
          mem_key.c_str(), mem_key.size(),
          len.ok() && (*len)->type == REDIS_REPLY_INTEGER ? static_cast<long long>((*len)->integer)
                                                          : -1LL,
          static_cast<long long>((*r)->integer));
    }
  }

  // A naive client-side limiter: GET tokens+time, compute, SET — not atomic. 8 threads
  // on one key; admitted units compared with the envelope r·T + B.
  double over_admission = 0;
  {
    const double rate = 1000, burst = 50;
    std::atomic<std::int64_t> admitted{0};
    quota::redis::Connection init(loopback(port));
    (void)init.command({"DEL", "naive-client"});
    const auto t0 = Clock::now();
    const auto end = t0 + std::chrono::duration<double>(seconds);
    std::vector<std::thread> threads;
    for (int t = 0; t < 8; ++t) {
      threads.emplace_back([&] {
        quota::redis::Connection c(loopback(port));
        while (Clock::now() < end) {
          const double now = std::chrono::duration<double>(Clock::now() - t0).count();
          auto g = c.command({"GET", "naive-client"});
          if (!g.ok()) continue;
          double tokens = burst, last = now;
          if ((*g)->type == REDIS_REPLY_STRING) {
            std::sscanf((*g)->str, "%lf %lf", &tokens, &last);
          }
          tokens = std::min(burst, tokens + (now - last) * rate);
          if (tokens >= 1) {
            tokens -= 1;
            ++admitted;
          }
          char v[64];
          std::snprintf(v, sizeof v, "%.9f %.9f", tokens, now);
          (void)c.command({"SET", "naive-client", v});
        }
      });
    }
    for (auto& th : threads) th.join();
    const double elapsed = std::chrono::duration<double>(Clock::now() - t0).count();
    const double envelope = rate * elapsed + burst;
    std::printf(
        "naive GET-compute-SET, 8 threads, one key (rate %.0f/s, burst %.0f): admitted %" PRId64
        " over %.2f s, envelope r*T+B = %.0f -> over-admission %.1f%%\n",
        rate, burst, admitted.load(), elapsed, envelope,
        100.0 * (static_cast<double>(admitted.load()) - envelope) / envelope);
    over_admission = (static_cast<double>(admitted.load()) - envelope) / envelope;
    Result r;
    r.decisions_per_s = static_cast<double>(admitted.load()) / elapsed;
    record("naive GET-compute-SET", 8, r);
    g_rows.back().extra["admitted"] = static_cast<double>(admitted.load());
    g_rows.back().extra["envelope"] = envelope;
    g_rows.back().extra["over_admission"] = over_admission;
  }

  // Issue 5's targets, from this run.
  std::vector<Target> targets;
  auto value = [&](const char* workload, int conns, const char* extra) -> double {
    const Row* r = find_row(workload, conns);
    if (r == nullptr) return std::numeric_limits<double>::quiet_NaN();
    if (extra == nullptr) return r->r.server_us_per_decision;
    const auto it = r->extra.find(extra);
    return it == r->extra.end() ? std::numeric_limits<double>::quiet_NaN() : it->second;
  };
  targets.push_back({"d1_fraction_of_incr",
                     "quota d1 decisions/s / INCR d1 requests/s, 50 connections",
                     value("quota d1", 50, "fraction_of_incr_d1"), 0.9, false});
  // Server cost per decision is wall time inside the script (commandstats) or the
  // server's CPU; a client of 50 threads on a small machine deschedules the server in
  // the middle of long scripts, which inflates both, so the targets take the LEAST over
  // the 1, 8 and 50 connection rows of this run (the per-row values are in the JSON).
  auto least = [&](const char* workload, bool cpu) {
    double v = std::numeric_limits<double>::infinity();
    for (const Row& r : g_rows) {
      if (r.workload == workload) {
        v = std::min(v, cpu ? r.r.server_cpu_us_per_decision : r.r.server_us_per_decision);
      }
    }
    return v;
  };
  targets.push_back({"b16_server_us_per_decision",
                     "quota b16 server us per decision (commandstats), least over 1/8/50 "
                     "connections",
                     least("quota b16", false), 3.0, true});
  targets.push_back({"b16_per_core_vs_naive",
                     "quota b16 decisions per Redis core / the straightforward script's "
                     "(commandstats, least over 1/8/50 connections of each)",
                     least("naive-lua d1", false) / least("quota b16", false), 2.0, false});
  targets.push_back({"b16_per_core_vs_naive_cpu",
                     "the same from the server process's CPU (INFO cpu)",
                     least("naive-lua d1", true) / least("quota b16", true), 2.0, false});
  targets.push_back({"d1_loop_fraction_of_incr",
                     "the same with one event-loop client for both (quota d1 loop / INCR d1 loop)",
                     value("quota d1 loop", 50, "fraction_of_incr_d1"), 0.9, false});
  // p99 at half the peak: met only if the run kept to its schedule (a client that fell
  // behind measured a lower rate than the target's).
  if (const Row* r = find_row("quota d1 @50%", 50); r != nullptr) {
    targets.push_back({"p99_us_at_half_peak",
                       "p99 latency (us) open-loop at 50% of the d1 peak, 50 client threads "
                       "(RedisStore::apply), from each request's scheduled send time",
                       r->r.p99_us, 1000.0, true, !fell_behind(r->r)});
  }
  if (const Row* r = find_row("quota d1 loop @50%", 50); r != nullptr) {
    targets.push_back({"p99_us_at_half_peak_loop",
                       "p99 latency (us) open-loop at 50% of quota d1 loop's peak of this run, "
                       "ONE event-loop thread with 50 connections (the same EVALSHA as "
                       "RedisStore::apply), from each request's scheduled send time",
                       r->r.p99_us, 1000.0, true, !fell_behind(r->r)});
    targets.push_back({"half_peak_loop_rate_achieved",
                       "achieved / target rate of that open-loop row (the schedule kept)",
                       r->r.decisions_per_s / r->r.target_rate, 1 - kRateTolerance, false});
  }
  // With coalescing: the same callers (50 threads, one decision each at a time) against
  // the INCR ceiling of one request per round trip.
  targets.push_back({"d1_coalesced_fraction_of_incr",
                     "quota d1 coalesced decisions/s (50 threads, one decision each at a time, "
                     "RedisStoreOptions::coalesce = 64) / INCR d1 requests/s, 50 connections",
                     value("quota d1 coalesced", 50, "fraction_of_incr_d1"), 0.9, false});
  if (const Row* r = find_row("quota d1 coalesced @50%", 50); r != nullptr) {
    targets.push_back({"p99_us_at_half_peak_coalesced",
                       "p99 latency (us) open-loop at 50% of quota d1 coalesced's peak, 50 "
                       "client threads, from each request's scheduled send time",
                       r->r.p99_us, 1000.0, true, !fell_behind(r->r)});
  }
  targets.push_back(
      {"memory_usage_bytes", "MEMORY USAGE of one bucket (20-byte key)", memory, 64, true});
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
