// AUTH against real servers that require it (handshake.hpp): a password (requirepass)
// and an ACL user, on a standalone server and on a Cluster of 3 masters, each started by
// the test. Right credentials decide; a wrong password, an unknown user or none at all
// is kUnauthenticated naming authentication — through RedisStore and through the Redis
// gateway store — never a decision, and each call makes one connect (no retry loop).
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "quota/gateway/gateway.hpp"
#include "quota/redis/gateway_store.hpp"
#include "quota/redis/redis_store.hpp"
#include "support/gateway_rules.hpp"
#include "support/redis_cluster.hpp"
#include "support/redis_server.hpp"

using namespace std::chrono_literals;
using quota::Nanos;
using quota::RedisStore;
using quota::RedisStoreOptions;
using quota::TokenBucket;
using quota::redis::ConnectionConfig;
using quota::redis::ConnectionPool;
using quota::testing::RedisServer;

namespace {

const TokenBucket kPolicy{.rate = {.units = 1, .per = std::chrono::hours(1)}, .burst = 3};

// An ACL user with every right on every key, and the default user off.
const std::vector<std::string> kAclLines = {"user alice on >alice-pw ~* &* +@all",
                                            "user default off"};

ConnectionConfig config(int port, std::string username, std::string password) {
  ConnectionConfig c{.host = "127.0.0.1", .port = port, .deadline = 2s};
  c.username = std::move(username);
  c.password = std::move(password);
  return c;
}

// Three decisions on one key with burst 3: all allowed when the credentials are right.
void expect_decides(RedisStore<TokenBucket>& store, const std::string& key) {
  for (int i = 0; i < 3; ++i) {
    auto d = store.apply(kPolicy, key, Nanos{0}, 1);
    INFO(d.status().ToString());
    REQUIRE(d.ok());
    CHECK(d->allowed);
  }
  auto d = store.apply(kPolicy, key, Nanos{0}, 1);
  REQUIRE(d.ok());
  CHECK_FALSE(d->allowed);
}

// Each call fails with kUnauthenticated naming authentication, and makes one connect.
void expect_unauthenticated(RedisStore<TokenBucket>& store, const ConnectionPool& pool,
                            const std::string& key, const std::string& names) {
  const auto before = pool.handshake_stats().connects.load();
  for (int i = 0; i < 3; ++i) {
    auto d = store.apply(kPolicy, key, Nanos{0}, 1);
    INFO(d.status().ToString());
    REQUIRE_FALSE(d.ok());
    CHECK(d.status().code() == absl::StatusCode::kUnauthenticated);
    CHECK(d.status().message().find("authentication") != absl::string_view::npos);
    CHECK(d.status().message().find(names) != absl::string_view::npos);
  }
  CHECK(pool.handshake_stats().connects.load() - before == 3);
}

RedisStore<TokenBucket> store_on(std::shared_ptr<ConnectionPool> pool, const std::string& test) {
  return RedisStore<TokenBucket>(
      RedisStoreOptions{.pool = std::move(pool), .prefix = quota::testing::unique_prefix(test)});
}

}  // namespace

TEST_CASE("error replies of authentication map to kUnauthenticated, NOPERM to kPermissionDenied") {
  auto status_of = [](std::string text) {
    redisReply r{};
    r.type = REDIS_REPLY_ERROR;
    r.str = text.data();
    r.len = text.size();
    return quota::redis::error_status(r);
  };
  CHECK(status_of("NOAUTH Authentication required.").code() == absl::StatusCode::kUnauthenticated);
  CHECK(status_of("WRONGPASS invalid username-password pair").code() ==
        absl::StatusCode::kUnauthenticated);
  CHECK(status_of("NOPERM this user has no permissions").code() ==
        absl::StatusCode::kPermissionDenied);
  CHECK(status_of("BUSY Redis is busy").code() == absl::StatusCode::kUnavailable);
}

TEST_CASE(
    "standalone with requirepass: the right password decides, a wrong or missing one is "
    "kUnauthenticated") {
  RedisServer server("auth-pass", {"requirepass s3cret"});
  REQUIRE(server.started());
  SECTION("right password") {
    auto pool = std::make_shared<ConnectionPool>(config(server.port(), "", "s3cret"), 2);
    auto store = store_on(pool, "auth-pass-ok");
    expect_decides(store, "{acme}read");
  }
  SECTION("wrong password") {
    auto pool = std::make_shared<ConnectionPool>(config(server.port(), "", "wrong"), 2);
    auto store = store_on(pool, "auth-pass-wrong");
    expect_unauthenticated(store, *pool, "{acme}read", "default user");
  }
  SECTION("no password: the server's NOAUTH") {
    auto pool = std::make_shared<ConnectionPool>(config(server.port(), "", ""), 2);
    auto store = store_on(pool, "auth-pass-none");
    expect_unauthenticated(store, *pool, "{acme}read", "NOAUTH");
  }
}

