// Tests for quota/gateway/key_state.hpp: a rule change never hands out a burst.
#include "quota/gateway/key_state.hpp"

#include <catch2/catch.hpp>
#include <chrono>

#include "quota/store/local_store.hpp"
#include "quota/store/sharded_store.hpp"

using namespace std::chrono_literals;
using quota::FixedWindow;
using quota::Nanos;
using quota::TokenBucket;
using quota::gateway::KeyPolicy;
using quota::gateway::KeyState;
using quota::gateway::RulePolicy;

namespace {

// Spends `cost` repeatedly at `now` until denied; returns the units admitted.
std::int64_t drain(const KeyPolicy& kp, KeyState& s, Nanos now) {
  std::int64_t n = 0;
  while (kp.apply(s, now, 1).allowed) ++n;
  return n;
}

}  // namespace

TEST_CASE("downgrade: refill at the old rate up to the change, then clamp to the new burst") {
  const RulePolicy old_p = TokenBucket{.rate = {.units = 10, .per = 1s}, .burst = 100};
  const RulePolicy new_p = TokenBucket{.rate = {.units = 1, .per = 1s}, .burst = 20};
  const KeyPolicy v1{.policy = &old_p, .version = 1};
  const KeyPolicy v2{.policy = &new_p, .version = 2};
  KeyState s = v1.init(Nanos{0});
  REQUIRE(v1.apply(s, Nanos{0}, 95).allowed);  // 5 left
  // 1 s later under the OLD rate: 5 + 10 = 15 <= 20, so the new bucket holds 15, not 20.
  auto d = v2.apply(s, 1s, 1);
  CHECK(d.allowed);
  CHECK(d.version == 2);
  CHECK(d.remaining == 14);
  CHECK(s.version == 2);
  // Had it refilled to the old burst (100) the clamp to 20 applies.
  KeyState t = v1.init(Nanos{0});
  REQUIRE(v1.apply(t, Nanos{0}, 1).allowed);  // 99 left
  CHECK(drain(v2, t, 1s) == 20);
}

TEST_CASE("upgrade: no fresh burst; the larger burst is reached by refilling at the new rate") {
  const RulePolicy old_p = TokenBucket{.rate = {.units = 1, .per = 1s}, .burst = 10};
  const RulePolicy new_p = TokenBucket{.rate = {.units = 100, .per = 1s}, .burst = 1000};
  const KeyPolicy v1{.policy = &old_p, .version = 1};
  const KeyPolicy v2{.policy = &new_p, .version = 2};
  KeyState s = v1.init(Nanos{0});
  REQUIRE(drain(v1, s, Nanos{0}) == 10);
  // 2 s later: the old rate gave 2; the upgrade must not hand out 1000.
  CHECK(drain(v2, s, 2s) == 2);
  // From then on the new rate applies: 100 per second.
  CHECK(drain(v2, s, 3s) == 100);
  // A full old bucket stays at the old burst at the moment of the upgrade.
  KeyState full = v1.init(Nanos{0});
  CHECK(drain(v2, full, 1h) == 10);
}

TEST_CASE("switching kind: bucket to window and back keeps what was left, never more") {
  const RulePolicy tb = TokenBucket{.rate = {.units = 1, .per = 1s}, .burst = 50};
  const RulePolicy fw = FixedWindow{.limit = 30, .window = 10s};
  const KeyPolicy v1{.policy = &tb, .version = 1};
  const KeyPolicy v2{.policy = &fw, .version = 2};
  const KeyPolicy v3{.policy = &tb, .version = 3};

  SECTION("bucket -> window: the window's count leaves min(limit, tokens)") {
    KeyState s = v1.init(Nanos{0});
    REQUIRE(v1.apply(s, Nanos{0}, 45).allowed);  // 5 tokens left
    auto d = v2.apply(s, 1s, 1);                 // +1 refilled at the old rate: 6
    CHECK(d.allowed);
    CHECK(d.remaining == 5);
    CHECK(d.version == 2);
    CHECK(drain(v2, s, 2s) == 5);
    // The next window is the window policy's own: full.
    CHECK(drain(v2, s, 10s) == 30);
  }
  SECTION("bucket -> window: a full bucket larger than the limit becomes the limit") {
    KeyState s = v1.init(Nanos{0});
    CHECK(drain(v2, s, 1s) == 30);
  }
  SECTION("window -> bucket: tokens = what the window still allowed") {
    KeyState s = v2.init(Nanos{0});
    REQUIRE(v2.apply(s, Nanos{0}, 25).allowed);  // 5 left in this window
    CHECK(drain(v3, s, 1s) == 5);                // not 50
    CHECK(drain(v3, s, 3s) == 2);                // then the bucket's own rate
  }
}

