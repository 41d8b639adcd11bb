// tests/redis/support/redis_cluster.hpp — the Redis Cluster the *cluster* tests run
// against, and slot migrations by hand.
//
// CTest starts a cluster of 3 masters as a fixture (cmake/redis_cluster.sh) and tells the
// test where through QUOTA_REDIS_CLUSTER_DIR (the ports are in $QUOTA_REDIS_CLUSTER_DIR/
// ports, one a line). `SlotMigration` moves one slot between two nodes the way
// `redis-cli --cluster reshard` does (SETSLOT IMPORTING / MIGRATING, MIGRATE key by key,
// SETSLOT NODE on every node), with the steps exposed so that a test can stop half way;
// its destructor finishes a migration left open and moves the slot back, so the other
// tests sharing the cluster find the slot layout as it was.
//
// `ScratchCluster` is a cluster of the test's own (3 masters, config lines of the test's
// choosing, e.g. AUTH); replicated_cluster.hpp has one with replicas, for failover tests.
//
// The helpers that may run on worker threads or in destructors (SlotMigration, LoadThreads)
// use no Catch2 assertions (they are not thread-safe); they report through return values.
#pragma once

#include <signal.h>
#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include "quota/decision.hpp"
#include "quota/redis/transport/cluster.hpp"
#include "quota/redis/transport/connection.hpp"
#include "support/redis_server.hpp"

namespace quota::testing {

// The cluster's node ports (3), from $QUOTA_REDIS_CLUSTER_DIR/ports.
inline std::vector<int> cluster_ports() {
  const char* dir = std::getenv("QUOTA_REDIS_CLUSTER_DIR");
  if (dir == nullptr || *dir == '\0') {
    throw std::runtime_error(
        "QUOTA_REDIS_CLUSTER_DIR is not set: run this test through ctest, which starts the "
        "cluster");
  }
  std::ifstream in(std::string(dir) + "/ports");
  std::vector<int> ports;
  int p = 0;
  while (in >> p) ports.push_back(p);
  if (ports.size() != 3) throw std::runtime_error(std::string("expected 3 ports in ") + dir);
  return ports;
}

// A config for one node (the test deadlines of redis_config).
inline redis::ConnectionConfig node_config(int port) {
  auto cfg = redis_config();
  cfg.port = port;
  return cfg;
}

// Sends one admin command; true when it was answered without an error.
inline bool admin(redis::Connection& c, const std::vector<std::string_view>& args) {
  auto r = c.command(args);
  return r.ok() && (*r)->type != REDIS_REPLY_ERROR;
}

// The port of the node serving `slot` (CLUSTER SLOTS of the first node); 0 if none.
inline int slot_owner(int slot) {
  redis::Connection c(node_config(cluster_ports()[0]));
  auto r = c.command({"CLUSTER", "SLOTS"});
  if (!r.ok() || (*r)->type != REDIS_REPLY_ARRAY) return 0;
  for (std::size_t i = 0; i < (*r)->elements; ++i) {
    const redisReply* range = (*r)->element[i];
    if (range->element[0]->integer <= slot && slot <= range->element[1]->integer) {
      return static_cast<int>(range->element[2]->element[1]->integer);
    }
  }
  return 0;
}

// Every node's view of `slot`, for failure messages: per node, the owner it names and
// its own line of CLUSTER NODES when that marks the slot migrating or importing
// ("[slot->-id]", "[slot-<-id]"), and how many of the slot's keys it holds.
inline std::string slot_report(int slot) {
  std::string out;
  const std::string marker = "[" + std::to_string(slot) + "-";
  for (int port : cluster_ports()) {
    redis::Connection c(node_config(port));
    out += "\n  node " + std::to_string(port) + ":";
    auto slots = c.command({"CLUSTER", "SLOTS"});
    if (slots.ok() && (*slots)->type == REDIS_REPLY_ARRAY) {
      for (std::size_t i = 0; i < (*slots)->elements; ++i) {
        const redisReply* range = (*slots)->element[i];
        if (range->element[0]->integer <= slot && slot <= range->element[1]->integer) {
          out += " owner " + std::to_string(range->element[2]->element[1]->integer);
        }
      }
    }
    auto nodes = c.command({"CLUSTER", "NODES"});
    if (nodes.ok() && (*nodes)->type == REDIS_REPLY_STRING) {
      const std::string text(redis::reply_string(**nodes));
      std::size_t at = 0;
      while (at < text.size()) {
        std::size_t end = text.find('\n', at);
        if (end == std::string::npos) end = text.size();
        const std::string line = text.substr(at, end - at);
        if (line.find("myself") != std::string::npos && line.find(marker) != std::string::npos) {
          out += " open: " + line.substr(line.find(marker));
        }
        at = end + 1;
      }
    }
    auto keys = c.command({"CLUSTER", "COUNTKEYSINSLOT", std::to_string(slot)});
    if (keys.ok() && (*keys)->type == REDIS_REPLY_INTEGER) {
      out += ", " + std::to_string((*keys)->integer) + " keys";
    }
  }
  return out;
}

// One slot's migration from its owner to another node, step by step.
class SlotMigration {
 public:
  // Opens the migration: the slot IMPORTING on `to_port`, MIGRATING on `from_port`.
  SlotMigration(int slot, int from_port, int to_port)
      : slot_(std::to_string(slot)), from_port_(from_port), to_port_(to_port) {
    redis::Connection from(node_config(from_port)), to(node_config(to_port));
    from_id_ = id_of(from);
    to_id_ = id_of(to);
    open_ = !from_id_.empty() && !to_id_.empty() &&
            admin(to, {"CLUSTER", "SETSLOT", slot_, "IMPORTING", from_id_}) &&
            admin(from, {"CLUSTER", "SETSLOT", slot_, "MIGRATING", to_id_});
  }
  SlotMigration(const SlotMigration&) = delete;
  SlotMigration& operator=(const SlotMigration&) = delete;
  // Finishes what is open, then moves the slot back unless kept.
  ~SlotMigration() {
    if (!finished_) finish();
    if (!kept_ && !restored_) restore();
  }

