// tests/redis/support/redis_server.hpp — the redis-server a test runs against.
//
// CTest starts it as a fixture (cmake/redis_server.sh) and tells the test where through
// QUOTA_REDIS_DIR (the port is in $QUOTA_REDIS_DIR/port). The fault tests also kill and
// restart it through the same script (QUOTA_REDIS_SCRIPT).
#pragma once

#include <signal.h>
#include <sys/types.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <stdexcept>
#include <string>

#include "quota/redis/transport/connection.hpp"

namespace quota::testing {

inline std::string redis_dir() {
  const char* dir = std::getenv("QUOTA_REDIS_DIR");
  if (dir == nullptr || *dir == '\0') {
    throw std::runtime_error(
        "QUOTA_REDIS_DIR is not set: run this test through ctest, which starts redis-server");
  }
  return dir;
}

inline int redis_port() {
  std::ifstream in(redis_dir() + "/port");
  int port = 0;
  if (!(in >> port) || port <= 0) throw std::runtime_error("no port in " + redis_dir() + "/port");
  return port;
}

// A config for the test server; deadlines generous enough for sanitizer builds on a busy
// machine unless a test is about deadlines.
inline redis::ConnectionConfig redis_config(
    std::chrono::microseconds deadline = std::chrono::seconds(2)) {
  return redis::ConnectionConfig{.host = "127.0.0.1",
                                 .port = redis_port(),
                                 .connect_timeout = deadline,
                                 .command_timeout = deadline,
                                 .pool_wait = std::chrono::seconds(5)};
}

inline std::shared_ptr<redis::ConnectionPool> redis_pool(
    std::size_t size = 4, std::chrono::microseconds deadline = std::chrono::seconds(2)) {
  return std::make_shared<redis::ConnectionPool>(redis_config(deadline), size);
}

// Runs cmake/redis_server.sh <what> on the test's server directory; true on success.
inline bool redis_script(const std::string& what) {
  const char* script = std::getenv("QUOTA_REDIS_SCRIPT");
  if (script == nullptr) return false;
  const std::string cmd =
      std::string("bash '") + script + "' " + what + " '" + redis_dir() + "' >/dev/null 2>&1";
  return std::system(cmd.c_str()) == 0;
}

// Sends `sig` to the server whose pid file is in `dir` (SIGSTOP / SIGCONT pause and resume
// it); true on success.
inline bool signal_redis(int sig, const std::string& dir = redis_dir()) {
  std::ifstream in(dir + "/redis.pid");
  long pid = 0;
  if (!(in >> pid) || pid <= 0) return false;
  return ::kill(static_cast<pid_t>(pid), sig) == 0;
}

// SIGKILLs the server (no clean shutdown), as a crash would.
inline bool kill_redis() { return signal_redis(SIGKILL); }

// Resumes a paused server (SIGCONT) when it goes out of scope, even when an assertion
// fails in between.
struct ResumeOnExit {
  std::string dir = redis_dir();
  ~ResumeOnExit() { signal_redis(SIGCONT, dir); }
};

// A unique key prefix per test run, so tests sharing one server never meet.
inline std::string unique_prefix(const std::string& test) {
  return "t:" + test + ":" + std::to_string(::getpid()) + ":";
}

}  // namespace quota::testing
