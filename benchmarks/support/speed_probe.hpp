// benchmarks/support/speed_probe.hpp — how fast the machine's CPUs ran during a row.
//
// On a shared virtual machine a core can run slower for a while (another tenant on its
// sibling hyperthread, host frequency limits) without the guest seeing steal time or a
// run-queue wait. SpeedProbe measures it directly: a thread times a fixed chunk of
// integer arithmetic (about 20 µs at full speed) every 5 ms, so it costs under 1 % of a
// core, and reports the chunk's median time per 100 ms window against the whole run's.
// A window whose median is much above the run's ran slower; a single slow chunk (the
// probe preempted) does not move a median.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <thread>
#include <utility>
#include <vector>

namespace quota::bench {

class SpeedProbe {
 public:
  struct Window {
    double start_ms = 0;  // after the probe started
    double median_us = 0;
  };
  struct Summary {
    double median_us = 0;       // the chunk's median over the whole run
    double slowest_ratio = 0;   // the slowest window's median / median_us
    int slow_windows = 0;       // windows at least `slow` times the median
    double slow_first_ms = -1;  // the first and last of them (start times)
    double slow_last_ms = -1;
  };

  SpeedProbe() : start_(Clock::now()), thread_([this] { run(); }) {}
  SpeedProbe(const SpeedProbe&) = delete;
  SpeedProbe& operator=(const SpeedProbe&) = delete;
  ~SpeedProbe() { stop(); }

  void stop() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
  }

  // After stop(): the windows whose median is at least `slow` times the run's.
  Summary summary(double slow = 1.4) const {
    Summary s;
    std::vector<double> all;
    for (const auto& [t, us] : samples_) all.push_back(us);
    if (all.empty()) return s;
    s.median_us = median(all);
    for (const Window& w : windows()) {
      const double ratio = w.median_us / s.median_us;
      s.slowest_ratio = std::max(s.slowest_ratio, ratio);
      if (ratio >= slow) {
        ++s.slow_windows;
        if (s.slow_first_ms < 0) s.slow_first_ms = w.start_ms;
        s.slow_last_ms = w.start_ms;
      }
    }
    return s;
  }

  std::vector<Window> windows() const {
    std::vector<Window> out;
    std::vector<double> in_window;
    double window_start = 0;
    for (const auto& [t, us] : samples_) {
      if (t >= window_start + 100 && !in_window.empty()) {
        out.push_back({window_start, median(in_window)});
        in_window.clear();
        window_start = t - std::fmod(t, 100.0);
      }
      in_window.push_back(us);
    }
    if (in_window.size() >= 5) out.push_back({window_start, median(in_window)});
    return out;
  }

 private:
  using Clock = std::chrono::steady_clock;

  static double median(std::vector<double> v) {
    std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2), v.end());
    return v[v.size() / 2];
  }

  void run() {
    std::uint64_t x = 1;
    while (!stop_) {
      const auto a = Clock::now();
      for (int i = 0; i < 20'000; ++i) x = x * 6364136223846793005ULL + 1442695040888963407ULL;
      const auto b = Clock::now();
      sink_.store(x, std::memory_order_relaxed);
      samples_.emplace_back(std::chrono::duration<double, std::milli>(a - start_).count(),
                            std::chrono::duration<double, std::micro>(b - a).count());
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }

  const Clock::time_point start_;
  std::atomic<bool> stop_{false};
  std::atomic<std::uint64_t> sink_{0};  // keeps the arithmetic from being optimized away
  std::vector<std::pair<double, double>> samples_;  // (ms since start, chunk µs); probe thread
  std::thread thread_;                              // last: starts after the rest is built
};

}  // namespace quota::bench
