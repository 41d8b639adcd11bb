// benchmarks/support/redis_server.hpp — a throw-away redis-server for one benchmark run.
//
// ScratchServer starts redis-server on a free loopback port through cmake/redis_server.sh,
// in a directory of its own (scratch_dir: /tmp/<name>-<pid>), and stops it (SIGTERM, then
// SIGKILL) when it goes out of scope. An optional wrapper command runs redis-server under
// a tool (the script's QUOTA_REDIS_WRAPPER, e.g. valgrind). Not thread-safe: one owner, in
// main. Example:
//
//   quota::bench::ScratchServer server(quota::bench::scratch_dir("quota-redis-bench"));
//   if (!server.started()) return 1;
//   quota::redis::Connection c(quota::bench::loopback(server.port()));
#pragma once

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <system_error>
#include <utility>

namespace quota::bench {

// The repository's root, from this header's path (<root>/benchmarks/support/...).
inline std::string source_dir() {
  std::string f = __FILE__;
  return f.substr(0, f.rfind("/benchmarks/"));
}

// A directory for one process's server: /tmp/<name>-<pid>.
inline std::string scratch_dir(const std::string& name) {
  return "/tmp/" + name + "-" + std::to_string(::getpid());
}

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

}  // namespace quota::bench
