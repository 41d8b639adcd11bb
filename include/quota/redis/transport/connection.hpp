// quota/redis/transport/connection.hpp — one hiredis connection bounded by a deadline.
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
// After each connect, one pipelined handshake authenticates (AUTH), confirms the primary
// (ROLE, with an AddressResolver) and reads maxmemory-policy (handshake.hpp); its
// failures are kUnauthenticated, kFailedPrecondition (an evicting policy) or kUnavailable.
// On a live connection the policy is read again before a call once every
// ConnectionConfig::eviction_recheck per pool (handshake.hpp): an evicting one is the
// same kFailedPrecondition.
//
// Error replies (`-BUSY ...`, `-LOADING ...`, `-NOSCRIPT ...`) are replies, not
// transport failures: `command` returns them and `error_status(reply)` (reply.hpp) maps
// them. A pool of connections to one node: connection_pool.hpp.
//
// Thread safety: a Connection is for one thread at a time.
//
//   quota::redis::Connection c({.host = "127.0.0.1", .port = 6379});
//   const auto deadline = quota::redis::Deadline::after(std::chrono::milliseconds(3));
//   absl::StatusOr<quota::redis::Reply> pong = c.command({"PING"}, deadline);
#pragma once

#include <hiredis/hiredis.h>
#include <poll.h>
#include <sys/time.h>

#include <cerrno>
#include <ctime>

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
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "quota/redis/transport/breaker.hpp"
#include "quota/redis/transport/connection_config.hpp"
#include "quota/redis/transport/deadline.hpp"
#include "quota/redis/transport/handshake.hpp"
#include "quota/redis/transport/node_watch.hpp"
#include "quota/redis/transport/reply.hpp"

namespace quota::redis {

class Connection {
 public:
  explicit Connection(ConnectionConfig config) : config_(std::move(config)) {
    if (config_.handshake_stats == nullptr) {
      config_.handshake_stats = std::make_shared<HandshakeStats>();
    }
    if (config_.policy_recheck == nullptr) {
      config_.policy_recheck = std::make_shared<PolicyRecheck>();
    }
  }

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
    auto reply = read_reply(deadline);
    if (reply.ok() && readonly(**reply)) drop_stale();
    return reply;
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
    return write(commands, deadline);
  }
  absl::StatusOr<std::vector<Reply>> receive(std::size_t n) {
    return receive(n, Deadline::after(config_.deadline));
  }
  absl::StatusOr<std::vector<Reply>> receive(std::size_t n, const Deadline& deadline) {
    if (ctx_ == nullptr) return absl::UnavailableError("redis receive: not connected");
    std::vector<Reply> replies;
    replies.reserve(n);
    bool stale = false;
    for (std::size_t i = 0; i < n; ++i) {
      auto r = read_reply(deadline);
      if (!r.ok()) return r.status();
      replies.push_back(*std::move(r));
      stale = stale || readonly(*replies.back());
    }
    if (stale) drop_stale();
    return replies;
  }

  // A subscribed connection (subscriber.hpp): the next reply the server pushes, or nullopt
  // when none is complete by `deadline` — the connection is kept (a quiet channel is not
  // a failure). kUnavailable when the connection is lost (it is dropped).
  absl::StatusOr<std::optional<Reply>> next_pushed(const Deadline& deadline) {
    if (ctx_ == nullptr) return absl::UnavailableError("redis read: not connected");
    for (;;) {
      void* raw = nullptr;
      if (redisGetReplyFromReader(ctx_.get(), &raw) != REDIS_OK) return fail("read", deadline);
      if (raw != nullptr) return std::optional<Reply>(Reply(static_cast<redisReply*>(raw)));
      if (!ready(deadline, POLLIN)) return std::optional<Reply>();
      if (redisBufferRead(ctx_.get()) != REDIS_OK) return fail("read", deadline);
    }
  }

  // How the exchanges since the last call went: kFailed when any failed on the
  // transport (or its deadline passed while talking to the server), kOk when replies
  // came and none failed, kNone when nothing was exchanged; then back to kNone. The
  // pool feeds it to the node's breaker.
  enum class Outcome { kNone, kOk, kFailed };
  Outcome take_outcome() { return std::exchange(outcome_, Outcome::kNone); }

