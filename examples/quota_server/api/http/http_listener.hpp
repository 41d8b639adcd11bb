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

#include <httplib.h>
#include <poll.h>
#include <sys/socket.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

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

  explicit HttpListener(HttpLimits limits);

  ~HttpListener() override;

  // Stops accepting, closes every idle connection; requests in progress finish.
  // listen_after_bind() returns once they have.
  void stop();

  // httplib's bind with the kernel's largest accept backlog (httplib asks for 5: a burst
  // of connects beyond that waits a SYN retransmission, a second).
  int bind_to_any_port(const std::string& host);
  bool bind_to_port(const std::string& host, int port);

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
    ssize_t read(char* ptr, size_t size) override;
    ssize_t write(const char* ptr, size_t size) override;
    void get_remote_ip_and_port(std::string& ip, int& port) const override;
    void get_local_ip_and_port(std::string& ip, int& port) const override;
    socket_t socket() const override { return fd_; }

    bool registered = false;  // in the epoll set (disarmed while a worker serves it)

   private:
    bool wait(short events, Clock::time_point until) const;
    void address(int (*get)(int, sockaddr*, socklen_t*), std::string& ip, int& port) const;

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
    explicit Workers(HttpListener& owner);
    void enqueue(std::function<void()> fn) override;
    // Runs what is queued, then joins the threads. The poller has stopped (stop()).
    void shutdown() override;

   private:
    void run();

    HttpListener& owner_;
    std::mutex mu_;
    std::condition_variable cv_;
    std::deque<std::function<void()>> jobs_;
    bool done_ = false;
    std::vector<std::thread> threads_;
  };

  // A connection httplib accepted: refused over the limit, else served.
  bool process_and_close_socket(socket_t sock) override;

  // Serves the requests `c` has ready, then parks it in the epoll set (or closes it).
  void serve(std::unique_ptr<Connection> c);

  void park(std::unique_ptr<Connection> c);

  // The epoll thread: a parked connection that becomes readable goes to a worker; one
  // idle past idle_timeout is closed.
  void poll_idle();

  // 400 for a body declared over the bound, before any of it is read; the connection is
  // closed after the answer (the body is still on it).
  HandlerResponse refuse_large_body(const httplib::Request& req, httplib::Response& res);

  void close_connection(int fd);

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
