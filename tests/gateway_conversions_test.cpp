// Tests for rule changes between every pair of the four kinds (quota/gateway/key_state.hpp
// migrate(), quota/gateway/rules/rule_kinds.hpp): a converted key never holds more than
// min(remaining before, new capacity), checked against an independent computation of
// "remaining" from the requests the old rule admitted.
#include <algorithm>
#include <array>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdint>
#include <random>
#include <utility>
#include <variant>
#include <vector>

#include "absl/numeric/int128.h"
#include "quota/gateway/key_state.hpp"
#include "support/exact_token_bucket.hpp"
#include "support/seed.hpp"

using namespace std::chrono_literals;
using quota::FixedWindow;
using quota::Nanos;
using quota::SlidingLog;
using quota::SlidingWindowEstimate;
using quota::TokenBucket;
using quota::gateway::KeyPolicy;
using quota::gateway::KeyState;
using quota::gateway::RulePolicy;

namespace {

// Requests a rule admitted: (time ns, cost).
using History = std::vector<std::pair<std::int64_t, std::int64_t>>;

constexpr std::array<const char*, 4> kKinds{"token_bucket", "fixed_window", "sliding_log",
                                            "sliding_window_estimate"};

RulePolicy random_policy(std::mt19937_64& rng, std::size_t kind) {
  auto pick = [&](std::int64_t lo, std::int64_t hi) {
    return std::uniform_int_distribution<std::int64_t>(lo, hi)(rng);
  };
  const std::int64_t cap = pick(1, 40);
  const Nanos window{pick(1, 50) * 100'000'000};  // 0.1 s .. 5 s
  switch (kind) {
    case 0:
      return TokenBucket{.rate = {.units = pick(0, 20), .per = Nanos{pick(1, 30) * 100'000'000}},
                         .burst = cap};
    case 1:
      return FixedWindow{.limit = cap, .window = window};
    case 2:
      return SlidingLog{.limit = cap, .window = window};
    default:
      return SlidingWindowEstimate{.limit = cap, .window = window};
  }
}

std::int64_t floor_div(absl::int128 a, absl::int128 b) {
  absl::int128 q = a / b;
  if (a % b != 0 && (a < 0) != (b < 0)) q -= 1;
  return static_cast<std::int64_t>(q);
}

// The whole units `p` still allows at `t` after admitting `h` (times <= t), computed
// from the definitions: a token bucket by an exact rational model, a fixed window by the
// aligned window of t, the log by (t − W, t], the estimator by its two aligned windows.
std::int64_t reference_remaining(const RulePolicy& policy, const History& h, std::int64_t t) {
  if (const auto* tb = std::get_if<TokenBucket>(&policy)) {
    quota::testing::ExactTokenBucket exact(*tb);
    for (const auto& [at, cost] : h) REQUIRE(exact.apply(at, cost).allowed);
    return exact.apply(t, tb->burst + 1).remaining;  // a cost it refuses: deducts nothing
  }
  auto sum = [&](auto counted) {
    std::int64_t n = 0;
    for (const auto& [at, cost] : h) n += counted(at) ? cost : 0;
    return n;
  };
  if (const auto* fw = std::get_if<FixedWindow>(&policy)) {
    const std::int64_t w = fw->window.count();
    return fw->limit - sum([&](std::int64_t at) { return at / w == t / w; });
  }
  if (const auto* log = std::get_if<SlidingLog>(&policy)) {
    return log->limit - sum([&](std::int64_t at) { return t - at < log->window.count(); });
  }
  const auto& est = std::get<SlidingWindowEstimate>(policy);
  const std::int64_t w = est.window.count();
  const std::int64_t cur = sum([&](std::int64_t at) { return at / w == t / w; });
  const std::int64_t prev = sum([&](std::int64_t at) { return at / w + 1 == t / w; });
  const std::int64_t el = t % w;
  const absl::int128 room = absl::int128(est.limit) * w - absl::int128(prev) * (w - el);
  return std::max<std::int64_t>(0, floor_div(room, w) - cur);
}

// The largest cost `kp` admits on `s` at `t` (0 if none), found on copies.
std::int64_t max_admitted(const KeyPolicy& kp, const KeyState& s, Nanos t) {
  std::int64_t best = 0;
  for (std::int64_t c = 1; c <= quota::gateway::detail::capacity(*kp.policy); ++c) {
    KeyState copy = s;
    if (kp.apply(copy, t, c).allowed) best = c;
  }
  return best;
}

}  // namespace

TEST_CASE("the reference remaining agrees with each kind's own decisions") {
  // Guards the reference itself: under one rule (no conversion) its remaining is the
  // largest cost the gateway admits.
  std::mt19937_64 rng(quota::testing::test_seed(20261201));
  for (int trial = 0; trial < 400; ++trial) {
    const std::size_t kind = trial % 4;
    INFO("trial " << trial << " kind " << kKinds[kind]);
    const RulePolicy p = random_policy(rng, kind);
    const KeyPolicy kp{.policy = &p, .version = 1};
    KeyState s = kp.init(Nanos{0});
    History h;
    std::int64_t t = 0;
    for (int i = 0; i < 30; ++i) {
      t += std::uniform_int_distribution<std::int64_t>(0, 700'000'000)(rng);
      const std::int64_t cost = std::uniform_int_distribution<std::int64_t>(1, 8)(rng);
      const std::int64_t ref = reference_remaining(p, h, t);
      CHECK(max_admitted(kp, s, Nanos{t}) == std::min(ref, quota::gateway::detail::capacity(p)));
      if (kp.apply(s, Nanos{t}, cost).allowed) h.emplace_back(t, cost);
    }
  }
}

