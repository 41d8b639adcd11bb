// quota/redis/transport/cluster.hpp — Redis Cluster slot routing for the Redis store.
//
// Redis Cluster splits the key space into 16384 slots, slot = CRC16(key) mod 16384,
// where only the hash tag is hashed when the key has one (the part between the first
// `{` and the next `}`, if not empty). quota's keys carry the tenant as the hash tag
// (keys.hpp), so all of a tenant's keys — its buckets and attempt records — share one
// slot and one node, and a multi-key script stays legal.
//
// `ClusterPool` keeps the slot → node map (from `CLUSTER SLOTS`, asked of any known
// node) and a ConnectionPool per node. `RedisStore` with `RedisStoreOptions::cluster`
// sends each script call to the node of its slot and follows redirections:
//   -MOVED <slot> <host:port>: the slot lives elsewhere now: refresh the map, retry there;
//   -ASK <slot> <host:port>:   the slot is being migrated and this key has moved: send
//                              ASKING + the command to that node, once, map unchanged.
// Everything one call waits on (the map, the redirections, the backoffs) is bounded by the
// call's one Deadline (deadline.hpp); at most kMaxRedirects redirections, then kUnavailable.
// Failover: the map is also reloaded (RefreshPolicy) after a node fails a call (a
// connection error, its deadline, its breaker), after -CLUSTERDOWN, and periodically;
// the reload asks the nodes that have not failed first, replicas included, and is
// rate-limited (one at a time, at most one per min_interval), so that the calls for a
// dead master's slots go to its replica once the cluster has promoted it.
//   -TRYAGAIN:                 a call of several keys met its slot half migrated (some
//                              of its keys on the source, some on the target), so
//                              neither node ran it. The script did not run, so it is
//                              sent again — to the slot's owner in the map, without
//                              ASKING — after a short backoff, a few times and within
//                              the command deadline (TryAgainPolicy); then kUnavailable
//                              naming TRYAGAIN. Retries do not count as redirections.
// Batches (RedisStore::apply_pipelined, apply_batch) group their calls by the node of each
// slot and send each node's calls in ONE pipelined write (counted by `pipelines()`); the
// replies that redirect are sent again, grouped the same way, after the map refresh.
//
// Thread safety: ClusterPool is thread-safe.
//
//   auto cluster = std::make_shared<quota::redis::ClusterPool>(
//       quota::redis::ConnectionConfig{.port = 7000}, /*connections_per_node=*/4);
//   quota::RedisStoreOptions options;
//   options.cluster = cluster;
//   quota::RedisStore<quota::TokenBucket> store(options);
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "quota/redis/transport/connection_pool.hpp"

namespace quota::redis {

inline constexpr int kClusterSlots = 16384;
inline constexpr int kMaxRedirects = 5;

// The payload (absl::Status::SetPayload) that marks an error after which the call
// certainly did not run on the server (TRYAGAIN given up on), so that it may be sent
// again without charging twice. See not_run().
inline constexpr char kNotRunPayload[] = "quota.redis/not-run";
inline bool not_run(const absl::Status& s) { return s.GetPayload(kNotRunPayload).has_value(); }

// CRC16-CCITT (XMODEM: polynomial 0x1021, initial value 0), as Redis Cluster uses.
inline std::uint16_t crc16(std::string_view data) {
  std::uint16_t crc = 0;
  for (char ch : data) {
    crc ^= static_cast<std::uint16_t>(static_cast<unsigned char>(ch) << 8);
    for (int i = 0; i < 8; ++i) {
      crc = (crc & 0x8000) != 0 ? static_cast<std::uint16_t>((crc << 1) ^ 0x1021)
                                : static_cast<std::uint16_t>(crc << 1);
    }
  }
  return crc;
}

// The cluster slot of a Redis key, honouring its hash tag.
inline int key_slot(std::string_view key) {
  const std::size_t open = key.find('{');
  if (open != std::string_view::npos) {
    const std::size_t close = key.find('}', open + 1);
    if (close != std::string_view::npos && close > open + 1) {
      key = key.substr(open + 1, close - open - 1);
    }
  }
  return crc16(key) % kClusterSlots;
}

// A redirection parsed from "-MOVED 3999 127.0.0.1:6381" or "-ASK ...".
struct Redirect {
  bool ask = false;
  int slot = 0;
  std::string host;
  int port = 0;
};

inline bool parse_redirect(const redisReply& r, Redirect& out) {
  const bool moved = is_error(r, "MOVED");
  const bool ask = is_error(r, "ASK");
  if (!moved && !ask) return false;
  const std::string s(reply_string(r));
  char host[256] = {0};
  int slot = 0, port = 0;
  const char* fmt = moved ? "MOVED %d %255[^:]:%d" : "ASK %d %255[^:]:%d";
  if (std::sscanf(s.c_str(), fmt, &slot, host, &port) != 3) return false;
  out = Redirect{.ask = ask, .slot = slot, .host = host, .port = port};
  return true;
}

// How a call retries -TRYAGAIN (its slot half migrated; the command did not run).
struct TryAgainPolicy {
  // Retries after the first -TRYAGAIN; 0: never retried.
  int retries = 5;
  // The wait before the first retry, doubled before each further one up to max_backoff.
  std::chrono::microseconds backoff{500};
  std::chrono::microseconds max_backoff{std::chrono::milliseconds(20)};
  // No retry starts after the call has run this long (since it started): the call's
  // deadline when 0, and never past it.
  std::chrono::microseconds budget{0};
};

// When the slot map is reloaded besides on first use and after -MOVED.
struct RefreshPolicy {
  // Reloaded by the first call after the map is this old; 0: never for age alone.
  std::chrono::milliseconds periodic{1000};
  // After a node failed a call or -CLUSTERDOWN, and for age: never two reloads started
  // closer than this (while a node is down every call to it fails).
  std::chrono::milliseconds min_interval{50};
};

class ClusterPool {
 public:
  // `seed`: any node of the cluster (and the config every node connection uses).
  ClusterPool(ConnectionConfig seed, std::size_t connections_per_node,
              TryAgainPolicy tryagain = TryAgainPolicy{}, RefreshPolicy refresh = RefreshPolicy{})
      : base_(std::move(seed)),
        per_node_(std::max<std::size_t>(connections_per_node, 1)),
        tryagain_(tryagain),
        refresh_(refresh) {
    node(base_.host, base_.port);
  }

