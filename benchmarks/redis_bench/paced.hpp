// benchmarks/redis_bench/paced.hpp — the event-loop rows (one thread, 50 connections) and the
// open-loop rows at a fraction of a peak of this run (p99 from each request's due time), with what
// else happened on the machine meanwhile.
// (Part of redis_bench: see the top of benchmarks/redis_bench.cpp.)
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
#include <span>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "quota/policy/token_bucket.hpp"
#include "quota/redis/redis_store.hpp"
#include "redis/support/redis_server.hpp"
#include "redis_bench/event_loop.hpp"
#include "redis_bench/measure.hpp"
#include "redis_bench/workloads.hpp"
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

// The d1 workloads from ONE event-loop thread, then the paced rows (after closed_rows:
// they pace at its peaks).
inline void loop_and_paced_rows(const Bench& b) {
  const int port = b.port;
  const double seconds = b.seconds;
  const TokenBucket& policy = b.policy;
  auto key = [&](std::mt19937_64& rng) -> const std::string& { return b.key(rng); };
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
}

}  // namespace redis_bench
