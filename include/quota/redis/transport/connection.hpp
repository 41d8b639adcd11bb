// quota/redis/transport/connection.hpp — one hiredis connection with deadlines, and a pool of them.
//
// `Connection` wraps a blocking hiredis context (hiredis 0.14, Debian's libhiredis-dev).
// It connects lazily, bounds the connect with `connect_timeout` and every socket wait of
// a command with `command_timeout`, and after ANY failure (connection refused or lost,
// timeout, a protocol error) it drops the context, so the next call reconnects. A timed
// out command may still run on the server; the caller only learns that it does not
// know. Every failure is `absl::StatusCode::kUnavailable` with the cause in the message
// — the store turns it into "no decision", never into an allow or a deny.
//
// Error replies (`-BUSY ...`, `-LOADING ...`, `-NOSCRIPT ...`) are replies, not
// transport failures: `command` returns them and `error_status(reply)` maps them.
//
// `ConnectionPool` hands connections to many threads: `acquire()` waits at most
// `pool_wait` for a free one (kUnavailable after that) and returns a lease that puts the
// connection back when destroyed.
//
// Thread safety: a Connection is for one thread at a time; ConnectionPool is thread-safe.
//
//   auto pool = std::make_shared<quota::redis::ConnectionPool>(
//       quota::redis::ConnectionConfig{.host = "127.0.0.1", .port = 6379}, 8);
//   auto lease = pool->acquire();
//   absl::StatusOr<quota::redis::Reply> pong = (*lease)->command({"PING"});
#pragma once

#include <hiredis/hiredis.h>
#include <sys/time.h>

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

namespace quota::redis {

struct ConnectionConfig {
  std::string host = "127.0.0.1";
  int port = 6379;
  // Bounds the TCP connect (a refused connection fails at once).
  std::chrono::microseconds connect_timeout{std::chrono::milliseconds(5)};
  // Bounds each socket wait of a command (send, and read of each reply).
  std::chrono::microseconds command_timeout{std::chrono::milliseconds(5)};
  // ConnectionPool::acquire waits at most this long for a free connection.
  std::chrono::microseconds pool_wait{std::chrono::milliseconds(5)};
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

  // Sends one command and reads its reply. kUnavailable on any transport failure (the
  // connection is then dropped and the next call reconnects).
  absl::StatusOr<Reply> command(const std::vector<std::string_view>& args) {
    if (auto s = ensure_connected(); !s.ok()) return s;
    std::vector<const char*> argv;
    std::vector<std::size_t> lens;
    to_argv(args, argv, lens);
    void* raw =
        redisCommandArgv(ctx_.get(), static_cast<int>(argv.size()), argv.data(), lens.data());
    if (raw == nullptr) return fail("command");
    return Reply(static_cast<redisReply*>(raw));
  }
  absl::StatusOr<Reply> command(std::initializer_list<std::string_view> args) {
    return command(std::vector<std::string_view>(args));
  }

  // Pipelining: writes every command in one go, then reads the replies in order.
  // All-or-nothing on transport failure (kUnavailable, connection dropped): the caller
  // cannot tell which of the commands ran.
  absl::StatusOr<std::vector<Reply>> pipeline(
      const std::vector<std::vector<std::string_view>>& commands) {
    if (auto s = send(commands); !s.ok()) return s;
    return receive(commands.size());
  }

  // Pipelining in two halves, so that one thread can keep several servers busy at once
  // (the cluster batch writes to every node before it reads any reply): `send` writes
  // every command and flushes them; `receive(n)` then reads n replies in order. The same
  // failure rules as `pipeline`.
  absl::Status send(const std::vector<std::vector<std::string_view>>& commands) {
    if (auto s = ensure_connected(); !s.ok()) return s;
    std::vector<const char*> argv;
    std::vector<std::size_t> lens;
    for (const auto& args : commands) {
      to_argv(args, argv, lens);
      if (redisAppendCommandArgv(ctx_.get(), static_cast<int>(argv.size()), argv.data(),
                                 lens.data()) != REDIS_OK) {
        return fail("pipeline append");
      }
    }
    int done = 0;
    while (done == 0) {
      if (redisBufferWrite(ctx_.get(), &done) != REDIS_OK) return fail("pipeline write");
    }
    return absl::OkStatus();
  }
  absl::StatusOr<std::vector<Reply>> receive(std::size_t n) {
    if (ctx_ == nullptr) return absl::UnavailableError("redis receive: not connected");
    std::vector<Reply> replies;
    replies.reserve(n);
    for (std::size_t i = 0; i < n; ++i) {
      void* raw = nullptr;
      if (redisGetReply(ctx_.get(), &raw) != REDIS_OK || raw == nullptr) {
        return fail("pipeline read");
      }
      replies.emplace_back(static_cast<redisReply*>(raw));
    }
    return replies;
  }

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