TEST_CASE("a new version with the same parameters changes only the version") {
  const RulePolicy p = TokenBucket{.rate = {.units = 1, .per = 3s}, .burst = 5};
  const KeyPolicy v1{.policy = &p, .version = 1};
  const KeyPolicy v2{.policy = &p, .version = 2};
  KeyState s = v1.init(Nanos{0});
  REQUIRE(drain(v1, s, Nanos{0}) == 5);
  // The carried fraction survives (no conversion): 1 unit at exactly 3 s.
  CHECK_FALSE(v2.apply(s, 3s - 1ns, 1).allowed);
  CHECK(s.version == 2);
  CHECK(v2.apply(s, 3s, 1).allowed);
}

TEST_CASE("a rule change with time going backwards does not move stored time back") {
  const RulePolicy old_p = TokenBucket{.rate = {.units = 1, .per = 1s}, .burst = 10};
  const RulePolicy new_p = TokenBucket{.rate = {.units = 1, .per = 1s}, .burst = 5};
  const KeyPolicy v1{.policy = &old_p, .version = 1};
  const KeyPolicy v2{.policy = &new_p, .version = 2};
  KeyState s = v1.init(Nanos{0});
  REQUIRE(drain(v1, s, 10s) == 10);
  CHECK(drain(v2, s, 5s) == 0);  // earlier than stored: nothing refilled, nothing invented
  CHECK(std::get<TokenBucket::State>(s.state).last == Nanos(10s).count());
  CHECK(drain(v2, s, 12s) == 2);
}

TEST_CASE("refund is capped at the burst; charge takes what is there and keeps debt") {
  const RulePolicy p = TokenBucket{.rate = {.units = 1, .per = 1s}, .burst = 10};
  const KeyPolicy kp{.policy = &p, .version = 1};
  KeyState s = kp.init(Nanos{0});
  REQUIRE(kp.apply(s, Nanos{0}, 4).allowed);                                      // 6 left
  CHECK(quota::gateway::refund(s, 7, Nanos{0}, Nanos{0}) == quota::to_micro(4));  // capped
  CHECK(std::get<TokenBucket::State>(s.state).tokens == quota::to_micro(10));

  REQUIRE(kp.apply(s, Nanos{0}, 8).allowed);  // 2 left
  // A deficit of 5: 2 taken now, 3 become debt, paid from the next refills.
  CHECK(quota::gateway::charge(s, 5, Nanos{0}) == quota::to_micro(3));
  CHECK(std::get<TokenBucket::State>(s.state).tokens == -quota::to_micro(3));
  auto denied = kp.apply(s, 3s, 1);  // the 3 refilled units pay the debt
  CHECK_FALSE(denied.allowed);
  CHECK(denied.retry_after == 1s);  // retry_after includes the debt
  CHECK(kp.apply(s, 4s, 1).allowed);
  // Debt is capped at the burst: a huge deficit blocks at most one full refill.
  KeyState t = kp.init(Nanos{0});
  CHECK(quota::gateway::charge(t, 1000, Nanos{0}) == quota::to_micro(10));
  // 10 taken at once, 990 owed, capped at the burst: tokens -10.
  CHECK(std::get<TokenBucket::State>(t.state).tokens == -quota::to_micro(10));
  CHECK_FALSE(kp.apply(t, 11s - 1ns, 1).allowed);
  CHECK(kp.apply(t, 11s, 1).allowed);
}

TEST_CASE("window debt is counted at later decisions, capped at the limit") {
  const RulePolicy p = FixedWindow{.limit = 10, .window = 10s};
  const KeyPolicy kp{.policy = &p, .version = 1};
  KeyState s = kp.init(Nanos{0});
  REQUIRE(kp.apply(s, Nanos{0}, 7).allowed);
  CHECK(quota::gateway::charge(s, 25, Nanos{0}) == quota::to_micro(10));  // 3 counted now
  CHECK(std::get<FixedWindow::State>(s.state).count == 10);
  CHECK(s.debt == quota::to_micro(10));
  CHECK_FALSE(kp.apply(s, 10s, 1).allowed);  // the next window pays the debt first
  CHECK(s.debt == 0);
  CHECK(kp.apply(s, 20s, 1).allowed);
}

