// Tests for the gateway twin's compact reply (twin/gateway_quick.hpp), as decoded by
// GatewayTwin::parse_decide (twin/gateway_codec.hpp): per level its outcome, tokens and
// carry, from which the caller derives the reason, remaining, retry_after and
// reset_after. The derivation is compared with TokenBucket::apply on random states (no
// server: replies are built by hand), and malformed replies must be errors, never
// decisions. The script that sends these replies is tested against the in-process gateway
// end to end by redis_gateway_differential_test and the rule-sets differential test.
#include <chrono>
#include <cstdint>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "quota/policy/fixed_window.hpp"
#include "quota/policy/token_bucket.hpp"
#include "quota/redis/gateway_store.hpp"
#include "support/policy_variants.hpp"
#include "support/printers.hpp"
#include "support/seed.hpp"

using namespace std::chrono_literals;
using quota::Decision;
using quota::Nanos;
using quota::Reason;
using quota::TokenBucket;
using quota::gateway::LevelCheck;
using quota::gateway::RulePolicy;
using quota::redis::GatewayTwin;

namespace {

// A reply array of integers built by hand.
struct FakeReply {
  std::vector<redisReply> elements;
  std::vector<redisReply*> pointers;
  redisReply top{};

  explicit FakeReply(const std::vector<long long>& values) : elements(values.size()) {
    for (std::size_t i = 0; i < values.size(); ++i) {
      elements[i].type = REDIS_REPLY_INTEGER;
      elements[i].integer = values[i];
      pointers.push_back(&elements[i]);
    }
    top.type = REDIS_REPLY_ARRAY;
    top.elements = pointers.size();
    top.element = pointers.data();
  }
};

// The twin's reduced period p = rate.per / g, g = gcd(rate.units·10^6, rate.per).
std::int64_t reduced_gcd(const TokenBucket& tb) {
  const std::int64_t per = tb.rate.per.count();
  return tb.rate.units == 0 ? per : std::gcd(quota::to_micro(tb.rate.units), per);
}

}  // namespace

