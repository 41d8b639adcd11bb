// Tests of attempts over Redis (quota/redis/gateway_store.hpp, quota/gateway/gateway.hpp)
// that meet an error, against a real redis-server behind a proxy that loses one reply:
// when the decision's script call fails (its reply lost: the outcome is unknown), the
// route's fail mode answers the request, and the attempt is abandoned rather than
// recorded with that answer, so a retry with the same id — from this process or
// another — decides afresh, and the decision it makes is the one replayed.
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

TEST_CASE("redis attempts: a decision whose reply was lost is not recorded as the 503") {
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
  // Load both scripts first, so that the reply lost is the decision's.
  REQUIRE(a.decide(read("warm", "warm-1"), Nanos{0})->decision.allowed);

  auto bucket = through_proxy.redis_key("{acme}read");
  REQUIRE(bucket.ok());
  proxy.drop_reply_to(*bucket);
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
  }
}