TEST_CASE("a window refund applies only in the window the cost was counted in") {
  const RulePolicy p = FixedWindow{.limit = 10, .window = 10s};
  const KeyPolicy kp{.policy = &p, .version = 1};
  KeyState s = kp.init(Nanos{0});
  REQUIRE(kp.apply(s, 1s, 8).allowed);
  CHECK(quota::gateway::refund(s, 3, 1s, 2s) == quota::to_micro(3));
  CHECK(std::get<FixedWindow::State>(s.state).count == 5);
  // In the next window the count already restarted at 0: nothing to give back.
  CHECK(quota::gateway::refund(s, 3, 1s, 11s) == 0);
  CHECK(std::get<FixedWindow::State>(s.state).count == 0);
}

TEST_CASE("KeyPolicy works in the ordinary stores, and idle keys are evicted safely") {
  const RulePolicy p = TokenBucket{.rate = {.units = 1, .per = 1s}, .burst = 2};
  const KeyPolicy kp{.policy = &p, .version = 7};
  quota::LocalStore<KeyPolicy> local({.max_keys = 1});
  auto d = local.apply(kp, "{a}read", Nanos{0}, 2);
  REQUIRE(d.ok());
  CHECK(d->version == 7);
  // Full store, key not idle: a new key is refused, the active one kept.
  CHECK(local.apply(kp, "{b}read", 1s, 1).status().code() == absl::StatusCode::kResourceExhausted);
  // Idle (full again) at 2 s: evicted for the new key.
  CHECK(local.apply(kp, "{b}read", 2s, 1).ok());
  quota::ShardedStore<KeyPolicy> sharded;
  CHECK(sharded.apply(kp, "{a}read", Nanos{0}, 1)->allowed);
}

TEST_CASE("a state written by a newer rule set is not rolled back by an older one") {
  const RulePolicy old_p = TokenBucket{.rate = {.units = 10, .per = 1s}, .burst = 100};
  const RulePolicy new_p = TokenBucket{.rate = {.units = 1, .per = 1s}, .burst = 5};
  const KeyPolicy v1{.policy = &old_p, .version = 1};
  const KeyPolicy v2{.policy = &new_p, .version = 2};
  KeyState s = v1.init(Nanos{0});
  auto d2 = v2.apply(s, Nanos{0}, 1);  // converted to v2: min(100, 5) - 1 = 4 left
  CHECK(d2.version == 2);
  CHECK(d2.remaining == 4);
  // A caller still on v1 is decided by v2's parameters, and told so.
  auto d1 = v1.apply(s, Nanos{0}, 1);
  CHECK(d1.allowed);
  CHECK(d1.version == 2);
  CHECK(d1.remaining == 3);
  CHECK(s.version == 2);
  CHECK(std::holds_alternative<TokenBucket>(s.policy));
  CHECK(std::get<TokenBucket>(s.policy).burst == 5);
  // v1's larger burst never comes back through the old caller.
  CHECK(drain(v1, s, Nanos{0}) == 3);
}

TEST_CASE("window debt carried into a bucket that is itself in debt creates no tokens") {
  const RulePolicy fw = FixedWindow{.limit = 10, .window = 10s};
  const RulePolicy tb = TokenBucket{.rate = {.units = 1, .per = 1s}, .burst = 10};
  const KeyPolicy v1{.policy = &fw, .version = 1};
  const KeyPolicy v2{.policy = &tb, .version = 2};
  KeyState s = v1.init(Nanos{0});
  // 25 units charged to a window of 10: 10 counted now, 10 kept as debt (capped).
  REQUIRE(quota::gateway::charge(s, 25, Nanos{0}) == 10 * quota::kMicrosPerUnit);
  // At the next window the debt is paid first: nothing left; then convert to a bucket.
  auto d = v2.apply(s, 10s, 1);
  CHECK_FALSE(d.allowed);
  // Charge the bucket into negative tokens while window debt remains.
  s.debt = 3 * quota::kMicrosPerUnit;
  quota::gateway::charge(s, 4, 10s);
  const auto tokens_before = std::get<TokenBucket::State>(s.state).tokens;
  REQUIRE(tokens_before < 0);
  // Paying debt from a negative bucket must not raise its tokens.
  auto d2 = v2.apply(s, 10s, 1);
  CHECK_FALSE(d2.allowed);
  CHECK(std::get<TokenBucket::State>(s.state).tokens == tokens_before);
  CHECK(s.debt == 3 * quota::kMicrosPerUnit);
}
