// quota/redis/transport/connection_pool.hpp — the connections to one node, shared by threads.
//
// `ConnectionPool` hands connections (connection.hpp) to many threads: `acquire(deadline)`
// waits for a free one at most until the deadline (kUnavailable after that) and returns a
// lease that puts the connection back when destroyed. The pool is one node's, and holds
// the node's circuit breaker (ConnectionConfig::breaker, breaker.hpp): while it is open,
// acquire() fails at once naming it; each lease reports to it whether its exchanges
// succeeded. The connect handshakes of its connections share one HandshakeStats.
//
// Thread safety: ConnectionPool is thread-safe; a lease's connection is its holder's alone.
//
//   auto pool = std::make_shared<quota::redis::ConnectionPool>(
//       quota::redis::ConnectionConfig{.host = "127.0.0.1", .port = 6379}, 8);
//   const auto deadline = quota::redis::Deadline::after(std::chrono::milliseconds(3));
//   auto lease = pool->acquire(deadline);
//   absl::StatusOr<quota::redis::Reply> pong = (*lease)->command({"PING"}, deadline);
#pragma once

#include <algorithm>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_format.h"
#include "quota/redis/transport/breaker.hpp"
#include "quota/redis/transport/connection.hpp"
#include "quota/redis/transport/deadline.hpp"

namespace quota::redis {

class ConnectionPool {
 public:
  // A pool of `size` (>= 1) connections to one server, opened lazily.
  ConnectionPool(ConnectionConfig config, std::size_t size)
      : config_(with_handshake_stats(std::move(config))), breaker_(config_.breaker) {
    size = std::max<std::size_t>(size, 1);
    for (std::size_t i = 0; i < size; ++i) {
      free_.push_back({std::make_unique<Connection>(config_), 0});
    }
    size_ = size;
  }

  // A connection on loan; returned to the pool when the lease is destroyed.
  class Lease {
   public:
    Lease(Lease&& other) noexcept
        : pool_(std::exchange(other.pool_, nullptr)),
          conn_(std::move(other.conn_)),
          probe_(other.probe_),
          generation_(other.generation_) {}
    Lease& operator=(Lease&&) = delete;
    ~Lease() {
      if (pool_ != nullptr) pool_->release(std::move(conn_), probe_, generation_);
    }
    Connection* operator->() const { return conn_.get(); }
    Connection& operator*() const { return *conn_; }

   private:
    friend class ConnectionPool;
    Lease(ConnectionPool* pool, std::unique_ptr<Connection> conn, bool probe,
          std::uint64_t generation)
        : pool_(pool), conn_(std::move(conn)), probe_(probe), generation_(generation) {}
    ConnectionPool* pool_;
    std::unique_ptr<Connection> conn_;
    bool probe_;                // the breaker's probe after a cool-down
    std::uint64_t generation_;  // the pool's generation the connection was opened in
  };

  // Waits for a free connection at most until `deadline` (default: a fresh
  // config().deadline); kUnavailable naming the deadline after that. While the node's
  // breaker is open: kUnavailable naming the breaker (ErrorKind::kBreakerOpen), at once.
  absl::StatusOr<Lease> acquire() { return acquire(Deadline::after(config_.deadline)); }
  absl::StatusOr<Lease> acquire(const Deadline& deadline) {
    const Breaker::Admit admit = breaker_.admit();
    if (admit == Breaker::Admit::kReject) {
      return with_kind(
          absl::UnavailableError(absl::StrFormat(
              "redis %s:%d: circuit breaker open after %d consecutive failures; failing at once "
              "for another %d us of its cool-down, then one probe",
              config_.host, config_.port, config_.breaker.failures, breaker_.open_left().count())),
          ErrorKind::kBreakerOpen);
    }
    const bool probe = admit == Breaker::Admit::kProbe;
    std::unique_lock<std::mutex> lock(mu_);
    if (!cv_.wait_until(lock, deadline.at(), [this] { return !free_.empty(); })) {
      lock.unlock();
      breaker_.abandon(probe);
      return deadline.error("pool", absl::StrFormat("%s:%d", config_.host, config_.port),
                            absl::StrFormat("all %d connections busy", size_));
    }
    auto [conn, generation] = std::move(free_.back());
    free_.pop_back();
    if (generation != generation_) {
      conn->disconnect();  // opened before renew(): connects (and handshakes) again
      generation = generation_;
    }
    return Lease(this, std::move(conn), probe, generation);
  }

  // Every connection, free or on loan, connects again before its next use, so its
  // handshake reads the node's identity again (a Cluster node seen promoted: its failover,
  // node_watch.hpp).
  void renew() {
    std::lock_guard<std::mutex> lock(mu_);
    ++generation_;
  }

  // The node's breaker counters (all zero without a breaker).
  BreakerStats breaker_stats() const { return breaker_.stats(); }

  std::size_t size() const { return size_; }
  const ConnectionConfig& config() const { return config_; }
  // What the connect handshakes of this pool's connections saw (never null).
  const HandshakeStats& handshake_stats() const { return *config_.handshake_stats; }
  // The node's identity and failovers, as its connects saw them (never null).
  NodeWatch& node_watch() const { return *config_.node_watch; }

 private:
  // Shares one HandshakeStats, one NodeWatch and one PolicyRecheck among the pool's
  // connections.
  static ConnectionConfig with_handshake_stats(ConnectionConfig c) {
    if (c.handshake_stats == nullptr) c.handshake_stats = std::make_shared<HandshakeStats>();
    if (c.node_watch == nullptr) c.node_watch = std::make_shared<NodeWatch>();
    c.policy_recheck = std::make_shared<PolicyRecheck>();  // one node's, whoever shares stats
    return c;
  }

  void release(std::unique_ptr<Connection> conn, bool probe, std::uint64_t generation) {
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
      free_.push_back({std::move(conn), generation});
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
  // Free connections, each with the generation it was opened in (renew()).
  std::vector<std::pair<std::unique_ptr<Connection>, std::uint64_t>> free_;  // guarded by mu_
  std::uint64_t generation_ = 0;                                             // guarded by mu_
};

}  // namespace quota::redis
