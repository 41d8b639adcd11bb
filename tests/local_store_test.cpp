// Tests for quota/store/local_store.hpp: per-key independence, creation at first use,
// update(), and the same capacity rules as the sharded store.
#include <chrono>
#include <string>

#include <catch2/catch.hpp>

#include "quota/policy/token_bucket.hpp"
#include "quota/store/local_store.hpp"
#include "quota/store/sharded_store.hpp"
#include "quota/store/store.hpp"
#include "support/printers.hpp"

using namespace std::chrono_literals;
using quota::LocalStore;
using quota::Nanos;
using quota::TokenBucket;

static_assert(quota::StateStore<LocalStore<TokenBucket>>);
static_assert(quota::StateStore<quota::ShardedStore<TokenBucket>>);
static_assert(quota::has_update<LocalStore<TokenBucket>>);
static_assert(quota::has_update<quota::ShardedStore<TokenBucket>>);

TEST_CASE("keys have independent budgets created at first use", "[local_store]") {
  const TokenBucket p{.rate = {.units = 1, .per = 1s}, .burst = 3};
  LocalStore<TokenBucket> store;
  CHECK(store.size() == 0);
  for (int i = 0; i < 3; ++i) REQUIRE(store.apply(p, "t1:read", Nanos{0}, 1)->allowed);
  CHECK_FALSE(store.apply(p, "t1:read", Nanos{0}, 1)->allowed);
  CHECK(store.apply(p, "t2:read", Nanos{0}, 3)->allowed);  // another tenant: its own bucket
  CHECK(store.size() == 2);
}

TEST_CASE("a key created late starts full at its first request, not at time 0", "[local_store]") {
  const TokenBucket p{.rate = {.units = 1, .per = 1s}, .burst = 2};
  LocalStore<TokenBucket> store;
  auto d = store.apply(p, "late", 100s, 2);
  REQUIRE(d->allowed);
  CHECK(d->remaining == 0);
  CHECK(d->reset_after == 2s);
}

TEST_CASE("update runs a function on the state atomically and returns its result",
          "[local_store]") {
  const TokenBucket p{.rate = {.units = 1, .per = 1s}, .burst = 5};
  LocalStore<TokenBucket> store;
  auto tokens = store.update(p, "k", Nanos{0}, [](TokenBucket::State& s) { return s.tokens; });
  REQUIRE(tokens.ok());
  CHECK(*tokens == 5'000'000);
  REQUIRE(store.apply(p, "k", Nanos{0}, 2)->allowed);
  CHECK(*store.update(p, "k", Nanos{0}, [](TokenBucket::State& s) { return s.tokens; }) ==
        3'000'000);
}

TEST_CASE("local store capacity: refuse new keys, evict idle ones, keep active ones",
          "[local_store][capacity]") {
  const TokenBucket p{.rate = {.units = 1, .per = 1s}, .burst = 1};
  LocalStore<TokenBucket> store({.max_keys = 2});
  REQUIRE(store.apply(p, "a", Nanos{0}, 1)->allowed);
  REQUIRE(store.apply(p, "b", 500ms, 1)->allowed);
  auto refused = store.apply(p, "c", 900ms, 1);
  REQUIRE_FALSE(refused.ok());
  CHECK(refused.status().code() == absl::StatusCode::kResourceExhausted);
  // At 1 s "a" is full again and goes; "b" (full at 1.5 s) stays with its state.
  REQUIRE(store.apply(p, "c", 1s, 1)->allowed);
  CHECK(store.size() == 2);
  CHECK_FALSE(store.apply(p, "b", 1s, 1)->allowed);
}
