// quota/testing/redis_server.hpp — a throw-away redis-server for integration tests: started
// on a free loopback port in a directory of its own, stopped by its pid when it goes out
// of scope.
//
// A test of a Redis-backed limiter wants a real server, its own, and nothing left behind.
// RedisServer writes <dir>/redis.conf (port, bind 127.0.0.1, daemonized, pid file, log,
// no persistence, plus the test's own lines: "requirepass pw", "maxmemory-policy
// allkeys-lru", or a sentinel's "sentinel monitor ..."), starts `redis-server` (or
// `redis-sentinel`) from PATH on a random port in [20000, 32000) — below the ephemeral
// range, retried on another port when one is taken — and waits until it answers PING
// (PONG or NOAUTH). It is this process's server: redis-server writes its pid file only
// once it has bound its port. `kill(SIGSTOP)` pauses it and `kill(SIGKILL)` crashes it,
// as a fault test wants; `restart()` starts it again on the same port with the same file.
// When it cannot start, started() is false and error() says why (no redis-server on
// PATH, the config line it refused, the end of its log).
//
// Links quota::redis (hiredis) besides quota::testing. Thread safety: one owner; the
// server itself serves any number of connections.
//
//   quota::testing::RedisServer server("my-test", {"maxmemory-policy noeviction"});
//   REQUIRE(server.started());  // else server.error()
//   quota::redis::ConnectionPool pool(server.connection(), 4);
//   ...                          // stopped and its directory removed at the end of scope
#pragma once

#include <signal.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include "quota/redis/transport/connection.hpp"
#include "quota/redis/transport/reply.hpp"

namespace quota::testing {

class RedisServer {
 public:
  // Starts a server in /tmp/<name>-<pid> with `config_lines` appended to its config; a
  // sentinel with `sentinel` (its config must then monitor a master).
  explicit RedisServer(const std::string& name, std::vector<std::string> config_lines = {},
                       bool sentinel = false)
      : dir_("/tmp/" + name + "-" + std::to_string(::getpid())),
        lines_(std::move(config_lines)),
        sentinel_(sentinel) {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
    std::filesystem::create_directories(dir_, ec);
    if (ec) {
      error_ = "cannot create " + dir_ + ": " + ec.message();
      return;
    }
    std::mt19937 rng(std::random_device{}());
    for (int i = 0; i < 50 && port_ == 0 && error_.empty(); ++i) {
      // Below the ephemeral range (a Cluster's bus port, +10000, stays below 42000).
      const int port = 20000 + static_cast<int>(rng() % 12000);
      if (launch(port)) port_ = port;
    }
    if (port_ == 0 && error_.empty()) error_ = "no free port answered after 50 tries" + log_tail();
  }
  ~RedisServer() {
    stop();
    if (started()) {
      std::error_code ec;
      std::filesystem::remove_all(dir_, ec);  // after a failed start it stays, for its log
    }
  }
  RedisServer(const RedisServer&) = delete;
  RedisServer& operator=(const RedisServer&) = delete;

  bool started() const { return port_ > 0; }
  // Why it did not start ("" once it has).
  const std::string& error() const { return error_; }
  int port() const { return port_; }
  long pid() const { return pid_; }
  // Its config, pid file and log.
  const std::string& dir() const { return dir_; }

  // A connection config for it, with a deadline generous enough for a busy machine.
  redis::ConnectionConfig connection(
      std::chrono::microseconds deadline = std::chrono::seconds(2)) const {
    return redis::ConnectionConfig{.host = "127.0.0.1", .port = port_, .deadline = deadline};
  }

  // Sends `sig` to the process (SIGSTOP pauses it, SIGCONT resumes it, SIGKILL crashes
  // it); true when it was delivered.
  bool kill(int sig) const { return pid_ > 0 && ::kill(static_cast<pid_t>(pid_), sig) == 0; }

