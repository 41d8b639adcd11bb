// quota/redis/transport/connection.hpp — one hiredis connection bounded by a deadline, and a
// pool of them.
//
// `Connection` wraps a blocking hiredis context (hiredis 0.14, Debian's libhiredis-dev).
// It connects lazily. Every call is bounded by ONE Deadline (deadline.hpp): the connect,
// the write of the command and the read of each reply each wait only the time left (a
// ppoll() with that timeout before every read or write: a socket timeout would be
// rounded to the kernel's tick, milliseconds), so they never add up past it; hiredis
// rounds the connect's wait up to a whole millisecond.
// Without an explicit Deadline a call gets `ConnectionConfig::deadline` (3 ms). After ANY
// failure (connection refused or lost, the deadline passed, a protocol error) it drops
// the context, so the next call reconnects. A timed out command may still run on the
// server; the caller only learns that it does not know. Every failure is
// `absl::StatusCode::kUnavailable` with the cause in the message (a passed deadline is
// named with its budget) — the store turns it into "no decision", never an allow or deny.
//
// Error replies (`-BUSY ...`, `-LOADING ...`, `-NOSCRIPT ...`) are replies, not
// transport failures: `command` returns them and `error_status(reply)` maps them.
//
// `ConnectionPool` hands connections to many threads: `acquire(deadline)` waits for a
// free one at most until the deadline (kUnavailable after that) and returns a lease that
// puts the connection back when destroyed. The pool is one node's, and holds the node's
// circuit breaker (ConnectionConfig::breaker, breaker.hpp): while it is open, acquire()
// fails at once naming it; each lease reports to it whether its exchanges succeeded.
//
// Thread safety: a Connection is for one thread at a time; ConnectionPool is thread-safe.
//
//   auto pool = std::make_shared<quota::redis::ConnectionPool>(
//       quota::redis::ConnectionConfig{.host = "127.0.0.1", .port = 6379}, 8);
//   const auto deadline = quota::redis::Deadline::after(std::chrono::milliseconds(3));
//   auto lease = pool->acquire(deadline);
//   absl::StatusOr<quota::redis::Reply> pong = (*lease)->command({"PING"}, deadline);
#pragma once

#include <hiredis/hiredis.h>
#include <poll.h>
#include <sys/time.h>

#include <cerrno>
#include <ctime>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "quota/redis/transport/breaker.hpp"
#include "quota/redis/transport/deadline.hpp"

namespace quota::redis {

struct ConnectionConfig {
  std::string host = "127.0.0.1";
  int port = 6379;
  // The budget of a call made without a Deadline: the pool wait, the connect, the write
  // and the reads, together. The stores use it unless their options set their own.
  std::chrono::microseconds deadline = kDefaultDeadline;
  // The node's circuit breaker (breaker.hpp); off unless `breaker.failures` > 0.
  BreakerConfig breaker{};
};

struct ReplyDeleter {
  void operator()(redisReply* r) const {
    if (r != nullptr) freeReplyObject(r);
  }
};
// A reply as hiredis returns it (any type, including REDIS_REPLY_ERROR).
using Reply = std::unique_ptr<redisReply, ReplyDeleter>;

namespace detail {
// Debian's abseil has its own absl::string_view; StrCat needs it, not std::string_view.
inline absl::string_view av(std::string_view s) { return absl::string_view(s.data(), s.size()); }
}  // namespace detail

inline std::string_view reply_string(const redisReply& r) {
  return std::string_view(r.str == nullptr ? "" : r.str, r.len);
}

// OK unless `r` is an error reply; then kUnavailable "redis error: <message>". Callers
// that treat some errors specially (NOSCRIPT) look at the reply before calling this.
inline absl::Status error_status(const redisReply& r) {
  if (r.type != REDIS_REPLY_ERROR) return absl::OkStatus();
  return absl::UnavailableError(absl::StrCat("redis error: ", detail::av(reply_string(r))));
}

// True for an error reply whose message starts with `code` ("NOSCRIPT", "BUSY", ...).
inline bool is_error(const redisReply& r, std::string_view code) {
  if (r.type != REDIS_REPLY_ERROR) return false;
  const std::string_view s = reply_string(r);
  return s.size() >= code.size() && s.substr(0, code.size()) == code &&
         (s.size() == code.size() || s[code.size()] == ' ');
}

class Connection {
 public:
  explicit Connection(ConnectionConfig config) : config_(std::move(config)) {}

  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  // Sends one command and reads its reply, within `deadline` (default: a fresh
  // config().deadline). kUnavailable on any transport failure or when the deadline
  // passes (the connection is then dropped and the next call reconnects).
  absl::StatusOr<Reply> command(const std::vector<std::string_view>& args) {
    return command(args, Deadline::after(config_.deadline));
  }
  absl::StatusOr<Reply> command(const std::vector<std::string_view>& args,
                                const Deadline& deadline) {
    if (auto s = ensure_connected(deadline); !s.ok()) return s;
    if (deadline.expired()) return deadline.error("send", where(), "no time left to send");
    std::vector<const char*> argv;
    std::vector<std::size_t> lens;
    to_argv(args, argv, lens);
    if (redisAppendCommandArgv(ctx_.get(), static_cast<int>(argv.size()), argv.data(),
                               lens.data()) != REDIS_OK) {
      return fail("command", deadline);
    }
    if (auto s = flush(deadline); !s.ok()) return s;
    return read_reply(deadline);
  }
  absl::StatusOr<Reply> command(std::initializer_list<std::string_view> args) {
    return command(std::vector<std::string_view>(args));
  }
  absl::StatusOr<Reply> command(std::initializer_list<std::string_view> args,
                                const Deadline& deadline) {
    return command(std::vector<std::string_view>(args), deadline);
  }

