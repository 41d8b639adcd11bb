// Tests of RedisStore's errors against a real redis-server: parameters outside the Lua
// twin's exact range, corrupted state (alone and among several keys, nothing charged),
// and NOSCRIPT after SCRIPT FLUSH.
#include <chrono>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include <catch2/catch.hpp>

#include "quota/policy/fixed_window.hpp"
#include "quota/policy/sliding_log.hpp"
#include "quota/policy/sliding_window_estimate.hpp"
#include "quota/policy/token_bucket.hpp"
#include "quota/redis/redis_store.hpp"
#include "support/printers.hpp"
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
using quota::testing::run;
using quota::testing::TenOf;

TEST_CASE("parameters outside the Lua twin's exact range are rejected, naming the bound") {
  using S = RedisStore<TokenBucket>;
  CHECK(S::check(kTen).ok());
  CHECK(S::check({.rate = {.units = 1000, .per = 60s}, .burst = 1000}).ok());
  const absl::Status burst =
      S::check({.rate = {.units = 1, .per = 1ns}, .burst = 1'000'000'000'001});
  CHECK(absl::IsInvalidArgument(burst));
  CHECK(burst.message().find("burst") != absl::string_view::npos);
  CHECK(burst.message().find("1000000000000 units") != absl::string_view::npos);
  const absl::Status fill = S::check({.rate = {.units = 1, .per = 24h}, .burst = 1200});
  CHECK(absl::IsInvalidArgument(fill));
  CHECK(fill.message().find("1157 days") != absl::string_view::npos);
  const absl::Status coprime =
      S::check({.rate = {.units = 999'999'937, .per = Nanos{999'999'929}}, .burst = 1});
  CHECK(absl::IsInvalidArgument(coprime));
  CHECK(coprime.message().find("rate") != absl::string_view::npos);
  RedisStore<TokenBucket> store(options("bounds"));
  CHECK(absl::IsInvalidArgument(
      store.apply({.rate = {.units = 1, .per = 24h}, .burst = 1200}, "k", Nanos{0}, 1).status()));
}

TEST_CASE("a key whose state was corrupted by hand is a clear data-loss error, never a decision") {
  RedisStore<TokenBucket> store(options("corrupt"));
  auto key = store.redis_key("{acme}c");
  REQUIRE(key.ok());
  SECTION("wrong type") { run(store, {"HSET", *key, "tokens", "5"}); }
  SECTION("wrong length") { run(store, {"SET", *key, "17"}); }
  SECTION("fields out of range") {
    // 32 bytes of 0xff: four NaN doubles.
    run(store, {"SET", *key, std::string(32, '\xff')});
  }
  SECTION("a fraction where an integer belongs") {
    // 0.5 as a little-endian double, then three zeros.
    std::string v("\x00\x00\x00\x00\x00\x00\xe0\x3f", 8);
    v += std::string(24, '\0');
    run(store, {"SET", *key, v});
  }
  auto d = store.apply(kTen, "{acme}c", Nanos{0}, 1);
  REQUIRE_FALSE(d.ok());
  CHECK(absl::IsDataLoss(d.status()));
  CHECK(d.status().message().find(*key) != absl::string_view::npos);
  // Deleting the key repairs it (a fresh, full bucket).
  run(store, {"DEL", *key});
  auto fresh = store.apply(kTen, "{acme}c", Nanos{0}, 1);
  REQUIRE(fresh.ok());
  CHECK(fresh->allowed);
}