  // Starts it again on its port (after kill(SIGKILL), say); true when it answers.
  bool restart() {
    stop();
    for (int i = 0; i < 40; ++i) {
      if (launch(port_)) {
        error_.clear();
        return true;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return false;
  }

  // SIGTERM (after SIGCONT, should it be paused), then SIGKILL after 2.5 s.
  void stop() {
    if (pid_ <= 0) return;
    const auto pid = static_cast<pid_t>(pid_);
    ::kill(pid, SIGCONT);
    ::kill(pid, SIGTERM);
    for (int i = 0; i < 50 && alive(pid); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    ::kill(pid, SIGKILL);
    pid_ = 0;
  }

 private:
  // Running (a zombie left unreaped by a container's init counts as gone).
  static bool alive(pid_t pid) {
    if (::kill(pid, 0) != 0) return false;
    std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
    std::string id, name, state;
    return !(stat >> id >> name >> state) || state != "Z";
  }

  // The non-empty lines of `file`, joined by " | ".
  static std::string text_of(const std::string& file) {
    std::ifstream in(file);
    std::string line, all;
    while (std::getline(in, line)) {
      if (line.empty()) continue;
      all += (all.empty() ? "" : " | ") + line;
    }
    return all;
  }

  std::string log_tail() const {
    std::ifstream in(dir_ + "/redis.log");
    std::string line, last;
    while (std::getline(in, line)) {
      if (!line.empty()) last = line;
    }
    return last.empty() ? "" : "; its log ends: " + last;
  }

  bool launch(int port) {
    const std::string conf = dir_ + "/redis.conf";
    const std::string pidfile = dir_ + "/redis.pid";
    std::error_code ec;
    std::filesystem::remove(pidfile, ec);
    {
      std::ofstream out(conf);
      out << "port " << port << "\nbind 127.0.0.1\ndaemonize yes\nprotected-mode no\n"
          << "pidfile " << pidfile << "\nlogfile " << dir_ << "/redis.log\ndir " << dir_ << "\n";
      if (!sentinel_) out << "save \"\"\nappendonly no\n";
      for (const auto& line : lines_) out << line << "\n";
    }
    const std::string binary = sentinel_ ? "redis-sentinel" : "redis-server";
    const std::string out = dir_ + "/start.out";  // what it prints before it has a log
    const int rc = std::system((binary + " '" + conf + "' >'" + out + "' 2>&1").c_str());
    if (rc != 0) {
      // The shell's 127: not on PATH; else it refused its config, and said why. Either
      // way another port would not help.
      error_ = WIFEXITED(rc) && WEXITSTATUS(rc) == 127
                   ? binary + " is not on PATH (Debian: apt-get install redis-server)"
                   : binary + " refused " + conf + ": " + text_of(out);
      return false;
    }
    for (int i = 0; i < 100; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      long pid = 0;
      std::ifstream(pidfile) >> pid;
      if (pid > 0 && !alive(static_cast<pid_t>(pid))) return false;  // it exited
      if (pid <= 0) continue;                                        // not bound yet
      redis::Connection c(
          redis::ConnectionConfig{.host = "127.0.0.1",
                                  .port = port,
                                  .deadline = std::chrono::seconds(1),
                                  .eviction_check = redis::EvictionPolicyCheck::kSkip});
      auto pong = c.command({"PING"});
      if (pong.ok() &&
          (redis::reply_string(**pong) == "PONG" || redis::is_error(**pong, "NOAUTH"))) {
        pid_ = pid;
        return true;
      }
    }
    long pid = 0;
    std::ifstream(pidfile) >> pid;
    if (pid > 0) ::kill(static_cast<pid_t>(pid), SIGKILL);
    return false;
  }

  std::string dir_;
  std::vector<std::string> lines_;
  bool sentinel_ = false;
  std::string error_;
  int port_ = 0;
  long pid_ = 0;
};

}  // namespace quota::testing
