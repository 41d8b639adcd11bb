// Tests of attempts over Redis (quota/redis/gateway_store.hpp, quota/gateway/gateway.hpp)
// that meet an error, against a real redis-server behind a proxy (support/lossy_proxy.hpp):
// a decision's script call that never reached the server (the proxy drops the request),
// or that the server answered with an error, records nothing; the route's fail mode
// answers the request, and a retry with the same id — from this process or another —
// decides afresh, and the decision it makes is the one replayed. (A reply lost after the
// script ran is replayed: redis_gateway_attempt_lost_reply_test.cpp.)
#include <chrono>
#include <memory>
#include <string>

#include <catch2/catch.hpp>

#include "quota/gateway/gateway.hpp"
#include "quota/redis/gateway_store.hpp"
#include "support/gateway_rules.hpp"
#include "support/lossy_proxy.hpp"
#include "support/printers.hpp"
#include "support/redis_server.hpp"

using namespace std::chrono_literals;
using quota::Nanos;
using quota::Reason;
using quota::TokenBucket;
using quota::gateway::Gateway;
using quota::gateway::Request;
using quota::gateway::RuleRegistry;
using quota::redis::GatewayStore;
using quota::testing::build;

namespace {

constexpr quota::Rate kSlow{.units = 1, .per = std::chrono::hours(1)};

Request read(const char* tenant, const char* id = "") {
  return {.who = {.tenant = tenant, .plan = "free"}, .route = "read", .attempt_id = id};
}

}  // namespace

TEST_CASE("redis attempts: a decision that never reached the server is not recorded as the 503") {
  static int runs = 0;  // a fresh key space per run (Catch runs it again per SECTION)
  quota::testing::LossyProxy proxy(quota::testing::redis_port());
  auto cfg = quota::testing::redis_config();
  cfg.port = proxy.port();
  GatewayStore through_proxy(
      {.pool = std::make_shared<quota::redis::ConnectionPool>(cfg, 1),
       .prefix = quota::testing::unique_prefix("gw-attempt-errors-" + std::to_string(++runs))});
  GatewayStore direct(
      {.pool = quota::testing::redis_pool(1), .prefix = through_proxy.options().prefix});
  const auto spec =
      quota::testing::levels_spec(1, TokenBucket{.rate = kSlow, .burst = 10});  // fails closed
  RuleRegistry registry_a(build(spec));
  RuleRegistry registry_b(build(spec));
  Gateway a(through_proxy, registry_a);
  Gateway b(direct, registry_b);
  // Load the script first, so that the request dropped is the decision's.
  REQUIRE(a.decide(read("warm", "warm-1"), Nanos{0})->decision.allowed);

  auto bucket = through_proxy.redis_key("{acme}read");
  REQUIRE(bucket.ok());
  proxy.drop_request_to(*bucket);
  auto lost = a.decide(read("acme", "err-1"), Nanos{0});
  REQUIRE(lost.ok());
  CHECK(proxy.dropped() == 1);
  CHECK_FALSE(lost->decision.allowed);
  CHECK(lost->decision.reason == Reason::kUnavailable);

  SECTION("the retry through the same gateway decides") {
    auto retry = a.decide(read("acme", "err-1"), 1s);
    REQUIRE(retry.ok());
    CHECK_FALSE(retry->replayed);
    CHECK(retry->decision.allowed);
    CHECK(retry->decision.reason == Reason::kAllowed);
    CHECK(retry->decision.remaining == 9);
    auto replay = b.decide(read("acme", "err-1"), 2s);
    REQUIRE(replay.ok());
    CHECK(replay->replayed);
    CHECK(replay->decision.allowed);
    CHECK(replay->decision.remaining == retry->decision.remaining);
  }
  SECTION("the retry through another gateway process decides") {
    auto retry = b.decide(read("acme", "err-1"), 1s);
    REQUIRE(retry.ok());
    CHECK_FALSE(retry->replayed);
    CHECK(retry->decision.allowed);
    CHECK(retry->decision.reason == Reason::kAllowed);
    CHECK(retry->decision.remaining == 9);
  }
}

TEST_CASE("redis attempts: a fail-open admission is not the attempt's decision either") {
  quota::testing::LossyProxy proxy(quota::testing::redis_port());
  auto cfg = quota::testing::redis_config();
  cfg.port = proxy.port();
  GatewayStore store({.pool = std::make_shared<quota::redis::ConnectionPool>(cfg, 1),
                      .prefix = quota::testing::unique_prefix("gw-attempt-open")});
  RuleRegistry registry(build(quota::testing::fail_open_spec(100)));  // read fails open
  Gateway gw(store, registry);
  REQUIRE(gw.decide(read("warm", "warm-1"), Nanos{0})->decision.allowed);
  auto bucket = store.redis_key("{acme}read");
  REQUIRE(bucket.ok());
  proxy.drop_request_to(*bucket);
  auto open = gw.decide(read("acme", "open-1"), Nanos{0});
  REQUIRE(open.ok());
  CHECK(proxy.dropped() == 1);
  CHECK(open->decision.reason == Reason::kFailOpen);
  auto retry = gw.decide(read("acme", "open-1"), 1s);
  REQUIRE(retry.ok());
  CHECK_FALSE(retry->replayed);
  CHECK(retry->decision.reason == Reason::kAllowed);
  CHECK(retry->decision.remaining == 99);  // decided by the store, not the emergency bucket
}

TEST_CASE("redis attempts: an error reply from the script records nothing") {
  GatewayStore store({.pool = quota::testing::redis_pool(1),
                      .prefix = quota::testing::unique_prefix("gw-attempt-corrupt")});
  RuleRegistry registry(
      build(quota::testing::levels_spec(1, TokenBucket{.rate = kSlow, .burst = 10})));
  Gateway gw(store, registry);
  auto bucket = store.redis_key("{acme}read");
  REQUIRE(bucket.ok());
  auto admin = quota::testing::redis_pool(1);  // the store's one connection stays free
  auto lease = admin->acquire();
  REQUIRE(lease.ok());
  REQUIRE((*lease)->command({"SET", *bucket, "not a gateway state"}).ok());
  auto corrupt = gw.decide(read("acme", "bad-1"), Nanos{0});
  CHECK(corrupt.status().code() == absl::StatusCode::kDataLoss);
  const std::string record = store.options().prefix + "a{acme}bad-1";
  auto exists = (*lease)->command({"EXISTS", record});
  REQUIRE(exists.ok());
  CHECK((*exists)->integer == 0);
  REQUIRE((*lease)->command({"DEL", *bucket}).ok());
  auto retry = gw.decide(read("acme", "bad-1"), 1s);
  REQUIRE(retry.ok());
  CHECK_FALSE(retry->replayed);
  CHECK(retry->decision.allowed);
  CHECK(retry->decision.remaining == 9);
}
