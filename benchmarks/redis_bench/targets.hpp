// benchmarks/redis_bench/targets.hpp — issue 5's targets, from the rows of this run.
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
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "quota/policy/token_bucket.hpp"
#include "quota/redis/redis_store.hpp"
#include "redis/support/redis_server.hpp"
#include "redis_bench/measure.hpp"
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

// The targets, from g_rows and the bucket's MEMORY USAGE (`memory`).
inline std::vector<Target> issue5_targets(double memory) {
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
  return targets;
}

}  // namespace redis_bench