  // Pipelining: writes every command in one go, then reads the replies in order, all
  // within one deadline. All-or-nothing on transport failure (kUnavailable, connection
  // dropped): the caller cannot tell which of the commands ran.
  absl::StatusOr<std::vector<Reply>> pipeline(
      const std::vector<std::vector<std::string_view>>& commands) {
    return pipeline(commands, Deadline::after(config_.deadline));
  }
  absl::StatusOr<std::vector<Reply>> pipeline(
      const std::vector<std::vector<std::string_view>>& commands, const Deadline& deadline) {
    if (auto s = send(commands, deadline); !s.ok()) return s;
    return receive(commands.size(), deadline);
  }

  // Pipelining in two halves, so that one thread can keep several servers busy at once
  // (the cluster batch writes to every node before it reads any reply): `send` writes
  // every command and flushes them; `receive(n)` then reads n replies in order. The same
  // failure rules as `pipeline`; pass both halves the same deadline.
  absl::Status send(const std::vector<std::vector<std::string_view>>& commands) {
    return send(commands, Deadline::after(config_.deadline));
  }
  absl::Status send(const std::vector<std::vector<std::string_view>>& commands,
                    const Deadline& deadline) {
    if (auto s = ensure_connected(deadline); !s.ok()) return s;
    // Nothing is sent once the deadline has passed: its result could not be awaited.
    if (deadline.expired()) return deadline.error("send", where(), "no time left to send");
    std::vector<const char*> argv;
    std::vector<std::size_t> lens;
    for (const auto& args : commands) {
      to_argv(args, argv, lens);
      if (redisAppendCommandArgv(ctx_.get(), static_cast<int>(argv.size()), argv.data(),
                                 lens.data()) != REDIS_OK) {
        return fail("pipeline append", deadline);
      }
    }
    return flush(deadline);
  }
  absl::StatusOr<std::vector<Reply>> receive(std::size_t n) {
    return receive(n, Deadline::after(config_.deadline));
  }
  absl::StatusOr<std::vector<Reply>> receive(std::size_t n, const Deadline& deadline) {
    if (ctx_ == nullptr) return absl::UnavailableError("redis receive: not connected");
    std::vector<Reply> replies;
    replies.reserve(n);
    for (std::size_t i = 0; i < n; ++i) {
      auto r = read_reply(deadline);
      if (!r.ok()) return r.status();
      replies.push_back(*std::move(r));
    }
    return replies;
  }

  // How the exchanges since the last call went: kFailed when any failed on the
  // transport (or its deadline passed while talking to the server), kOk when replies
  // came and none failed, kNone when nothing was exchanged; then back to kNone. The
  // pool feeds it to the node's breaker.
  enum class Outcome { kNone, kOk, kFailed };
  Outcome take_outcome() { return std::exchange(outcome_, Outcome::kNone); }

  // Drops the connection; the next call reconnects. Tests use it to lose a reply.
  void disconnect() { ctx_.reset(); }
  bool connected() const { return ctx_ != nullptr; }
  const ConnectionConfig& config() const { return config_; }

