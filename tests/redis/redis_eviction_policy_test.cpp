// Eviction safety (handshake.hpp): every connect reads maxmemory-policy, and a live pool
// reads it again once per ConnectionConfig::eviction_recheck (1 s). Against servers the
// test starts: allkeys-lru and volatile-lru are refused with kFailedPrecondition naming
// the policy, and nothing is written; noeviction decides; a `CONFIG SET maxmemory-policy
// volatile-lru` on a live server is refused within the recheck interval on every
// connection and store of the pool, until noeviction is set again; EvictionPolicyCheck::
// kAllow decides and counts, before and after such a change; where CONFIG is renamed
// away or not permitted to the ACL user, the store says so once (HandshakeStats) and
// decides.
#include <chrono>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <thread>
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
using quota::testing::RedisServer;

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
  RedisServer server("evict-" + policy, {"maxmemory 64mb", "maxmemory-policy " + policy});
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
  RedisServer server("evict-none", {"maxmemory 64mb", "maxmemory-policy noeviction"});
  REQUIRE(server.started());
  auto pool = std::make_shared<ConnectionPool>(config(server.port()), 2);
  auto store = store_on(pool, "evict-none");
  expect_decides(store);
  CHECK(pool->handshake_stats().connects.load() >= 1);
  CHECK(pool->handshake_stats().evicting.load() == 0);
  CHECK(pool->handshake_stats().policy_unread.load() == 0);
}

// Decisions over `store` (a drained bucket: each a deny) every 20 ms from the moment of
// `changed` until one is refused, at most `limit` after it; the time of the refusal from
// `changed`, or nullopt when none was refused. Every decision before it is a deny.
template <typename Decide>
std::optional<std::chrono::milliseconds> refused_after(
    Decide decide, std::chrono::steady_clock::time_point changed, std::chrono::milliseconds limit) {
  while (std::chrono::steady_clock::now() - changed < limit) {
    absl::StatusOr<bool> allowed = decide();
    if (!allowed.ok()) {
      INFO(allowed.status().ToString());
      CHECK(allowed.status().code() == absl::StatusCode::kFailedPrecondition);
      CHECK(allowed.status().message().find("maxmemory-policy volatile-lru") !=
            absl::string_view::npos);
      return std::chrono::duration_cast<std::chrono::milliseconds>(
          std::chrono::steady_clock::now() - changed);
    }
    CHECK_FALSE(*allowed);  // drained: a deny, never a fresh burst
    std::this_thread::sleep_for(20ms);
  }
  return std::nullopt;
}

TEST_CASE("a policy set to evict on a live server is refused within eviction_recheck") {
  RedisServer server("evict-live", {"maxmemory 64mb", "maxmemory-policy noeviction"});
  REQUIRE(server.started());
  auto pool = std::make_shared<ConnectionPool>(config(server.port()), 3);
  REQUIRE(pool->config().eviction_recheck == std::chrono::seconds(1));
  auto store = store_on(pool, "evict-live");
  quota::redis::GatewayStore gw_store(
      {.pool = pool, .prefix = quota::testing::unique_prefix("evict-live-gw")});
  quota::gateway::RuleRegistry registry(
      quota::testing::build(quota::testing::levels_spec(1, kPolicy)));
  quota::gateway::Gateway gw(gw_store, registry);
  auto decide_store = [&]() -> absl::StatusOr<bool> {
    auto d = store.apply(kPolicy, "{acme}read", Nanos{0}, 1);
    if (!d.ok()) return d.status();
    return d->allowed;
  };
  auto decide_gateway = [&]() -> absl::StatusOr<bool> {
    auto r = gw.decide({.who = {.tenant = "acme", .plan = "free"}, .route = "read"}, Nanos{0});
    if (!r.ok()) return r.status();
    return r->decision.allowed;
  };
  expect_decides(store);  // the bucket drained: 2 admitted, then denied
  for (int i = 0; i < 3; ++i) {
    auto r = decide_gateway();
    REQUIRE(r.ok());
    CHECK(*r == (i < 2));
  }
  quota::redis::Connection admin(config(server.port(), EvictionPolicyCheck::kSkip));
  REQUIRE(admin.command({"CONFIG", "SET", "maxmemory-policy", "volatile-lru"}).ok());
  const auto changed = std::chrono::steady_clock::now();
  // The bound: one recheck interval, plus the 20 ms between two decisions and slack for
  // a loaded machine.
  const auto bound = std::chrono::milliseconds(1000 + 20 + 300);
  auto at = refused_after(decide_store, changed, bound);
  REQUIRE(at.has_value());
  std::printf("maxmemory-policy volatile-lru set on a live server: refused %lld ms after it\n",
              static_cast<long long>(at->count()));
  CHECK(*at <= bound);
  CHECK(pool->handshake_stats().recheck_refusals.load() >= 1);
  // Every later call, on every connection and through either store, is refused.
  for (int i = 0; i < 6; ++i) {
    auto a = decide_store();
    auto b = decide_gateway();
    REQUIRE_FALSE(a.ok());
    REQUIRE_FALSE(b.ok());
    CHECK(a.status().code() == absl::StatusCode::kFailedPrecondition);
    CHECK(b.status().code() == absl::StatusCode::kFailedPrecondition);
  }
  // Fixed on the server: the next calls decide again, the bucket still drained.
  REQUIRE(admin.command({"CONFIG", "SET", "maxmemory-policy", "noeviction"}).ok());
  auto d = decide_store();
  INFO(d.status().ToString());
  REQUIRE(d.ok());
  CHECK_FALSE(*d);
}

TEST_CASE("kAllow: a policy set to evict on a live server is not re-read; decisions go on") {
  RedisServer server("evict-live-allow", {"maxmemory 64mb", "maxmemory-policy noeviction"});
  REQUIRE(server.started());
  auto pool =
      std::make_shared<ConnectionPool>(config(server.port(), EvictionPolicyCheck::kAllow), 2);
  auto store = store_on(pool, "evict-live-allow");
  expect_decides(store);
  quota::redis::Connection admin(config(server.port(), EvictionPolicyCheck::kSkip));
  REQUIRE(admin.command({"CONFIG", "SET", "maxmemory-policy", "volatile-lru"}).ok());
  const auto changed = std::chrono::steady_clock::now();
  auto at = refused_after(
      [&]() -> absl::StatusOr<bool> {
        auto d = store.apply(kPolicy, "{acme}read", Nanos{0}, 1);
        if (!d.ok()) return d.status();
        return d->allowed;
      },
      changed, 2000ms);
  CHECK_FALSE(at.has_value());
  CHECK(pool->handshake_stats().rechecks.load() == 0);
}

TEST_CASE("EvictionPolicyCheck::kAllow decides over an evicting policy, counted and warned once") {
  RedisServer server("evict-allow", {"maxmemory 64mb", "maxmemory-policy allkeys-lru"});
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
    RedisServer server("evict-noconfig", {"maxmemory 64mb", "maxmemory-policy allkeys-lru",
                                               "rename-command CONFIG \"\""});
    REQUIRE(server.started());
    auto pool = std::make_shared<ConnectionPool>(config(server.port()), 2);
    auto store = store_on(pool, "evict-noconfig");
    expect_decides(store);
    CHECK(pool->handshake_stats().policy_unread.load() >= 1);
    CHECK(pool->handshake_stats().warned_unread.load());
  }
  SECTION("an ACL user without CONFIG") {
    RedisServer server("evict-noperm",
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
