// tests/redis/support/lossy_proxy.hpp — a loopback TCP proxy in front of redis-server
// that can lose a reply: armed with drop_next_reply(), it forwards the next command to
// the server (which runs it) and closes the client's connection when the reply comes
// back, instead of forwarding it. That is the "reply lost" fault of idempotent attempts.
// Armed with drop_reply_to(needle), it does the same to the reply of the next command
// whose bytes contain `needle` (one caller at a time: the reply dropped is the next one
// the server sends after that command). Armed with drop_request_to(needle), it closes the
// client's connection on the next command containing `needle` without forwarding it: the
// server never runs it. dropped() counts both. While set_blocked(true), every command is
// handled so (the connection closed, nothing forwarded): the server is unreachable through
// the proxy until set_blocked(false). With set_delay(d), every command waits d before it is
// forwarded (one thread forwards all: the commands through the proxy are serialized), a
// slow path to a far server.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

namespace quota::testing {

class LossyProxy {
 public:
  explicit LossyProxy(int server_port) : server_port_(server_port) {
    listen_fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = 0;
    if (::bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
        ::listen(listen_fd_, 16) != 0) {
      throw std::runtime_error("proxy: cannot listen");
    }
    socklen_t len = sizeof addr;
    ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len);
    port_ = ntohs(addr.sin_port);
    thread_ = std::thread([this] { run(); });
  }
  ~LossyProxy() {
    stop_ = true;
    thread_.join();
    ::close(listen_fd_);
  }
  LossyProxy(const LossyProxy&) = delete;
  LossyProxy& operator=(const LossyProxy&) = delete;

  int port() const { return port_; }
  void drop_next_reply() { drop_ = true; }
  void drop_reply_to(std::string needle) {
    std::lock_guard<std::mutex> lock(mu_);
    needle_ = std::move(needle);
  }
  void drop_request_to(std::string needle) {
    std::lock_guard<std::mutex> lock(mu_);
    request_needle_ = std::move(needle);
  }
  void set_blocked(bool blocked) { blocked_ = blocked; }
  void set_delay(std::chrono::microseconds delay) { delay_us_ = delay.count(); }
  int dropped() const { return dropped_.load(); }

 private:
  struct Pair {
    int client, server;
  };

  int connect_server() const {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = htons(static_cast<std::uint16_t>(server_port_));
    if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
      ::close(fd);
      return -1;
    }
    return fd;
  }

  // One thread polls everything: the listening socket and both ends of every pair.
  void run() {
    std::vector<Pair> pairs;
    char buf[65536];
    while (!stop_) {
      std::vector<pollfd> fds{{listen_fd_, POLLIN, 0}};
      for (const Pair& p : pairs) {
        fds.push_back({p.client, POLLIN, 0});
        fds.push_back({p.server, POLLIN, 0});
      }
      if (::poll(fds.data(), fds.size(), 20) <= 0) continue;
      if (fds[0].revents & POLLIN) {
        const int c = ::accept(listen_fd_, nullptr, nullptr);
        const int s = c >= 0 ? connect_server() : -1;
        if (s >= 0) {
          pairs.push_back({c, s});
        } else if (c >= 0) {
          ::close(c);
        }
        continue;  // fds no longer match pairs
      }
      std::vector<Pair> keep;
      for (std::size_t i = 0; i < pairs.size(); ++i) {
        const Pair p = pairs[i];
        bool closed = false;
        if (fds[1 + 2 * i].revents & (POLLIN | POLLHUP | POLLERR)) {
          const ssize_t n = ::read(p.client, buf, sizeof buf);
          const std::string_view command(buf, n > 0 ? static_cast<std::size_t>(n) : 0);
          if (n > 0 && (blocked_ || request_matches(command))) {
            ++dropped_;
            closed = true;  // never forwarded: the server does not run it
          } else {
            if (n > 0) arm_if_matches(command);
            if (n > 0 && delay_us_ > 0) {
              std::this_thread::sleep_for(std::chrono::microseconds(delay_us_.load()));
            }
            closed = n <= 0 || ::write(p.server, buf, static_cast<std::size_t>(n)) != n;
          }
        }
        if (!closed && (fds[2 + 2 * i].revents & (POLLIN | POLLHUP | POLLERR))) {
          const ssize_t n = ::read(p.server, buf, sizeof buf);
          if (n > 0 && drop_.exchange(false)) {
            ++dropped_;
            closed = true;  // the server ran it; the client never hears back
          } else {
            closed = n <= 0 || ::write(p.client, buf, static_cast<std::size_t>(n)) != n;
          }
        }
        if (closed) {
          ::close(p.client);
          ::close(p.server);
        } else {
          keep.push_back(p);
        }
      }
      pairs = std::move(keep);
    }
    for (const Pair& p : pairs) {
      ::close(p.client);
      ::close(p.server);
    }
  }

  void arm_if_matches(std::string_view command) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!needle_.empty() && command.find(needle_) != std::string_view::npos) {
      needle_.clear();
      drop_ = true;
    }
  }

  bool request_matches(std::string_view command) {
    std::lock_guard<std::mutex> lock(mu_);
    if (request_needle_.empty() || command.find(request_needle_) == std::string_view::npos) {
      return false;
    }
    request_needle_.clear();
    return true;
  }

  int server_port_;
  int listen_fd_ = -1;
  std::mutex mu_;
  std::string needle_;          // guarded by mu_
  std::string request_needle_;  // guarded by mu_
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<bool> drop_{false};
  std::atomic<bool> blocked_{false};
  std::atomic<int> dropped_{0};
  std::atomic<std::int64_t> delay_us_{0};
  std::thread thread_;
};

}  // namespace quota::testing
