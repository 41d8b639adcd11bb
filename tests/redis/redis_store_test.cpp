// Tests for quota/redis/redis_store.hpp (and keys.hpp) against a real redis-server: the
// store as a Limiter's store, keys and hash tags, TTLs and bytes per key, parameter
// bounds, corrupted state, NOSCRIPT recovery, idempotent attempts (with a lost reply),
// hierarchical all-or-nothing checks and pipelined batches.
#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <random>
#include <string>
#include <tuple>
#include <type_traits>
#include <typeinfo>
#include <utility>
#include <vector>

#include <catch2/catch.hpp>

#include "quota/clock.hpp"
#include "quota/limiter.hpp"
#include "quota/policy/fixed_window.hpp"
#include "quota/policy/sliding_log.hpp"
#include "quota/policy/sliding_window_estimate.hpp"
#include "quota/policy/token_bucket.hpp"
#include "quota/redis/redis_store.hpp"
#include "support/lossy_proxy.hpp"
#include "support/policy_variants.hpp"
#include "support/printers.hpp"
#include "support/redis_server.hpp"
#include "support/seed.hpp"

using namespace std::chrono_literals;
using quota::Decision;
using quota::Nanos;
using quota::Reason;
using quota::RedisStore;
using quota::RedisStoreOptions;
using quota::TokenBucket;
using quota::redis::TimeSource;

namespace {

RedisStoreOptions options(const std::string& test, TimeSource time = TimeSource::kCaller) {
  return RedisStoreOptions{.pool = quota::testing::redis_pool(),
                           .prefix = quota::testing::unique_prefix(test),
                           .time = time};
}

// Runs one command on the store's server.
quota::redis::Reply run(RedisStore<TokenBucket>& store, std::vector<std::string_view> args) {
  auto lease = store.options().pool->acquire();
  REQUIRE(lease.ok());
  auto r = (*lease)->command(args);
  REQUIRE(r.ok());
  return std::move(*r);
}

const TokenBucket kTen{.rate = {.units = 1, .per = 1s}, .burst = 10};

}  // namespace

TEST_CASE("Limiter<TokenBucket, RedisStore> spends a shared budget with the server's time") {
  auto limiter = quota::Limiter<TokenBucket, RedisStore>::create(
      {.rate = {.units = 1, .per = 1h}, .burst = 5}, options("limiter", TimeSource::kServer));
  REQUIRE(limiter.ok());
  auto key = quota::redis::tenant_key("acme", "read");
  REQUIRE(key.ok());
  CHECK(*key == "{acme}read");
  for (int i = 0; i < 5; ++i) {
    auto d = limiter->acquire(*key, 1);
    REQUIRE(d.ok());
    CHECK(d->allowed);
    CHECK(d->remaining == 4 - i);
  }
  auto denied = limiter->acquire(*key, 1);
  REQUIRE(denied.ok());
  CHECK_FALSE(denied->allowed);
  CHECK(denied->reason == Reason::kOverLimit);
  // A little less than one hour (the refill of one unit) is left, as the server sees it.
  CHECK(denied->retry_after > 3590s);
  CHECK(denied->retry_after <= 3600s);
  auto too_big = limiter->acquire(*key, 6);
  REQUIRE(too_big.ok());
  CHECK(too_big->reason == Reason::kCostExceedsBurst);
  CHECK(too_big->retry_after == quota::kNever);
  auto invalid = limiter->acquire(*key, 0);
  REQUIRE(invalid.ok());
  CHECK(invalid->reason == Reason::kInvalidCost);
}

TEST_CASE(
    "keys: one hash slot per tenant; braces, control bytes and oversized parts are rejected") {
  using quota::redis::split_key;
  using quota::redis::tenant_key;
  CHECK(tenant_key("t", "").ok());
  CHECK_FALSE(tenant_key("", "read").ok());
  CHECK_FALSE(tenant_key("evil}x{victim", "read").ok());
  CHECK_FALSE(tenant_key("acme", "r{victim}").ok());
  CHECK_FALSE(tenant_key("acme", "read\n").ok());
  CHECK_FALSE(tenant_key(std::string(quota::redis::kMaxTenantBytes + 1, 'a'), "read").ok());
  CHECK_FALSE(tenant_key("acme", std::string(quota::redis::kMaxRouteBytes + 1, 'r')).ok());

  auto tenant = split_key("{acme}read");
  REQUIRE(tenant.ok());
  CHECK(tenant->tag == "acme");
  CHECK(tenant->rest == "read");
  auto plain = split_key("tenant-7:read");
  REQUIRE(plain.ok());
  CHECK(plain->tag == "tenant-7:read");
  for (const char* bad :
       {"{}read", "{acme", "{acme}re{ad", "{acme}read}", "a{b}c", "x}y", "line\nbreak", ""}) {
    INFO(bad);
    CHECK_FALSE(split_key(bad).ok());
  }

  RedisStore<TokenBucket> store(options("keys"));
  auto d = store.apply(kTen, "{victim}read}x", Nanos{0}, 1);
  REQUIRE_FALSE(d.ok());
  CHECK(absl::IsInvalidArgument(d.status()));
  auto rk = store.redis_key("{acme}read");
  REQUIRE(rk.ok());
  CHECK(*rk == store.options().prefix + "{acme}read");
  RedisStore<TokenBucket> braces(
      RedisStoreOptions{.pool = quota::testing::redis_pool(1), .prefix = "p{x}"});
  CHECK(absl::IsInvalidArgument(braces.apply(kTen, "k", Nanos{0}, 1).status()));
}

