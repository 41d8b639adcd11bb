// quota/redis/transport/breaker.hpp — failing fast while Redis is down: a circuit breaker
// per node and a guard on the decisions in flight.
//
// During an outage every call would otherwise wait out its whole deadline again, and a
// gateway with many threads would keep that many calls parked on a struggling server.
//
// `Breaker` (one per node: each ConnectionPool has one, configured by
// ConnectionConfig::breaker; on by default, 5 failures and 250 ms). Closed, it lets every call
// through and counts consecutive failed exchanges (a transport error or a deadline passed while
// talking to the node); after `failures` of them it opens: every call fails at once for
// `cool_down`. Then it lets exactly ONE call through as a probe (the others still fail at once):
// when the probe succeeds the breaker closes, when it fails the breaker opens for another
// cool-down, and when the probe never reached the node (its own deadline passed first)
// the next call becomes the probe. An error REPLY (BUSY, NOSCRIPT, ...) is an answer
// from a live node and counts as a success.
//
// `InFlightGuard` (one per process, shared by the stores through their options): at most
// `max` calls to the authority at once; a call beyond that fails at once with
// kUnavailable naming the guard, so that the gateway applies the route's fail mode
// instead of queueing more work on a server that is not answering.
//
// Both keep counters (BreakerStats, InFlightStats), readable at any time.
//
// Thread safety: every method may be called from any thread.
//
//   quota::redis::ConnectionConfig cfg{.port = 6379};
//   cfg.breaker = {.failures = 5, .cool_down = std::chrono::milliseconds(250)};
//   auto guard = std::make_shared<quota::redis::InFlightGuard>(64);
//   quota::RedisStoreOptions options;
//   options.pool = std::make_shared<quota::redis::ConnectionPool>(cfg, 8);
//   options.limits.in_flight = guard;  // CallLimits, transport/limits.hpp
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_format.h"
#include "quota/redis/transport/error_kind.hpp"

namespace quota::redis {

struct BreakerConfig {
  // Consecutive failed exchanges with a node that open its breaker; 0: no breaker. On by
  // default: a healthy node does not fail 5 exchanges in a row (a lost packet or one slow
  // reply fails one), and a node that does would otherwise cost each call its deadline.
  int failures = 5;
  // How long an open breaker fails every call at once before it lets one probe through.
  std::chrono::microseconds cool_down{std::chrono::milliseconds(250)};
};

// A breaker's counters: the times it opened, the calls it failed at once, the probes it
// let through, and whether it is open (or waiting on a probe) now.
struct BreakerStats {
  std::uint64_t opened = 0, rejected = 0, probes = 0;
  bool open = false;
};

class Breaker {
 public:
  enum class Admit { kPass, kProbe, kReject };

  explicit Breaker(BreakerConfig config) : config_(config) {}

  // Whether a call may go to the node now: kPass (closed), kProbe (the one call let
  // through after a cool-down: report its outcome with probe = true), kReject.
  Admit admit() {
    if (config_.failures <= 0 || !tripped_.load(std::memory_order_acquire)) return Admit::kPass;
    std::lock_guard<std::mutex> lock(mu_);
    if (!tripped_.load(std::memory_order_relaxed)) return Admit::kPass;
    if (probe_out_ || Clock::now() < open_until_) {
      ++rejected_;
      return Admit::kReject;
    }
    probe_out_ = true;
    ++probes_;
    return Admit::kProbe;
  }

  // The outcome of an admitted call that talked to the node.
  void success(bool probe) {
    if (config_.failures <= 0) return;
    if (!probe && !tripped_.load(std::memory_order_acquire) &&
        consecutive_.load(std::memory_order_relaxed) == 0) {
      return;  // the common case: no write to shared memory
    }
    std::lock_guard<std::mutex> lock(mu_);
    // A call let through before the breaker opened does not close it: only the probe.
    if (tripped_.load(std::memory_order_relaxed) && !probe) return;
    tripped_.store(false, std::memory_order_release);
    probe_out_ = false;
    consecutive_.store(0, std::memory_order_relaxed);
  }
  void failure(bool probe) {
    if (config_.failures <= 0) return;
    std::lock_guard<std::mutex> lock(mu_);
    if (tripped_.load(std::memory_order_relaxed)) {
      if (probe) open_locked();  // the probe failed: another cool-down
      return;
    }
    if (consecutive_.fetch_add(1, std::memory_order_relaxed) + 1 >= config_.failures) {
      open_locked();
    }
  }
  // An admitted call that never talked to the node (its deadline passed in the pool): a
  // probe's turn goes to the next call.
  void abandon(bool probe) {
    if (!probe || config_.failures <= 0) return;
    std::lock_guard<std::mutex> lock(mu_);
    probe_out_ = false;
  }

