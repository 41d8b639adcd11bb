// tests/redis/support/replicated_cluster.hpp — a Redis Cluster with replicas, of one test.
//
// `ReplicatedCluster` is 3 masters with one replica each (6 redis-server processes in
// scratch directories, cluster-node-timeout shortened), for failover tests that SIGKILL
// a master and wait for its replica to be promoted. Every wait is bounded (30 s); the
// servers are stopped by pid when it is destroyed.
#pragma once

#include <signal.h>
#include <sys/types.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <vector>

#include "quota/redis/transport/cluster.hpp"
#include "quota/redis/transport/connection.hpp"
#include "support/redis_server.hpp"

namespace quota::testing {

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