  // The pool of the node serving `slot`; reloads the map first if it has never been
  // loaded, or, rate-limited, when it is stale (a node failed, -CLUSTERDOWN) or old
  // (RefreshPolicy), within `deadline` (default a fresh config().deadline). kUnavailable
  // when the slot has no node and no node answers CLUSTER SLOTS.
  absl::StatusOr<std::shared_ptr<ConnectionPool>> for_slot(int slot) {
    return for_slot(slot, Deadline::after(base_.deadline));
  }
  absl::StatusOr<std::shared_ptr<ConnectionPool>> for_slot(int slot, const Deadline& deadline) {
    const auto i = static_cast<std::size_t>(slot);
    bool due = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (loaded_ && slots_[i] != nullptr) {
        due = claim_refresh_locked();
        if (!due) return slots_[i];
      }
    }
    // A stale map's reload failing leaves the old map in use; with a map to fall back on,
    // the reload gets half the time left, so an unresponsive node it asks cannot take
    // the call's own time.
    absl::Status s = refresh(due ? deadline.share(2) : deadline);
    std::lock_guard<std::mutex> lock(mu_);
    if (due) refreshing_ = false;
    if (slots_[i] == nullptr) {
      if (!s.ok()) return s;
      return absl::UnavailableError(absl::StrFormat("redis cluster: no node serves slot %d", slot));
    }
    return slots_[i];
  }

  // A call to `node` failed (transport, deadline, breaker): the map is stale and the node
  // is asked last by the next reload.
  void note_failure(const ConnectionPool& node) {
    std::lock_guard<std::mutex> lock(mu_);
    stale_ = true;
    suspects_.insert(absl::StrFormat("%s:%d", node.config().host, node.config().port));
  }
  // A node answered -CLUSTERDOWN: the map is stale.
  void note_clusterdown() {
    clusterdowns_.fetch_add(1, std::memory_order_relaxed);
    std::lock_guard<std::mutex> lock(mu_);
    stale_ = true;
  }

  // The pool of one node, created on first use.
  std::shared_ptr<ConnectionPool> node(const std::string& host, int port) {
    std::lock_guard<std::mutex> lock(mu_);
    return node_locked(host, port);
  }

