// Tests for the token bucket twin's compact reply (twin/token_bucket.hpp), as parsed by
// LuaTwin<TokenBucket> in quota/redis/redis_store.hpp: each bucket's state as written and
// its denials, from which the caller derives remaining, retry_after and reset_after. The
// derivation is compared with TokenBucket::apply on random states (no server: replies
// are built by hand), and malformed replies must be errors, never decisions. The script
// that sends these replies is tested against the C++ policy end to end by
// redis_differential_test and redis_store_test.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <random>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include <catch2/catch.hpp>

#include "quota/policy/token_bucket.hpp"
#include "quota/redis/redis_store.hpp"
#include "support/policy_variants.hpp"
#include "support/printers.hpp"
#include "support/seed.hpp"

using namespace std::chrono_literals;
using quota::Decision;
using quota::Nanos;
using quota::Reason;
using quota::TokenBucket;
using Twin = quota::redis::LuaTwin<TokenBucket>;

namespace {

// A state as the script packs it ('<I5I3I7i5I4I4'): tokens as whole units and
// micro-units, carry, then the time and the expiry, which the reply's reader ignores
// (filled with `fill`). `micros` overrides the micro-units field (a malformed state).
std::string state(std::int64_t tokens, std::int64_t carry, char fill = '\x5a',
                  std::int64_t micros = -1) {
  std::string s(Twin::kStateBytes, fill);
  const std::int64_t units = tokens / quota::kMicrosPerUnit;
  if (micros < 0) micros = tokens % quota::kMicrosPerUnit;
  for (int i = 0; i < 5; ++i)
    s[static_cast<std::size_t>(i)] = static_cast<char>((units >> (8 * i)) & 0xff);
  for (int i = 0; i < 3; ++i)
    s[static_cast<std::size_t>(5 + i)] = static_cast<char>((micros >> (8 * i)) & 0xff);
  for (int i = 0; i < 7; ++i)
    s[static_cast<std::size_t>(8 + i)] = static_cast<char>((carry >> (8 * i)) & 0xff);
  return s;
}

// A reply array built by hand: integers and strings.
struct FakeReply {
  std::vector<std::string> strings;
  std::vector<redisReply> elements;
  std::vector<redisReply*> pointers;
  redisReply top{};

  explicit FakeReply(const std::vector<std::variant<long long, std::string>>& values) {
    strings.reserve(values.size());
    elements.resize(values.size());
    for (std::size_t i = 0; i < values.size(); ++i) {
      redisReply& e = elements[i];
      if (const long long* x = std::get_if<long long>(&values[i])) {
        e.type = REDIS_REPLY_INTEGER;
        e.integer = *x;
      } else {
        strings.push_back(std::get<std::string>(values[i]));
        e.type = REDIS_REPLY_STRING;
        e.str = strings.back().data();
        e.len = strings.back().size();
      }
      pointers.push_back(&e);
    }
    top.type = REDIS_REPLY_ARRAY;
    top.elements = pointers.size();
    top.element = pointers.data();
  }
};

// The parts of reply `r` for buckets of policy `tb` with costs `costs`.
absl::StatusOr<std::vector<Decision>> parts(const FakeReply& r, const TokenBucket& tb,
                                            const std::vector<std::int64_t>& costs) {
  return Twin::compact_parts(r.top, costs.size(), [&](std::size_t b) {
    return std::pair<const TokenBucket*, std::int64_t>(&tb, costs[b]);
  });
}

}  // namespace

