// Tests of RedisStore (quota/redis/redis_store.hpp) as a Limiter's store, for every
// policy on the server's time, and of quota/redis/keys.hpp: one hash slot per tenant, and
// the keys and prefixes that are rejected.
#include <chrono>
#include <string>

#include <catch2/catch.hpp>

#include "quota/limiter.hpp"
#include "quota/policy/fixed_window.hpp"
#include "quota/policy/sliding_log.hpp"
#include "quota/policy/sliding_window_estimate.hpp"
#include "quota/policy/token_bucket.hpp"
#include "quota/redis/redis_store.hpp"
#include "support/printers.hpp"
#include "support/redis_server.hpp"
#include "support/store_fixtures.hpp"

using namespace std::chrono_literals;
using quota::Decision;
using quota::Nanos;
using quota::Reason;
using quota::RedisStore;
using quota::RedisStoreOptions;
using quota::TokenBucket;
using quota::redis::TimeSource;
using quota::testing::kTen;
using quota::testing::options;

TEST_CASE("Limiter<TokenBucket, RedisStore> spends a shared budget with the server's time") {
  auto limiter = quota::Limiter<TokenBucket, RedisStore>::create(
      {.rate = {.units = 1, .per = 1h}, .burst = 5}, options("limiter", TimeSource::kServer));
  REQUIRE(limiter.ok());
  auto key = quota::redis::tenant_key("acme", "read");
  REQUIRE(key.ok());
  CHECK(*key == "{acme}read");
  for (int i = 0; i < 5; ++i) {
    auto d = limiter->acquire(*key, 1);
    REQUIRE(d.ok());
    CHECK(d->allowed);
    CHECK(d->remaining == 4 - i);
  }
  auto denied = limiter->acquire(*key, 1);
  REQUIRE(denied.ok());
  CHECK_FALSE(denied->allowed);
  CHECK(denied->reason == Reason::kOverLimit);
  // A little less than one hour (the refill of one unit) is left, as the server sees it.
  CHECK(denied->retry_after > 3590s);
  CHECK(denied->retry_after <= 3600s);
  auto too_big = limiter->acquire(*key, 6);
  REQUIRE(too_big.ok());
  CHECK(too_big->reason == Reason::kCostExceedsBurst);
  CHECK(too_big->retry_after == quota::kNever);
  auto invalid = limiter->acquire(*key, 0);
  REQUIRE(invalid.ok());
  CHECK(invalid->reason == Reason::kInvalidCost);
}

TEST_CASE(
    "keys: one hash slot per tenant; braces, control bytes and oversized parts are rejected") {
  using quota::redis::split_key;
  using quota::redis::tenant_key;
  CHECK(tenant_key("t", "").ok());
  CHECK_FALSE(tenant_key("", "read").ok());
  CHECK_FALSE(tenant_key("evil}x{victim", "read").ok());
  CHECK_FALSE(tenant_key("acme", "r{victim}").ok());
  CHECK_FALSE(tenant_key("acme", "read\n").ok());
  CHECK_FALSE(tenant_key(std::string(quota::redis::kMaxTenantBytes + 1, 'a'), "read").ok());
  CHECK_FALSE(tenant_key("acme", std::string(quota::redis::kMaxRouteBytes + 1, 'r')).ok());

  auto tenant = split_key("{acme}read");
  REQUIRE(tenant.ok());
  CHECK(tenant->tag == "acme");
  CHECK(tenant->rest == "read");
  auto plain = split_key("tenant-7:read");
  REQUIRE(plain.ok());
  CHECK(plain->tag == "tenant-7:read");
  for (const char* bad :
       {"{}read", "{acme", "{acme}re{ad", "{acme}read}", "a{b}c", "x}y", "line\nbreak", ""}) {
    INFO(bad);
    CHECK_FALSE(split_key(bad).ok());
  }

  RedisStore<TokenBucket> store(options("keys"));
  auto d = store.apply(kTen, "{victim}read}x", Nanos{0}, 1);
  REQUIRE_FALSE(d.ok());
  CHECK(absl::IsInvalidArgument(d.status()));
  auto rk = store.redis_key("{acme}read");
  REQUIRE(rk.ok());
  CHECK(*rk == store.options().prefix + "{acme}read");
  RedisStore<TokenBucket> braces(
      RedisStoreOptions{.pool = quota::testing::redis_pool(1), .prefix = "p{x}"});
  CHECK(absl::IsInvalidArgument(braces.apply(kTen, "k", Nanos{0}, 1).status()));
}

TEMPLATE_TEST_CASE("every policy works as Limiter<P, RedisStore> with the server's time", "",
                   quota::FixedWindow, quota::SlidingLog, quota::SlidingWindowEstimate) {
  auto limiter = quota::Limiter<TestType, RedisStore>::create(
      TestType{.limit = 3, .window = std::chrono::hours(1)},
      options(std::string("limiter-") + std::to_string(sizeof(typename TestType::State)),
              TimeSource::kServer));
  REQUIRE(limiter.ok());
  auto key = quota::redis::tenant_key("acme", "window");
  REQUIRE(key.ok());
  for (int i = 0; i < 3; ++i) {
    auto d = limiter->acquire(*key, 1);
    REQUIRE(d.ok());
    CHECK(d->allowed);
    CHECK(d->remaining == 2 - i);
  }
  auto denied = limiter->acquire(*key, 1);
  REQUIRE(denied.ok());
  CHECK_FALSE(denied->allowed);
  CHECK(denied->reason == Reason::kOverLimit);
  CHECK(denied->retry_after > Nanos{0});
  CHECK(denied->retry_after <= std::chrono::hours(2));
}
