// tests/redis/support/redis_server.hpp — the redis-servers of the tests, benchmarks and
// the gateway simulator, all started and stopped by cmake/redis_server.sh.
//
// A test's server: CTest starts it as a fixture and tells the test where through
// QUOTA_REDIS_DIR (the port is in $QUOTA_REDIS_DIR/port). The fault tests also kill and
// restart it through the same script (QUOTA_REDIS_SCRIPT).
//
// A program's own server (benchmarks, gateway_sim --redis local): ScratchServer, below.
// A test's own server with its own config lines (auth, eviction policy, sentinels): the
// kit's RedisServer (quota/testing/redis_server.hpp).
// Benchmarks include it as "redis/support/redis_server.hpp" (tests/ on their path).
#pragma once

#include <signal.h>
#include <sys/types.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <stdexcept>
#include <string>
#include <system_error>
#include <utility>

#include "quota/redis/transport/connection_pool.hpp"
#include "quota/testing/redis_server.hpp"

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
  return redis::ConnectionConfig{.host = "127.0.0.1", .port = redis_port(), .deadline = deadline};
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

// The repository's root, from this header's path (<root>/tests/redis/support/...).
inline std::string source_dir() {
  std::string f = __FILE__;
  return f.substr(0, f.rfind("/tests/redis/support/"));
}

// A directory for one process's server: /tmp/<name>-<pid>.
inline std::string scratch_dir(const std::string& name) {
  return "/tmp/" + name + "-" + std::to_string(::getpid());
}

// A throw-away redis-server for one program run: started on a free loopback port through
// cmake/redis_server.sh, in a directory of its own (scratch_dir), and stopped (SIGTERM,
// then SIGKILL) when it goes out of scope. An optional wrapper command runs redis-server
// under a tool (the script's QUOTA_REDIS_WRAPPER, e.g. valgrind). Not thread-safe: one
// owner, in main. Example:
//
//   quota::testing::ScratchServer server(quota::testing::scratch_dir("quota-redis-bench"));
//   if (!server.started()) return 1;
//   quota::redis::Connection c(quota::bench::loopback(server.port()));
class ScratchServer {
 public:
  // Starts redis-server in `dir` (created if missing). With a non-empty `wrapper`,
  // redis-server runs under it (QUOTA_REDIS_WRAPPER, set only for the script's start and
  // unset after; the script then waits 30 s rather than 5 for an answer). started() says
  // whether it answered.
  explicit ScratchServer(std::string dir, const std::string& wrapper = {}) : dir_(std::move(dir)) {
    std::error_code ec;
    std::filesystem::create_directories(dir_, ec);  // the wrapper may write there first
    if (!wrapper.empty()) ::setenv("QUOTA_REDIS_WRAPPER", wrapper.c_str(), 1);
    const bool ok = std::system(script("start", ">/dev/null").c_str()) == 0;
    if (!wrapper.empty()) ::unsetenv("QUOTA_REDIS_WRAPPER");
    if (!ok) return;
    std::ifstream(dir_ + "/port") >> port_;
    std::ifstream(dir_ + "/redis.pid") >> pid_;
  }

  // Stops the server (also after a failed start: the script may have left one behind).
  // Its directory is removed once the server had started; after a failed start it stays,
  // with redis.log, for a look at why.
  ~ScratchServer() {
    if (std::system(script("stop", ">/dev/null 2>&1").c_str()) != 0) {
      std::fprintf(stderr, "could not stop redis-server\n");
    }
    if (started()) {
      std::error_code ec;
      std::filesystem::remove_all(dir_, ec);
    }
  }

  ScratchServer(const ScratchServer&) = delete;
  ScratchServer& operator=(const ScratchServer&) = delete;

  bool started() const { return port_ > 0; }
  int port() const { return port_; }
  // The server's process id from its pid file (under valgrind, which runs redis-server
  // inside its own process, valgrind's); 0 if none was read.
  long pid() const { return pid_; }
  // Where the server keeps its pid file and log (and a wrapper may write its output).
  const std::string& dir() const { return dir_; }

 private:
  std::string script(const char* what, const char* redirect) const {
    return "bash '" + source_dir() + "/cmake/redis_server.sh' " + what + " '" + dir_ + "' " +
           redirect;
  }

  std::string dir_;
  int port_ = 0;
  long pid_ = 0;
};

}  // namespace quota::testing
