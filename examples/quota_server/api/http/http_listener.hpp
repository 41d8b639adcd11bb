// examples/quota_server/api/http/http_listener.hpp — quota-server's HTTP listener: cpp-httplib's
// request handling on connections no client can use to stall the others.
//
// httplib's own server ties a pool thread to each connection for its whole life: 8 idle
// keep-alive connections (its pool on a 2-core machine) make every other caller wait,
// and a body declared huge is read (and discarded) at the sender's pace. HttpListener
// keeps httplib's parsing, routing and handlers and replaces the connection handling:
//   - a worker serves one request at a time: a connection with nothing to read waits in
//     an epoll set (one thread for all of them), not in a worker;
//   - each request must arrive whole within `request_timeout` of its first byte (head
//     and body; a slow sender is cut off, its connection closed);
//   - a body whose declared Content-Length is over `max_body_bytes` is answered 400 (a
//     bad request, with a JSON message, as every bad input of quota-server's API) before
//     a byte of it is read, and the connection closed; a chunked body is cut at the same
//     bound while it is read (httplib's 413);
//   - at most `max_connections` connections are open: one more is closed at once;
//   - a connection idle for `idle_timeout` is closed.
// So a client holding connections open, or sending slowly, holds at most a worker for
// `request_timeout` per connection it sends on, and nothing while it is idle.
// counters() says what was refused.
//
// Thread safety: register handlers before listen_after_bind(); stop() from any thread
// (once). Handlers run on the `workers` threads.
//
//   quota::server::HttpListener http({.workers = 16});
//   http.Get("/healthz", handler);
//   const int port = http.bind_to_any_port("127.0.0.1");
//   std::thread t([&] { http.listen_after_bind(); });
//   ...
//   http.stop();
//   t.join();
#pragma once

#include <arpa/inet.h>
#include <httplib.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"

namespace quota::server {

struct HttpLimits {
  int workers = 16;                                 // threads that run requests
  int max_connections = 512;                        // open connections; one more is closed at once
  std::chrono::milliseconds request_timeout{1000};  // a whole request, from its first byte
  std::chrono::milliseconds write_timeout{5000};    // an answer's write
  std::chrono::seconds idle_timeout{60};            // a keep-alive connection with no request
  std::size_t max_body_bytes = 8 * 1024;            // larger declared bodies: 400, unread
};

class HttpListener : public httplib::Server {
 public:
  // What the listener refused, since it started.
  struct Counters {
    std::uint64_t connections_refused = 0;  // over max_connections
    std::uint64_t bodies_refused = 0;       // declared over max_body_bytes
    std::uint64_t requests_timed_out = 0;   // not whole within request_timeout
    std::uint64_t idle_closed = 0;          // idle past idle_timeout
  };

