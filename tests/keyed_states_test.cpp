// Tests for quota/detail/keyed_states.hpp, the compact key → state table under both
// in-process stores: random operations (creations, decisions, sweeps that compact the
// arena, evictions of a full table) against a std::map model, for a policy with a plain
// state (TokenBucket) and one that owns memory (SlidingLog, so ASan sees every move and
// destruction in a compaction); keys of every length up to the bound; stable addresses;
// and, through both stores, a full table that evicts whenever a key is idle, also when
// refunds made it so, and finds it without looking at every key.
#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include <catch2/catch.hpp>

#include "absl/status/status.h"

#include "quota/detail/keyed_states.hpp"
#include "quota/policy/sliding_log.hpp"
#include "quota/policy/token_bucket.hpp"
#include "quota/store/local_store.hpp"
#include "quota/store/sharded_store.hpp"
#include "support/printers.hpp"
#include "support/seed.hpp"

using namespace std::chrono_literals;
using quota::Nanos;
using quota::SlidingLog;
using quota::TokenBucket;
using quota::detail::key_hash;
using quota::detail::KeyedStates;

namespace {

// Keys of many lengths: short ones (most), some longer than the first 1 KiB chunk, and
// one of exactly the bound.
template <class P>
std::vector<std::string> key_pool(std::mt19937_64& rng) {
  std::vector<std::string> keys;
  for (int i = 0; i < 400; ++i) {
    std::size_t len = rng() % 40;
    if (i % 50 == 7) len = 1000 + rng() % 3000;
    std::string k = "k" + std::to_string(i) + ":";
    while (k.size() < len) k.push_back(static_cast<char>('a' + rng() % 26));
    keys.push_back(std::move(k));
  }
  keys.push_back(std::string(KeyedStates<P>::kMaxLocalKeyBytes, 'x'));
  keys.push_back("");
  return keys;
}

// The reference: a std::map of states, the same transitions, and the store's documented
// capacity rule (a new key in a full table first forgets the idle keys; if none is idle
// it is refused).
template <class P>
struct Model {
  std::size_t capacity;
  std::map<std::string, typename P::State> states;

