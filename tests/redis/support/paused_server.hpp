// tests/redis/support/paused_server.hpp — a redis-server of the test's own that it can
// pause (SIGSTOP) and resume (SIGCONT), and timing helpers for the deadline and
// fail-fast tests.
//
// `PausedServer` starts a ScratchServer (redis_server.hpp) on a free loopback port;
// `pause()` stops it with SIGSTOP and returns a guard that sends SIGCONT when it goes out
// of scope (also when an assertion fails in between), so a paused server never outlives
// its test. The server is stopped by its pid when the PausedServer is destroyed.
//
// Not thread-safe: one owner, on the test's thread.
#pragma once

#include <signal.h>
#include <sys/types.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "support/redis_server.hpp"

namespace quota::testing {

class PausedServer {
 public:
  explicit PausedServer(const std::string& name) : server_(scratch_dir(name)) {}

  bool started() const { return server_.started(); }
  int port() const { return server_.port(); }

  // Sends SIGCONT when destroyed.
  class Resume {
   public:
    explicit Resume(long pid) : pid_(pid) {}
    Resume(const Resume&) = delete;
    Resume& operator=(const Resume&) = delete;
    ~Resume() { resume(); }
    // Resumes now (again harmless later).
    void resume() {
      if (pid_ > 0) ::kill(static_cast<pid_t>(pid_), SIGCONT);
    }

   private:
    long pid_;
  };

  // SIGSTOPs the server; it resumes when the returned guard goes out of scope.
  [[nodiscard]] Resume pause() {
    ::kill(static_cast<pid_t>(server_.pid()), SIGSTOP);
    return Resume(server_.pid());
  }

 private:
  ScratchServer server_;
};

// Durations in microseconds, summarized for the docs: p50, p99 and the largest.
struct Spread {
  std::int64_t p50 = 0, p99 = 0, max = 0;
  std::size_t n = 0;
};
inline Spread spread(std::vector<std::int64_t> us) {
  Spread s;
  s.n = us.size();
  if (us.empty()) return s;
  std::sort(us.begin(), us.end());
  s.p50 = us[us.size() / 2];
  s.p99 = us[std::min(us.size() - 1, us.size() * 99 / 100)];
  s.max = us.back();
  return s;
}
inline void print_spread(const char* what, const Spread& s) {
  std::printf("%s: n=%zu p50=%lld us p99=%lld us max=%lld us\n", what, s.n,
              static_cast<long long>(s.p50), static_cast<long long>(s.p99),
              static_cast<long long>(s.max));
}

inline std::int64_t micros_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() -
                                                               t0)
      .count();
}

}  // namespace quota::testing
