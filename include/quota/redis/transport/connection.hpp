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
// After each connect, one pipelined handshake authenticates (AUTH), confirms the primary
// (ROLE, with an AddressResolver) and reads maxmemory-policy (handshake.hpp); its
// failures are kUnauthenticated, kFailedPrecondition (an evicting policy) or kUnavailable.
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
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <initializer_list>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "quota/redis/transport/handshake.hpp"

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

  // -- The connect handshake (one pipelined round trip after every connect). --
  // AUTH: with a non-empty `password`, every connection authenticates before its first
  // command: `AUTH username password` for an ACL user (Redis 6+), `AUTH password` for the
  // default user (requirepass) when `username` is empty. A rejected AUTH, or a server that
  // answers NOAUTH, is kUnauthenticated naming authentication (connection dropped).
  std::string username = {};
  std::string password = {};
  // What to do when the server's maxmemory-policy evicts keys (anything but
  // `noeviction`): see EvictionPolicyCheck.
  EvictionPolicyCheck eviction_check = EvictionPolicyCheck::kRefuse;
  // When set, the address is asked of it on every connect instead of host/port, the
  // server must say ROLE master, and a failed connection, a timeout or a READONLY reply
  // tells it that the address is stale (sentinel.hpp). host/port then only name the
  // configuration in messages until the first connect.
  std::shared_ptr<AddressResolver> resolver = nullptr;
  // Counters and once-only warnings of the handshake, shared by the connections of one
  // ConnectionPool (the pool creates it when null).
  std::shared_ptr<HandshakeStats> handshake_stats = nullptr;
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

// True for an error reply whose message starts with `code` ("NOSCRIPT", "BUSY", ...).
inline bool is_error(const redisReply& r, std::string_view code) {
  if (r.type != REDIS_REPLY_ERROR) return false;
  const std::string_view s = reply_string(r);
  return s.size() >= code.size() && s.substr(0, code.size()) == code &&
         (s.size() == code.size() || s[code.size()] == ' ');
}

// OK unless `r` is an error reply; then "redis error: <message>" with the code its kind
// calls for: NOAUTH and WRONGPASS kUnauthenticated (naming authentication), NOPERM (an
// ACL user without the right) kPermissionDenied, any other kUnavailable. Callers that
// treat some errors specially (NOSCRIPT) look at the reply before calling this.
inline absl::Status error_status(const redisReply& r) {
  if (r.type != REDIS_REPLY_ERROR) return absl::OkStatus();
  const std::string_view msg = reply_string(r);
  if (is_error(r, "NOAUTH") || is_error(r, "WRONGPASS")) {
    return absl::UnauthenticatedError(
        absl::StrCat("redis error: authentication: ", detail::av(msg)));
  }
  if (is_error(r, "NOPERM")) {
    return absl::PermissionDeniedError(absl::StrCat("redis error: ", detail::av(msg)));
  }
  return absl::UnavailableError(absl::StrCat("redis error: ", detail::av(msg)));
}

class Connection {
 public:
  explicit Connection(ConnectionConfig config) : config_(std::move(config)) {
    if (config_.handshake_stats == nullptr) {
      config_.handshake_stats = std::make_shared<HandshakeStats>();
    }
  }

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
    Reply reply(static_cast<redisReply*>(raw));
    if (readonly(*reply)) drop_stale();
    return reply;
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
    bool stale = false;
    for (std::size_t i = 0; i < n; ++i) {
      void* raw = nullptr;
      if (redisGetReply(ctx_.get(), &raw) != REDIS_OK || raw == nullptr) {
        return fail("pipeline read");
      }
      replies.emplace_back(static_cast<redisReply*>(raw));
      stale = stale || readonly(*replies.back());
    }
    if (stale) drop_stale();
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

  std::string where() const { return absl::StrFormat("%s:%d", at_.host, at_.port); }

  absl::Status ensure_connected() {
    if (ctx_ != nullptr) return absl::OkStatus();
    at_ = Endpoint{config_.host, config_.port};
    if (config_.resolver != nullptr) {
      auto at = config_.resolver->resolve();
      if (!at.ok()) return at.status();
      at_ = *std::move(at);
    }
    ctx_.reset(
        redisConnectWithTimeout(at_.host.c_str(), at_.port, to_timeval(config_.connect_timeout)));
    if (ctx_ == nullptr) {
      return absl::UnavailableError(absl::StrCat("redis connect to ", where(), ": out of memory"));
    }
    if (ctx_->err != 0) {
      absl::Status s = absl::UnavailableError(
          absl::StrCat("redis connect to ", where(), " failed: ", ctx_->errstr));
      ctx_.reset();
      if (config_.resolver != nullptr) config_.resolver->stale(at_);
      return s;
    }
    if (redisSetTimeout(ctx_.get(), to_timeval(config_.command_timeout)) != REDIS_OK) {
      absl::Status s = absl::UnavailableError(
          absl::StrCat("redis connect to ", where(), ": cannot set timeout: ", ctx_->errstr));
      ctx_.reset();
      return s;
    }
    return handshake();
  }