 private:
  struct ContextDeleter {
    void operator()(redisContext* c) const {
      if (c != nullptr) redisFree(c);
    }
  };

  static timeval to_timeval(std::chrono::microseconds d) {
    const auto us = std::max<std::int64_t>(d.count(), 1);
    return timeval{.tv_sec = static_cast<time_t>(us / 1'000'000),
                   .tv_usec = static_cast<suseconds_t>(us % 1'000'000)};
  }

  static void to_argv(const std::vector<std::string_view>& args, std::vector<const char*>& argv,
                      std::vector<std::size_t>& lens) {
    argv.clear();
    lens.clear();
    for (std::string_view a : args) {
      argv.push_back(a.data());
      lens.push_back(a.size());
    }
  }

  std::string where() const { return absl::StrFormat("%s:%d", config_.host, config_.port); }

  // Connects unless connected, within the time left. A deadline that passed before
  // the connect is an error of this call only: the connection state is unchanged.
  absl::Status ensure_connected(const Deadline& deadline) {
    if (ctx_ != nullptr) return absl::OkStatus();
    if (deadline.expired()) return deadline.error("connect", where(), "no time left to connect");
    ctx_.reset(
        redisConnectWithTimeout(config_.host.c_str(), config_.port, to_timeval(deadline.left())));
    if (ctx_ == nullptr) {
      return absl::UnavailableError(absl::StrCat("redis connect to ", where(), ": out of memory"));
    }
    if (ctx_->err != 0) {
      const std::string cause = ctx_->errstr;
      ctx_.reset();
      outcome_ = Outcome::kFailed;
      if (deadline.expired()) return deadline.error("connect", where(), cause);
      return absl::UnavailableError(absl::StrCat("redis connect to ", where(), " failed: ", cause));
    }
    // A backstop only: a read or write that blocks despite ppoll's answer.
    if (redisSetTimeout(ctx_.get(), to_timeval(deadline.budget())) != REDIS_OK) {
      const std::string cause = ctx_->errstr;
      ctx_.reset();
      return absl::UnavailableError(
          absl::StrCat("redis connect to ", where(), ": cannot set timeout: ", cause));
    }
    return absl::OkStatus();
  }

  // Waits until the socket is ready for `events` (POLLIN, POLLOUT), at most the time
  // left; false when the deadline passes first. Past the deadline it still looks once,
  // without waiting: a reply that has already arrived (a batch's other node, read after
  // a node that did not answer) is taken. ppoll has nanosecond resolution; the socket's
  // own timeouts (set at connect to the whole budget) are only a backstop.
  bool ready(const Deadline& deadline, short events) {
    for (;;) {
      const auto left = deadline.left();
      const timespec ts{.tv_sec = static_cast<time_t>(left.count() / 1'000'000),
                        .tv_nsec = static_cast<long>(left.count() % 1'000'000) * 1000};
      pollfd p{.fd = ctx_->fd, .events = events, .revents = 0};
      const int n = ppoll(&p, 1, &ts, nullptr);
      if (n > 0) return true;  // readable, writable, or an error the next call reports
      if (n == 0) return false;
      if (errno != EINTR) return true;
    }
  }

  // Writes what is buffered, each socket wait bounded by the time left.
  absl::Status flush(const Deadline& deadline) {
    int done = 0;
    while (done == 0) {
      if (!ready(deadline, POLLOUT)) return fail("write", deadline);
      if (redisBufferWrite(ctx_.get(), &done) != REDIS_OK) return fail("write", deadline);
    }
    return absl::OkStatus();
  }

  // Reads one reply, each socket wait bounded by the time left.
  absl::StatusOr<Reply> read_reply(const Deadline& deadline) {
    for (;;) {
      void* raw = nullptr;
      if (redisGetReplyFromReader(ctx_.get(), &raw) != REDIS_OK) return fail("read", deadline);
      if (raw != nullptr) {
        if (outcome_ == Outcome::kNone) outcome_ = Outcome::kOk;
        return Reply(static_cast<redisReply*>(raw));
      }
      if (!ready(deadline, POLLIN)) return fail("read", deadline);
      if (redisBufferRead(ctx_.get()) != REDIS_OK) return fail("read", deadline);
    }
  }

