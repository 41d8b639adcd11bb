// run.hpp — one strategy on the traffic: the checked run in lock-step ticks (run) and the
// flat-out speed measurement (throughput).
#pragma once

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <barrier>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "options.hpp"
#include "strategies.hpp"
#include "traffic.hpp"

namespace gateway_sim {

enum : std::uint8_t { kDenied = 0, kAllowed = 1, kError = 2 };

struct Record {
  std::int64_t time_ns;
  std::uint32_t tenant;
  std::uint16_t cost;
  std::uint8_t outcome;
};

struct RunResult {
  std::vector<Record> records;  // all gateways
  double wall_s = 0;
  std::int64_t errors = 0;
  std::string first_error;
};

inline RunResult run(Strategy& strategy, const std::vector<std::vector<Request>>& traffic,
                     const Options& o) {
  const int g_count = o.traffic.gateways;
  const std::int64_t tick_ns = o.tick_ms * 1'000'000;
  const std::int64_t end_ns = o.traffic.seconds * 1'000'000'000;
  const std::int64_t ticks = (end_ns + tick_ns - 1) / tick_ns;
  std::vector<std::vector<Record>> logs(g_count);
  std::atomic<std::int64_t> ticks_done{0};
  std::atomic<int> finished{0};
  std::atomic<std::int64_t> errors{0};
  std::string first_error;
  std::atomic<bool> have_error{false};
  std::barrier sync(g_count,
                    [&]() noexcept { ticks_done.fetch_add(1, std::memory_order_relaxed); });

  const auto start = std::chrono::steady_clock::now();
  std::vector<std::chrono::steady_clock::time_point> done_at(g_count);
  std::vector<std::thread> threads;
  for (int g = 0; g < g_count; ++g) {
    threads.emplace_back([&, g] {
      const auto& reqs = traffic[g];
      auto& log = logs[g];
      log.reserve(reqs.size());
      std::size_t i = 0;
      for (std::int64_t k = 0; k < ticks; ++k) {
        const std::int64_t tick_end = (k + 1) * tick_ns;
        for (; i < reqs.size() && reqs[i].time_ns < tick_end; ++i) {
          const Request& r = reqs[i];
          auto out = strategy.decide(g, r.tenant, Nanos{r.time_ns}, r.cost);
          if (!out.ok()) {
            errors.fetch_add(1, std::memory_order_relaxed);
            if (!have_error.exchange(true)) first_error = out.status().ToString();
            log.push_back(Record{r.time_ns, r.tenant, static_cast<std::uint16_t>(r.cost), kError});
            continue;
          }
          log.push_back(Record{out->time_ns, r.tenant, static_cast<std::uint16_t>(r.cost),
                               out->allowed ? kAllowed : kDenied});
        }
        sync.arrive_and_wait();
      }
      done_at[g] = std::chrono::steady_clock::now();
      finished.fetch_add(1);
    });
  }
  const bool tty = o.progress && ::isatty(2);
  while (finished.load() < g_count) {
    std::this_thread::sleep_for(100ms);
    if (tty) {
      const double sim_s = static_cast<double>(ticks_done.load()) * tick_ns / 1e9;
      std::fprintf(stderr, "\r  %-15s %3.0f%%  (%.1f of %lld simulated seconds)",
                   strategy.name().c_str(), 100.0 * ticks_done.load() / ticks,
                   std::min(sim_s, double(o.traffic.seconds)),
                   static_cast<long long>(o.traffic.seconds));
    }
  }
  for (auto& t : threads) t.join();
  const auto end = *std::max_element(done_at.begin(), done_at.end());
  RunResult result;
  result.wall_s = std::chrono::duration<double>(end - start).count();
  if (o.progress) {
    std::fprintf(stderr, "%s  %-15s done: %.2f s wall%s\n", tty ? "\r" : "",
                 strategy.name().c_str(), result.wall_s, tty ? "                         " : "");
  }
  result.errors = errors.load();
  result.first_error = first_error;
  std::size_t total = 0;
  for (const auto& l : logs) total += l.size();
  result.records.reserve(total);
  for (auto& l : logs) result.records.insert(result.records.end(), l.begin(), l.end());
  return result;
}

// Decisions per second of `strategy` with all G gateway threads deciding as fast as they
// can (no lock-step), replaying their requests (shifted by the duration on each pass, so
// each gateway's time keeps moving forward) for about kThroughputWindow of wall time.
// The decisions themselves are not checked here: only how many were made.
constexpr auto kThroughputWindow = 250ms;

inline double throughput(Strategy& strategy, const std::vector<std::vector<Request>>& traffic,
                         const Options& o) {
  const int g_count = o.traffic.gateways;
  const std::int64_t span_ns = o.traffic.seconds * 1'000'000'000;
  std::atomic<bool> stop{false};
  std::atomic<std::int64_t> decided{0};
  std::barrier start_line(g_count + 1);
  std::vector<std::thread> threads;
  for (int g = 0; g < g_count; ++g) {
    threads.emplace_back([&, g] {
      const auto& reqs = traffic[g];
      std::int64_t n = 0;
      start_line.arrive_and_wait();
      for (std::int64_t pass = 0; !reqs.empty() && !stop.load(std::memory_order_relaxed); ++pass) {
        for (std::size_t i = 0; i < reqs.size(); ++i) {
          const Request& r = reqs[i];
          (void)strategy.decide(g, r.tenant, Nanos{r.time_ns + pass * span_ns}, r.cost);
          ++n;
          if ((n & 63) == 0 && stop.load(std::memory_order_relaxed)) break;
        }
      }
      decided.fetch_add(n);
    });
  }
  start_line.arrive_and_wait();
  const auto t0 = std::chrono::steady_clock::now();
  std::this_thread::sleep_for(kThroughputWindow);
  stop.store(true);
  for (auto& t : threads) t.join();
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return static_cast<double>(decided.load()) / s;
}

}  // namespace gateway_sim