  // The connect handshake, in one pipelined round trip: AUTH (with a password), ROLE
  // (with a resolver: the server must be the primary), CONFIG GET maxmemory-policy
  // (unless EvictionPolicyCheck::kSkip). Any failure drops the connection.
  absl::Status handshake() {
    HandshakeStats& stats = *config_.handshake_stats;
    stats.connects.fetch_add(1, std::memory_order_relaxed);
    std::vector<std::vector<std::string_view>> cmds;
    const bool auth = !config_.password.empty();
    if (auth && config_.username.empty()) cmds.push_back({"AUTH", config_.password});
    if (auth && !config_.username.empty()) {
      cmds.push_back({"AUTH", config_.username, config_.password});
    }
    const bool role = config_.resolver != nullptr;
    if (role) cmds.push_back({"ROLE"});
    const bool policy = config_.eviction_check != EvictionPolicyCheck::kSkip;
    if (policy) cmds.push_back({"CONFIG", "GET", "maxmemory-policy"});
    if (cmds.empty()) return absl::OkStatus();
    if (auto s = send(cmds); !s.ok()) return s;
    auto replies = receive(cmds.size());
    if (!replies.ok()) return replies.status();
    auto refuse = [this](absl::Status s) {
      ctx_.reset();
      return s;
    };
    std::size_t k = 0;
    if (auth) {
      const redisReply& r = *(*replies)[k++];
      if (r.type == REDIS_REPLY_ERROR) {
        return refuse(absl::UnauthenticatedError(
            absl::StrCat("redis AUTH on ", where(), " failed: authentication rejected for ",
                         config_.username.empty() ? std::string("the default user")
                                                  : absl::StrCat("user '", config_.username, "'"),
                         ": ", detail::av(reply_string(r)))));
      }
    }
    for (std::size_t i = k; i < replies->size(); ++i) {
      if (is_error(*(*replies)[i], "NOAUTH")) {
        return refuse(absl::UnauthenticatedError(
            absl::StrCat("redis on ", where(),
                         " requires authentication (NOAUTH): set ConnectionConfig::password (and "
                         "username for an ACL user)")));
      }
    }
    if (role) {
      const redisReply& r = *(*replies)[k++];
      if (r.type == REDIS_REPLY_ERROR) {
        return refuse(absl::Status(
            error_status(r).code(),
            absl::StrCat("redis ROLE on ", where(), ": ", detail::av(reply_string(r)))));
      }
      const std::string_view is =
          r.type == REDIS_REPLY_ARRAY && r.elements > 0 && r.element[0]->type == REDIS_REPLY_STRING
              ? reply_string(*r.element[0])
              : std::string_view("unknown");
      if (is != "master") {
        drop_stale();
        return absl::UnavailableError(absl::StrCat("redis at ", where(),
                                                   " is not the primary (ROLE says ",
                                                   detail::av(is), "): its address is stale"));
      }
    }
    if (policy) return check_policy(*(*replies)[k++]);
    return absl::OkStatus();
  }

  // The reply to CONFIG GET maxmemory-policy, against config_.eviction_check.
  absl::Status check_policy(const redisReply& r) {
    const bool read =
        r.type == REDIS_REPLY_ARRAY && r.elements == 2 && r.element[1]->type == REDIS_REPLY_STRING;
    absl::Status s = detail::eviction_policy_status(
        read ? std::optional<std::string_view>(reply_string(*r.element[1])) : std::nullopt,
        r.type == REDIS_REPLY_ERROR ? reply_string(r) : std::string_view("no value"),
        config_.eviction_check, *config_.handshake_stats, where());
    if (!s.ok()) ctx_.reset();
    return s;
  }

  // With a resolver: a READONLY reply says the server was demoted to a replica.
  bool readonly(const redisReply& r) const {
    return config_.resolver != nullptr && is_error(r, "READONLY");
  }
  // Drops the connection and tells the resolver that its address is stale.
  void drop_stale() {
    ctx_.reset();
    if (config_.resolver != nullptr) config_.resolver->stale(at_);
  }

  // Maps the context's error to kUnavailable and drops the connection.
  absl::Status fail(std::string_view what) {
    std::string cause = ctx_ != nullptr && ctx_->err != 0 ? std::string(ctx_->errstr) : "no reply";
    // hiredis reports a socket timeout as an I/O error with EAGAIN's text.
    if (absl::StrContains(cause, "Resource temporarily unavailable")) {
      cause = absl::StrFormat("timed out after %d us (%s)", config_.command_timeout.count(), cause);
    }
    drop_stale();
    return absl::UnavailableError(
        absl::StrCat("redis ", detail::av(what), " on ", where(), ": ", cause));
  }

  ConnectionConfig config_;
  Endpoint at_{config_.host, config_.port};  // where ctx_ is (or was last) connected
  std::unique_ptr<redisContext, ContextDeleter> ctx_;
};

class ConnectionPool {
 public:
  // A pool of `size` (>= 1) connections to one server, opened lazily.
  ConnectionPool(ConnectionConfig config, std::size_t size)
      : config_(with_handshake_stats(std::move(config))) {
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
  // What the connect handshakes of this pool's connections saw (never null).
  const HandshakeStats& handshake_stats() const { return *config_.handshake_stats; }

 private:
  // Shares one HandshakeStats among the pool's connections.
  static ConnectionConfig with_handshake_stats(ConnectionConfig c) {
    if (c.handshake_stats == nullptr) c.handshake_stats = std::make_shared<HandshakeStats>();
    return c;
  }

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
