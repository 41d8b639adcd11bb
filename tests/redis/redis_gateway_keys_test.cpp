// Tests of the gateway's keys in Redis: rules outside the Lua twin's exact range,
// corrupted keys, TTLs (kept while they cover the idle time) and bytes per key.
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include <catch2/catch.hpp>

#include "quota/gateway/gateway.hpp"
#include "quota/redis/gateway_store.hpp"
#include "support/gateway_fixtures.hpp"
#include "support/gateway_rules.hpp"
#include "support/printers.hpp"
#include "support/redis_server.hpp"
#include "support/seed.hpp"

using namespace std::chrono_literals;
using quota::FixedWindow;
using quota::MicroUnits;
using quota::Nanos;
using quota::Reason;
using quota::TokenBucket;
using quota::gateway::Gateway;
using quota::gateway::Level;
using quota::gateway::LevelCheck;
using quota::gateway::Request;
using quota::gateway::RuleRegistry;
using quota::gateway::RuleSetSpec;
using quota::redis::GatewayStore;
using quota::testing::admit;
using quota::testing::build;
using quota::testing::kSlow;
using quota::testing::make_store;
using quota::testing::read;
using quota::testing::spec;
using quota::testing::with_cost;

// A key's state, bytes (STRLEN's type).
// A scope of one record named "" (the key "{acme}read").
constexpr long long kStateBytes =
    static_cast<long long>(quota::redis::kGatewayHeaderBytes + quota::redis::kGatewayRecordBytes +
                           quota::redis::kGatewayEntryBytes);

namespace {

// Runs one command on the test server.
quota::redis::Reply admin(const std::vector<std::string>& argv) {
  static auto pool = quota::testing::redis_pool(1);
  auto lease = pool->acquire();
  REQUIRE(lease.ok());
  auto r = (*lease)->command(std::vector<std::string_view>(argv.begin(), argv.end()));
  REQUIRE(r.ok());
  return *std::move(r);
}

// Writes `key` as 13 struct-packed doubles (version, kind, units|limit, per|window ns,
// burst|0, m|window µs, p, g, fill, tokens|count, carry over rate.per, last µs, debt):
// the straightforward form the MEMORY USAGE test compares the twin's state with.
void set_doubles(const std::string& key, const std::vector<std::int64_t>& fields) {
  REQUIRE(fields.size() == 13);
  std::vector<std::string> argv = {
      "EVAL",
      "redis.call('SET', KEYS[1], struct.pack('<ddddddddddddd', ARGV[1] + 0, ARGV[2] + 0, "
      "ARGV[3] + 0, ARGV[4] + 0, ARGV[5] + 0, ARGV[6] + 0, ARGV[7] + 0, ARGV[8] + 0, ARGV[9] + 0, "
      "ARGV[10] + 0, ARGV[11] + 0, ARGV[12] + 0, ARGV[13] + 0))",
      "1", key};
  for (std::int64_t f : fields) argv.push_back(std::to_string(f));
  admin(argv);
  REQUIRE(admin({"STRLEN", key})->integer == 104);
}

}  // namespace

