// benchmarks/support/client_threads.hpp — what the Redis load generators share: client
// threads that call one function in a loop for a while, each call timed, and the
// latency percentiles of those calls.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <random>
#include <thread>
#include <utility>
#include <vector>

namespace quota::bench {

// Latency percentiles, in µs.
struct Latency {
  double p50_us = 0, p99_us = 0;
  double p90_us = 0, p999_us = 0, max_us = 0;
};

// Sorts `us` (latencies in µs) and reads the value at index size·q/1000 for q = 500, 900,
// 990 and 999 (the same index as size/2, size·90/100, ...), and the largest; all 0 when
// `us` is empty.
inline Latency latency_of(std::vector<float>& us) {
  std::sort(us.begin(), us.end());
  Latency l;
  if (us.empty()) return l;
  auto at = [&](std::size_t per_mille) { return us[us.size() * per_mille / 1000]; };
  l.p50_us = at(500);
  l.p99_us = at(990);
  l.p90_us = at(900);
  l.p999_us = at(999);
  l.max_us = us.back();
  return l;
}

// What run_threads measured.
struct ThreadsRun {
  std::vector<float> latency_us;  // every call's, in no particular order
  std::int64_t calls = 0;
  std::int64_t errors = 0;  // the sum of what the calls returned
  double elapsed_s = 0;     // from the start until every thread has stopped
};

// Runs `threads` threads for `seconds`: thread t calls `one(t, rng)` in a loop (rng a
// std::mt19937_64 seeded t·7919 + 1) and times each call; `one` returns how many errors
// the call had (0 when it went well). `reserve` latencies are reserved per thread.
//
// Closed loop when `rate` <= 0: a thread's next call starts when its previous one
// returns, and a call's latency counts from its start. Open loop when `rate` > 0 (calls
// per second in all): thread t starts its calls at fixed intervals (threads / rate apart,
// staggered by t / rate), and a call's latency counts from its SCHEDULED start, so a slow
// reply delays nothing that is not also measured (no coordinated omission).
template <class One>
ThreadsRun run_threads(int threads, double seconds, One&& one, double rate = 0,
                       std::size_t reserve = std::size_t{1} << 18) {
  using Clock = std::chrono::steady_clock;
  struct PerThread {
    std::vector<float> latency_us;
    std::int64_t calls = 0, errors = 0;
  };
  std::vector<PerThread> per(static_cast<std::size_t>(threads));
  const auto t0 = Clock::now();
  const auto end = t0 + std::chrono::duration<double>(seconds);
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      std::mt19937_64 rng(static_cast<std::uint64_t>(t) * 7919 + 1);
      // Counted locally and stored once at the end: the PerThread records of neighbouring
      // threads share cache lines.
      PerThread mine;
      mine.latency_us.reserve(reserve);
      const auto interval = std::chrono::duration_cast<Clock::duration>(
          std::chrono::duration<double>(rate > 0 ? threads / rate : 0));
      auto next = t0 + interval * t / threads;
      while (Clock::now() < end) {
        auto a = Clock::now();
        if (rate > 0) {
          std::this_thread::sleep_until(next);
          a = next;
          next += interval;
        }
        mine.errors += one(t, rng);
        mine.latency_us.push_back(
            std::chrono::duration<float, std::micro>(Clock::now() - a).count());
        ++mine.calls;
      }
      per[static_cast<std::size_t>(t)] = std::move(mine);
    });
  }
  for (auto& th : pool) th.join();
  ThreadsRun run;
  run.elapsed_s = std::chrono::duration<double>(Clock::now() - t0).count();
  for (PerThread& p : per) {
    run.latency_us.insert(run.latency_us.end(), p.latency_us.begin(), p.latency_us.end());
    run.calls += p.calls;
    run.errors += p.errors;
  }
  return run;
}

}  // namespace quota::bench
