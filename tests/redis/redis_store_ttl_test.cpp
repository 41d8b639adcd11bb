// Tests of RedisStore's TTLs and bytes per key against a real redis-server: a key never
// expires before its time to full (reset_after) plus the margin, a kept TTL is kept, and
// a window key's kept writes overwrite it in place.
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <type_traits>

#include <catch2/catch.hpp>

#include "quota/policy/fixed_window.hpp"
#include "quota/policy/sliding_log.hpp"
#include "quota/policy/sliding_window_estimate.hpp"
#include "quota/policy/token_bucket.hpp"
#include "quota/redis/redis_store.hpp"
#include "support/printers.hpp"
#include "support/seed.hpp"
#include "support/store_fixtures.hpp"

using namespace std::chrono_literals;
using quota::Decision;
using quota::Nanos;
using quota::Reason;
using quota::RedisStore;
using quota::RedisStoreOptions;
using quota::TokenBucket;
using quota::redis::TimeSource;
using quota::testing::options;
using quota::testing::run;
using quota::testing::run_in;
using quota::testing::set_state;
using quota::testing::TenOf;

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
  auto unmarked = p.init(Nanos{0});
  set_state(short_margin, *old_key, unmarked);
  run_in(long_margin, {"PEXPIRE", *old_key, "50"});
  auto renewed = long_margin.apply(p, "{acme}old-ttl", Nanos{0}, 1);
  REQUIRE(renewed.ok());
  CHECK(run_in(long_margin, {"PTTL", *old_key})->integer >= need(*renewed, 5s) - 10);
}