  std::size_t sweep(const P& p, Nanos now) {
    std::size_t removed = 0;
    for (auto it = states.begin(); it != states.end();) {
      if (p.idle_at(it->second) <= now) {
        it = states.erase(it);
        ++removed;
      } else {
        ++it;
      }
    }
    return removed;
  }
  typename P::State* find_or_create(const P& p, const std::string& key, Nanos now) {
    if (auto it = states.find(key); it != states.end()) return &it->second;
    if (states.size() >= capacity && sweep(p, now) == 0) return nullptr;
    return &states.emplace(key, p.init(now)).first->second;
  }
};

template <class P>
void run_against_model(const P& policy, std::size_t capacity, std::uint64_t seed) {
  INFO("seed " << seed << ", capacity " << capacity);
  std::mt19937_64 rng(seed);
  const auto keys = key_pool<P>(rng);
  KeyedStates<P> table(capacity);
  Model<P> model{capacity, {}};
  std::int64_t now = 0;
  for (int op = 0; op < 20'000; ++op) {
    INFO("op " << op);
    // Time mostly forward, sometimes back (the policies ignore the past).
    now += static_cast<std::int64_t>(rng() % 40'000'000);
    if (rng() % 20 == 0) now -= 100'000'000;
    const Nanos t{now};
    if (rng() % 500 == 0) {
      const std::size_t removed = table.sweep(policy, t);
      REQUIRE(removed == model.sweep(policy, t));
      REQUIRE(table.size() == model.states.size());
      continue;
    }
    // A skewed key choice: a few hot keys, a long tail.
    const std::size_t pick = rng() % 3 == 0 ? rng() % 8 : rng() % keys.size();
    const std::string& key = keys[pick];
    const std::int64_t cost = 1 + static_cast<std::int64_t>(rng() % 3);
    auto got = table.find_or_create(policy, key, key_hash(key), t);
    auto* want = model.find_or_create(policy, key, t);
    REQUIRE(got.ok() == (want != nullptr));
    if (!got.ok()) {
      REQUIRE(got.status().code() == absl::StatusCode::kResourceExhausted);
      REQUIRE(table.size() == model.states.size());
      continue;
    }
    const quota::Decision a = policy.apply(**got, t, cost);
    const quota::Decision b = policy.apply(*want, t, cost);
    REQUIRE(a.allowed == b.allowed);
    REQUIRE(a.remaining == b.remaining);
    REQUIRE(a.retry_after == b.retry_after);
    REQUIRE(a.reset_after == b.reset_after);
    REQUIRE(a.reason == b.reason);
    REQUIRE(table.size() == model.states.size());
  }
  // Everything idle in the end: a sweep empties the table, which then works again.
  const Nanos later{now + std::int64_t{1'000'000'000'000'000}};
  REQUIRE(table.sweep(policy, later) == model.sweep(policy, later));
  REQUIRE(table.size() == 0);
  REQUIRE(table.find_or_create(policy, keys[0], key_hash(keys[0]), later).ok());
  REQUIRE(table.size() == 1);
}

}  // namespace

TEST_CASE("keyed states match a map model through creations, sweeps and evictions",
          "[keyed_states]") {
  const std::uint64_t seed = quota::testing::test_seed(20261129);
  const TokenBucket tb{.rate = {.units = 10, .per = 1s}, .burst = 5};
  const SlidingLog log{.limit = 4, .window = 1s};
  for (const std::size_t capacity : {std::size_t{1'000'000}, std::size_t{40}, std::size_t{3}}) {
    SECTION("token bucket, capacity " + std::to_string(capacity)) {
      run_against_model(tb, capacity, seed);
    }
    SECTION("sliding log (a state that owns memory), capacity " + std::to_string(capacity)) {
      run_against_model(log, capacity, seed + 1);
    }
  }
}

TEST_CASE("a key longer than the bound is refused with its size and the bound", "[keyed_states]") {
  const TokenBucket tb{.rate = {.units = 1, .per = 1s}, .burst = 1};
  KeyedStates<TokenBucket> table(10);
  const std::string too_long(KeyedStates<TokenBucket>::kMaxLocalKeyBytes + 1, 'k');
  auto r = table.find_or_create(tb, too_long, key_hash(too_long), Nanos{0});
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK_THAT(std::string(r.status().message()),
             Catch::Contains(std::to_string(too_long.size())) &&
                 Catch::Contains(std::to_string(KeyedStates<TokenBucket>::kMaxLocalKeyBytes)));
  CHECK(table.size() == 0);
}

TEST_CASE("a state keeps its address while other keys are created", "[keyed_states]") {
  const TokenBucket tb{.rate = {.units = 1, .per = 1s}, .burst = 100};
  KeyedStates<TokenBucket> table(1'000'000);
  auto first = table.find_or_create(tb, "first", key_hash("first"), Nanos{0});
  REQUIRE(first.ok());
  REQUIRE(tb.apply(**first, Nanos{0}, 7).allowed);
  for (int i = 0; i < 50'000; ++i) {
    const std::string k = "key-" + std::to_string(i);
    REQUIRE(table.find_or_create(tb, k, key_hash(k), Nanos{0}).ok());
  }
  auto again = table.find_or_create(tb, "first", key_hash("first"), Nanos{0});
  REQUIRE(again.ok());
  CHECK(*again == *first);
  CHECK((*first)->tokens == 93'000'000);
  CHECK(table.size() == 50'001);
}

TEST_CASE("a moved store keeps its keys and states", "[keyed_states]") {
  const TokenBucket tb{.rate = {.units = 1, .per = 1s}, .burst = 3};
  quota::LocalStore<TokenBucket> a;
  for (int i = 0; i < 1000; ++i) {
    REQUIRE(a.apply(tb, "k" + std::to_string(i), Nanos{0}, 1 + i % 3)->allowed);
  }
  quota::LocalStore<TokenBucket> b(std::move(a));
  REQUIRE(b.size() == 1000);
  for (int i = 0; i < 1000; ++i) {
    auto d = b.apply(tb, "k" + std::to_string(i), Nanos{0}, 1);
    REQUIRE(d.ok());
    CHECK(d->allowed == (i % 3 != 2));  // 3 - (1 + i % 3) tokens were left
  }
  CHECK(b.apply(tb, "new", Nanos{0}, 3)->allowed);
  CHECK(b.size() == 1001);
}

namespace {

// A refund of `units` (capped at the burst): moves the key's idle time earlier.
void refund(const TokenBucket& tb, TokenBucket::State& s, Nanos now, std::int64_t units) {
  tb.refill(s, now.count());
  s.tokens = std::min(quota::to_micro(tb.burst), s.tokens + quota::to_micro(units));
  if (s.tokens == quota::to_micro(tb.burst)) s.carry = 0;
}

}  // namespace

TEMPLATE_TEST_CASE("a full store evicts whenever a key is idle, also after refunds",
                   "[keyed_states]", quota::LocalStore<TokenBucket>,
                   quota::ShardedStore<TokenBucket>) {
  const std::uint64_t seed = quota::testing::test_seed(20261201);
  // Slow refill, so that keys are idle mostly because a refund made them whole.
  const TokenBucket tb{.rate = {.units = 1, .per = 1s}, .burst = 5};
  for (const std::size_t capacity : {std::size_t{3}, std::size_t{40}}) {
    INFO("seed " << seed << ", capacity " << capacity);
    std::mt19937_64 rng(seed + capacity);
    const auto keys = key_pool<TokenBucket>(rng);
    TestType store({.max_keys = capacity, .shards = 1});
    Model<TokenBucket> model{capacity, {}};
    std::int64_t now = 0;
    for (int op = 0; op < 20'000; ++op) {
      INFO("op " << op);
      now += static_cast<std::int64_t>(rng() % 20'000'000);
      const Nanos t{now};
      const std::string& key = keys[rng() % 3 == 0 ? rng() % 8 : rng() % keys.size()];
      const bool is_refund = rng() % 3 == 0;
      const std::int64_t units = 1 + static_cast<std::int64_t>(rng() % 5);
      auto* want = model.find_or_create(tb, key, t);
      auto got = store.update(tb, key, t, [&](TokenBucket::State& s) {
        if (is_refund) {
          refund(tb, s, t, units);
          return s.tokens;
        }
        (void)tb.apply(s, t, units);
        return s.tokens;
      });
      // The store creates the key exactly when the model (which evicts every idle key
      // when full) does.
      REQUIRE(got.ok() == (want != nullptr));
      if (!got.ok()) {
        REQUIRE(got.status().code() == absl::StatusCode::kResourceExhausted);
        continue;
      }
      if (is_refund) {
        refund(tb, *want, t, units);
      } else {
        (void)tb.apply(*want, t, units);
      }
      REQUIRE(*got == want->tokens);
    }
  }
}

namespace {

// A token bucket that counts its idle_at calls: the work a store does to find idle keys.
struct CountingBucket {
  using State = TokenBucket::State;
  TokenBucket tb;
  std::int64_t* idle_calls;
  absl::Status validate() const { return tb.validate(); }
  State init(Nanos now) const { return tb.init(now); }
  quota::Decision apply(State& s, Nanos now, std::int64_t cost) const {
    return tb.apply(s, now, cost);
  }
  Nanos idle_at(const State& s) const {
    ++*idle_calls;
    return tb.idle_at(s);
  }
};

}  // namespace

TEMPLATE_TEST_CASE("a full store finds the one idle key without looking at every key",
                   "[keyed_states]", quota::LocalStore<CountingBucket>,
                   quota::ShardedStore<CountingBucket>) {
  // n keys, each spending its one unit (refilled in 1 s) 0.2 ms after the previous: they
  // turn idle one at a time, 0.2 ms apart. Then one new key per 0.2 ms: each needs room,
  // and exactly one old key (the one that turned idle in that step) is there to give it;
  // the new keys stay active (all within 0.4 s). A sweep per new key would call idle_at
  // n times per key; the idle index needs a bounded number per decision.
  constexpr int kKeys = 2000;
  constexpr std::int64_t kStep = 200'000;  // ns
  std::int64_t idle_calls = 0;
  const CountingBucket policy{.tb = {.rate = {.units = 1, .per = 1s}, .burst = 1},
                              .idle_calls = &idle_calls};
  TestType store({.max_keys = kKeys, .shards = 1});
  const auto spend = [&](const std::string& key, Nanos t) {
    return store.update(policy, key, t,
                        [&](TokenBucket::State& s) { return policy.apply(s, t, 1).allowed; });
  };
  for (int i = 0; i < kKeys; ++i) {
    REQUIRE(*spend("old-" + std::to_string(i), Nanos{i * kStep}));
  }
  // Full: "old-0" is idle from 1 s on, nothing is before.
  REQUIRE(spend("early", Nanos{999'999'999}).status().code() ==
          absl::StatusCode::kResourceExhausted);
  idle_calls = 0;
  for (int j = 0; j < kKeys; ++j) {
    const Nanos t{1'000'000'000 + j * kStep + kStep / 2};  // old-j idle, old-(j+1) not
    auto admitted = spend("new-" + std::to_string(j), t);
    INFO("new key " << j);
    REQUIRE(admitted.ok());
    REQUIRE(*admitted);
    REQUIRE(store.size() == kKeys);
    // old-(j+1) was not evicted: it still has no unit to give.
    if (j + 1 < kKeys) {
      auto old_next = spend("old-" + std::to_string(j + 1), t);
      REQUIRE(old_next.ok());
      REQUIRE_FALSE(*old_next);
    }
  }
  // Every decision above is two spends; a sweep per new key would be kKeys calls each.
  const double per_decision = static_cast<double>(idle_calls) / (2.0 * kKeys);
  INFO("idle_at calls per decision: " << per_decision);
  CHECK(per_decision < 16.0);
}
