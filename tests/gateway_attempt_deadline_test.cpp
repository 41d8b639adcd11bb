// Tests of request deadlines (quota/gateway/request.hpp Request::deadline, attempts.hpp)
// with the in-process store: a call past its deadline decides nothing and is answered
// Reason::kAttemptExpired (HTTP 504); a retry of an attempt past the deadline recorded
// with its decision gets kAttemptExpired instead of the decision, and the units it spent
// stay spent. The same semantics over Redis: redis_gateway_attempt_lost_reply_test.cpp.
#include <catch2/catch.hpp>
#include <chrono>

#include "quota/gateway/gateway.hpp"
#include "quota/http.hpp"
#include "quota/store/sharded_store.hpp"
#include "support/gateway_rules.hpp"

using namespace std::chrono_literals;
using quota::Nanos;
using quota::Reason;
using quota::gateway::Gateway;
using quota::gateway::KeyPolicy;
using quota::gateway::Request;
using quota::gateway::RuleRegistry;
using quota::testing::build;

namespace {

using Store = quota::ShardedStore<KeyPolicy>;

// read: 1 unit of a burst of 10, refilled at 1 unit per hour (nothing comes back in a test).
const quota::gateway::RuleSetSpec kSpec = quota::testing::levels_spec(
    1, quota::TokenBucket{.rate = {.units = 1, .per = std::chrono::hours(1)}, .burst = 10});

Request read(const char* id, std::optional<Nanos> deadline) {
  return {.who = {.tenant = "acme", .plan = "free"},
          .route = "read",
          .attempt_id = id,
          .deadline = deadline};
}

std::int64_t remaining_after_one(Gateway& gw, Nanos now) {
  auto r = gw.decide(read("", std::nullopt), now);
  REQUIRE(r.ok());
  return r->decision.remaining;
}

}  // namespace

TEST_CASE("attempt deadline: replayed before it, expired after it, the units stay spent") {
  RuleRegistry registry(build(kSpec));
  Store store;
  Gateway gw(store, registry);
  auto first = gw.decide(read("dl-1", Nanos{5s}), 1s);
  REQUIRE(first.ok());
  CHECK(first->decision.allowed);
  CHECK(first->decision.remaining == 9);
  auto before = gw.decide(read("dl-1", Nanos{5s}), 5s);  // at the deadline: not past it
  REQUIRE(before.ok());
  CHECK(before->replayed);
  CHECK(before->decision == first->decision);
  SECTION("a retry past the deadline") {
    auto after = gw.decide(read("dl-1", Nanos{5s}), 6s);
    REQUIRE(after.ok());
    CHECK_FALSE(after->decision.allowed);
    CHECK(after->decision.reason == Reason::kAttemptExpired);
    CHECK(after->decision.retry_after == quota::kNever);
  }
  SECTION("a retry with a later deadline of its own: the attempt's deadline holds") {
    auto after = gw.decide(read("dl-1", Nanos{100s}), 6s);
    REQUIRE(after.ok());
    CHECK(after->replayed);
    CHECK(after->decision.reason == Reason::kAttemptExpired);
    CHECK(after->decision.remaining == 9);  // as of the recorded decision
  }
  SECTION("a retry without a deadline of its own: the attempt's deadline holds") {
    auto after = gw.decide(read("dl-1", std::nullopt), 6s);
    REQUIRE(after.ok());
    CHECK(after->replayed);
    CHECK(after->decision.reason == Reason::kAttemptExpired);
  }
  // Spent once, never given back: 10 − 1 − 1.
  CHECK(remaining_after_one(gw, 7s) == 8);
}

TEST_CASE("attempt deadline: a call past its deadline decides nothing and records nothing") {
  RuleRegistry registry(build(kSpec));
  Store store;
  Gateway gw(store, registry);
  auto late = gw.decide(read("dl-2", Nanos{5s}), 6s);
  REQUIRE(late.ok());
  CHECK_FALSE(late->replayed);
  CHECK_FALSE(late->decision.allowed);
  CHECK(late->decision.reason == Reason::kAttemptExpired);
  CHECK(late->decision.version == 1);
  CHECK(gw.attempts().size() == 0);
  CHECK(remaining_after_one(gw, 6s) == 9);
  // The same id within a new deadline is decided (nothing was recorded for it).
  auto fresh = gw.decide(read("dl-2", Nanos{20s}), 7s);
  REQUIRE(fresh.ok());
  CHECK_FALSE(fresh->replayed);
  CHECK(fresh->decision.allowed);
  CHECK(fresh->decision.remaining == 8);
  SECTION("without an attempt id too") {
    auto plain = gw.decide(read("", Nanos{5s}), 6s);
    REQUIRE(plain.ok());
    CHECK(plain->decision.reason == Reason::kAttemptExpired);
    CHECK(remaining_after_one(gw, 6s) == 7);
  }
}

TEST_CASE("attempt deadline: kAttemptExpired is HTTP 504 \"attempt_expired\"") {
  RuleRegistry registry(build(kSpec));
  Store store;
  Gateway gw(store, registry);
  auto late = gw.decide(read("dl-3", Nanos{0}), 1s);
  REQUIRE(late.ok());
  const auto a =
      quota::http::answer(late->decision, {.name = "read", .quota = 10, .window_seconds = 36000});
  CHECK(a.status == 504);
  CHECK(a.reason == "attempt_expired");
  CHECK(quota::to_string(Reason::kAttemptExpired) == "attempt_expired");
}