  explicit HttpListener(HttpLimits limits) : limits_(limits) {
    new_task_queue = [this] { return new Workers(*this); };
    set_payload_max_length(limits_.max_body_bytes);
    set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
      return refuse_large_body(req, res);
    });
    epoll_ = epoll_create1(EPOLL_CLOEXEC);
    poller_ = std::thread([this] { poll_idle(); });
  }

  ~HttpListener() override {
    stop();
    if (epoll_ >= 0) close(epoll_);
  }

  // Stops accepting, closes every idle connection; requests in progress finish.
  // listen_after_bind() returns once they have.
  void stop() {
    if (!stopping_.exchange(true)) {
      if (poller_.joinable()) poller_.join();
      std::lock_guard lock(mu_);
      for (auto& [fd, c] : parked_) close_connection(fd);
      parked_.clear();
    }
    httplib::Server::stop();
  }

  // httplib's bind with the kernel's largest accept backlog (httplib asks for 5: a burst
  // of connects beyond that waits a SYN retransmission, a second).
  int bind_to_any_port(const std::string& host) {
    const int port = httplib::Server::bind_to_any_port(host);
    if (port > 0) ::listen(svr_sock_, SOMAXCONN);
    return port;
  }
  bool bind_to_port(const std::string& host, int port) {
    if (!httplib::Server::bind_to_port(host, port)) return false;
    ::listen(svr_sock_, SOMAXCONN);
    return true;
  }

  Counters counters() const {
    return {.connections_refused = refused_.load(std::memory_order_relaxed),
            .bodies_refused = bodies_refused_.load(std::memory_order_relaxed),
            .requests_timed_out = timed_out_.load(std::memory_order_relaxed),
            .idle_closed = idle_closed_.load(std::memory_order_relaxed)};
  }
  int open_connections() const { return open_.load(std::memory_order_relaxed); }

 private:
  using Clock = std::chrono::steady_clock;

  // One connection's socket as httplib's Stream, with a read buffer that outlives a
  // request (a pipelined next request stays in it) and the current request's deadline.
  class Connection : public httplib::Stream {
   public:
    Connection(int fd, const HttpLimits& limits) : fd_(fd), limits_(limits) {}

    void start_request() {
      deadline_ = Clock::now() + limits_.request_timeout;
      timed_out_ = false;
    }
    bool buffered() const { return begin_ < end_; }
    bool timed_out() const { return timed_out_; }

    bool is_readable() const override { return buffered() || wait(POLLIN, deadline_); }
    bool is_writable() const override {
      return wait(POLLOUT, Clock::now() + limits_.write_timeout);
    }
    ssize_t read(char* ptr, size_t size) override {
      if (!buffered()) {
        if (!wait(POLLIN, deadline_)) {
          timed_out_ = true;
          return -1;
        }
        const ssize_t n = recv(fd_, buf_, sizeof buf_, 0);
        if (n <= 0) return n;
        begin_ = 0;
        end_ = static_cast<std::size_t>(n);
      }
      const std::size_t n = std::min(size, end_ - begin_);
      std::memcpy(ptr, buf_ + begin_, n);
      begin_ += n;
      return static_cast<ssize_t>(n);
    }
    ssize_t write(const char* ptr, size_t size) override {
      if (!is_writable()) return -1;
      return send(fd_, ptr, size, MSG_NOSIGNAL);
    }
    void get_remote_ip_and_port(std::string& ip, int& port) const override {
      address(getpeername, ip, port);
    }
    void get_local_ip_and_port(std::string& ip, int& port) const override {
      address(getsockname, ip, port);
    }
    socket_t socket() const override { return fd_; }

    bool registered = false;  // in the epoll set (disarmed while a worker serves it)

   private:
    bool wait(short events, Clock::time_point until) const {
      for (;;) {
        const auto left =
            std::chrono::duration_cast<std::chrono::milliseconds>(until - Clock::now()).count();
        pollfd p{fd_, events, 0};
        const int r = poll(&p, 1, static_cast<int>(std::max<std::int64_t>(left, 0)));
        if (r > 0) return true;
        if (r == 0 || errno != EINTR) return false;
      }
    }
    void address(int (*get)(int, sockaddr*, socklen_t*), std::string& ip, int& port) const {
      sockaddr_storage a{};
      socklen_t len = sizeof a;
      ip.clear();
      port = 0;
      if (get(fd_, reinterpret_cast<sockaddr*>(&a), &len) != 0) return;
      char text[INET6_ADDRSTRLEN] = {};
      if (a.ss_family == AF_INET) {
        const auto* v4 = reinterpret_cast<const sockaddr_in*>(&a);
        inet_ntop(AF_INET, &v4->sin_addr, text, sizeof text);
        port = ntohs(v4->sin_port);
      } else if (a.ss_family == AF_INET6) {
        const auto* v6 = reinterpret_cast<const sockaddr_in6*>(&a);
        inet_ntop(AF_INET6, &v6->sin6_addr, text, sizeof text);
        port = ntohs(v6->sin6_port);
      }
      ip = text;
    }

    int fd_;
    const HttpLimits& limits_;
    char buf_[4096];
    std::size_t begin_ = 0, end_ = 0;
    Clock::time_point deadline_{};
    bool timed_out_ = false;
  };

  // The worker threads (httplib's TaskQueue: it hands over each accepted socket).
  class Workers : public httplib::TaskQueue {
   public:
    explicit Workers(HttpListener& owner) : owner_(owner) {
      owner_.workers_.store(this, std::memory_order_release);
      for (int i = 0; i < std::max(1, owner_.limits_.workers); ++i) {
        threads_.emplace_back([this] { run(); });
      }
    }
    void enqueue(std::function<void()> fn) override {
      {
        std::lock_guard lock(mu_);
        jobs_.push_back(std::move(fn));
      }
      cv_.notify_one();
    }
    // Runs what is queued, then joins the threads. The poller has stopped (stop()).
    void shutdown() override {
      {
        std::lock_guard lock(mu_);
        done_ = true;
      }
      cv_.notify_all();
      for (auto& t : threads_) t.join();
      owner_.workers_.store(nullptr, std::memory_order_release);
    }

   private:
    void run() {
      for (;;) {
        std::function<void()> fn;
        {
          std::unique_lock lock(mu_);
          cv_.wait(lock, [this] { return done_ || !jobs_.empty(); });
          if (jobs_.empty()) return;
          fn = std::move(jobs_.front());
          jobs_.pop_front();
        }
        fn();
      }
    }

    HttpListener& owner_;
    std::mutex mu_;
    std::condition_variable cv_;
    std::deque<std::function<void()>> jobs_;
    bool done_ = false;
    std::vector<std::thread> threads_;
  };

  // A connection httplib accepted: refused over the limit, else served.
  bool process_and_close_socket(socket_t sock) override {
    if (open_.fetch_add(1, std::memory_order_relaxed) >= limits_.max_connections ||
        stopping_.load(std::memory_order_acquire)) {
      refused_.fetch_add(1, std::memory_order_relaxed);
      close_connection(sock);
      return false;
    }
    // An answer goes out at once: httplib writes its head and body separately, and with
    // Nagle the body would wait for the client's delayed ACK (~40 ms).
    const int one = 1;
    setsockopt(sock, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    serve(std::make_unique<Connection>(sock, limits_));
    return true;
  }

  // Serves the requests `c` has ready, then parks it in the epoll set (or closes it).
  void serve(std::unique_ptr<Connection> c) {
    for (;;) {
      if (!c->buffered()) {
        pollfd p{c->socket(), POLLIN, 0};
        if (poll(&p, 1, 0) <= 0) return park(std::move(c));
      }
      c->start_request();
      close_after_ = false;
      bool closed = false;
      const bool ok = process_request(*c, false, closed, nullptr);
      // A request that did not arrive in time was answered 400 by httplib; what is left
      // of it on the connection cannot be parsed: close.
      if (c->timed_out()) timed_out_.fetch_add(1, std::memory_order_relaxed);
      if (!ok || closed || close_after_ || c->timed_out() ||
          stopping_.load(std::memory_order_acquire)) {
        close_connection(c->socket());
        return;
      }
    }
  }

  void park(std::unique_ptr<Connection> c) {
    const int fd = c->socket();
    std::lock_guard lock(mu_);
    if (stopping_.load(std::memory_order_acquire)) {
      close_connection(fd);
      return;
    }
    epoll_event ev{};
    ev.events = EPOLLIN | EPOLLRDHUP | EPOLLONESHOT;
    ev.data.fd = fd;
    const int op = c->registered ? EPOLL_CTL_MOD : EPOLL_CTL_ADD;
    c->registered = true;
    if (epoll_ctl(epoll_, op, fd, &ev) != 0) {
      close_connection(fd);
      return;
    }
    parked_[fd] =
        Parked{.connection = std::move(c), .idle_until = Clock::now() + limits_.idle_timeout};
  }

  // The epoll thread: a parked connection that becomes readable goes to a worker; one
  // idle past idle_timeout is closed.
  void poll_idle() {
    auto next_sweep = Clock::now() + std::chrono::seconds(1);
    epoll_event events[64];
    while (!stopping_.load(std::memory_order_acquire)) {
      const int n = epoll_wait(epoll_, events, 64, 100);
      std::vector<std::unique_ptr<Connection>> ready;
      {
        std::lock_guard lock(mu_);
        for (int i = 0; i < n; ++i) {
          auto it = parked_.find(events[i].data.fd);
          if (it == parked_.end()) continue;
          ready.push_back(std::move(it->second.connection));
          parked_.erase(it);
        }
        if (Clock::now() >= next_sweep) {
          next_sweep = Clock::now() + std::chrono::seconds(1);
          for (auto it = parked_.begin(); it != parked_.end();) {
            if (it->second.idle_until <= Clock::now()) {
              idle_closed_.fetch_add(1, std::memory_order_relaxed);
              close_connection(it->first);
              it = parked_.erase(it);
            } else {
              ++it;
            }
          }
        }
      }
      Workers* w = workers_.load(std::memory_order_acquire);
      for (auto& c : ready) {
        if (w == nullptr) {
          close_connection(c->socket());
          continue;
        }
        auto* raw = c.release();
        w->enqueue([this, raw] { serve(std::unique_ptr<Connection>(raw)); });
      }
    }
  }

  // 400 for a body declared over the bound, before any of it is read; the connection is
  // closed after the answer (the body is still on it).
  HandlerResponse refuse_large_body(const httplib::Request& req, httplib::Response& res) {
    if (!req.has_header("Content-Length")) return HandlerResponse::Unhandled;
    std::uint64_t declared = 0;
    const std::string v = req.get_header_value("Content-Length");
    if (absl::SimpleAtoi(v, &declared) && declared <= limits_.max_body_bytes) {
      return HandlerResponse::Unhandled;
    }
    bodies_refused_.fetch_add(1, std::memory_order_relaxed);
    close_after_ = true;
    res.status = 400;
    res.set_header("Connection", "close");
    res.set_content(absl::StrFormat("{\"error\":\"invalid_argument\",\"message\":\"body declared "
                                    "as %s bytes; at most %d are accepted\"}\n",
                                    v, limits_.max_body_bytes),
                    "application/json");
    return HandlerResponse::Handled;
  }

  void close_connection(int fd) {
    shutdown(fd, SHUT_RDWR);
    close(fd);
    open_.fetch_sub(1, std::memory_order_relaxed);
  }

  struct Parked {
    std::unique_ptr<Connection> connection;
    Clock::time_point idle_until;
  };

  HttpLimits limits_;
  int epoll_ = -1;
  std::atomic<bool> stopping_{false};
  std::atomic<Workers*> workers_{nullptr};
  std::mutex mu_;  // parked_ and epoll registrations
  std::unordered_map<int, Parked> parked_;
  std::thread poller_;
  std::atomic<int> open_{0};
  std::atomic<std::uint64_t> refused_{0}, bodies_refused_{0}, timed_out_{0}, idle_closed_{0};
  static inline thread_local bool close_after_ = false;
};

}  // namespace quota::server