  // Maps the context's error (or the passed deadline) to kUnavailable and drops the
  // connection: the exchange on it is broken off half way.
  absl::Status fail(std::string_view what, const Deadline& deadline) {
    std::string cause = ctx_ != nullptr && ctx_->err != 0 ? std::string(ctx_->errstr) : "no reply";
    ctx_.reset();
    outcome_ = Outcome::kFailed;
    // A socket timeout is an I/O error with EAGAIN's text; the socket waited the time left.
    if (deadline.left().count() == 0 ||
        absl::StrContains(cause, "Resource temporarily unavailable")) {
      return deadline.error(what, where(), absl::StrCat("waiting to ", detail::av(what)));
    }
    return absl::UnavailableError(
        absl::StrCat("redis ", detail::av(what), " on ", where(), ": ", cause));
  }

  ConnectionConfig config_;
  std::unique_ptr<redisContext, ContextDeleter> ctx_;
  Outcome outcome_ = Outcome::kNone;
};

class ConnectionPool {
 public:
  // A pool of `size` (>= 1) connections to one server, opened lazily.
  ConnectionPool(ConnectionConfig config, std::size_t size)
      : config_(std::move(config)), breaker_(config_.breaker) {
    size = std::max<std::size_t>(size, 1);
    for (std::size_t i = 0; i < size; ++i) free_.push_back(std::make_unique<Connection>(config_));
    size_ = size;
  }

  // A connection on loan; returned to the pool when the lease is destroyed.
  class Lease {
   public:
    Lease(Lease&& other) noexcept
        : pool_(std::exchange(other.pool_, nullptr)),
          conn_(std::move(other.conn_)),
          probe_(other.probe_) {}
    Lease& operator=(Lease&&) = delete;
    ~Lease() {
      if (pool_ != nullptr) pool_->release(std::move(conn_), probe_);
    }
    Connection* operator->() const { return conn_.get(); }
    Connection& operator*() const { return *conn_; }

   private:
    friend class ConnectionPool;
    Lease(ConnectionPool* pool, std::unique_ptr<Connection> conn, bool probe)
        : pool_(pool), conn_(std::move(conn)), probe_(probe) {}
    ConnectionPool* pool_;
    std::unique_ptr<Connection> conn_;
    bool probe_;  // the breaker's probe after a cool-down
  };

  // Waits for a free connection at most until `deadline` (default: a fresh
  // config().deadline); kUnavailable naming the deadline after that. While the node's
  // breaker is open: kUnavailable naming the breaker, at once.
  absl::StatusOr<Lease> acquire() { return acquire(Deadline::after(config_.deadline)); }
  absl::StatusOr<Lease> acquire(const Deadline& deadline) {
    const Breaker::Admit admit = breaker_.admit();
    if (admit == Breaker::Admit::kReject) {
      return absl::UnavailableError(absl::StrFormat(
          "redis %s:%d: circuit breaker open after %d consecutive failures; failing at once "
          "for another %d us of its cool-down, then one probe",
          config_.host, config_.port, config_.breaker.failures, breaker_.open_left().count()));
    }
    const bool probe = admit == Breaker::Admit::kProbe;
    std::unique_lock<std::mutex> lock(mu_);
    if (!cv_.wait_until(lock, deadline.at(), [this] { return !free_.empty(); })) {
      lock.unlock();
      breaker_.abandon(probe);
      return deadline.error("pool", absl::StrFormat("%s:%d", config_.host, config_.port),
                            absl::StrFormat("all %d connections busy", size_));
    }
    std::unique_ptr<Connection> conn = std::move(free_.back());
    free_.pop_back();
    return Lease(this, std::move(conn), probe);
  }

  // The node's breaker counters (all zero without a breaker).
  BreakerStats breaker_stats() const { return breaker_.stats(); }

  std::size_t size() const { return size_; }
  const ConnectionConfig& config() const { return config_; }

 private:
  void release(std::unique_ptr<Connection> conn, bool probe) {
    switch (conn->take_outcome()) {
      case Connection::Outcome::kOk:
        breaker_.success(probe);
        break;
      case Connection::Outcome::kFailed:
        breaker_.failure(probe);
        break;
      case Connection::Outcome::kNone:
        breaker_.abandon(probe);
        break;
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      free_.push_back(std::move(conn));
    }
    cv_.notify_one();
  }

  const ConnectionConfig config_;
  Breaker breaker_;
  std::size_t size_ = 0;
  // std::mutex rather than absl::Mutex: Debian's abseil is not built with TSan, which
  // then cannot see absl::Mutex's synchronization.
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::unique_ptr<Connection>> free_;  // guarded by mu_
};

}  // namespace quota::redis
