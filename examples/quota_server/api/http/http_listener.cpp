// examples/quota_server/api/http/http_listener.cpp — the definitions of http_listener.hpp:
// cpp-httplib's request handling on connections no client can use to stall the others.
#include "api/http/http_listener.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"

namespace quota::server {

HttpListener::HttpListener(HttpLimits limits) : limits_(limits) {
  new_task_queue = [this] { return new Workers(*this); };
  set_payload_max_length(limits_.max_body_bytes);
  set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    return refuse_large_body(req, res);
  });
  epoll_ = epoll_create1(EPOLL_CLOEXEC);
  poller_ = std::thread([this] { poll_idle(); });
}

HttpListener::~HttpListener() {
  stop();
  if (epoll_ >= 0) close(epoll_);
}

void HttpListener::stop() {
  if (!stopping_.exchange(true)) {
    if (poller_.joinable()) poller_.join();
    std::lock_guard lock(mu_);
    for (auto& [fd, c] : parked_) close_connection(fd);
    parked_.clear();
  }
  httplib::Server::stop();
}

int HttpListener::bind_to_any_port(const std::string& host) {
  const int port = httplib::Server::bind_to_any_port(host);
  if (port > 0) ::listen(svr_sock_, SOMAXCONN);
  return port;
}

bool HttpListener::bind_to_port(const std::string& host, int port) {
  if (!httplib::Server::bind_to_port(host, port)) return false;
  ::listen(svr_sock_, SOMAXCONN);
  return true;
}

ssize_t HttpListener::Connection::read(char* ptr, size_t size) {
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

ssize_t HttpListener::Connection::write(const char* ptr, size_t size) {
  if (!is_writable()) return -1;
  return send(fd_, ptr, size, MSG_NOSIGNAL);
}

void HttpListener::Connection::get_remote_ip_and_port(std::string& ip, int& port) const {
  address(getpeername, ip, port);
}

void HttpListener::Connection::get_local_ip_and_port(std::string& ip, int& port) const {
  address(getsockname, ip, port);
}

bool HttpListener::Connection::wait(short events, Clock::time_point until) const {
  for (;;) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(until - Clock::now()).count();
    pollfd p{fd_, events, 0};
    const int r = poll(&p, 1, static_cast<int>(std::max<std::int64_t>(left, 0)));
    if (r > 0) return true;
    if (r == 0 || errno != EINTR) return false;
  }
}

void HttpListener::Connection::address(int (*get)(int, sockaddr*, socklen_t*), std::string& ip,
                                       int& port) const {
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

HttpListener::Workers::Workers(HttpListener& owner) : owner_(owner) {
  owner_.workers_.store(this, std::memory_order_release);
  for (int i = 0; i < std::max(1, owner_.limits_.workers); ++i) {
    threads_.emplace_back([this] { run(); });
  }
}

void HttpListener::Workers::enqueue(std::function<void()> fn) {
  {
    std::lock_guard lock(mu_);
    jobs_.push_back(std::move(fn));
  }
  cv_.notify_one();
}

void HttpListener::Workers::shutdown() {
  {
    std::lock_guard lock(mu_);
    done_ = true;
  }
  cv_.notify_all();
  for (auto& t : threads_) t.join();
  owner_.workers_.store(nullptr, std::memory_order_release);
}

void HttpListener::Workers::run() {
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

bool HttpListener::process_and_close_socket(socket_t sock) {
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

void HttpListener::serve(std::unique_ptr<Connection> c) {
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

void HttpListener::park(std::unique_ptr<Connection> c) {
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

void HttpListener::poll_idle() {
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

HttpListener::HandlerResponse HttpListener::refuse_large_body(const httplib::Request& req,
                                                              httplib::Response& res) {
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

void HttpListener::close_connection(int fd) {
  shutdown(fd, SHUT_RDWR);
  close(fd);
  open_.fetch_sub(1, std::memory_order_relaxed);
}

}  // namespace quota::server