  // Reloads the slot map from the first node that answers CLUSTER SLOTS (the nodes that
  // failed a call since the last reload asked last), within `deadline` (default: a
  // fresh config().deadline); each node asked gets its share of the time left, so one
  // that does not answer leaves time for the others.
  absl::Status refresh() { return refresh(Deadline::after(base_.deadline)); }
  absl::Status refresh(const Deadline& deadline) {
    std::vector<std::shared_ptr<ConnectionPool>> nodes, suspects;
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (auto& [name, pool] : nodes_) {
        (suspects_.count(name) > 0 ? suspects : nodes).push_back(pool);
      }
    }
    nodes.insert(nodes.end(), suspects.begin(), suspects.end());
    absl::Status last = absl::UnavailableError("redis cluster: no node known");
    for (std::size_t k = 0; k < nodes.size(); ++k) {
      const auto& pool = nodes[k];
      const Deadline mine = deadline.share(static_cast<int>(nodes.size() - k));
      auto lease = pool->acquire(mine);
      if (!lease.ok()) {
        last = lease.status();
        continue;
      }
      auto reply = (*lease)->command({"CLUSTER", "SLOTS"}, mine);
      if (!reply.ok()) {
        last = reply.status();
        continue;
      }
      const redisReply& r = **reply;
      if (r.type != REDIS_REPLY_ARRAY) {
        last = absl::UnavailableError(
            absl::StrCat("redis cluster: CLUSTER SLOTS failed: ", detail::av(reply_string(r))));
        continue;
      }
      std::lock_guard<std::mutex> lock(mu_);
      const std::set<ConnectionPool*> masters_before = masters_locked();
      slots_.fill(nullptr);
      for (std::size_t i = 0; i < r.elements; ++i) {
        const redisReply* range = r.element[i];
        if (range->type != REDIS_REPLY_ARRAY || range->elements < 3) continue;
        const redisReply* master = range->element[2];
        if (master->type != REDIS_REPLY_ARRAY || master->elements < 2) continue;
        const auto from = range->element[0]->integer, to = range->element[1]->integer;
        auto pool_of = node_locked(std::string(reply_string(*master->element[0])),
                                   static_cast<int>(master->element[1]->integer));
        for (auto s = from; s <= to && s < kClusterSlots; ++s) {
          slots_[static_cast<std::size_t>(s)] = pool_of;
        }
        // Replicas are known too: one of them may be asked for the map after a failover.
        for (std::size_t k = 3; k < range->elements; ++k) {
          const redisReply* replica = range->element[k];
          if (replica->type != REDIS_REPLY_ARRAY || replica->elements < 2) continue;
          node_locked(std::string(reply_string(*replica->element[0])),
                      static_cast<int>(replica->element[1]->integer));
        }
      }
      // A node that serves slots and did not before (a replica promoted) is met again:
      // its connections reconnect, so their handshake sees its new identity.
      if (loaded_) {
        for (ConnectionPool* p : masters_locked()) {
          if (masters_before.count(p) == 0) p->renew();
        }
      }
      loaded_ = true;
      stale_ = false;
      loaded_at_ = std::chrono::steady_clock::now();
      suspects_.clear();
      refreshes_.fetch_add(1, std::memory_order_relaxed);
      return absl::OkStatus();
    }
    return last;
  }

  const ConnectionConfig& config() const { return base_; }

  // The configs of the nodes serving slots in the last loaded map (the seed's before one).
  std::vector<ConnectionConfig> node_configs() const {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<ConnectionConfig> out;
    for (const ConnectionPool* p : masters_locked()) out.push_back(p->config());
    if (out.empty()) out.push_back(base_);
    return out;
  }
  const TryAgainPolicy& tryagain_policy() const { return tryagain_; }

  // Every known node's breaker counters, summed (FailFastStats::breakers, open_nodes).
  FailFastStats breaker_stats() const {
    std::lock_guard<std::mutex> lock(mu_);
    FailFastStats out;
    for (const auto& [name, pool] : nodes_) {
      const BreakerStats b = pool->breaker_stats();
      out.breakers.opened += b.opened;
      out.breakers.rejected += b.rejected;
      out.breakers.probes += b.probes;
      out.breakers.open = out.breakers.open || b.open;
      out.open_nodes += b.open ? 1 : 0;
    }
    return out;
  }

  // Every known node's failovers and clock refusals, summed (failover_at: the latest).
  NodeWatchStats node_watch_stats() const {
    std::lock_guard<std::mutex> lock(mu_);
    NodeWatchStats out;
    for (const auto& [name, pool] : nodes_) out += pool->node_watch().stats();
    return out;
  }

  // After a -TRYAGAIN for a call bounded by `deadline` that has been retried `retries`
  // times: the wait before the next retry, or nullopt when the call must give up (no
  // retries left, or the wait would end past the budget or the deadline).
  std::optional<std::chrono::microseconds> tryagain_delay(int retries,
                                                          const Deadline& deadline) const {
    if (retries < 0 || retries >= tryagain_.retries) return std::nullopt;
    auto delay = std::max(tryagain_.backoff, std::chrono::microseconds(1));
    for (int i = 0; i < retries && delay < tryagain_.max_backoff; ++i) delay *= 2;
    delay = std::min(delay, std::max(tryagain_.max_backoff, std::chrono::microseconds(1)));
    if (delay >= deadline.left()) return std::nullopt;
    const auto start = deadline.at() - deadline.budget();
    if (tryagain_.budget.count() > 0 &&
        std::chrono::steady_clock::now() - start + delay > tryagain_.budget) {
      return std::nullopt;
    }
    return delay;
  }

  // The error of a call given up on after -TRYAGAIN `reply` (kUnavailable: nothing ran).
  static absl::Status tryagain_error(const redisReply& reply, int slot, int retries,
                                     std::chrono::steady_clock::time_point start) {
    const auto us = std::chrono::duration_cast<std::chrono::microseconds>(
                        std::chrono::steady_clock::now() - start)
                        .count();
    absl::Status s = absl::UnavailableError(absl::StrFormat(
        "redis cluster: slot %d is being migrated with the call's keys split between two "
        "nodes (%s), still after %d retries in %d us; the script did not run",
        slot, detail::av(reply_string(reply)), retries, us));
    s.SetPayload(kNotRunPayload, absl::Cord("TRYAGAIN"));
    return s;
  }

  // Redirections followed so far (for tests and monitoring).
  void note_redirect(bool ask) { (ask ? asks_ : moves_).fetch_add(1, std::memory_order_relaxed); }
  std::uint64_t asks() const { return asks_.load(std::memory_order_relaxed); }
  std::uint64_t moves() const { return moves_.load(std::memory_order_relaxed); }
  // Pipelined writes of batches to nodes, one per node and round (tests, monitoring).
  void note_pipeline() { pipelines_.fetch_add(1, std::memory_order_relaxed); }
  std::uint64_t pipelines() const { return pipelines_.load(std::memory_order_relaxed); }
  // -TRYAGAIN replies received (each retried or given up on).
  void note_tryagain() { tryagains_.fetch_add(1, std::memory_order_relaxed); }
  std::uint64_t tryagains() const { return tryagains_.load(std::memory_order_relaxed); }
  // Slot maps loaded, and -CLUSTERDOWN replies seen.
  std::uint64_t refreshes() const { return refreshes_.load(std::memory_order_relaxed); }
  std::uint64_t clusterdowns() const { return clusterdowns_.load(std::memory_order_relaxed); }

 private:
  // Whether this caller reloads the map now: it is stale or old, no reload is running,
  // and none started within min_interval. Claims the reload (refreshing_) when true.
  bool claim_refresh_locked() {
    const auto now = std::chrono::steady_clock::now();
    const bool old = refresh_.periodic.count() > 0 && now - loaded_at_ >= refresh_.periodic;
    if (refreshing_ || !(stale_ || old) || now - last_attempt_ < refresh_.min_interval) {
      return false;
    }
    refreshing_ = true;
    last_attempt_ = now;
    return true;
  }

  // The nodes that serve a slot.
  std::set<ConnectionPool*> masters_locked() const {
    std::set<ConnectionPool*> out;
    for (const auto& p : slots_) out.insert(p.get());
    out.erase(nullptr);
    return out;
  }

  std::shared_ptr<ConnectionPool> node_locked(const std::string& host, int port) {
    const std::string name = absl::StrFormat("%s:%d", host, port);
    auto it = nodes_.find(name);
    if (it != nodes_.end()) return it->second;
    ConnectionConfig cfg = base_;
    cfg.host = host;
    cfg.port = port;
    cfg.node_watch = std::make_shared<NodeWatch>(history_);  // each node its own
    auto pool = std::make_shared<ConnectionPool>(cfg, per_node_);
    nodes_.emplace(name, pool);
    return pool;
  }

  const ConnectionConfig base_;
  const std::size_t per_node_;
  const TryAgainPolicy tryagain_;
  const RefreshPolicy refresh_;
  // The replication ids the nodes were met with: a promoted replica is known as a
  // failover at its first connect (node_watch.hpp).
  const std::shared_ptr<ReplicationHistory> history_ = std::make_shared<ReplicationHistory>();
  std::atomic<std::uint64_t> asks_{0}, moves_{0}, pipelines_{0}, tryagains_{0};
  std::atomic<std::uint64_t> refreshes_{0}, clusterdowns_{0};
  mutable std::mutex mu_;  // guards everything below (std::mutex: see ConnectionPool)
  bool loaded_ = false;
  bool stale_ = false;       // a node failed or said CLUSTERDOWN since the last reload
  bool refreshing_ = false;  // a rate-limited reload is running
  std::chrono::steady_clock::time_point loaded_at_{}, last_attempt_{};
  std::set<std::string> suspects_;  // nodes that failed a call since the last reload
  std::map<std::string, std::shared_ptr<ConnectionPool>> nodes_;
  std::array<std::shared_ptr<ConnectionPool>, kClusterSlots> slots_{};
};

}  // namespace quota::redis
