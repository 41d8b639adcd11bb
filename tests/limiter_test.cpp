// Tests for quota/limiter.hpp: construction validates the policy, keys are bounded,
// the clock is read for each decision.
#include <chrono>
#include <string>

#include <catch2/catch.hpp>

#include "quota/clock.hpp"
#include "quota/limiter.hpp"
#include "quota/policy/token_bucket.hpp"
#include "quota/store/local_store.hpp"
#include "support/printers.hpp"

using namespace std::chrono_literals;
using quota::ManualClock;
using quota::TokenBucket;

using LocalLimiter = quota::Limiter<TokenBucket, quota::LocalStore, ManualClock>;

TEST_CASE("create rejects invalid policies with the field named", "[limiter]") {
  auto bad = LocalLimiter::create({.rate = {.units = 1, .per = 1s}, .burst = 0});
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK_THAT(std::string(bad.status().message()), Catch::Contains("burst"));
}

TEST_CASE("acquire uses the limiter's clock", "[limiter]") {
  ManualClock clock(10s);
  auto limiter = LocalLimiter::create({.rate = {.units = 2, .per = 1s}, .burst = 2}, {}, clock);
  REQUIRE(limiter.ok());
  REQUIRE(limiter->acquire("t:read", 2)->allowed);
  auto d = limiter->acquire("t:read", 1);
  REQUIRE(d.ok());
  CHECK_FALSE(d->allowed);
  CHECK(d->retry_after == 500ms);
  clock.advance(500ms);
  CHECK(limiter->acquire("t:read", 1)->allowed);
}

TEST_CASE("keys must be 1..kMaxLimiterKeyBytes bytes; others touch no state", "[limiter]") {
  ManualClock clock;
  auto limiter = LocalLimiter::create({.rate = {.units = 1, .per = 1s}, .burst = 1}, {}, clock);
  REQUIRE(limiter.ok());
  auto empty = limiter->acquire("", 1);
  REQUIRE_FALSE(empty.ok());
  CHECK(empty.status().code() == absl::StatusCode::kInvalidArgument);
  const std::string longest(quota::kMaxLimiterKeyBytes, 'k');
  CHECK(limiter->acquire(longest, 1).ok());
  auto too_long = limiter->acquire(longest + "k", 1);
  REQUIRE_FALSE(too_long.ok());
  CHECK_THAT(std::string(too_long.status().message()),
             Catch::Contains("257 bytes") && Catch::Contains("256"));
  CHECK(limiter->store().size() == 1);
}

TEST_CASE("the default limiter is thread-safe: ShardedStore and SteadyClock", "[limiter]") {
  auto limiter = quota::Limiter<TokenBucket>::create({.rate = {.units = 0, .per = 1s}, .burst = 4});
  REQUIRE(limiter.ok());
  int admitted = 0;
  for (int i = 0; i < 10; ++i) admitted += limiter->acquire("t:read")->allowed;
  CHECK(admitted == 4);
}
