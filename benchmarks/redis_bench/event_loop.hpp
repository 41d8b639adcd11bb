// benchmarks/redis_bench/event_loop.hpp — the event-loop client (run_loop): one thread, many
// non-blocking connections, closed or open loop. (Part of redis_bench: see the top of
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
inline Result run_loop(int port, int conns, double seconds,
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

inline const Row* find_row(const std::string& workload, int conns) {
  for (const Row& r : g_rows) {
    if (r.workload == workload && r.conns == conns) return &r;
  }
  return nullptr;
}
}  // namespace redis_bench