  bool open() const { return open_; }
  int from_port() const { return from_port_; }
  int to_port() const { return to_port_; }

  // Migrates one given key (its Redis key) to the target.
  bool move(const std::string& redis_key) {
    redis::Connection from(node_config(from_port_));
    return admin(from, {"MIGRATE", "127.0.0.1", std::to_string(to_port_), redis_key, "0", "5000"});
  }

  // Migrates one key of the slot, any; false when none is left (or on an error).
  bool move_one() {
    redis::Connection from(node_config(from_port_));
    auto got = from.command({"CLUSTER", "GETKEYSINSLOT", slot_, "1"});
    if (!got.ok() || (*got)->type != REDIS_REPLY_ARRAY || (*got)->elements == 0) return false;
    return move(std::string(redis::reply_string(*(*got)->element[0])));
  }

  // Migrates the remaining keys and gives the slot to the target on every node (from
  // any thread).
  bool finish() {
    finished_ = move_all(from_port_, to_port_, to_id_);
    return finished_;
  }

  // Moves the finished slot back to where it was (a whole migration the other way).
  bool restore() {
    redis::Connection back_from(node_config(to_port_)), back_to(node_config(from_port_));
    restored_ = admin(back_to, {"CLUSTER", "SETSLOT", slot_, "IMPORTING", to_id_}) &&
                admin(back_from, {"CLUSTER", "SETSLOT", slot_, "MIGRATING", from_id_}) &&
                move_all(to_port_, from_port_, from_id_);
    return restored_;
  }

  // The slot stays on the target when this is destroyed.
  void keep() { kept_ = true; }

 private:
  static std::string id_of(redis::Connection& c) {
    auto r = c.command({"CLUSTER", "MYID"});
    return r.ok() && (*r)->type == REDIS_REPLY_STRING ? std::string(redis::reply_string(**r))
                                                      : std::string();
  }

  // Every key of the slot from `from_port` to `to_port`, then the slot to `to_id` on the
  // target, the source and the other nodes, in that order (as redis-cli does).
  bool move_all(int from_port, int to_port, const std::string& to_id) {
    redis::Connection from(node_config(from_port));
    for (;;) {
      auto got = from.command({"CLUSTER", "GETKEYSINSLOT", slot_, "100"});
      if (!got.ok() || (*got)->type != REDIS_REPLY_ARRAY) return false;
      if ((*got)->elements == 0) break;
      for (std::size_t i = 0; i < (*got)->elements; ++i) {
        const std::string key(redis::reply_string(*(*got)->element[i]));
        if (!admin(from, {"MIGRATE", "127.0.0.1", std::to_string(to_port), key, "0", "5000"})) {
          return false;
        }
      }
    }
    std::vector<int> order = {to_port, from_port};
    for (int port : cluster_ports()) {
      if (port != to_port && port != from_port) order.push_back(port);
    }
    bool ok = true;
    for (int port : order) {
      redis::Connection c(node_config(port));
      ok = admin(c, {"CLUSTER", "SETSLOT", slot_, "NODE", to_id}) && ok;
    }
    return ok;
  }

