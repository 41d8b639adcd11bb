// benchmarks/redis_bench/workloads.hpp — the workloads: each a function that measures its rows
// (print and record them into g_rows). (Part of redis_bench: see the top of
// benchmarks/redis_bench.cpp.)
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
#include "redis_bench/event_loop.hpp"
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

// What every workload runs against: the server, the row length, the policy and the keys.
struct Bench {
  int port = 0;
  double seconds = 1.5;
  TokenBucket policy{.rate = {.units = 1'000'000, .per = 1s}, .burst = 1'000'000};
  std::vector<std::string> keys;  // "{tenant-N}read"
  const std::string& key(std::mt19937_64& rng) const { return keys[rng() % keys.size()]; }
};

// quota d1 (and coalesced), p16, b16, b64, naive-lua d1, noop-lua d1 and redis-benchmark
// INCR at 1, 8 and 50 connections, one thread per connection; then the ratios of each
// connection count.
inline void closed_rows(const Bench& b) {
  const int port = b.port;
  const double seconds = b.seconds;
  const TokenBucket& policy = b.policy;
  auto key = [&](std::mt19937_64& rng) -> const std::string& { return b.key(rng); };
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
}

// Bytes per bucket (MEMORY USAGE); -1 when it could not be read.
inline double memory_row(const Bench& b) {
  const int port = b.port;
  const TokenBucket& policy = b.policy;
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
  return memory;
}

// A naive client-side limiter: GET tokens+time, compute, SET — not atomic. 8 threads
// on one key; admitted units compared with the envelope r·T + B.
inline void naive_client_row(const Bench& b) {
  const int port = b.port;
  const double seconds = b.seconds;
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
}

}  // namespace redis_bench