TEST_CASE("a compact gateway reply gives TokenBucket::apply's decision") {
  const std::uint64_t seed = quota::testing::test_seed(20261203);
  INFO("seed " << seed);
  std::mt19937_64 rng(seed);
  quota::testing::OutcomeTally tally;
  for (int i = 0; i < 20'000; ++i) {
    TokenBucket tb = quota::testing::random_token_bucket(rng, 2'000'000'000);
    if (rng() % 8 == 0) tb.rate.units = 0;
    if (!quota::redis::GatewayStore::check(tb).ok()) continue;
    const std::int64_t cap = quota::to_micro(tb.burst);
    const std::int64_t g = reduced_gcd(tb);
    TokenBucket::State s;
    s.last = static_cast<std::int64_t>(rng() >> 4);
    const auto below = [&](std::int64_t n) {
      return static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(n));
    };
    // tokens in [-capacity, capacity]: a gateway's charges leave negative tokens
    s.tokens = rng() % 4 == 0 ? cap : below(cap);
    if (rng() % 5 == 0) s.tokens = -below(cap + 1);
    s.carry = s.tokens == cap || tb.rate.units == 0 ? 0 : g * below(tb.rate.per.count() / g);
    const std::int64_t cost = quota::testing::random_cost(rng, tb.burst);
    // At the state's own time: no refill, so the state after apply is what the script
    // writes and answers.
    const Decision want = tb.apply(s, Nanos{s.last}, cost);
    INFO("burst=" << tb.burst << " rate=" << quota::to_string(tb.rate) << " tokens=" << s.tokens
                  << " carry=" << s.carry << " cost=" << cost);
    auto got = GatewayTwin::quick_decision(tb, cost, want.allowed ? 1 : 0, s.tokens, s.carry / g);
    REQUIRE(got.ok());
    REQUIRE(*got == want);
    tally.add(want);
  }
  CHECK(tally.allowed > 1'000);
  CHECK(tally.over > 1'000);
  CHECK(tally.never > 1'000);
}

TEST_CASE("a compact gateway reply decodes per level, the version the caller's") {
  const RulePolicy minute = TokenBucket{.rate = {.units = 60, .per = 60s}, .burst = 10};
  const RulePolicy day = TokenBucket{.rate = {.units = 1000, .per = 24h}, .burst = 1000};
  const LevelCheck levels[] = {{.policy = &minute, .key = "{acme}#m", .cost = 2},
                               {.policy = &day, .key = "{acme}#d", .cost = 2}};
  // both allowed (8 and 998 units left), then the first denied
  const FakeReply both({7, 250'000'000, -2, 1, 8'000'000, 0, 1, 998'000'000, 0});
  auto d = GatewayTwin::parse_decide(both.top, levels, 42);
  REQUIRE(d.ok());
  CHECK(d->time == Nanos{7'250'000'000});
  REQUIRE(d->parts.size() == 2);
  CHECK(d->parts[0].allowed);
  CHECK(d->parts[0].remaining == 8);
  CHECK(d->parts[0].reset_after == 2s);  // 2 units at one per second
  CHECK(d->parts[0].version == 42);
  CHECK(d->parts[1].remaining == 998);
  const FakeReply denied({7, 0, -1, 0, 1'500'000, 0});
  auto x = GatewayTwin::parse_decide(denied.top, levels, 42);
  REQUIRE(x.ok());
  REQUIRE(x->parts.size() == 1);
  CHECK_FALSE(x->parts[0].allowed);
  CHECK(x->parts[0].reason == Reason::kOverLimit);
  CHECK(x->parts[0].remaining == 1);
  CHECK(x->parts[0].retry_after == 500ms);  // 0.5 units more at one per second
}

TEST_CASE("a malformed compact gateway reply is an error, never a decision") {
  const RulePolicy tb = TokenBucket{.rate = {.units = 1, .per = 1s}, .burst = 10};
  const RulePolicy fw = quota::FixedWindow{.limit = 10, .window = 1s};
  const LevelCheck one[] = {{.policy = &tb, .key = "{acme}#a", .cost = 2}};
  const LevelCheck window[] = {{.policy = &fw, .key = "{acme}#w", .cost = 2}};
  const std::vector<std::vector<long long>> bad = {
      {7, 0, -1, 2, 0, 0},                           // outcome 2
      {7, 0, -1, 1, 10'000'001, 0},                  // tokens above the capacity
      {7, 0, -1, 1, -10'000'001, 0},                 // below −capacity
      {7, 0, -1, 1, 5'000'000, 1'000'000'000},       // carry not below the reduced period
      {7, 0, -1, 1, 5'000'000, -1},                  // negative carry
      {7, 0, -1, 0, 2'000'000, 0},                   // denied with enough tokens for the cost
      {7, 0, -1, 1, 5'000'000},                      // too few elements
      {7, 0, -2, 1, 5'000'000, 0, 1, 5'000'000, 0},  // more levels than asked
      {7, 1'000'000'000, -1, 1, 5'000'000, 0},       // nanoseconds out of range
  };
  for (const auto& values : bad) {
    const FakeReply r(values);
    auto d = GatewayTwin::parse_decide(r.top, one, 1);
    INFO("reply element 3: " << values[3] << ", elements " << values.size());
    CHECK(d.status().code() == absl::StatusCode::kUnavailable);
    CHECK(d.status().message().find("malformed reply") != std::string::npos);
  }
  const FakeReply not_a_bucket({7, 0, -1, 1, 5'000'000, 0});
  auto w = GatewayTwin::parse_decide(not_a_bucket.top, window, 1);
  CHECK(w.status().code() == absl::StatusCode::kUnavailable);
  // a cost above the burst is never allowed
  const LevelCheck big[] = {{.policy = &tb, .key = "{acme}#a", .cost = 11}};
  const FakeReply allowed_big({7, 0, -1, 1, 0, 0});
  CHECK(GatewayTwin::parse_decide(allowed_big.top, big, 1).status().code() ==
        absl::StatusCode::kUnavailable);
}
