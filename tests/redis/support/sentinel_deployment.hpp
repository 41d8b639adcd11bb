// tests/redis/support/sentinel_deployment.hpp — a primary, its replicas and
// redis-sentinel processes monitoring it, as real processes on loopback (RedisServer
// of redis_server.hpp, each stopped by pid when the deployment goes out of scope), for the
// tests that fail a primary over under a client: redis_sentinel_test (the library's
// SentinelPool) and quota_server_redis_production_test (quota-server --redis-sentinel).
//
// SentinelDeployment starts the primary, then every replica (`replicaof`, the first sync
// without the default 5 s delay) and waits until the primary lists each one online; then
// the sentinels (master name kSentinelMaster, the given quorum, down-after 1000 ms,
// failover-timeout 4000 ms) and waits until each knows the other sentinels and every
// replica, so a SIGKILL of the primary is followed by a promotion. Credentials, when
// given, go on the data nodes (requirepass + masterauth, and the sentinels' auth-pass)
// and on the sentinels (requirepass + sentinel-pass). Every wait is bounded (30 s) and a
// REQUIRE; redis_ask() and eventually() are the probes it uses, for the tests too.
//
// Thread safety: one owner per deployment; redis_ask() and eventually() any thread.
//
//   quota::testing::SentinelDeployment d("failover", {.replicas = 1, .sentinels = 1,
//                                                     .quorum = 1});
//   REQUIRE(d.primary->kill(SIGKILL));
//   // ... d.sentinels[0]->port() answers SENTINEL get-master-addr-by-name quota ...
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include <catch2/catch.hpp>

#include "quota/redis/transport/connection.hpp"
#include "quota/redis/transport/sentinel.hpp"
#include "redis_server.hpp"

namespace quota::testing {

// The master name every deployment's sentinels monitor.
inline constexpr char kSentinelMaster[] = "quota";

struct SentinelCredentials {
  std::string data{};      // requirepass of the data nodes (and masterauth); empty: none
  std::string sentinel{};  // requirepass of the sentinels; empty: none
};

// A data node's connection settings: 500 ms per call, the password of `creds`.
inline redis::ConnectionConfig sentinel_data_config(const SentinelCredentials& creds,
                                                    int port = 0) {
  redis::ConnectionConfig c{
      .host = "127.0.0.1", .port = port, .deadline = std::chrono::milliseconds(500)};
  c.password = creds.data;
  return c;
}

// The first reply to `args` on `port` as text: a string or status as is, an array as
// "N elements", "" on any failure. No eviction-policy check (sentinels have none).
inline std::string redis_ask(int port, const std::string& password,
                             const std::vector<std::string_view>& args) {
  redis::ConnectionConfig c = sentinel_data_config({}, port);
  c.password = password;
  c.eviction_check = redis::EvictionPolicyCheck::kSkip;
  redis::Connection conn(c);
  auto r = conn.command(args);
  if (!r.ok()) return "";
  if ((*r)->type == REDIS_REPLY_STRING || (*r)->type == REDIS_REPLY_STATUS) {
    return std::string(redis::reply_string(**r));
  }
  if ((*r)->type == REDIS_REPLY_ARRAY) return std::to_string((*r)->elements) + " elements";
  return "";
}

// Polls `done` every 100 ms for at most `limit`; true once it holds.
template <class F>
bool eventually(F done, std::chrono::seconds limit) {
  const auto end = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < end) {
    if (done()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return false;
}

struct SentinelDeploymentOptions {
  int replicas = 1;
  int sentinels = 3;
  int quorum = 2;  // sentinels that must agree the primary is down
  SentinelCredentials creds{};
};

class SentinelDeployment {
 public:
  std::unique_ptr<RedisServer> primary;
  std::vector<std::unique_ptr<RedisServer>> replicas, sentinels;
  SentinelCredentials creds;

  // `name` prefixes the processes' scratch directories.
  SentinelDeployment(const std::string& name, SentinelDeploymentOptions o)
      : creds(std::move(o.creds)) {
    std::vector<std::string> data_lines = {"repl-diskless-sync-delay 0"};
    if (!creds.data.empty()) {
      data_lines.push_back("requirepass " + creds.data);
      data_lines.push_back("masterauth " + creds.data);
    }
    primary = std::make_unique<RedisServer>(name + "-primary", data_lines);
    REQUIRE(primary->started());
    for (int i = 0; i < o.replicas; ++i) {
      auto lines = data_lines;
      lines.push_back("replicaof 127.0.0.1 " + std::to_string(primary->port()));
      replicas.push_back(
          std::make_unique<RedisServer>(name + "-replica" + std::to_string(i), lines));
      REQUIRE(replicas.back()->started());
    }
    // Every replica synced (state=online), not just connected.
    REQUIRE(eventually(
        [&] {
          const std::string info = redis_ask(primary->port(), creds.data, {"INFO", "replication"});
          int online = 0;
          for (auto at = info.find("state=online"); at != std::string::npos;
               at = info.find("state=online", at + 1)) {
            ++online;
          }
          return online == o.replicas;
        },
        std::chrono::seconds(30)));
    const std::string m = kSentinelMaster;
    std::vector<std::string> lines = {
        "sentinel monitor " + m + " 127.0.0.1 " + std::to_string(primary->port()) + " " +
            std::to_string(o.quorum),
        "sentinel down-after-milliseconds " + m + " 1000",
        "sentinel failover-timeout " + m + " 4000", "sentinel parallel-syncs " + m + " 1"};
    if (!creds.data.empty()) lines.push_back("sentinel auth-pass " + m + " " + creds.data);
    if (!creds.sentinel.empty()) {
      lines.push_back("requirepass " + creds.sentinel);
      lines.push_back("sentinel sentinel-pass " + creds.sentinel);
    }
    for (int i = 0; i < o.sentinels; ++i) {
      sentinels.push_back(std::make_unique<RedisServer>(name + "-sentinel" + std::to_string(i),
                                                             lines, /*sentinel=*/true));
      REQUIRE(sentinels.back()->started());
    }
    // Every sentinel knows the others and the replicas (a failover needs the quorum and a
    // replica to promote).
    const std::string others = std::to_string(o.sentinels - 1) + " elements";
    const std::string reps = std::to_string(o.replicas) + " elements";
    for (const auto& s : sentinels) {
      INFO("sentinel on port " << s->port());
      REQUIRE(eventually(
          [&] {
            return redis_ask(s->port(), creds.sentinel, {"SENTINEL", "sentinels", m}) == others &&
                   redis_ask(s->port(), creds.sentinel, {"SENTINEL", "replicas", m}) == reps;
          },
          std::chrono::seconds(30)));
    }
  }

  // A SentinelPool's configuration for this deployment (the data nodes' credentials).
  redis::SentinelConfig sentinel_config(std::string sentinel_password) const {
    redis::SentinelConfig c{.name = kSentinelMaster};
    for (const auto& s : sentinels) c.sentinels.push_back({"127.0.0.1", s->port()});
    c.sentinel_password = std::move(sentinel_password);
    c.primary = sentinel_data_config(creds);
    return c;
  }
};

}  // namespace quota::testing