  // The cool-down left (zero when closed or when a probe may go).
  std::chrono::microseconds open_left() const {
    std::lock_guard<std::mutex> lock(mu_);
    if (!tripped_.load(std::memory_order_relaxed)) return std::chrono::microseconds(0);
    return std::max(
        std::chrono::duration_cast<std::chrono::microseconds>(open_until_ - Clock::now()),
        std::chrono::microseconds(0));
  }

  BreakerStats stats() const {
    std::lock_guard<std::mutex> lock(mu_);
    return {opened_, rejected_, probes_, tripped_.load(std::memory_order_relaxed)};
  }
  const BreakerConfig& config() const { return config_; }

 private:
  using Clock = std::chrono::steady_clock;

  void open_locked() {
    tripped_.store(true, std::memory_order_release);
    probe_out_ = false;
    open_until_ = Clock::now() + config_.cool_down;
    ++opened_;
  }

  const BreakerConfig config_;
  std::atomic<bool> tripped_{false};                      // open or half open; written under mu_
  std::atomic<int> consecutive_{0};                       // failures in a row while closed
  mutable std::mutex mu_;                                 // std::mutex: see ConnectionPool
  bool probe_out_ = false;                                // guarded by mu_
  Clock::time_point open_until_{};                        // guarded by mu_
  std::uint64_t opened_ = 0, rejected_ = 0, probes_ = 0;  // guarded by mu_
};

// The guard's counters: calls in flight now, the most at once, the calls it failed.
struct InFlightStats {
  std::int64_t in_flight = 0, peak = 0;
  std::uint64_t rejected = 0;
};

// What a store reports (RedisStore / GatewayStore::fail_fast_stats()): its nodes'
// breakers summed (`breakers.open`: any node open; `open_nodes`: how many) and its
// in-flight guard's counters (zero without one).
struct FailFastStats {
  BreakerStats breakers;
  std::size_t open_nodes = 0;
  InFlightStats in_flight;
};

class InFlightGuard {
 public:
  // At most `max` (>= 1) calls at once.
  explicit InFlightGuard(int max) : max_(std::max(max, 1)) {}

  InFlightGuard(const InFlightGuard&) = delete;
  InFlightGuard& operator=(const InFlightGuard&) = delete;

  // A call's place; gives it back when destroyed.
  class Token {
   public:
    Token(Token&& o) noexcept : guard_(std::exchange(o.guard_, nullptr)) {}
    Token& operator=(Token&&) = delete;
    ~Token() {
      if (guard_ != nullptr) guard_->in_flight_.fetch_sub(1, std::memory_order_acq_rel);
    }

   private:
    friend class InFlightGuard;
    explicit Token(InFlightGuard* g) : guard_(g) {}
    InFlightGuard* guard_;
  };

  // A place for one call, or at once kUnavailable naming the guard (ErrorKind::kInFlight).
  absl::StatusOr<Token> enter() {
    const std::int64_t n = in_flight_.fetch_add(1, std::memory_order_acq_rel) + 1;
    if (n > max_) {
      in_flight_.fetch_sub(1, std::memory_order_acq_rel);
      rejected_.fetch_add(1, std::memory_order_relaxed);
      return with_kind(absl::UnavailableError(absl::StrFormat(
                           "redis: the in-flight guard's maximum of %d calls to the authority is "
                           "reached; failing at once",
                           max_)),
                       ErrorKind::kInFlight);
    }
    std::int64_t peak = peak_.load(std::memory_order_relaxed);
    while (n > peak && !peak_.compare_exchange_weak(peak, n, std::memory_order_relaxed)) {
    }
    return Token(this);
  }

  InFlightStats stats() const {
    return {in_flight_.load(std::memory_order_relaxed), peak_.load(std::memory_order_relaxed),
            rejected_.load(std::memory_order_relaxed)};
  }
  int max() const { return max_; }

 private:
  const int max_;
  std::atomic<std::int64_t> in_flight_{0}, peak_{0};
  std::atomic<std::uint64_t> rejected_{0};
};

}  // namespace quota::redis