TEMPLATE_TEST_CASE("a corrupt key among several fails the call, and nothing is charged", "",
                   TokenBucket, quota::FixedWindow, quota::SlidingWindowEstimate,
                   quota::SlidingLog) {
  // The token bucket reads a batch's states with one MGET, which answers nil for a key of
  // another type as for a missing one; the twins that write each bucket as they decide it
  // find a state of the wrong size or out of range only after the buckets before it were
  // written (the script puts them back); the sliding log finds a malformed event after
  // the expired events of the buckets before it were counted (it trims them only when
  // the whole call succeeds).
  using Ten = TenOf<TestType>;
  const TestType ten = Ten::policy();
  RedisStore<TestType> store(options(std::string("corrupt-many-") + Ten::name));
  auto lease = store.options().pool->acquire();
  REQUIRE(lease.ok());
  auto cmd = [&](std::vector<std::string_view> args) {
    auto r = (*lease)->command(args);
    REQUIRE(r.ok());
    return std::move(*r);
  };
  auto key = store.redis_key("{acme}c");
  REQUIRE(key.ok());
  auto fresh = store.redis_key("{acme}new");
  REQUIRE(fresh.ok());
  const std::string events = *key + "}l";  // the sliding log's event list
  // Each section runs the test again on the same keys.
  for (const char* k : {"{acme}a", "{acme}b", "{acme}c"}) {
    const std::string rk = *store.redis_key(k);
    cmd({"DEL", rk, rk + "}l"});
  }
  SECTION("another type") { cmd({"LPUSH", *key, "x"}); }
  SECTION("wrong size") { cmd({"SET", *key, "17"}); }
  SECTION("out of range") { cmd({"SET", *key, std::string(Ten::bytes, '\xff')}); }
  if constexpr (Ten::doubles != 0) {
    SECTION("a state of another length (the same state as doubles)") {
      cmd({"SET", *key, std::string(Ten::doubles, '\xff')});
    }
  }
  if constexpr (std::is_same_v<TestType, quota::FixedWindow>) {
    // the wide form, for counts of 2^24 and more: a count of 2^56 - 1
    SECTION("out of range, the wide form") {
      cmd({"SET", *key, std::string(7, '\xff') + std::string(9, '\0')});
    }
  }
  if constexpr (std::is_same_v<TestType, quota::SlidingLog>) {
    SECTION("a malformed event") { cmd({"RPUSH", events, "x"}); }
  }
  // "{acme}a" was charged at 0 and 30 min; at t (past the window: the sliding log's first
  // event has left) it is decided before "{acme}c" is read. "{acme}new" does not exist.
  // The expected state comes from the C++ policy.
  const Nanos t = 1h + 1s;
  auto model = ten.init(Nanos{0});
  for (const auto& [when, cost] : {std::pair{Nanos{0}, 2}, std::pair{Nanos{30min}, 3}}) {
    REQUIRE(store.apply(ten, "{acme}a", when, cost).ok());
    ten.apply(model, when, cost);
  }
  using Item = typename RedisStore<TestType>::BatchItem;
  using Req = typename RedisStore<TestType>::Request;
  const std::vector<Item> items = {
      {"{acme}a", 4}, {"{acme}new", 4}, {"{acme}c", 1}, {"{acme}b", 4}};
  auto got = store.apply_batch(ten, items, t);
  REQUIRE(got.ok());
  REQUIRE(got->size() == items.size());
  for (const auto& d : *got) {
    REQUIRE_FALSE(d.ok());
    CHECK(absl::IsDataLoss(d.status()));
    CHECK(d.status().message().find(*key) != absl::string_view::npos);
  }
  const std::vector<Req> reqs = {{&ten, "{acme}a", 4}, {&ten, "{acme}c", 1}, {&ten, "{acme}b", 4}};
  auto all = store.apply_all(reqs, t);
  REQUIRE_FALSE(all.ok());
  CHECK(absl::IsDataLoss(all.status()));
  // Nothing was charged or trimmed, and the new bucket was not created. (A peek: cost 11
  // is over the budget.)
  CHECK(cmd({"EXISTS", *fresh, *fresh + "}l"})->integer == 0);
  auto untouched = ten.init(t);
  for (const auto& [good, expected] : {std::pair{"{acme}a", ten.apply(model, t, 11)},
                                       std::pair{"{acme}b", ten.apply(untouched, t, 11)}}) {
    INFO(good);
    auto d = store.apply(ten, good, t, 11);
    REQUIRE(d.ok());
    CHECK(d->reason == Reason::kCostExceedsBurst);
    CHECK(d->remaining == expected.remaining);
    CHECK(d->reset_after == expected.reset_after);
  }
}

TEST_CASE("after SCRIPT FLUSH the store loads the script again and the decision is not lost") {
  RedisStore<TokenBucket> store(options("noscript"));
  REQUIRE(store.apply(kTen, "{acme}n", Nanos{0}, 4).ok());
  run(store, {"SCRIPT", "FLUSH"});
  auto d = store.apply(kTen, "{acme}n", Nanos{0}, 4);
  REQUIRE(d.ok());
  CHECK(d->allowed);
  CHECK(d->remaining == 2);
}