TEST_CASE("redis gateway: rules outside the exact range, corrupted keys, TTLs") {
  SECTION("a rule the Lua twin cannot decide exactly is rejected, naming the bound") {
    // capacity: 10^12 units (two limbs), exactly at it and one past it
    CHECK(GatewayStore::check(
              TokenBucket{.rate = {.units = 10'000'000, .per = 1s}, .burst = 1'000'000'000'000})
              .ok());
    auto s = GatewayStore::check(
        TokenBucket{.rate = {.units = 10'000'000, .per = 1s}, .burst = 1'000'000'000'001});
    CHECK(s.code() == absl::StatusCode::kInvalidArgument);
    CHECK(s.message().find("at most 1000000000000 units") != std::string::npos);
    CHECK(s.message().find("the Redis gateway store") != std::string::npos);
    // time to fill: 10^17 ns (~1157 days) exactly, and 1 ns more
    CHECK(GatewayStore::check(
              TokenBucket{.rate = {.units = 1, .per = 100us}, .burst = 1'000'000'000'000})
              .ok());
    auto fill = GatewayStore::check(
        TokenBucket{.rate = {.units = 1, .per = Nanos{413'339}}, .burst = 241'932'167'059});
    CHECK(fill.code() == absl::StatusCode::kInvalidArgument);
    CHECK(fill.message().find("bound is 100000000000000000 ns (~1157 days)") != std::string::npos);
    auto w = GatewayStore::check(FixedWindow{.limit = 10, .window = Nanos{1500}});
    CHECK(w.code() == absl::StatusCode::kInvalidArgument);
    CHECK(w.message().find("divides 1 s") != std::string::npos);
    CHECK(w.message().find("the Redis gateway store") != std::string::npos);
    // The fixed window twin's grid, within the gateway's span (10^8 s): 10^8 s + 1 s is not.
    auto days =
        GatewayStore::check(FixedWindow{.limit = 10, .window = std::chrono::seconds(100'000'001)});
    CHECK(days.code() == absl::StatusCode::kInvalidArgument);
    CHECK(days.message().find("100000000 s") != std::string::npos);
    CHECK(GatewayStore::check(FixedWindow{.limit = 10, .window = std::chrono::seconds(100'000'000)})
              .ok());
    CHECK(
        GatewayStore::check(FixedWindow{.limit = 10, .window = std::chrono::hours(24 * 400)}).ok());
    CHECK(GatewayStore::check(TokenBucket{.rate = {.units = 10, .per = 1s}, .burst = 20}).ok());
  }
  SECTION("a decision under such a rule gets check()'s error every time") {
    // The store keeps each policy's checked arguments, never its errors.
    GatewayStore store = make_store("gw-range");
    const quota::gateway::RulePolicy wide =
        TokenBucket{.rate = {.units = 1, .per = 1s}, .burst = 3'000'000'000};
    const quota::gateway::RulePolicy fine = TokenBucket{.rate = kSlow, .burst = 10};
    const absl::Status expected = GatewayStore::check(wide);
    REQUIRE(expected.code() == absl::StatusCode::kInvalidArgument);
    for (int i = 0; i < 3; ++i) {
      const LevelCheck bad[] = {{.policy = &wide, .key = "{acme}read", .shadow = false}};
      auto r = store.decide(with_cost(bad, 1), 1, Nanos{0});
      CHECK(r.status() == expected);
      const LevelCheck ok[] = {{.policy = &fine, .key = "{acme}read", .shadow = false}};
      auto d = store.decide(with_cost(ok, 1), 1, Nanos{0});
      REQUIRE(d.ok());
      CHECK(d->parts.back().remaining == 9 - i);
      CHECK(store.charge(wide, 1, "{acme}read", 1, Nanos{0}).status() == expected);
    }
  }
  SECTION("a key holding something else is DataLoss naming it; nothing is decided") {
    GatewayStore store = make_store("gw-corrupt");
    RuleRegistry registry(build(spec(1, TokenBucket{.rate = kSlow, .burst = 10})));
    Gateway gw(store, registry);
    auto key = store.redis_key("{acme}read");
    REQUIRE(key.ok());
    auto admin = quota::testing::redis_pool(1);
    auto lease = admin->acquire();
    REQUIRE(lease.ok());
    REQUIRE((*lease)->command({"SET", *key, "not a state"}).ok());
    auto r = gw.decide(read("acme"), Nanos{0});
    CHECK(r.status().code() == absl::StatusCode::kDataLoss);
    CHECK(r.status().message().find(*key) != std::string::npos);
    REQUIRE((*lease)->command({"DEL", *key}).ok());
    CHECK(gw.decide(read("acme"), Nanos{0}).ok());
  }
  SECTION("a key's TTL covers its time until full again, and a one-off budget keeps none") {
    GatewayStore store = make_store("gw-ttl");
    RuleRegistry registry(
        build(spec(1, TokenBucket{.rate = {.units = 1, .per = 10s}, .burst = 10})));
    Gateway gw(store, registry);
    REQUIRE(admit(gw, read("acme"), 2) == 2);  // 20 s until full again
    auto key = store.redis_key("{acme}read");
    REQUIRE(key.ok());
    auto admin = quota::testing::redis_pool(1);
    auto lease = admin->acquire();
    REQUIRE(lease.ok());
    auto ttl = (*lease)->command({"PTTL", *key});
    REQUIRE(ttl.ok());
    REQUIRE((*ttl)->type == REDIS_REPLY_INTEGER);
    CHECK((*ttl)->integer > 19'000);   // ~20 s + the 1 s margin
    CHECK((*ttl)->integer <= 21'002);  // (the quick path's TTL: at most 2 ms more)
    RuleRegistry once(build(spec(2, TokenBucket{.rate = {.units = 0, .per = 1s}, .burst = 10})));
    Gateway gw_once(store, once);
    REQUIRE(admit(gw_once, read("once"), 1) == 1);
    auto once_key = store.redis_key("{once}read");
    REQUIRE(once_key.ok());
    auto none = (*lease)->command({"PTTL", *once_key});
    REQUIRE(none.ok());
    CHECK((*none)->integer == -1);  // persists: a one-off budget must not come back
  }
}

TEST_CASE("redis gateway: a state out of range in the current form is QUOTA_CORRUPT") {
  GatewayStore store = make_store("gw-corrupt72");
  const quota::gateway::RulePolicy tb = TokenBucket{.rate = kSlow, .burst = 10};
  auto key = store.redis_key("{acme}read");
  REQUIRE(key.ok());
  const LevelCheck level[] = {{.policy = &tb, .key = "{acme}read", .shadow = false}};
  REQUIRE(store.decide(with_cost(level, 1), 1, Nanos{0}).ok());
  REQUIRE(admin({"STRLEN", *key})->integer == kStateBytes);
  SECTION("all bits set") { admin({"SET", *key, std::string(kStateBytes, '\xff')}); }
  SECTION("kind 5, which no release wrote") {
    auto v = admin({"GET", *key});
    std::string s(v->str, v->len);
    REQUIRE(static_cast<long long>(s.size()) == kStateBytes);
    // the kind, first byte of the policy argument at the end of the record's entry
    s[kStateBytes - quota::redis::GatewayTwin::kPolicyArgBytes] = 5;
    admin({"SET", *key, s});
  }
  auto d = store.decide(with_cost(level, 1), 1, Nanos{0});
  CHECK(d.status().code() == absl::StatusCode::kDataLoss);
  CHECK(d.status().message().find(*key) != std::string::npos);
}

TEST_CASE("redis gateway: a key takes fewer bytes than as doubles (MEMORY USAGE)") {
  GatewayStore store = make_store("gw-memory");
  const quota::gateway::RulePolicy tb = TokenBucket{.rate = {.units = 1, .per = 1s}, .burst = 10};
  const LevelCheck level[] = {{.policy = &tb, .key = "{acme}read", .shadow = false}};
  REQUIRE(store.decide(with_cost(level, 1), 1, Nanos{0}).ok());
  auto key = store.redis_key("{acme}read");
  auto old_key = store.redis_key("{acme}reax");  // as long
  REQUIRE(key.ok());
  REQUIRE(old_key.ok());
  // The same state as doubles, with a TTL too.
  set_doubles(*old_key,
              {1, 1, 1, 1'000'000'000, 10, 1, 1000, 1'000'000, 10'000'000'000, 9'000'000, 0, 5, 0});
  admin({"PEXPIRE", *old_key, "60000"});
  const long long now_bytes = admin({"MEMORY", "USAGE", *key})->integer;
  const long long old_bytes = admin({"MEMORY", "USAGE", *old_key})->integer;
  std::printf("MEMORY USAGE of one gateway key (key of %zu bytes): %lld bytes (as doubles: %lld)\n",
              key->size(), now_bytes, old_bytes);
  CHECK(now_bytes < old_bytes);
}

TEST_CASE("redis gateway: a busy key's TTL is kept, never below its idle time plus the margin") {
  // The twin keeps a key's TTL while the expiry it set last still covers the idle time +
  // margin (the state overwritten in place: SETRANGE, the value a raw string of its header, record
  // and entry, MEMORY USAGE that of the same value written new), and sets one margin more when a
  // busy key's fell short.
  GatewayStore store = make_store("gw-ttl-kept");
  const quota::gateway::RulePolicy tb =
      TokenBucket{.rate = {.units = 1000, .per = 1s}, .burst = 1000};  // full in 1 s
  const std::int64_t margin = store.options().ttl_margin.count();
  auto key = store.redis_key("{acme}kept");
  auto ref = store.redis_key("{acme}kepu");  // as long
  REQUIRE(key.ok());
  REQUIRE(ref.ok());
  // MEMORY USAGE of a key of the same length holding the same value, written new.
  auto as_new = [&] {
    auto value = admin({"GET", *key});
    REQUIRE(value->type == REDIS_REPLY_STRING);
    admin({"SET", *ref, std::string(value->str, value->len)});
    return admin({"MEMORY", "USAGE", *ref})->integer;
  };
  std::mt19937_64 rng(quota::testing::test_seed(20261130));
  int kept = 0;
  long long last_pttl = -1;
  for (int i = 0; i < 300; ++i) {
    const std::int64_t cost = 1 + static_cast<std::int64_t>(rng() % 40);
    const LevelCheck level[] = {{.policy = &tb, .key = "{acme}kept", .shadow = false}};
    auto d = store.decide(with_cost(level, cost), 1, Nanos{0});
    REQUIRE(d.ok());
    const long long pttl = admin({"PTTL", *key})->integer;
    const long long need =
        std::chrono::ceil<std::chrono::milliseconds>(d->parts[0].reset_after).count() + margin;
    INFO("request " << i << " cost " << cost << " reset_after " << d->parts[0].reset_after.count()
                    << " ns, PTTL " << pttl << " ms");
    // 10 ms of slack for the time between the script and PTTL on a busy machine.
    REQUIRE(pttl >= need - 10);
    CHECK(pttl <= need + margin + 2);
    if (last_pttl >= 0 && pttl < last_pttl) {  // the expiry did not move
      ++kept;
      CHECK(admin({"STRLEN", *key})->integer == kStateBytes);
      CHECK(std::string(admin({"OBJECT", "ENCODING", *key})->str) == "raw");
      CHECK(admin({"MEMORY", "USAGE", *key})->integer == as_new());
    }
    last_pttl = pttl;
  }
  CHECK(kept > 0);
}

TEST_CASE("redis gateway: a scope key holds at most 255 records, the bound named") {
  GatewayStore store = make_store("gw-scope-full");
  const quota::gateway::RulePolicy tb = TokenBucket{.rate = kSlow, .burst = 10};
  for (int i = 0; i < 255; ++i) {
    const std::string key = "{acme}#l" + std::to_string(i);
    const LevelCheck level[] = {{.policy = &tb, .key = key, .shadow = false}};
    REQUIRE(store.decide(with_cost(level, 1), 1, Nanos{0}).ok());
  }
  auto scope = store.redis_key("{acme}#l0");
  REQUIRE(scope.ok());
  auto value = [&] {
    auto r = admin({"GET", *scope});
    return std::string(r->str, r->len);
  };
  const std::string before = value();
  const LevelCheck one_more[] = {{.policy = &tb, .key = "{acme}#l255", .shadow = false}};
  auto d = store.decide(with_cost(one_more, 1), 1, Nanos{0});
  CHECK(d.status().code() == absl::StatusCode::kUnavailable);
  CHECK(d.status().message().find("QUOTA_SCOPE_FULL") != std::string::npos);
  CHECK(d.status().message().find("at most 255") != std::string::npos);
  // nothing written; the records there still decide
  CHECK(value() == before);
  const LevelCheck first[] = {{.policy = &tb, .key = "{acme}#l0", .shadow = false}};
  auto again = store.decide(with_cost(first, 1), 1, Nanos{0});
  REQUIRE(again.ok());
  CHECK(again->parts[0].remaining == 8);
}

TEST_CASE("redis gateway: two levels of one call that are one record are InvalidArgument") {
  GatewayStore store = make_store("gw-one-record");
  const quota::gateway::RulePolicy tb = TokenBucket{.rate = kSlow, .burst = 10};
  // the same key twice, and two keys of one record ("{acme}read" is record "" of its
  // scope, as "{acme}read#" is)
  for (const char* second : {"{acme}read", "{acme}read#"}) {
    const LevelCheck levels[] = {{.policy = &tb, .key = "{acme}read", .shadow = false},
                                 {.policy = &tb, .key = second, .shadow = false}};
    auto d = store.decide(with_cost(levels, 1), 1, Nanos{0});
    CHECK(d.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK(d.status().message().find("one record") != std::string::npos);
  }
  const LevelCheck one[] = {{.policy = &tb, .key = "{acme}read", .shadow = false}};
  auto d = store.decide(with_cost(one, 1), 1, Nanos{0});
  REQUIRE(d.ok());
  CHECK(d->parts[0].remaining == 9);  // nothing was deducted before
}