  absl::Status ensure_connected() {
    if (ctx_ != nullptr) return absl::OkStatus();
    ctx_.reset(redisConnectWithTimeout(config_.host.c_str(), config_.port,
                                       to_timeval(config_.connect_timeout)));
    if (ctx_ == nullptr) {
      return absl::UnavailableError(absl::StrCat("redis connect to ", where(), ": out of memory"));
    }
    if (ctx_->err != 0) {
      absl::Status s = absl::UnavailableError(
          absl::StrCat("redis connect to ", where(), " failed: ", ctx_->errstr));
      ctx_.reset();
      return s;
    }
    if (redisSetTimeout(ctx_.get(), to_timeval(config_.command_timeout)) != REDIS_OK) {
      absl::Status s = absl::UnavailableError(
          absl::StrCat("redis connect to ", where(), ": cannot set timeout: ", ctx_->errstr));
      ctx_.reset();
      return s;
    }
    return absl::OkStatus();
  }

  // Maps the context's error to kUnavailable and drops the connection.
  absl::Status fail(std::string_view what) {
    std::string cause = ctx_ != nullptr && ctx_->err != 0 ? std::string(ctx_->errstr) : "no reply";
    // hiredis reports a socket timeout as an I/O error with EAGAIN's text.
    if (absl::StrContains(cause, "Resource temporarily unavailable")) {
      cause = absl::StrFormat("timed out after %d us (%s)", config_.command_timeout.count(), cause);
    }
    ctx_.reset();
    return absl::UnavailableError(
        absl::StrCat("redis ", detail::av(what), " on ", where(), ": ", cause));
  }

  ConnectionConfig config_;
  std::unique_ptr<redisContext, ContextDeleter> ctx_;
};

class ConnectionPool {
 public:
  // A pool of `size` (>= 1) connections to one server, opened lazily.
  ConnectionPool(ConnectionConfig config, std::size_t size) : config_(std::move(config)) {
    size = std::max<std::size_t>(size, 1);
    for (std::size_t i = 0; i < size; ++i) free_.push_back(std::make_unique<Connection>(config_));
    size_ = size;
  }

  // A connection on loan; returned to the pool when the lease is destroyed.
  class Lease {
   public:
    Lease(Lease&& other) noexcept
        : pool_(std::exchange(other.pool_, nullptr)), conn_(std::move(other.conn_)) {}
    Lease& operator=(Lease&&) = delete;
    ~Lease() {
      if (pool_ != nullptr) pool_->release(std::move(conn_));
    }
    Connection* operator->() const { return conn_.get(); }
    Connection& operator*() const { return *conn_; }

   private:
    friend class ConnectionPool;
    Lease(ConnectionPool* pool, std::unique_ptr<Connection> conn)
        : pool_(pool), conn_(std::move(conn)) {}
    ConnectionPool* pool_;
    std::unique_ptr<Connection> conn_;
  };

  // Waits up to config.pool_wait for a free connection; kUnavailable after that.
  absl::StatusOr<Lease> acquire() {
    std::unique_lock<std::mutex> lock(mu_);
    if (!cv_.wait_for(lock, config_.pool_wait, [this] { return !free_.empty(); })) {
      return absl::UnavailableError(absl::StrFormat("redis pool: all %d connections busy for %d us",
                                                    size_, config_.pool_wait.count()));
    }
    std::unique_ptr<Connection> conn = std::move(free_.back());
    free_.pop_back();
    return Lease(this, std::move(conn));
  }

  std::size_t size() const { return size_; }
  const ConnectionConfig& config() const { return config_; }

 private:
  void release(std::unique_ptr<Connection> conn) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      free_.push_back(std::move(conn));
    }
    cv_.notify_one();
  }

  const ConnectionConfig config_;
  std::size_t size_ = 0;
  // std::mutex rather than absl::Mutex: Debian's abseil is not built with TSan, which
  // then cannot see absl::Mutex's synchronization.
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::unique_ptr<Connection>> free_;  // guarded by mu_
};

}  // namespace quota::redis