TEST_CASE("a bucket's TTL covers its time to full plus the margin; state is compact") {
  RedisStore<TokenBucket> store(options("ttl", TimeSource::kServer));
  const TokenBucket slow{.rate = {.units = 1, .per = 10s}, .burst = 100};
  auto d = store.apply(slow, "{acme}ttl", Nanos{0}, 30);
  REQUIRE(d.ok());
  REQUIRE(d->allowed);
  CHECK(d->reset_after == 300s);
  auto key = store.redis_key("{acme}ttl");
  REQUIRE(key.ok());
  auto pttl = run(store, {"PTTL", *key});
  REQUIRE(pttl->type == REDIS_REPLY_INTEGER);
  CHECK(pttl->integer > 300'000);
  CHECK(pttl->integer <= 301'000);
  auto bytes = run(store, {"MEMORY", "USAGE", *key});
  REQUIRE(bytes->type == REDIS_REPLY_INTEGER);
  INFO("MEMORY USAGE of a bucket: " << bytes->integer << " bytes (key " << key->size()
                                    << " bytes)");
  std::printf("MEMORY USAGE of one bucket (key of %zu bytes): %lld bytes\n", key->size(),
              static_cast<long long>(bytes->integer));
  CHECK(bytes->integer <= 128);

  // A rate of 0 is a one-off budget: it must never expire (it would come back full).
  const TokenBucket once{.rate = {.units = 0, .per = 1s}, .burst = 3};
  REQUIRE(store.apply(once, "{acme}once", Nanos{0}, 1).ok());
  auto once_key = store.redis_key("{acme}once");
  REQUIRE(once_key.ok());
  CHECK(run(store, {"PTTL", *once_key})->integer == -1);
}

TEST_CASE("a bucket's TTL never drops below its time to full plus the margin, also when kept") {
  // The token bucket twin keeps a key's TTL (SETRANGE) while the expiry it set last
  // still covers time to full + margin, and extends it by one margin more when not.
  RedisStore<TokenBucket> store(options("ttl-kept", TimeSource::kServer));
  const TokenBucket tb{.rate = {.units = 1000, .per = 1s}, .burst = 1000};  // full in 1 s
  const std::chrono::milliseconds margin = store.options().ttl_margin;
  auto key = store.redis_key("{acme}kept");
  REQUIRE(key.ok());
  std::mt19937_64 rng(quota::testing::test_seed(20261201));
  int kept = 0;
  long long last_pttl = -1;
  // The decisions are the C++ policy's at the server's times, also after the writes that
  // keep the TTL (they overwrite the state in place).
  std::optional<TokenBucket::State> model;
  for (int i = 0; i < 300; ++i) {
    const std::int64_t cost = 1 + static_cast<std::int64_t>(rng() % 40);
    auto outcome = store.apply_attempt(tb, "{acme}kept", Nanos{0}, cost);
    REQUIRE(outcome.ok());
    if (!model) model = tb.init(outcome->time);
    const Decision* d = &outcome->decision;
    REQUIRE(*d == tb.apply(*model, outcome->time, cost));
    const long long pttl = run(store, {"PTTL", *key})->integer;
    const long long need =
        std::chrono::ceil<std::chrono::milliseconds>(d->reset_after).count() + margin.count();
    INFO("request " << i << " cost " << cost << " reset_after " << d->reset_after.count()
                    << " ns, PTTL " << pttl << " ms");
    // 10 ms of slack for the time between the script and PTTL on a busy machine.
    REQUIRE(pttl >= need - 10);
    // A kept expiry was set at an earlier write as ceil(time to full then) + 2 margins,
    // in whole ms on the server's clock, while `need` rounds this write's time to full up
    // on its own: the two roundings may differ by a millisecond each.
    CHECK(pttl <= need + margin.count() + 2);
    if (last_pttl >= 0 && pttl < last_pttl) ++kept;  // the expiry did not move
    last_pttl = pttl;
  }
  CHECK(kept > 0);
}

TEST_CASE("parameters outside the Lua twin's exact range are rejected, naming the bound") {
  using S = RedisStore<TokenBucket>;
  CHECK(S::check(kTen).ok());
  CHECK(S::check({.rate = {.units = 1000, .per = 60s}, .burst = 1000}).ok());
  const absl::Status burst = S::check({.rate = {.units = 1, .per = 1ns}, .burst = 9'007'199'255});
  CHECK(absl::IsInvalidArgument(burst));
  CHECK(burst.message().find("burst") != absl::string_view::npos);
  CHECK(burst.message().find("2^53") != absl::string_view::npos);
  const absl::Status fill = S::check({.rate = {.units = 1, .per = 24h}, .burst = 200});
  CHECK(absl::IsInvalidArgument(fill));
  CHECK(fill.message().find("104 days") != absl::string_view::npos);
  const absl::Status coprime =
      S::check({.rate = {.units = 999'999'937, .per = Nanos{999'999'929}}, .burst = 1});
  CHECK(absl::IsInvalidArgument(coprime));
  CHECK(coprime.message().find("rate") != absl::string_view::npos);
  RedisStore<TokenBucket> store(options("bounds"));
  CHECK(absl::IsInvalidArgument(
      store.apply({.rate = {.units = 1, .per = 24h}, .burst = 200}, "k", Nanos{0}, 1).status()));
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

namespace {

// Each policy with a budget of 10, and the sizes of its twin's packed state (a corrupt
// state of such a size is only found out of range): `bytes` the current form, `legacy`
// the earlier form still read (0: none).
template <class P>
struct TenOf;
template <>
struct TenOf<TokenBucket> {
  static constexpr const char* name = "token-bucket";
  static constexpr std::size_t bytes = 28;
  static constexpr std::size_t legacy = 32;
  static TokenBucket policy() { return {.rate = {.units = 1, .per = 600s}, .burst = 10}; }
};
template <class W, std::size_t Bytes, std::size_t Legacy>
struct TenOfWindow {
  static constexpr std::size_t bytes = Bytes;
  static constexpr std::size_t legacy = Legacy;
  static W policy() { return {.limit = 10, .window = 1h}; }
};
template <>
struct TenOf<quota::FixedWindow> : TenOfWindow<quota::FixedWindow, 12, 24> {
  static constexpr const char* name = "fixed-window";
};
template <>
struct TenOf<quota::SlidingWindowEstimate> : TenOfWindow<quota::SlidingWindowEstimate, 21, 32> {
  static constexpr const char* name = "window-estimate";
};
template <>
struct TenOf<quota::SlidingLog> : TenOfWindow<quota::SlidingLog, 24, 0> {
  static constexpr const char* name = "sliding-log";
};

}  // namespace

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
  if constexpr (Ten::legacy != 0) {
    SECTION("out of range, the earlier form") {
      cmd({"SET", *key, std::string(Ten::legacy, '\xff')});
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

namespace {

// Runs one command on a store's server.
template <class S>
quota::redis::Reply run_in(S& store, std::vector<std::string_view> args) {
  auto lease = store.options().pool->acquire();
  REQUIRE(lease.ok());
  auto r = (*lease)->command(args);
  REQUIRE(r.ok());
  return std::move(*r);
}

// A window policy's state as struct-packed doubles, the straightforward form the MEMORY
// USAGE test compares the twin's with: the fixed window's (count, seconds, nanoseconds),
// the estimate's (cur, prev, seconds, nanoseconds).
void set_legacy(RedisStore<quota::FixedWindow>& store, const std::string& key,
                const quota::FixedWindow::State& st) {
  const std::string c = std::to_string(st.count), sec = std::to_string(st.last / 1'000'000'000),
                    ns = std::to_string(st.last % 1'000'000'000);
  run_in(store, {"EVAL",
                 "redis.call('SET', KEYS[1], struct.pack('<ddd', ARGV[1] + 0, ARGV[2] + 0, "
                 "ARGV[3] + 0), 'PX', 3600000)",
                 "1", key, c, sec, ns});
}
void set_legacy(RedisStore<quota::SlidingWindowEstimate>& store, const std::string& key,
                const quota::SlidingWindowEstimate::State& st) {
  const std::string c = std::to_string(st.cur), p = std::to_string(st.prev),
                    sec = std::to_string(st.last / 1'000'000'000),
                    ns = std::to_string(st.last % 1'000'000'000);
  run_in(store, {"EVAL",
                 "redis.call('SET', KEYS[1], struct.pack('<dddd', ARGV[1] + 0, ARGV[2] + 0, "
                 "ARGV[3] + 0, ARGV[4] + 0), 'PX', 3600000)",
                 "1", key, c, p, sec, ns});
}

// A window policy's state in its Lua twin's current form, unmarked (its TTL not known to
// cover it, as a caller-time write leaves it): the fixed window's '<I3i5I4' (count below
// 2^24) or '<I7i5I4' (count, seconds, nanoseconds), the estimate's '<I6I6i5I4' (cur,
// prev, seconds, nanoseconds).
void set_state(RedisStore<quota::FixedWindow>& store, const std::string& key,
               const quota::FixedWindow::State& st) {
  const std::int64_t sec = st.last / 1'000'000'000 - (st.last % 1'000'000'000 < 0 ? 1 : 0);
  const std::string c = std::to_string(st.count), s = std::to_string(sec),
                    ns = std::to_string(st.last - sec * 1'000'000'000);
  run_in(store, {"EVAL",
                 "local f = '<I7i5I4' if ARGV[1] + 0 < 16777216 then f = '<I3i5I4' end "
                 "redis.call('SET', KEYS[1], struct.pack(f, ARGV[1] + 0, ARGV[2] + 0, "
                 "ARGV[3] + 0), 'PX', 3600000)",
                 "1", key, c, s, ns});
}
void set_state(RedisStore<quota::SlidingWindowEstimate>& store, const std::string& key,
               const quota::SlidingWindowEstimate::State& st) {
  const std::int64_t sec = st.last / 1'000'000'000 - (st.last % 1'000'000'000 < 0 ? 1 : 0);
  const std::string c = std::to_string(st.cur), p = std::to_string(st.prev),
                    s = std::to_string(sec), ns = std::to_string(st.last - sec * 1'000'000'000);
  run_in(store, {"EVAL",
                 "redis.call('SET', KEYS[1], struct.pack('<I6I6i5I4', ARGV[1] + 0, ARGV[2] + 0, "
                 "ARGV[3] + 0, ARGV[4] + 0), 'PX', 3600000)",
                 "1", key, c, p, s, ns});
}

}  // namespace

TEST_CASE("the estimate twin decides exactly where its products cross 2^53") {
  // The twin compares prev·(W − el) with (limit − cur − cost)·W as plain numbers while
  // both are below 2^53 and in two limbs beyond; remaining's prev·el / W likewise (2^52).
  // States with both products within a few units of 2^53 (written by hand in the twin's
  // form) are decided as the C++ policy decides them.
  const auto seed = quota::testing::test_seed(20261204);
  INFO("seed " << seed);
  std::mt19937_64 rng(seed);
  using quota::SlidingWindowEstimate;
  RedisStore<SlidingWindowEstimate> store(options("estimate-2^53"));
  const std::int64_t t53 = std::int64_t{1} << 53;
  const std::int64_t windows[] = {1'000'000'000, 1'000'000'000'000, 1'000'000'000'000'000,
                                  4'500'000'000'000'000};
  int allowed = 0, denied = 0;
  for (int trial = 0; trial < 200; ++trial) {
    const std::int64_t w = windows[rng() % std::size(windows)];
    const std::int64_t el = static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(w / 2));
    auto near = [&](std::int64_t v) {
      return std::max<std::int64_t>(0, v + static_cast<std::int64_t>(rng() % 7) - 3);
    };
    const std::int64_t cur = static_cast<std::int64_t>(rng() % 4);
    const std::int64_t cost = 1 + static_cast<std::int64_t>(rng() % 3);
    const std::int64_t spare = near(t53 / w);
    const SlidingWindowEstimate p{.limit = cur + cost + spare, .window = Nanos{w}};
    REQUIRE(RedisStore<SlidingWindowEstimate>::check(p).ok());
    const std::int64_t k = static_cast<std::int64_t>(
        rng() % static_cast<std::uint64_t>((std::int64_t{1} << 62) / w - 1));
    SlidingWindowEstimate::State state{
        .cur = cur, .prev = std::max<std::int64_t>(1, near(t53 / (w - el))), .last = k * w + el};
    const std::string route = "{acme}e" + std::to_string(trial);
    auto key = store.redis_key(route);
    REQUIRE(key.ok());
    set_state(store, *key, state);
    std::int64_t now = state.last;
    for (int i = 0; i < 3; ++i) {
      const Decision expected = p.apply(state, Nanos{now}, cost);
      auto got = store.apply(p, route, Nanos{now}, cost);
      INFO("trial " << trial << " request " << i << " W " << w << " limit " << p.limit << " cur "
                    << state.cur << " prev " << state.prev << " now " << now);
      REQUIRE(got.ok());
      CHECK(*got == expected);
      (expected.allowed ? allowed : denied) += 1;
      now += static_cast<std::int64_t>(rng() % 1000);
    }
  }
  CHECK(allowed > 50);
  CHECK(denied > 50);

  // Ties: prev·(W − el) = spare·W ± 1 with spare·W >= 2^53 (where doubles are 2 apart, so
  // a rounded comparison would get one of the two wrong): −1 passes, +1 does not.
  int ties = 0;
  for (int trial = 0; ties < 200 && trial < 20'000; ++trial) {
    const std::int64_t w = windows[rng() % std::size(windows)];
    const std::int64_t lo = t53 / w + 1;
    const std::int64_t prev =
        lo + 1 + static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(3 * lo));
    // spare ≡ −e·W^-1 (mod prev), by the extended Euclid algorithm
    absl::int128 r0 = prev, r1 = w % prev, s0 = 0, s1 = 1;
    while (r1 != 0) {
      const absl::int128 q = r0 / r1;
      std::tie(r0, r1) = std::pair{r1, r0 - q * r1};
      std::tie(s0, s1) = std::pair{s1, s0 - q * s1};
    }
    if (r0 != 1) continue;  // W and prev share a factor
    const std::int64_t e = rng() % 2 == 0 ? -1 : 1;
    const std::int64_t inv = static_cast<std::int64_t>(((s0 % prev) + prev) % prev);
    const std::int64_t spare =
        static_cast<std::int64_t>(((absl::int128(-e) * inv) % prev + prev) % prev);
    if (spare < lo) continue;
    const absl::int128 target = absl::int128(spare) * w + e;
    REQUIRE(target % prev == 0);
    const std::int64_t d = static_cast<std::int64_t>(target / prev);  // W − el
    if (d < 1 || d > w) continue;
    const std::int64_t cur = static_cast<std::int64_t>(rng() % 3);
    const SlidingWindowEstimate p{.limit = cur + 1 + spare, .window = Nanos{w}};
    if (!RedisStore<SlidingWindowEstimate>::check(p).ok()) continue;
    const std::int64_t k = static_cast<std::int64_t>(
        rng() % static_cast<std::uint64_t>((std::int64_t{1} << 62) / w - 1));
    SlidingWindowEstimate::State state{.cur = cur, .prev = prev, .last = k * w + (w - d)};
    const std::string route = "{acme}tie" + std::to_string(ties);
    auto key = store.redis_key(route);
    REQUIRE(key.ok());
    set_state(store, *key, state);
    const Decision expected = p.apply(state, Nanos{state.last}, 1);
    INFO("tie " << ties << " W " << w << " prev " << prev << " spare " << spare << " e " << e);
    REQUIRE(expected.allowed == (e < 0));
    auto got = store.apply(p, route, Nanos{state.last}, 1);
    REQUIRE(got.ok());
    CHECK(*got == expected);
    ++ties;
  }
  CHECK(ties == 200);
}

TEMPLATE_TEST_CASE("a window key takes fewer bytes than in the earlier form (MEMORY USAGE)", "",
                   quota::FixedWindow, quota::SlidingWindowEstimate) {
  using Ten = TenOf<TestType>;
  RedisStore<TestType> store(options(std::string("memory-") + Ten::name, TimeSource::kServer));
  const TestType p = Ten::policy();
  auto d = store.apply(p, "{acme}mem-new", Nanos{0}, 3);
  REQUIRE(d.ok());
  REQUIRE(d->allowed);
  auto key = store.redis_key("{acme}mem-new");
  auto old_key = store.redis_key("{acme}mem-old");  // a key of the same length
  REQUIRE(key.ok());
  REQUIRE(old_key.ok());
  REQUIRE(key->size() == old_key->size());
  // The same decision's state in the earlier form (counted 3 at 10 s), with a TTL too.
  auto state = p.init(Nanos{10s});
  REQUIRE(p.apply(state, Nanos{10s}, 3).allowed);
  set_legacy(store, *old_key, state);
  const long long now_bytes = run_in(store, {"MEMORY", "USAGE", *key})->integer;
  const long long old_bytes = run_in(store, {"MEMORY", "USAGE", *old_key})->integer;
  std::printf("MEMORY USAGE of one %s key (key of %zu bytes): %lld bytes (earlier form: %lld)\n",
              Ten::name, key->size(), now_bytes, old_bytes);
  INFO(Ten::name << ": " << now_bytes << " bytes, earlier form " << old_bytes);
  CHECK(run_in(store, {"STRLEN", *key})->integer == static_cast<long long>(Ten::bytes));
  CHECK(now_bytes > 0);
  CHECK(now_bytes < old_bytes);
}

TEMPLATE_TEST_CASE("a window key's kept writes overwrite it in place: same bytes, TTL kept", "",
                   quota::FixedWindow, quota::SlidingWindowEstimate) {
  // Server time, a window of an hour: the writes after the first in a window keep the TTL
  // and overwrite the state in place (SETRANGE: the value becomes a raw string). Its
  // length and MEMORY USAGE do not change, and the decisions are the policy's at the
  // server's times. The fixed window's count crossing 2^24 in the window (12 -> 16 bytes)
  // is rewritten whole (SET KEEPTTL): MEMORY USAGE as a new 16-byte value's, not grown.
  using Ten = TenOf<TestType>;
  RedisStore<TestType> store(options(std::string("in-place-") + Ten::name, TimeSource::kServer));
  const TestType p{.limit = std::int64_t{1} << 25, .window = 1h};
  auto key = store.redis_key("{acme}place-a");
  auto ref = store.redis_key("{acme}place-b");  // a key of the same length
  REQUIRE(key.ok());
  REQUIRE(ref.ok());
  REQUIRE(key->size() == ref->size());
  auto usage = [&](const std::string& k) { return run_in(store, {"MEMORY", "USAGE", k})->integer; };
  // MEMORY USAGE of a key of the same length holding the same value, written new.
  auto as_new = [&] {
    auto value = run_in(store, {"GET", *key});
    REQUIRE(value->type == REDIS_REPLY_STRING);
    run_in(store, {"SET", *ref, std::string_view(value->str, value->len)});
    return usage(*ref);
  };
  // (Retried when the hour turns during the loop.)
  for (int attempt = 0; attempt < 3; ++attempt) {
    run_in(store, {"DEL", *key});
    std::optional<typename TestType::State> model;
    std::optional<Decision> first;
    long long bytes = 0, last_pttl = 0;
    bool turned = false;
    auto step = [&](std::int64_t cost) {
      auto outcome = store.apply_attempt(p, "{acme}place-a", Nanos{0}, cost);
      REQUIRE(outcome.ok());
      if (!model) model = p.init(outcome->time);
      const Decision expected = p.apply(*model, outcome->time, cost);
      CHECK(outcome->decision == expected);
      if (first && outcome->decision.reset_after > first->reset_after) turned = true;
      if (!first) first = outcome->decision;
      return outcome->decision;
    };
    REQUIRE(step(1).allowed);
    bytes = usage(*key);
    last_pttl = run_in(store, {"PTTL", *key})->integer;
    CHECK(bytes == as_new());
    for (int i = 0; i < 5 && !turned; ++i) {
      REQUIRE(step(1).allowed);
      if (turned) break;
      const long long pttl = run_in(store, {"PTTL", *key})->integer;
      INFO("write " << i << ": PTTL " << pttl << " ms, before " << last_pttl << " ms");
      CHECK(pttl <= last_pttl);  // kept, not set again
      last_pttl = pttl;
      CHECK(run_in(store, {"STRLEN", *key})->integer == static_cast<long long>(Ten::bytes));
      CHECK(std::string(run_in(store, {"OBJECT", "ENCODING", *key})->str) == "raw");
      CHECK(usage(*key) == bytes);
    }
    if constexpr (std::is_same_v<TestType, quota::FixedWindow>) {
      // 6 counted: the count reaches 2^24 in the same window
      const Decision big = step((std::int64_t{1} << 24) - 6);
      REQUIRE(big.allowed);
      if (turned) continue;
      CHECK(run_in(store, {"STRLEN", *key})->integer == 16);
      const long long pttl = run_in(store, {"PTTL", *key})->integer;
      CHECK(pttl <= last_pttl);
      last_pttl = pttl;
      const long long grown = usage(*key);
      CHECK(grown == as_new());
      REQUIRE(step(1).allowed);  // 16 bytes, overwritten in place
      if (turned) continue;
      CHECK(run_in(store, {"STRLEN", *key})->integer == 16);
      CHECK(run_in(store, {"PTTL", *key})->integer <= last_pttl);
      CHECK(usage(*key) == grown);
    }
    if (!turned) break;
  }
}

TEMPLATE_TEST_CASE("a busy window key never expires before reset_after plus the margin", "",
                   quota::FixedWindow, quota::SlidingWindowEstimate) {
  // Server time and windows of 50 ms: the requests of the loop cross many windows. Later
  // writes in a window keep the TTL set by its first (SETRANGE in place), and so does the
  // estimate's first write of a window that counts nothing (only prev left: the TTL of the
  // window before still covers it); after each write the key's TTL still covers
  // reset_after (rounded up to ms) plus the margin, and is no longer. Half of the
  // requests cost more than the limit (counted nothing).
  const auto seed = quota::testing::test_seed(20261203);
  INFO("seed " << seed);
  std::mt19937_64 rng(seed);
  using Ten = TenOf<TestType>;
  auto opts = options(std::string("ttl-busy-") + Ten::name, TimeSource::kServer);
  opts.ttl_margin = std::chrono::milliseconds(100);
  RedisStore<TestType> store(opts);
  const TestType p{.limit = 1'000'000, .window = 50ms};
  auto key = store.redis_key("{acme}busy");
  REQUIRE(key.ok());
  using Clock = std::chrono::steady_clock;
  const auto deadline = Clock::now() + 5s;
  int windows = 0, requests = 0;
  std::optional<Decision> before;
  Clock::time_point before_at;
  while (windows < 8 && Clock::now() < deadline) {
    const bool counts = rng() % 2 == 0;
    const auto at = Clock::now();
    auto d = store.apply(p, "{acme}busy", Nanos{0}, counts ? 1 : p.limit + 1);
    REQUIRE(d.ok());
    REQUIRE(d->allowed == counts);
    const long long pttl = run_in(store, {"PTTL", *key})->integer;
    // The script ran after `at`, PTTL before now: the TTL left may be short by that much,
    // and by 3 ms for the roundings to whole ms of the write that set it and of this one.
    const long long waited =
        std::chrono::ceil<std::chrono::milliseconds>(Clock::now() - at).count();
    const long long need =
        std::chrono::ceil<std::chrono::milliseconds>(d->reset_after).count() + 100;
    INFO("request " << requests << " reset_after " << d->reset_after.count() << " ns, PTTL " << pttl
                    << " ms, " << waited << " ms after the call began");
    REQUIRE(pttl >= need - 3 - waited);
    CHECK(pttl <= need + 3);
    // The time to the next window start, W − el in (0, W], grows only at a new window
    // (compared only when both calls ran within 20 ms, less than a window).
    const auto done = Clock::now();
    const Nanos to_next = (d->reset_after - Nanos{1}) % p.window + Nanos{1};
    if (before && done - before_at < 20ms && before->reset_after > Nanos{0} &&
        d->reset_after > Nanos{0}) {
      if (to_next > (before->reset_after - Nanos{1}) % p.window + Nanos{1}) {
        ++windows;
      } else if constexpr (std::is_same_v<TestType, quota::FixedWindow>) {
        // the same window: the count went on (the key lived)
        CHECK(d->remaining == before->remaining - (counts ? 1 : 0));
      }
    }
    before = *d;
    before_at = at;
    ++requests;
  }
  INFO(requests << " requests");
  CHECK(windows >= 4);
}

TEMPLATE_TEST_CASE("a window key's TTL is kept within its window and set again when unknown", "",
                   quota::FixedWindow, quota::SlidingWindowEstimate) {
  // Two stores on the same keys with different margins: a write in the window keeps the
  // TTL the other set (SETRANGE in place), which is how it shows.
  using Ten = TenOf<TestType>;
  auto opts = options(std::string("ttl-kept-") + Ten::name, TimeSource::kServer);
  opts.ttl_margin = 5s;
  RedisStore<TestType> long_margin(opts);
  opts.ttl_margin = 100ms;
  RedisStore<TestType> short_margin(opts);
  const TestType p{.limit = 100, .window = 1h};
  auto key = long_margin.redis_key("{acme}kept");
  REQUIRE(key.ok());
  auto need = [](const Decision& d, std::chrono::milliseconds margin) {
    return std::chrono::ceil<std::chrono::milliseconds>(d.reset_after).count() + margin.count();
  };
  // (Retried when the hour turns between the two writes.)
  for (int attempt = 0; attempt < 3; ++attempt) {
    run_in(long_margin, {"DEL", *key});
    auto a = long_margin.apply(p, "{acme}kept", Nanos{0}, 1);
    REQUIRE(a.ok());
    auto b = short_margin.apply(p, "{acme}kept", Nanos{0}, 1);
    REQUIRE(b.ok());
    if (b->reset_after > a->reset_after) continue;
    CHECK(b->remaining == 98);
    const long long pttl = run_in(long_margin, {"PTTL", *key})->integer;
    INFO("PTTL " << pttl << " ms, reset_after " << b->reset_after.count() << " ns");
    CHECK(pttl >= need(*b, 5s) - 10);  // the first write's TTL, kept
    break;
  }
  // A key written with nothing counted has only the margin as its TTL, and is not marked:
  // the next write that counts sets the TTL again.
  auto fresh = long_margin.redis_key("{acme}unmarked");
  REQUIRE(fresh.ok());
  run_in(long_margin, {"DEL", *fresh});
  auto none = short_margin.apply(p, "{acme}unmarked", Nanos{0}, 101);
  REQUIRE(none.ok());
  CHECK(none->reason == Reason::kCostExceedsBurst);
  CHECK(run_in(long_margin, {"PTTL", *fresh})->integer <= 100);
  auto counted = long_margin.apply(p, "{acme}unmarked", Nanos{0}, 1);
  REQUIRE(counted.ok());
  CHECK(run_in(long_margin, {"PTTL", *fresh})->integer >= need(*counted, 5s) - 10);
  // A state written unmarked (as a caller-time write leaves it) is not marked either.
  auto old_key = long_margin.redis_key("{acme}old-ttl");
  REQUIRE(old_key.ok());
  auto legacy = p.init(Nanos{0});
  set_state(short_margin, *old_key, legacy);
  run_in(long_margin, {"PEXPIRE", *old_key, "50"});
  auto renewed = long_margin.apply(p, "{acme}old-ttl", Nanos{0}, 1);
  REQUIRE(renewed.ok());
  CHECK(run_in(long_margin, {"PTTL", *old_key})->integer >= need(*renewed, 5s) - 10);
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

TEST_CASE("an attempt id makes a decision idempotent, even when its reply was lost") {
  quota::testing::LossyProxy proxy(quota::testing::redis_port());
  auto cfg = quota::testing::redis_config();
  cfg.port = proxy.port();
  auto opts = options("attempt");
  opts.pool = std::make_shared<quota::redis::ConnectionPool>(cfg, 1);
  RedisStore<TokenBucket> store(opts);
  // Load the script first, so that the lost reply is the decision's.
  REQUIRE(store.apply(kTen, "{acme}warm", Nanos{0}, 1).ok());

  proxy.drop_next_reply();
  auto lost = store.apply_attempt(kTen, "{acme}att", Nanos{0}, 4, "attempt-1");
  REQUIRE_FALSE(lost.ok());
  CHECK(absl::IsUnavailable(lost.status()));
  CHECK(proxy.dropped() == 1);

  // The retry replays the first decision: it ran on the server, and charges nothing more.
  auto retry = store.apply_attempt(kTen, "{acme}att", Nanos{0}, 4, "attempt-1");
  REQUIRE(retry.ok());
  CHECK(retry->replayed);
  CHECK(retry->decision.allowed);
  CHECK(retry->decision.remaining == 6);
  auto again = store.apply_attempt(kTen, "{acme}att", Nanos{5}, 4, "attempt-1");
  REQUIRE(again.ok());
  CHECK(again->replayed);
  CHECK(again->decision == retry->decision);
  auto next = store.apply_attempt(kTen, "{acme}att", Nanos{0}, 1);
  REQUIRE(next.ok());
  CHECK_FALSE(next->replayed);
  CHECK(next->decision.remaining == 5);  // 10 − 4 (once) − 1

  // The same id with another cost or another key is an error, and charges nothing.
  auto other_cost = store.apply_attempt(kTen, "{acme}att", Nanos{0}, 3, "attempt-1");
  CHECK(absl::IsInvalidArgument(other_cost.status()));
  auto other_key = store.apply_attempt(kTen, "{acme}other", Nanos{0}, 4, "attempt-1");
  CHECK(absl::IsInvalidArgument(other_key.status()));
  auto after = store.apply(kTen, "{acme}att", Nanos{0}, 1);
  REQUIRE(after.ok());
  CHECK(after->remaining == 4);
  CHECK(absl::IsInvalidArgument(
      store.apply_attempt(kTen, "{acme}att", Nanos{0}, 1, "bad\nid").status()));

  // The record expires after attempt_ttl.
  auto lease = store.options().pool->acquire();
  REQUIRE(lease.ok());
  auto ttl = (*lease)->command({"PTTL", store.options().prefix + "a{acme}attempt-1"});
  REQUIRE(ttl.ok());
  CHECK((*ttl)->integer > 0);
  CHECK((*ttl)->integer <= std::chrono::milliseconds(store.options().attempt_ttl).count());
}

TEST_CASE("a hierarchical check deducts from every bucket or from none") {
  RedisStore<TokenBucket> store(options("hier"));
  const TokenBucket tenant_wide{.rate = {.units = 1, .per = 1s}, .burst = 10};
  const TokenBucket route{.rate = {.units = 1, .per = 1s}, .burst = 3};
  using Req = RedisStore<TokenBucket>::Request;
  const std::vector<Req> both = {{&tenant_wide, "{acme}", 2}, {&route, "{acme}create", 2}};
  auto first = store.apply_all(both, Nanos{0});
  REQUIRE(first.ok());
  CHECK(first->decision.allowed);
  CHECK(first->decision.remaining == 1);  // the least: route 3 − 2
  REQUIRE(first->parts.size() == 2);
  CHECK(first->parts[0].remaining == 8);
  auto second = store.apply_all(both, Nanos{0});
  REQUIRE(second.ok());
  CHECK_FALSE(second->decision.allowed);  // the route bucket has 1 left
  CHECK(second->decision.reason == Reason::kOverLimit);
  CHECK(second->decision.retry_after == 1s);
  CHECK(second->parts[0].remaining == 8);  // the tenant-wide bucket was not charged
  CHECK_FALSE(second->parts[0].allowed);   // each part carries the call's outcome
  auto tenant = store.apply(tenant_wide, "{acme}", Nanos{0}, 1);
  REQUIRE(tenant.ok());
  CHECK(tenant->remaining == 7);
  const std::vector<Req> cross = {{&tenant_wide, "{acme}", 1}, {&route, "{other}create", 1}};
  CHECK(absl::IsInvalidArgument(store.apply_all(cross, Nanos{0}).status()));
}

TEMPLATE_TEST_CASE("all-or-nothing checks match the C++ policies: every bucket deducted or none",
                   "", TokenBucket, quota::FixedWindow, quota::SlidingWindowEstimate,
                   quota::SlidingLog) {
  // Random checks over one, two or three buckets of one tenant, each with its own
  // parameters, at nondecreasing times (caller time). The model: each bucket's C++ policy
  // decides on a copy of its state; when all allow, the copies are kept (all deducted);
  // else none is (the next decision refills over the whole gap, which is the same as
  // refilling now and then, as time never goes back here).
  const auto seed = quota::testing::test_seed(20261201);
  INFO("seed " << seed);
  std::mt19937_64 rng(seed);
  const auto policies = quota::testing::policy_variants<TestType>();
  RedisStore<TestType> store(options(std::string("all-or-none-") + typeid(TestType).name()));
  const std::string keys[3] = {"{aon}a", "{aon}b", "{aon}c"};
  std::optional<typename TestType::State> model[3];
  Nanos now{1'000'000'000'000};
  int all_allowed = 0, some_denied = 0;
  for (int step = 0; step < 600; ++step) {
    now += Nanos{static_cast<std::int64_t>(rng() % 300'000'000)};
    std::vector<std::size_t> which = {0, 1, 2};
    std::shuffle(which.begin(), which.end(), rng);
    which.resize(1 + rng() % 3);
    std::vector<typename RedisStore<TestType>::Request> reqs;
    std::vector<typename TestType::State> copies;
    std::vector<Decision> want;
    bool all = true;
    for (std::size_t b : which) {
      const std::int64_t cost = 1 + static_cast<std::int64_t>(rng() % 3);
      reqs.push_back({&policies[b], keys[b], cost});
      if (!model[b]) model[b] = policies[b].init(now);
      copies.push_back(*model[b]);
      want.push_back(policies[b].apply(copies.back(), now, cost));
      all = all && want.back().allowed;
    }
    INFO("step " << step << ": " << which.size() << " buckets");
    auto got = store.apply_all(reqs, now);
    REQUIRE(got.ok());
    REQUIRE(got->parts.size() == which.size());
    REQUIRE(got->decision.allowed == all);
    for (std::size_t j = 0; j < which.size(); ++j) {
      INFO("bucket " << keys[which[j]]);
      if (all) {
        CHECK(got->parts[j] == want[j]);
      } else if (!want[j].allowed) {
        CHECK_FALSE(got->parts[j].allowed);
        CHECK(got->parts[j].reason == want[j].reason);
        CHECK(got->parts[j].retry_after == want[j].retry_after);
      }
    }
    if (all) {
      for (std::size_t j = 0; j < which.size(); ++j) model[which[j]] = copies[j];
      ++all_allowed;
    } else {
      ++some_denied;
    }
  }
  CHECK(all_allowed > 50);
  CHECK(some_denied > 50);
}

TEST_CASE("apply_pipelined pipelines a batch with the same decisions as one by one") {
  RedisStore<TokenBucket> store(options("many"));
  using Item = RedisStore<TokenBucket>::BatchItem;
  std::vector<Item> items;
  for (int i = 0; i < 64; ++i) items.push_back({i % 2 == 0 ? "{acme}hot" : "{acme}cold", 1});
  items.push_back({"{bad", 1});
  auto result = store.apply_pipelined(kTen, items, Nanos{0});
  REQUIRE(result.ok());
  REQUIRE(result->size() == 65);
  int hot_allowed = 0;
  for (int i = 0; i < 64; i += 2) {
    REQUIRE((*result)[i].ok());
    // in request order: the first 10 pass, then every one is denied
    CHECK((*result)[i]->allowed == (i / 2 < 10));
    hot_allowed += (*result)[i]->allowed;
  }
  CHECK(hot_allowed == 10);
  CHECK(absl::IsInvalidArgument((*result)[64].status()));
  // After SCRIPT FLUSH the batch still decides (NOSCRIPT → retried once with EVAL).
  run(store, {"SCRIPT", "FLUSH"});
  auto more =
      store.apply_pipelined(kTen, std::vector<Item>{{"{acme}new", 3}, {"{acme}new", 3}}, Nanos{0});
  REQUIRE(more.ok());
  REQUIRE((*more)[1].ok());
  CHECK((*more)[1]->remaining == 4);
}

TEMPLATE_TEST_CASE("every policy works as Limiter<P, RedisStore> with the server's time", "",
                   quota::FixedWindow, quota::SlidingLog, quota::SlidingWindowEstimate) {
  auto limiter = quota::Limiter<TestType, RedisStore>::create(
      TestType{.limit = 3, .window = std::chrono::hours(1)},
      options(std::string("limiter-") + std::to_string(sizeof(typename TestType::State)),
              TimeSource::kServer));
  REQUIRE(limiter.ok());
  auto key = quota::redis::tenant_key("acme", "window");
  REQUIRE(key.ok());
  for (int i = 0; i < 3; ++i) {
    auto d = limiter->acquire(*key, 1);
    REQUIRE(d.ok());
    CHECK(d->allowed);
    CHECK(d->remaining == 2 - i);
  }
  auto denied = limiter->acquire(*key, 1);
  REQUIRE(denied.ok());
  CHECK_FALSE(denied->allowed);
  CHECK(denied->reason == Reason::kOverLimit);
  CHECK(denied->retry_after > Nanos{0});
  CHECK(denied->retry_after <= std::chrono::hours(2));
}

TEST_CASE("apply_batch decides a batch of 10,000 buckets in one script call") {
  // More keys than Lua can unpack onto its stack at once (about 8,000): the script reads
  // the states in slices.
  RedisStore<TokenBucket> store(options("big-batch"));
  using Item = RedisStore<TokenBucket>::BatchItem;
  std::vector<std::string> keys;
  for (int i = 0; i < 10'000; ++i) keys.push_back("{big}k" + std::to_string(i));
  std::vector<Item> items;
  for (int round = 0; round < 2; ++round) {
    items.clear();
    for (const auto& k : keys) items.push_back({k, 6});
    auto got = store.apply_batch(kTen, items, Nanos{0});
    REQUIRE(got.ok());
    REQUIRE(got->size() == items.size());
    int allowed = 0;
    for (const auto& d : *got) {
      REQUIRE(d.ok());
      allowed += d->allowed;
      CHECK(d->remaining == 4);
    }
    CHECK(allowed == (round == 0 ? 10'000 : 0));  // 10 − 6 = 4 left: the second is denied
  }
}

TEST_CASE("apply_batch decides a batch in one script call exactly as one by one") {
  RedisStore<TokenBucket> batched(options("batch"));
  RedisStore<TokenBucket> single(options("batch-ref"));
  using Item = RedisStore<TokenBucket>::BatchItem;
  const std::vector<std::string> keys = {"{a}x", "{b}y", "c", "{a}z"};
  std::vector<Item> mixed;  // a cost per bucket
  std::vector<Item> same;   // one cost, sent once per call
  for (int i = 0; i < 64; ++i) {
    mixed.push_back({keys[i % keys.size()], 1 + i % 4});
    same.push_back({keys[i % keys.size()], 3});
  }
  for (int round = 0; round < 6; ++round) {
    const Nanos now{round * 700'000'000LL};
    const std::vector<Item>& items = round % 2 == 0 ? mixed : same;
    auto got = batched.apply_batch(kTen, items, now);
    REQUIRE(got.ok());
    REQUIRE(got->size() == items.size());
    for (std::size_t i = 0; i < items.size(); ++i) {
      auto expected = single.apply(kTen, items[i].key, now, items[i].cost);
      REQUIRE(expected.ok());
      INFO("round " << round << " item " << i);
      REQUIRE((*got)[i].ok());
      CHECK((*got)[i].value() == *expected);
    }
  }
  CHECK(absl::IsInvalidArgument(
      batched.apply_batch(kTen, std::vector<Item>{{"{bad", 1}}, Nanos{0}).status()));
}
