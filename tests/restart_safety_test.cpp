// Tests for restart safety (StoreOptions::assume_spent_at, Policy::exhausted): a process
// that restarts with an empty store must not hand every key a fresh budget on top of what
// the previous process admitted just before it stopped. The admission logs of a store
// before a restart and of a new one after it are checked together with the envelope
// verifier: with the option they keep the policy's envelope; without it (the control)
// the fresh budgets break it, so these tests can fail.
#include <chrono>
#include <cstdint>
#include <map>
#include <random>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "quota/gateway/key_state.hpp"
#include "quota/policy/fixed_window.hpp"
#include "quota/policy/sliding_log.hpp"
#include "quota/policy/sliding_window_estimate.hpp"
#include "quota/policy/token_bucket.hpp"
#include "quota/store/local_store.hpp"
#include "quota/store/sharded_store.hpp"
#include "quota/verify/envelope.hpp"
#include "support/printers.hpp"
#include "support/seed.hpp"

using namespace std::chrono_literals;
using quota::Decision;
using quota::FixedWindow;
using quota::Nanos;
using quota::SlidingLog;
using quota::SlidingWindowEstimate;
using quota::StoreOptions;
using quota::TokenBucket;
using quota::verify::AdmittedEvent;

namespace {

TokenBucket token_bucket() { return TokenBucket{.rate = {.units = 100, .per = 1s}, .burst = 50}; }
template <class P>
P window_policy() {
  return P{.limit = 50, .window = 500ms};
}

template <class P>
P test_policy() {
  if constexpr (std::is_same_v<P, TokenBucket>) {
    return token_bucket();
  } else {
    return window_policy<P>();
  }
}

template <class P>
std::int64_t budget(const P& p) {
  if constexpr (std::is_same_v<P, TokenBucket>) {
    return p.burst;
  } else {
    return p.limit;
  }
}

// Per key, the admitted events of a run.
using Logs = std::map<std::string, std::vector<AdmittedEvent>>;

// Random requests on 3 keys from `from` to `to` (ns), about twice what the policies
// allow, into `logs`; returns the time of the last request.
template <class Store, class P>
std::int64_t run(Store& store, const P& policy, std::mt19937_64& rng, std::int64_t from,
                 std::int64_t to, Logs& logs) {
  const char* keys[] = {"tenant-a:read", "tenant-b:read", "tenant-c:write"};
  std::int64_t t = from;
  std::int64_t last = from;
  while (t < to) {
    const std::string key = keys[rng() % 3];
    const std::int64_t cost = 1 + static_cast<std::int64_t>(rng() % 5);
    auto d = store.apply(policy, key, Nanos{t}, cost);
    REQUIRE(d.ok());
    if (d->allowed) logs[key].push_back({.time_ns = t, .cost = cost});
    last = t;
    t += 1'000'000 + static_cast<std::int64_t>(rng() % 8'000'000);  // 1–9 ms apart
  }
  return last;
}

// Whether every key's log keeps the policy's envelope.
template <class P>
bool envelope_holds(const P& policy, const Logs& logs) {
  for (const auto& [key, log] : logs) {
    INFO("key " << key << ", " << log.size() << " admissions");
    if constexpr (std::is_same_v<P, TokenBucket>) {
      auto r = quota::verify::verify_token_bucket(log, policy.rate, policy.burst);
      REQUIRE(r.ok());
      if (!r->holds()) return false;
    } else if constexpr (std::is_same_v<P, FixedWindow>) {
      // At most `limit` in each aligned window.
      std::map<std::int64_t, std::int64_t> per_window;
      for (const AdmittedEvent& e : log) per_window[e.time_ns / policy.window.count()] += e.cost;
      for (const auto& [w, sum] : per_window) {
        if (sum > policy.limit) return false;
      }
    } else {
      auto r = quota::verify::verify_window(log, policy.limit, policy.window);
      REQUIRE(r.ok());
      if (!r->holds()) return false;
    }
  }
  return true;
}

// Checks the envelope across a restart at about 2 s, with and without the option.
template <template <quota::Policy> class Store, class P>
void check_restart(const P& policy) {
  const std::uint64_t seed = quota::testing::test_seed(20261130);
  INFO("seed " << seed);
  std::mt19937_64 rng(seed);
  Logs before;
  Store<P> first;
  const std::int64_t stop = run(first, policy, rng, 0, 2'000'000'000, before);
  const std::int64_t restart = stop + 1'000'000;  // the new process starts 1 ms later

  // With the option: the logs of both processes together keep the envelope.
  {
    std::mt19937_64 after_rng(seed + 1);
    Logs logs = before;
    Store<P> second(StoreOptions{.assume_spent_at = Nanos{restart}});
    run(second, policy, after_rng, restart, restart + 2'000'000'000, logs);
    CHECK(envelope_holds(policy, logs));
  }
  // The control: a store without it hands out fresh budgets, and the envelope breaks.
  {
    std::mt19937_64 after_rng(seed + 1);
    Logs logs = before;
    Store<P> second;
    run(second, policy, after_rng, restart, restart + 2'000'000'000, logs);
    CHECK_FALSE(envelope_holds(policy, logs));
  }
}

// A policy without exhausted(): a token bucket by delegation.
struct PlainBucket {
  using State = TokenBucket::State;
  TokenBucket tb;
  absl::Status validate() const { return tb.validate(); }
  State init(Nanos now) const { return tb.init(now); }
  Decision apply(State& s, Nanos now, std::int64_t cost) const { return tb.apply(s, now, cost); }
  Nanos idle_at(const State& s) const { return tb.idle_at(s); }
};
static_assert(quota::Policy<PlainBucket> && !quota::HasExhausted<PlainBucket>);

}  // namespace

TEMPLATE_TEST_CASE("exhausted(at) is the state the whole budget spent at `at` leaves", "",
                   TokenBucket, FixedWindow, SlidingWindowEstimate, SlidingLog) {
  const TestType p = test_policy<TestType>();
  const std::uint64_t seed = quota::testing::test_seed(20261130);
  INFO("seed " << seed);
  std::mt19937_64 rng(seed);
  for (int trace = 0; trace < 200; ++trace) {
    const Nanos at{static_cast<std::int64_t>(rng() % 10'000'000'000)};
    auto spent = p.init(at);
    const Decision all = p.apply(spent, at, budget(p));
    REQUIRE(all.allowed);
    REQUIRE(all.remaining == 0);
    auto exhausted = p.exhausted(at);
    // The same decisions from both states on one random trace (including times before
    // `at`, which refill nothing).
    std::int64_t t = at.count() - 50'000'000;
    for (int i = 0; i < 60; ++i) {
      t += static_cast<std::int64_t>(rng() % 40'000'000);
      const std::int64_t cost = static_cast<std::int64_t>(rng() % (budget(p) + 2));
      INFO("trace " << trace << " step " << i << " at " << at.count() << " t " << t << " cost "
                    << cost);
      REQUIRE(p.apply(exhausted, Nanos{t}, cost) == p.apply(spent, Nanos{t}, cost));
    }
    CHECK(p.idle_at(exhausted) == p.idle_at(spent));
  }
}

TEMPLATE_TEST_CASE("across a restart the logs of both processes keep the token bucket's envelope",
                   "", quota::LocalStore<TokenBucket>, quota::ShardedStore<TokenBucket>) {
  if constexpr (std::is_same_v<TestType, quota::LocalStore<TokenBucket>>) {
    check_restart<quota::LocalStore>(token_bucket());
  } else {
    check_restart<quota::ShardedStore>(token_bucket());
  }
}

TEMPLATE_TEST_CASE("across a restart the logs keep the window policies' envelopes", "", FixedWindow,
                   SlidingLog) {
  check_restart<quota::LocalStore>(window_policy<TestType>());
}

TEST_CASE(
    "a key first seen after it would have refilled starts full; an earlier time gets "
    "nothing") {
  const TokenBucket p = token_bucket();  // full again 0.5 s after being emptied
  quota::LocalStore<TokenBucket> store(StoreOptions{.assume_spent_at = Nanos{10'000'000'000}});
  auto early = store.apply(p, "before", Nanos{9'000'000'000}, 1);
  REQUIRE(early.ok());
  CHECK_FALSE(early->allowed);
  // A time before the stored one counts as the stored one (Policy): one unit 10 ms later.
  CHECK(early->retry_after == Nanos{10'000'000});
  auto at = store.apply(p, "at", Nanos{10'000'000'000}, 1);
  REQUIRE(at.ok());
  CHECK_FALSE(at->allowed);
  auto half = store.apply(p, "half", Nanos{10'250'000'000}, 25);
  REQUIRE(half.ok());
  CHECK(half->allowed);
  CHECK(half->remaining == 0);
  auto late = store.apply(p, "late", Nanos{60'000'000'000}, 1);
  REQUIRE(late.ok());
  CHECK(late->allowed);
  CHECK(late->remaining == p.burst - 1);
}

TEST_CASE("a policy without exhausted() is refused a store with assume_spent_at, by name") {
  const PlainBucket p{token_bucket()};
  quota::ShardedStore<PlainBucket> store(StoreOptions{.assume_spent_at = Nanos{0}});
  auto d = store.apply(p, "k", Nanos{1}, 1);
  REQUIRE_FALSE(d.ok());
  CHECK(absl::IsInvalidArgument(d.status()));
  CHECK(d.status().message().find("assume_spent_at") != std::string::npos);
  quota::ShardedStore<PlainBucket> plain;
  CHECK(plain.apply(p, "k", Nanos{1}, 1).ok());
}

TEST_CASE("gateway keys (KeyPolicy) start with the rule's budget spent") {
  for (const quota::gateway::RulePolicy& rule :
       {quota::gateway::RulePolicy{token_bucket()},
        quota::gateway::RulePolicy{window_policy<FixedWindow>()},
        quota::gateway::RulePolicy{window_policy<SlidingLog>()},
        quota::gateway::RulePolicy{window_policy<SlidingWindowEstimate>()}}) {
    INFO(rule.index());
    const quota::gateway::KeyPolicy policy{.policy = &rule, .version = 1};
    quota::LocalStore<quota::gateway::KeyPolicy> store(
        StoreOptions{.assume_spent_at = Nanos{1'000'000'000}});
    auto d = store.apply(policy, "{acme}read", Nanos{1'000'000'000}, 1);
    REQUIRE(d.ok());
    CHECK_FALSE(d->allowed);
    CHECK(d->remaining == 0);
    // A fresh store's key at the same time is full.
    quota::LocalStore<quota::gateway::KeyPolicy> fresh;
    auto f = fresh.apply(policy, "{acme}read", Nanos{1'000'000'000}, 1);
    REQUIRE(f.ok());
    CHECK(f->allowed);
    CHECK(f->remaining == 49);
  }
}