TEST_CASE("a compact reply's state gives TokenBucket::apply's decision") {
  const std::uint64_t seed = quota::testing::test_seed(20261130);
  INFO("seed " << seed);
  std::mt19937_64 rng(seed);
  quota::testing::OutcomeTally tally;
  for (int i = 0; i < 20'000; ++i) {
    TokenBucket tb = quota::testing::random_token_bucket(rng, 1'000'000'000);
    // bursts past 2^53 micro-units, up to the twin's bound of 10^12 units
    if (rng() % 4 == 0) tb.burst = 1 + static_cast<std::int64_t>(rng() % 1'000'000'000'000);
    if (rng() % 8 == 0) tb.rate.units = 0;
    if (!quota::RedisStore<TokenBucket>::check(tb).ok()) continue;
    const std::int64_t cap = quota::to_micro(tb.burst);
    TokenBucket::State s;
    s.last = static_cast<std::int64_t>(rng() >> 4);
    s.tokens =
        rng() % 4 == 0 ? cap : static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(cap));
    s.carry =
        s.tokens == cap || tb.rate.units == 0
            ? 0
            : static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(tb.rate.per.count()));
    const std::int64_t cost = quota::testing::random_cost(rng, tb.burst);
    // At the state's own time: no refill, so the state after apply is what the script
    // would have written.
    const Decision want = tb.apply(s, Nanos{s.last}, cost);
    INFO("burst=" << tb.burst << " rate=" << quota::to_string(tb.rate) << " tokens=" << s.tokens
                  << " carry=" << s.carry << " cost=" << cost);
    auto got = Twin::decision(tb, cost, state(s.tokens, s.carry), want.reason);
    REQUIRE(got.ok());
    REQUIRE(*got == want);
    tally.add(want);
  }
  CHECK(tally.allowed > 1'000);
  CHECK(tally.over > 1'000);
  CHECK(tally.never > 1'000);
}

TEST_CASE("a compact reply's denials go to their buckets") {
  const TokenBucket tb{.rate = {.units = 1, .per = 1s}, .burst = 10};
  // bucket 1 allowed with 9 left; 2 over limit with 2 (cost 5: 3 s); 3 invalid cost;
  // 4 allowed, full after an all-or-nothing check that denied
  const FakeReply r({0LL, 7LL, 8LL, 0LL, state(9'000'000, 0), state(2'000'000, 0),
                     state(4'000'000, 0), state(10'000'000, 0), 4LL * 2 + 1, 4LL * 3 + 3});
  auto got = parts(r, tb, {1, 5, 0, 3});
  REQUIRE(got.ok());
  REQUIRE(got->size() == 4);
  CHECK((*got)[0] == Decision{.allowed = true,
                              .remaining = 9,
                              .retry_after = Nanos{0},
                              .reset_after = 1s,
                              .version = 0,
                              .reason = Reason::kAllowed});
  CHECK((*got)[1] == Decision{.allowed = false,
                              .remaining = 2,
                              .retry_after = 3s,
                              .reset_after = 8s,
                              .version = 0,
                              .reason = Reason::kOverLimit});
  CHECK((*got)[2].reason == Reason::kInvalidCost);
  CHECK((*got)[2].retry_after == quota::kNever);
  CHECK((*got)[2].remaining == 4);
  CHECK((*got)[3].allowed);
  CHECK((*got)[3].reset_after == Nanos{0});
  // cost exceeds burst
  auto big = parts(FakeReply({0LL, 0LL, 0LL, 0LL, state(10'000'000, 0), 4LL + 2}), tb, {11});
  REQUIRE(big.ok());
  CHECK((*big)[0].reason == Reason::kCostExceedsBurst);
  CHECK((*big)[0].retry_after == quota::kNever);
  // a one-off budget (rate 0): never refills
  const TokenBucket once{.rate = {.units = 0, .per = 1s}, .burst = 10};
  auto spent = parts(FakeReply({0LL, 0LL, 0LL, 0LL, state(1'000'000, 0), 4LL + 1}), once, {2});
  REQUIRE(spent.ok());
  CHECK((*spent)[0].retry_after == quota::kNever);
  CHECK((*spent)[0].reset_after == quota::kNever);
}

TEST_CASE("a malformed compact reply is an error, never a decision") {
  const TokenBucket tb{.rate = {.units = 1, .per = 1s}, .burst = 10};
  const std::string ok = state(5'000'000, 0);
  using V = std::variant<long long, std::string>;
  struct Case {
    const char* what;
    std::vector<V> values;
    std::vector<std::int64_t> costs;
  };
  const std::vector<Case> cases = {
      {"too few elements", {0LL, 0LL, 0LL, 1LL, ok}, {1, 1}},
      {"more denials than buckets", {0LL, 0LL, 0LL, 0LL, ok, 5LL, 9LL}, {9}},
      {"a state of the wrong size", {0LL, 0LL, 0LL, 1LL, ok, std::string(27, '\0')}, {1, 1}},
      {"an integer for a state", {0LL, 0LL, 0LL, 1LL, ok, 7LL, ok}, {1, 1, 1}},
      {"tokens above burst", {0LL, 0LL, 0LL, 1LL, state(10'000'001, 0)}, {1}},
      {"a carry not below rate.per", {0LL, 0LL, 0LL, 1LL, state(5'000'000, 1'000'000'000)}, {1}},
      {"micro-units not below 10^6",
       {0LL, 0LL, 0LL, 1LL, state(5'000'000, 0, 'x', 1'000'000)},
       {1}},
      {"over limit with enough tokens", {0LL, 0LL, 0LL, 0LL, ok, 4LL + 1}, {5}},
      {"over limit with an invalid cost", {0LL, 0LL, 0LL, 0LL, ok, 4LL + 1}, {0}},
      {"a denial of reason 0", {0LL, 0LL, 0LL, 0LL, ok, 4LL}, {1}},
      {"a denial of bucket 0", {0LL, 0LL, 0LL, 0LL, ok, ok, 3LL}, {1, 1}},
      {"a denial past the last bucket", {0LL, 0LL, 0LL, 0LL, ok, ok, 4LL * 3 + 1}, {1, 1}},
      {"denials out of order", {0LL, 0LL, 0LL, 0LL, ok, ok, 4LL * 2 + 3, 4LL + 3}, {0, 0}},
      {"a bucket denied twice", {0LL, 0LL, 0LL, 0LL, ok, ok, 4LL + 3, 4LL + 3}, {0, 0}},
      {"a negative denial", {0LL, 0LL, 0LL, 0LL, ok, -7LL}, {0}},
      {"a string for a denial", {0LL, 0LL, 0LL, 0LL, ok, ok, std::string("7")}, {0, 0}},
  };
  for (const Case& c : cases) {
    INFO(c.what);
    auto got = parts(FakeReply(c.values), tb, c.costs);
    CHECK(absl::IsUnavailable(got.status()));
  }
  // and the same shapes, well formed, decide
  CHECK(parts(FakeReply({0LL, 0LL, 0LL, 0LL, ok, ok, 4LL + 3, 4LL * 2 + 3}), tb, {0, 0}).ok());
  CHECK(parts(FakeReply({0LL, 0LL, 0LL, 0LL, ok, 4LL + 1}), tb, {6}).ok());
  CHECK(parts(FakeReply({0LL, 0LL, 0LL, 1LL, state(10'000'000, 0)}), tb, {1}).ok());
  CHECK(parts(FakeReply({0LL, 0LL, 0LL, 1LL, state(9'000'000, 999'999'999)}), tb, {1}).ok());
}
