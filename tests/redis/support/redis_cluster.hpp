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
// `ReplicatedCluster` is a cluster of the test's own: 3 masters with one replica each (6
// redis-server processes in scratch directories, cluster-node-timeout shortened), for
// failover tests that SIGKILL a master and wait for its replica to be promoted.
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

// A Redis Cluster of 3 masters with one replica each, started by the test: 6 ScratchServers
// (/tmp/<name>-<pid>-<i>) in cluster mode with cluster-node-timeout `node_timeout` and
// replica-validity-factor 0 (a replica may always take over), joined by `redis-cli
// --cluster create --cluster-replicas 1`. ready() once every node says cluster_state:ok
// and every replica's link to its master is up (waited for at most 30 s). Stopped by pid
// when destroyed (a node killed by the test is simply gone). Not thread-safe: one owner.
class ReplicatedCluster {
 public:
  explicit ReplicatedCluster(const std::string& name,
                             std::chrono::milliseconds node_timeout = std::chrono::seconds(1)) {
    for (int i = 0; i < 6; ++i) {
      const std::string dir = scratch_dir(name) + "-" + std::to_string(i);
      const std::string extra = "--cluster-enabled yes --cluster-config-file " + dir +
                                "/nodes.conf --cluster-node-timeout " +
                                std::to_string(node_timeout.count()) +
                                " --cluster-replica-validity-factor 0";
      std::error_code ec;
      std::filesystem::remove(dir + "/nodes.conf", ec);
      ::setenv("QUOTA_REDIS_EXTRA", extra.c_str(), 1);
      nodes_.push_back(std::make_unique<ScratchServer>(dir));
      ::unsetenv("QUOTA_REDIS_EXTRA");
      if (!nodes_.back()->started()) return;
    }
    std::string cmd = "redis-cli --cluster create";
    for (const auto& n : nodes_) cmd += " 127.0.0.1:" + std::to_string(n->port());
    cmd += " --cluster-replicas 1 --cluster-yes >" + nodes_[0]->dir() + "/create.log 2>&1";
    if (std::system(cmd.c_str()) != 0) return;
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (std::chrono::steady_clock::now() < until) {
      if (all_ok()) {
        ready_ = true;
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  }
  ReplicatedCluster(const ReplicatedCluster&) = delete;
  ReplicatedCluster& operator=(const ReplicatedCluster&) = delete;

  bool ready() const { return ready_; }
  std::vector<int> ports() const {
    std::vector<int> out;
    for (const auto& n : nodes_) out.push_back(n->port());
    return out;
  }

  // The port of the master serving `slot`, as node `asked` sees it (any live node when
  // 0); 0 if none answers.
  int owner(int slot, int asked = 0) const {
    for (const auto& n : nodes_) {
      if (asked != 0 && n->port() != asked) continue;
      if (!alive(n->port())) continue;
      redis::Connection c(config(n->port()));
      auto r = c.command({"CLUSTER", "SLOTS"});
      if (!r.ok() || (*r)->type != REDIS_REPLY_ARRAY) continue;
      for (std::size_t i = 0; i < (*r)->elements; ++i) {
        const redisReply* range = (*r)->element[i];
        if (range->element[0]->integer <= slot && slot <= range->element[1]->integer) {
          return static_cast<int>(range->element[2]->element[1]->integer);
        }
      }
    }
    return 0;
  }

  // The port of the replica of the master on `master_port` (CLUSTER REPLICAS); 0 if none.
  int replica_of(int master_port) const {
    redis::Connection c(config(master_port));
    auto id = c.command({"CLUSTER", "MYID"});
    if (!id.ok() || (*id)->type != REDIS_REPLY_STRING) return 0;
    auto r = c.command({"CLUSTER", "REPLICAS", std::string(redis::reply_string(**id))});
    if (!r.ok() || (*r)->type != REDIS_REPLY_ARRAY || (*r)->elements == 0) return 0;
    // "<id> 127.0.0.1:<port>@<bus port> slave <master id> ..."
    const std::string line(redis::reply_string(*(*r)->element[0]));
    const std::size_t colon = line.find(':'), at = line.find('@');
    if (colon == std::string::npos || at == std::string::npos || at < colon) return 0;
    return std::atoi(line.substr(colon + 1, at - colon - 1).c_str());
  }

  // SIGKILLs the node on `port` (no clean shutdown, as a crash); true on success.
  bool kill(int port) {
    for (const auto& n : nodes_) {
      if (n->port() == port && n->pid() > 0) {
        killed_.push_back(port);
        return ::kill(static_cast<pid_t>(n->pid()), SIGKILL) == 0;
      }
    }
    return false;
  }

 private:
  static redis::ConnectionConfig config(int port) {
    return {.host = "127.0.0.1", .port = port, .deadline = std::chrono::seconds(2)};
  }

  bool alive(int port) const {
    for (int k : killed_) {
      if (k == port) return false;
    }
    return true;
  }

  // Every node in state ok, every master with a replica whose link is up.
  bool all_ok() const {
    int linked = 0;
    for (const auto& n : nodes_) {
      redis::Connection c(config(n->port()));
      auto info = c.command({"CLUSTER", "INFO"});
      if (!info.ok() || (*info)->type != REDIS_REPLY_STRING ||
          redis::reply_string(**info).find("cluster_state:ok") == std::string_view::npos) {
        return false;
      }
      auto repl = c.command({"INFO", "replication"});
      if (repl.ok() && (*repl)->type == REDIS_REPLY_STRING &&
          redis::reply_string(**repl).find("master_link_status:up") != std::string_view::npos) {
        ++linked;
      }
    }
    return linked == 3;
  }

  std::vector<std::unique_ptr<ScratchServer>> nodes_;
  std::vector<int> killed_;
  bool ready_ = false;
};

}  // namespace quota::testing
