// examples/quota_server/testing/server_process.hpp — quota-server (or any program) as a
// child process of a test, on free loopback ports, stopped by pid.
//
// ServerProcess::start() forks and execs the binary with its stdout on a pipe, and reads
// that pipe until every expected "<word> listening on 127.0.0.1:PORT" line has appeared
// (at most 20 s), recording each port by its word ("grpc", "http"). stop() sends SIGTERM
// and waits (SIGKILL after 10 s); kill() sends SIGKILL. The destructor stops a running
// child. Every wait is bounded. set_stderr(path) before start() sends the child's stderr
// to that file (its log, for a test to read).
//
// Thread safety: one thread per ServerProcess.
//
//   quota::testing::ServerProcess s;
//   REQUIRE(s.start({exe, "--rules", path, "--grpc-port", "0"}, {"grpc"}));
//   int port = s.port("grpc");
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace quota::testing {

class ServerProcess {
 public:
  ServerProcess() = default;
  ServerProcess(const ServerProcess&) = delete;
  ServerProcess& operator=(const ServerProcess&) = delete;
  ~ServerProcess() { stop(); }

  // The file the next start()'s child writes its stderr to (truncated); "": inherited.
  void set_stderr(std::string path) { stderr_path_ = std::move(path); }

  // Starts `args` (args[0] the binary) and waits for "<word> listening on 127.0.0.1:PORT"
  // for every word of `words`. False (the child killed, its output printed) otherwise.
  bool start(std::vector<std::string> args, const std::vector<std::string>& words) {
    int fds[2];
    if (pipe(fds) != 0) return false;
    pid_ = fork();
    if (pid_ == 0) {
      dup2(fds[1], 1);
      if (!stderr_path_.empty()) {
        const int err = open(stderr_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
        if (err >= 0) {
          dup2(err, 2);
          close(err);
        }
      }
      close(fds[0]);
      close(fds[1]);
      std::vector<char*> argv;
      for (auto& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      execv(argv[0], argv.data());
      _exit(127);
    }
    close(fds[1]);
    std::string out;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (std::chrono::steady_clock::now() < deadline && ports_.size() < words.size()) {
      pollfd p{fds[0], POLLIN, 0};
      if (poll(&p, 1, 100) <= 0) continue;
      char buf[512];
      const ssize_t n = read(fds[0], buf, sizeof buf);
      if (n <= 0) break;
      out.append(buf, static_cast<std::size_t>(n));
      for (const std::string& w : words) {
        const std::string marker = w + " listening on 127.0.0.1:";
        const auto at = out.find(marker);
        if (at == std::string::npos) continue;
        const auto end = out.find_first_not_of("0123456789", at + marker.size());
        if (end == std::string::npos) continue;  // the port may not be complete yet
        ports_[w] = std::atoi(out.c_str() + at + marker.size());
      }
    }
    close(fds[0]);  // later output goes nowhere (the server ignores SIGPIPE)
    if (ports_.size() < words.size()) {
      std::printf("server did not say where it listens; output: %s\n", out.c_str());
      kill();
      return false;
    }
    return true;
  }

  int port(const std::string& word) const {
    const auto it = ports_.find(word);
    return it == ports_.end() ? 0 : it->second;
  }
  pid_t pid() const { return pid_; }
  bool running() const { return pid_ > 0; }

  // SIGTERM, then wait (SIGKILL after 10 s). Returns the exit status (waitpid's).
  int stop() { return end(SIGTERM); }
  int kill() { return end(SIGKILL); }

 private:
  int end(int sig) {
    if (pid_ <= 0) return -1;
    ::kill(pid_, sig);
    int status = 0;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (waitpid(pid_, &status, WNOHANG) == 0) {
      if (std::chrono::steady_clock::now() > deadline) {
        ::kill(pid_, SIGKILL);
        waitpid(pid_, &status, 0);
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    pid_ = -1;
    return status;
  }

  pid_t pid_ = -1;
  std::string stderr_path_;
  std::map<std::string, int> ports_;
};

}  // namespace quota::testing