TEST_CASE("a conversion between any two kinds leaves min(remaining before, new capacity)") {
  std::mt19937_64 rng(quota::testing::test_seed(7'000'001));
  for (int trial = 0; trial < 1600; ++trial) {
    const std::size_t from = trial % 4;
    const std::size_t to = (trial / 4) % 4;
    INFO("trial " << trial << ": " << kKinds[from] << " -> " << kKinds[to]);
    const RulePolicy a = random_policy(rng, from);
    RulePolicy b = random_policy(rng, to);
    while (quota::gateway::detail::same_params(a, b)) b = random_policy(rng, to);
    const KeyPolicy ka{.policy = &a, .version = 1};
    const KeyPolicy kb{.policy = &b, .version = 2};

    KeyState s = ka.init(Nanos{0});
    History h;
    std::int64_t t = 0;
    const int requests = std::uniform_int_distribution<int>(0, 40)(rng);
    for (int i = 0; i < requests; ++i) {
      t += std::uniform_int_distribution<std::int64_t>(0, 400'000'000)(rng);
      const std::int64_t cost = std::uniform_int_distribution<std::int64_t>(1, 6)(rng);
      if (ka.apply(s, Nanos{t}, cost).allowed) h.emplace_back(t, cost);
    }
    t += std::uniform_int_distribution<std::int64_t>(0, 2'000'000'000)(rng);
    const std::int64_t before = reference_remaining(a, h, t);
    const std::int64_t cap = quota::gateway::detail::capacity(b);
    const std::int64_t expected = std::min(before, cap);
    INFO("remaining before " << before << ", new capacity " << cap);

    REQUIRE(quota::gateway::migrate(s, b, 2, Nanos{t}));
    CHECK(s.version == 2);
    CHECK(s.debt == 0);
    CHECK(max_admitted(kb, s, Nanos{t}) == expected);
    if (const auto* log = std::get_if<SlidingLog::State>(&s.state)) {
      CHECK(log->capacity() <= static_cast<std::size_t>(cap));  // one event at most
      CHECK(log->events() == (expected < cap ? 1u : 0u));
    }

    // Under a window kind the units the conversion took count as admitted at t: the new
    // rule then decides exactly as the reference over that history.
    if (to == 0) continue;
    History hb;
    if (expected < cap) hb.emplace_back(t, cap - expected);
    for (int i = 0; i < 20; ++i) {
      t += std::uniform_int_distribution<std::int64_t>(0, 600'000'000)(rng);
      const std::int64_t ref = reference_remaining(b, hb, t);
      CHECK(max_admitted(kb, s, Nanos{t}) == ref);
      const std::int64_t cost = std::uniform_int_distribution<std::int64_t>(1, 6)(rng);
      const bool allowed = kb.apply(s, Nanos{t}, cost).allowed;
      CHECK(allowed == (cost <= ref));
      if (allowed) hb.emplace_back(t, cost);
    }
  }
}

TEST_CASE("a log converted at t frees the units it took exactly one window later") {
  const RulePolicy tb = TokenBucket{.rate = {.units = 0, .per = 1s}, .burst = 10};
  const RulePolicy log = SlidingLog{.limit = 8, .window = 60s};
  const KeyPolicy v1{.policy = &tb, .version = 1};
  const KeyPolicy v2{.policy = &log, .version = 2};
  KeyState s = v1.init(Nanos{0});
  REQUIRE(v1.apply(s, Nanos{0}, 7).allowed);  // 3 left, never refilled
  REQUIRE(quota::gateway::migrate(s, log, 2, 10s));
  CHECK(max_admitted(v2, s, 10s) == 3);
  CHECK(max_admitted(v2, s, 70s - 1ns) == 3);  // the 5 taken units still count
  CHECK(max_admitted(v2, s, 70s) == 8);
  CHECK(v2.idle_at(s) == 70s);
}

TEST_CASE("token bucket debt converted to a window kind stays debt, capped") {
  const RulePolicy tb = TokenBucket{.rate = {.units = 0, .per = 1s}, .burst = 10};
  for (const RulePolicy& window : {RulePolicy{SlidingLog{.limit = 4, .window = 10s}},
                                   RulePolicy{SlidingWindowEstimate{.limit = 4, .window = 10s}}}) {
    INFO(window.index());
    const KeyPolicy v1{.policy = &tb, .version = 1};
    const KeyPolicy v2{.policy = &window, .version = 2};
    KeyState s = v1.init(Nanos{0});
    REQUIRE(v1.apply(s, Nanos{0}, 10).allowed);
    REQUIRE(quota::gateway::charge(s, 6, Nanos{0}) == quota::to_micro(6));  // tokens -6
    REQUIRE(quota::gateway::migrate(s, window, 2, 1s));
    CHECK(s.debt == quota::to_micro(4));  // 6, capped at the new limit
    CHECK(v2.idle_at(s) == quota::kNever);
    CHECK(max_admitted(v2, s, 1s) == 0);
  }
}
