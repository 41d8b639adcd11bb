// Eviction safety (handshake.hpp): every connect reads maxmemory-policy. Against servers
// the test starts: allkeys-lru and volatile-lru are refused with kFailedPrecondition
// naming the policy, and nothing is written; noeviction decides; EvictionPolicyCheck::
// kAllow decides and counts; where CONFIG is renamed away or not permitted to the ACL
// user, the store says so once (HandshakeStats) and decides.
#include <chrono>
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
using quota::redis::EvictionPolicyCheck;
using quota::testing::ConfiguredServer;

namespace {

const TokenBucket kPolicy{.rate = {.units = 1, .per = std::chrono::hours(1)}, .burst = 2};

ConnectionConfig config(int port, EvictionPolicyCheck check = EvictionPolicyCheck::kRefuse) {
  return ConnectionConfig{
      .host = "127.0.0.1", .port = port, .deadline = 2s, .eviction_check = check};
}

// The number of keys on the server (over a connection that skips the check).
long long dbsize(ConnectionConfig c) {
  c.eviction_check = EvictionPolicyCheck::kSkip;
  quota::redis::Connection conn(c);
  auto r = conn.command({"DBSIZE"});
  REQUIRE(r.ok());
  REQUIRE((*r)->type == REDIS_REPLY_INTEGER);
  return (*r)->integer;
}

RedisStore<TokenBucket> store_on(std::shared_ptr<ConnectionPool> pool, const std::string& test) {
  return RedisStore<TokenBucket>(
      RedisStoreOptions{.pool = std::move(pool), .prefix = quota::testing::unique_prefix(test)});
}

void expect_decides(RedisStore<TokenBucket>& store) {
  for (int i = 0; i < 3; ++i) {
    auto d = store.apply(kPolicy, "{acme}read", Nanos{0}, 1);
    INFO(d.status().ToString());
    REQUIRE(d.ok());
    CHECK(d->allowed == (i < 2));
  }
}

}  // namespace

TEST_CASE("an evicting maxmemory-policy is refused with the policy named; nothing is written") {
  const std::string policy = GENERATE(std::string("allkeys-lru"), std::string("volatile-lru"));
  ConfiguredServer server("evict-" + policy, {"maxmemory 64mb", "maxmemory-policy " + policy});
  REQUIRE(server.started());
  auto pool = std::make_shared<ConnectionPool>(config(server.port()), 2);
  auto store = store_on(pool, "evict-refused");
  for (int i = 0; i < 2; ++i) {
    auto d = store.apply(kPolicy, "{acme}read", Nanos{0}, 1);
    INFO(d.status().ToString());
    REQUIRE_FALSE(d.ok());
    CHECK(d.status().code() == absl::StatusCode::kFailedPrecondition);
    CHECK(d.status().message().find("maxmemory-policy " + policy) != absl::string_view::npos);
    CHECK(d.status().message().find("noeviction") != absl::string_view::npos);
  }
  CHECK(dbsize(config(server.port())) == 0);
  CHECK(pool->handshake_stats().evicting.load() == 0);

  SECTION("the gateway store refuses too: an error, not a decision") {
    quota::redis::GatewayStore gw_store(
        {.pool = pool, .prefix = quota::testing::unique_prefix("evict-gw")});
    quota::gateway::RuleRegistry registry(
        quota::testing::build(quota::testing::levels_spec(1, kPolicy)));
    quota::gateway::Gateway gw(gw_store, registry);
    auto r = gw.decide({.who = {.tenant = "acme", .plan = "free"}, .route = "read"}, Nanos{0});
    INFO(r.status().ToString());
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().code() == absl::StatusCode::kFailedPrecondition);
    CHECK(dbsize(config(server.port())) == 0);
  }
  SECTION("fixed on the server: the next call decides") {
    quota::redis::Connection admin(config(server.port(), EvictionPolicyCheck::kSkip));
    REQUIRE(admin.command({"CONFIG", "SET", "maxmemory-policy", "noeviction"}).ok());
    expect_decides(store);
  }
}

TEST_CASE("noeviction is accepted") {
  ConfiguredServer server("evict-none", {"maxmemory 64mb", "maxmemory-policy noeviction"});
  REQUIRE(server.started());
  auto pool = std::make_shared<ConnectionPool>(config(server.port()), 2);
  auto store = store_on(pool, "evict-none");
  expect_decides(store);
  CHECK(pool->handshake_stats().connects.load() >= 1);
  CHECK(pool->handshake_stats().evicting.load() == 0);
  CHECK(pool->handshake_stats().policy_unread.load() == 0);
}

TEST_CASE("EvictionPolicyCheck::kAllow decides over an evicting policy, counted and warned once") {
  ConfiguredServer server("evict-allow", {"maxmemory 64mb", "maxmemory-policy allkeys-lru"});
  REQUIRE(server.started());
  auto pool =
      std::make_shared<ConnectionPool>(config(server.port(), EvictionPolicyCheck::kAllow), 2);
  auto store = store_on(pool, "evict-allow");
  expect_decides(store);
  const auto& stats = pool->handshake_stats();
  CHECK(stats.evicting.load() >= 1);
  CHECK(stats.evicting.load() == stats.connects.load());
  CHECK(stats.warned_evicting.load());
}

TEST_CASE("CONFIG disabled (renamed away) or not permitted: said once, and decided") {
  SECTION("rename-command CONFIG \"\" in the config file, even over allkeys-lru") {
    ConfiguredServer server("evict-noconfig", {"maxmemory 64mb", "maxmemory-policy allkeys-lru",
                                               "rename-command CONFIG \"\""});
    REQUIRE(server.started());
    auto pool = std::make_shared<ConnectionPool>(config(server.port()), 2);
    auto store = store_on(pool, "evict-noconfig");
    expect_decides(store);
    CHECK(pool->handshake_stats().policy_unread.load() >= 1);
    CHECK(pool->handshake_stats().warned_unread.load());
  }
  SECTION("an ACL user without CONFIG") {
    ConfiguredServer server("evict-noperm",
                            {"user bob on >bob-pw ~* &* +@all -config", "user default off"});
    REQUIRE(server.started());
    ConnectionConfig c = config(server.port());
    c.username = "bob";
    c.password = "bob-pw";
    auto pool = std::make_shared<ConnectionPool>(c, 2);
    auto store = store_on(pool, "evict-noperm");
    expect_decides(store);
    CHECK(pool->handshake_stats().policy_unread.load() >= 1);
  }
}

TEST_CASE("a Cluster whose nodes run volatile-lru: refused on every node") {
  quota::testing::ScratchCluster cluster("evict-cluster",
                                         {"maxmemory 64mb", "maxmemory-policy volatile-lru"},
                                         config(0, EvictionPolicyCheck::kSkip));
  REQUIRE(cluster.ok());
  auto pool = std::make_shared<quota::redis::ClusterPool>(cluster.config(0, config(0)), 2);
  RedisStore<TokenBucket> store(RedisStoreOptions{
      .pool = nullptr, .prefix = quota::testing::unique_prefix("evict-cluster"), .cluster = pool});
  auto d = store.apply(kPolicy, "{acme}read", Nanos{0}, 1);
  INFO(d.status().ToString());
  REQUIRE_FALSE(d.ok());
  CHECK(d.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK(d.status().message().find("volatile-lru") != absl::string_view::npos);
}