  const std::string slot_;
  const int from_port_, to_port_;
  std::string from_id_, to_id_;
  bool open_ = false, finished_ = false, restored_ = false, kept_ = false;
};

// Load for the migration tests: `threads` threads each call `work(thread)` until stop()
// (or destruction). Results are counted with `tally`, for assertions after stop().
class LoadThreads {
 public:
  LoadThreads(int threads, std::function<void(int)> work) : work_(std::move(work)) {
    for (int t = 0; t < threads; ++t) {
      threads_.emplace_back([this, t] {
        while (!stop_.load()) {
          work_(t);
          calls_.fetch_add(1);
        }
      });
    }
  }
  LoadThreads(const LoadThreads&) = delete;
  LoadThreads& operator=(const LoadThreads&) = delete;
  ~LoadThreads() { stop(); }

  void stop() {
    stop_ = true;
    for (auto& th : threads_) {
      if (th.joinable()) th.join();
    }
  }

  std::int64_t calls() const { return calls_.load(); }

  // Counts one decision: allowed or an error.
  void tally(const absl::StatusOr<Decision>& d) {
    if (!d.ok()) {
      errors_.fetch_add(1);
    } else if (d->allowed) {
      allowed_.fetch_add(1);
    }
  }
  void tally_errors(std::int64_t n) { errors_.fetch_add(n); }
  std::int64_t allowed() const { return allowed_.load(); }
  std::int64_t errors() const { return errors_.load(); }

 private:
  std::function<void(int)> work_;
  std::atomic<bool> stop_{false};
  std::atomic<std::int64_t> calls_{0}, allowed_{0}, errors_{0};
  std::vector<std::thread> threads_;
};

// A Redis Cluster of 3 masters of one test (RedisServer each, with `lines` added to
// every node's config: "requirepass pw", "masterauth pw", an ACL user ...), its slots
// split evenly with CLUSTER ADDSLOTSRANGE and the nodes joined with CLUSTER MEET; `admin`
// (the credentials the test's admin connections use) must be able to do that. ok() once
// every node says cluster_state:ok (waited for at most 20 s).
class ScratchCluster {
 public:
  ScratchCluster(const std::string& name, const std::vector<std::string>& lines,
                 const redis::ConnectionConfig& admin_config) {
    for (int i = 0; i < 3; ++i) {
      std::vector<std::string> node_lines = {
          "cluster-enabled yes", "cluster-config-file nodes.conf", "cluster-node-timeout 2000"};
      node_lines.insert(node_lines.end(), lines.begin(), lines.end());
      nodes_.push_back(
          std::make_unique<RedisServer>(name + "-node" + std::to_string(i), node_lines));
      if (!nodes_.back()->started()) return;
    }
    const int per = redis::kClusterSlots / 3;
    for (int i = 0; i < 3; ++i) {
      redis::Connection c(config(i, admin_config));
      const int lo = i * per, hi = i == 2 ? redis::kClusterSlots - 1 : (i + 1) * per - 1;
      if (!admin(c, {"CLUSTER", "ADDSLOTSRANGE", std::to_string(lo), std::to_string(hi)})) return;
      if (i > 0 && !admin(c, {"CLUSTER", "MEET", "127.0.0.1", std::to_string(nodes_[0]->port())})) {
        return;
      }
    }
    for (int tries = 0; tries < 200 && !ok_; ++tries) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      bool all = true;
      for (int i = 0; i < 3 && all; ++i) {
        redis::Connection c(config(i, admin_config));
        auto info = c.command({"CLUSTER", "INFO"});
        all = info.ok() && (*info)->type == REDIS_REPLY_STRING &&
              redis::reply_string(**info).find("cluster_state:ok") != std::string_view::npos;
      }
      ok_ = all;
    }
  }

  bool ok() const { return ok_; }
  int port(int i) const { return nodes_[static_cast<std::size_t>(i)]->port(); }
  // `base` pointed at node i.
  redis::ConnectionConfig config(int i, redis::ConnectionConfig base) const {
    base.host = "127.0.0.1";
    base.port = port(i);
    return base;
  }

 private:
  std::vector<std::unique_ptr<RedisServer>> nodes_;
  bool ok_ = false;
};

}  // namespace quota::testing