  // What every call does first, within `deadline`: connects unless connected (with the
  // handshake, which feeds the node's NodeWatch), or reads maxmemory-policy again when due
  // (handshake.hpp). Script calls it before it builds a call's node argument, so that a
  // failover found by this connect is in the argument of the call that found it.
  absl::Status connect(const Deadline& deadline) { return ensure_connected(deadline); }

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

  // Connects unless connected, within the time left. A deadline that passed before
  // the connect is an error of this call only: the connection state is unchanged.
  absl::Status ensure_connected(const Deadline& deadline) {
    if (ctx_ != nullptr) {
      if (config_.eviction_check != EvictionPolicyCheck::kRefuse) return absl::OkStatus();
      if (config_.policy_recheck->epoch.load(std::memory_order_acquire) == epoch_) {
        return recheck_policy(deadline);
      }
      ctx_.reset();  // another connection found an evicting policy: the handshake reads it
    }
    if (deadline.expired()) return deadline.error("connect", where(), "no time left to connect");
    at_ = Endpoint{config_.host, config_.port};
    if (config_.resolver != nullptr) {
      auto at = config_.resolver->resolve();
      if (!at.ok()) return at.status();
      at_ = *std::move(at);
    }
    ctx_.reset(redisConnectWithTimeout(at_.host.c_str(), at_.port, to_timeval(deadline.left())));
    if (ctx_ == nullptr) {
      return absl::UnavailableError(absl::StrCat("redis connect to ", where(), ": out of memory"));
    }
    if (ctx_->err != 0) {
      const std::string cause = ctx_->errstr;
      ctx_.reset();
      if (config_.resolver != nullptr) config_.resolver->stale(at_);
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
    return handshake(deadline);
  }

  // The connect handshake, in one pipelined round trip: AUTH (with a password), ROLE
  // (with a resolver: the server must be the primary), CONFIG GET maxmemory-policy
  // (unless EvictionPolicyCheck::kSkip), INFO and TIME (with a NodeWatch: the node's
  // identity, unless the server refuses them, node_watch.hpp). Any failure, the deadline
  // passing before or during it included, drops the connection: a connection is never
  // used without its handshake (an unread role or identity would hide a failover).
  absl::Status handshake(const Deadline& deadline) {
    absl::Status s = handshake_round(deadline);
    if (!s.ok()) ctx_.reset();
    return s;
  }
  // The round trip itself; an error return leaves the dropping to handshake().
  absl::Status handshake_round(const Deadline& deadline) {
    if (deadline.expired()) return deadline.error("handshake", where(), "connected too late");
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
    if (policy) {
      cmds.push_back({"CONFIG", "GET", "maxmemory-policy"});
      epoch_ = config_.policy_recheck->epoch.load(std::memory_order_acquire);
      config_.policy_recheck->read_at.store(steady_ns(), std::memory_order_relaxed);
    }
    const bool watch = config_.node_watch != nullptr;
    if (watch) {
      cmds.push_back({"INFO", "server", "replication"});
      cmds.push_back({"TIME"});
    }
    if (cmds.empty()) return absl::OkStatus();
    if (auto s = write(cmds, deadline); !s.ok()) return s;
    auto replies = receive(cmds.size(), deadline);
    if (!replies.ok()) return replies.status();
    std::size_t k = 0;
    if (auth) {
      const redisReply& r = *(*replies)[k++];
      if (r.type == REDIS_REPLY_ERROR) {
        return absl::UnauthenticatedError(
            absl::StrCat("redis AUTH on ", where(), " failed: authentication rejected for ",
                         config_.username.empty() ? std::string("the default user")
                                                  : absl::StrCat("user '", config_.username, "'"),
                         ": ", detail::av(reply_string(r))));
      }
    }
    for (std::size_t i = k; i < replies->size(); ++i) {
      if (is_error(*(*replies)[i], "NOAUTH")) {
        return absl::UnauthenticatedError(
            absl::StrCat("redis on ", where(),
                         " requires authentication (NOAUTH): set ConnectionConfig::password (and "
                         "username for an ACL user)"));
      }
    }
    if (role) {
      const redisReply& r = *(*replies)[k++];
      if (r.type == REDIS_REPLY_ERROR) {
        return absl::Status(error_status(r).code(), absl::StrCat("redis ROLE on ", where(), ": ",
                                                                 detail::av(reply_string(r))));
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
    if (policy) {
      if (auto s = check_policy(*(*replies)[k++]); !s.ok()) return s;
    }
    if (watch) detail::watch_node(*config_.node_watch, *(*replies)[k], *(*replies)[k + 1]);
    return absl::OkStatus();
  }

  // The reply to CONFIG GET maxmemory-policy, against config_.eviction_check. An evicting
  // policy refused drops this connection and raises the pool's epoch (every other
  // connection connects again); a policy that cannot be read is not read again on this
  // connection.
  absl::Status check_policy(const redisReply& r) {
    const bool read =
        r.type == REDIS_REPLY_ARRAY && r.elements == 2 && r.element[1]->type == REDIS_REPLY_STRING;
    policy_readable_ = read;
    absl::Status s = detail::eviction_policy_status(
        read ? std::optional<std::string_view>(reply_string(*r.element[1])) : std::nullopt,
        r.type == REDIS_REPLY_ERROR ? reply_string(r) : std::string_view("no value"),
        config_.eviction_check, *config_.handshake_stats, where());
    if (!s.ok()) {
      ctx_.reset();
      config_.policy_recheck->epoch.fetch_add(1, std::memory_order_acq_rel);
    }
    return s;
  }

  // On a live connection, with kRefuse: reads maxmemory-policy again, in a round trip of
  // its own within `deadline`, when ConnectionConfig::eviction_recheck has passed since
  // the pool's last read and no other connection of the pool has claimed this read
  // (handshake.hpp). OK when not due, or when the policy does not evict.
  absl::Status recheck_policy(const Deadline& deadline) {
    const std::int64_t every =
        std::chrono::duration_cast<std::chrono::nanoseconds>(config_.eviction_recheck).count();
    if (every <= 0 || !policy_readable_) return absl::OkStatus();
    PolicyRecheck& recheck = *config_.policy_recheck;
    const std::int64_t now = steady_ns();
    std::int64_t last = recheck.read_at.load(std::memory_order_relaxed);
    if (now - last < every) return absl::OkStatus();
    if (!recheck.read_at.compare_exchange_strong(last, now, std::memory_order_relaxed)) {
      return absl::OkStatus();  // another connection reads it now
    }
    config_.handshake_stats->rechecks.fetch_add(1, std::memory_order_relaxed);
    if (deadline.expired()) return deadline.error("send", where(), "no time left to send");
    static constexpr std::string_view kGet[] = {"CONFIG", "GET", "maxmemory-policy"};
    const char* argv[] = {kGet[0].data(), kGet[1].data(), kGet[2].data()};
    const std::size_t lens[] = {kGet[0].size(), kGet[1].size(), kGet[2].size()};
    if (redisAppendCommandArgv(ctx_.get(), 3, argv, lens) != REDIS_OK) {
      return fail("command", deadline);
    }
    if (auto s = flush(deadline); !s.ok()) return s;
    auto reply = read_reply(deadline);
    if (!reply.ok()) return reply.status();
    absl::Status s = check_policy(**reply);
    if (!s.ok()) config_.handshake_stats->recheck_refusals.fetch_add(1, std::memory_order_relaxed);
    return s;
  }

  static std::int64_t steady_ns() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
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

  // Appends `commands` to the connected context and writes them out.
  absl::Status write(const std::vector<std::vector<std::string_view>>& commands,
                     const Deadline& deadline) {
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
    drop_stale();
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
  Endpoint at_{config_.host, config_.port};  // where ctx_ is (or was last) connected
  std::unique_ptr<redisContext, ContextDeleter> ctx_;
  Outcome outcome_ = Outcome::kNone;
  std::uint64_t epoch_ = 0;       // the pool's PolicyRecheck::epoch at this connect
  bool policy_readable_ = false;  // maxmemory-policy was read at this connect
};

}  // namespace quota::redis