TEST_CASE(
    "standalone with an ACL user: user and password decide; a wrong password, an unknown "
    "user or the disabled default user are kUnauthenticated") {
  RedisServer server("auth-acl", kAclLines);
  REQUIRE(server.started());
  SECTION("right user and password") {
    auto pool = std::make_shared<ConnectionPool>(config(server.port(), "alice", "alice-pw"), 2);
    auto store = store_on(pool, "auth-acl-ok");
    expect_decides(store, "{acme}read");
  }
  SECTION("wrong password") {
    auto pool = std::make_shared<ConnectionPool>(config(server.port(), "alice", "nope"), 2);
    auto store = store_on(pool, "auth-acl-wrong");
    expect_unauthenticated(store, *pool, "{acme}read", "user 'alice'");
  }
  SECTION("unknown user") {
    auto pool = std::make_shared<ConnectionPool>(config(server.port(), "mallory", "alice-pw"), 2);
    auto store = store_on(pool, "auth-acl-unknown");
    expect_unauthenticated(store, *pool, "{acme}read", "user 'mallory'");
  }
  SECTION("the default user, which is off") {
    auto pool = std::make_shared<ConnectionPool>(config(server.port(), "", "alice-pw"), 2);
    auto store = store_on(pool, "auth-acl-default");
    expect_unauthenticated(store, *pool, "{acme}read", "default user");
  }
}

TEST_CASE(
    "the Redis gateway store with an ACL user: decides with the right credentials; a wrong "
    "password is an error, not a decision") {
  RedisServer server("auth-gw", kAclLines);
  REQUIRE(server.started());
  const bool right = GENERATE(true, false);
  auto pool = std::make_shared<ConnectionPool>(
      config(server.port(), "alice", right ? "alice-pw" : "wrong"), 2);
  quota::redis::GatewayStore store(
      {.pool = pool, .prefix = quota::testing::unique_prefix("auth-gw")});
  quota::gateway::RuleRegistry registry(
      quota::testing::build(quota::testing::levels_spec(1, kPolicy)));
  quota::gateway::Gateway gw(store, registry);
  const quota::gateway::Request req{.who = {.tenant = "acme", .plan = "free"}, .route = "read"};
  for (int i = 0; i < 4; ++i) {
    auto r = gw.decide(req, Nanos{0});
    INFO(r.status().ToString());
    if (right) {
      REQUIRE(r.ok());
      CHECK(r->decision.allowed == (i < 3));
    } else {
      REQUIRE_FALSE(r.ok());
      CHECK(r.status().code() == absl::StatusCode::kUnauthenticated);
      CHECK(r.status().message().find("authentication") != absl::string_view::npos);
    }
  }
}

TEST_CASE(
    "a Cluster with requirepass and an ACL user: both credentials decide on every node; "
    "wrong ones are kUnauthenticated") {
  // The default user with a password (the nodes' admin and cluster bus need none; a
  // replica would use masterauth) and an ACL user.
  const std::vector<std::string> lines = {"requirepass cluster-pw",
                                          "user alice on >alice-pw ~* &* +@all"};
  const ConnectionConfig admin = config(0, "", "cluster-pw");
  quota::testing::ScratchCluster cluster("auth-cluster", lines, admin);
  REQUIRE(cluster.ok());
  // One tenant per node, found through the slot map.
  auto tenants_per_node = [&](quota::redis::ClusterPool& pool) {
    std::vector<std::string> keys;
    std::vector<std::shared_ptr<ConnectionPool>> seen;
    for (int i = 0; keys.size() < 3 && i < 1000; ++i) {
      const std::string key = "{t" + std::to_string(i) + "}read";
      auto node = pool.for_slot(quota::redis::key_slot(key));
      REQUIRE(node.ok());
      if (std::find(seen.begin(), seen.end(), *node) != seen.end()) continue;
      seen.push_back(*node);
      keys.push_back(key);
    }
    REQUIRE(keys.size() == 3);
    return keys;
  };
  SECTION("the password, and the ACL user: decisions on all three nodes") {
    for (const auto& [user, pw] : {std::pair<std::string, std::string>{"", "cluster-pw"},
                                   std::pair<std::string, std::string>{"alice", "alice-pw"}}) {
      auto pool =
          std::make_shared<quota::redis::ClusterPool>(cluster.config(0, config(0, user, pw)), 2);
      RedisStore<TokenBucket> store(
          RedisStoreOptions{.pool = nullptr,
                            .prefix = quota::testing::unique_prefix("auth-cluster-" + user),
                            .cluster = pool});
      for (const auto& key : tenants_per_node(*pool)) expect_decides(store, key);
      // And the gateway store on the same cluster.
      quota::redis::GatewayStore gw_store(
          {.pool = nullptr,
           .prefix = quota::testing::unique_prefix("auth-cluster-gw-" + user),
           .cluster = pool});
      quota::gateway::RuleRegistry registry(
          quota::testing::build(quota::testing::levels_spec(1, kPolicy)));
      quota::gateway::Gateway gw(gw_store, registry);
      auto r = gw.decide({.who = {.tenant = "acme", .plan = "free"}, .route = "read"}, Nanos{0});
      INFO(r.status().ToString());
      REQUIRE(r.ok());
      CHECK(r->decision.allowed);
    }
  }
  SECTION("a wrong password and an unknown user: kUnauthenticated, also for the slot map") {
    for (const auto& [user, pw] : {std::pair<std::string, std::string>{"", "wrong"},
                                   std::pair<std::string, std::string>{"mallory", "alice-pw"}}) {
      auto pool =
          std::make_shared<quota::redis::ClusterPool>(cluster.config(0, config(0, user, pw)), 2);
      RedisStore<TokenBucket> store(
          RedisStoreOptions{.pool = nullptr,
                            .prefix = quota::testing::unique_prefix("auth-cluster-bad"),
                            .cluster = pool});
      auto d = store.apply(kPolicy, "{acme}read", Nanos{0}, 1);
      INFO(d.status().ToString());
      REQUIRE_FALSE(d.ok());
      CHECK(d.status().code() == absl::StatusCode::kUnauthenticated);
      CHECK(d.status().message().find("authentication") != absl::string_view::npos);
    }
  }
}
