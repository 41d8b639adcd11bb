// Tests of the gateway over Redis (quota/redis/gateway_store.hpp) against a real
// redis-server, on the server's clock: rule changes (downgrade, upgrade, switching kind)
// converted in Redis without a burst and versioned; a process still on older rules never
// rolls a key back; user + tenant levels all-or-nothing in one script; the global level
// given back when it denies; shadow mode; estimate-then-settle; many threads on one
// budget; bad rules, corrupted keys and TTLs; states of the earlier form; memory; kept
// TTLs.
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "quota/gateway/gateway.hpp"
#include "quota/redis/gateway_store.hpp"
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
using quota::testing::build;

namespace {

// A fresh key space per call (Catch runs a test case again for each SECTION).
GatewayStore make_store(const std::string& test) {
  static int runs = 0;
  return GatewayStore(
      {.pool = quota::testing::redis_pool(4),
       .prefix = quota::testing::unique_prefix(test + "-" + std::to_string(++runs))});
}

RuleSetSpec spec(std::uint64_t version, quota::gateway::RulePolicy tenant,
                 std::optional<quota::gateway::RulePolicy> user = std::nullopt,
                 std::optional<quota::gateway::RulePolicy> global = std::nullopt,
                 bool global_shadow = false) {
  return quota::testing::levels_spec(version, std::move(tenant), std::move(user), std::move(global),
                                     global_shadow);
}

Request read(const char* tenant, const char* user = "") {
  return {.who = {.tenant = tenant, .plan = "free", .user = user}, .route = "read"};
}

// Decides `n` requests; returns how many were admitted.
template <class G>
int admit(G& gw, const Request& req, int n) {
  int admitted = 0;
  for (int i = 0; i < n; ++i) {
    auto r = gw.decide(req, Nanos{0});
    REQUIRE(r.ok());
    if (r->decision.allowed) ++admitted;
  }
  return admitted;
}

// A slow rate, so that server time passing during a test refills nothing measurable.
constexpr quota::Rate kSlow{.units = 1, .per = std::chrono::hours(1)};

}  // namespace

TEST_CASE("redis gateway: a downgrade clamps to the new burst and carries the new version") {
  GatewayStore store = make_store("gw-down");
  RuleRegistry registry(build(spec(1, TokenBucket{.rate = kSlow, .burst = 100})));
  Gateway gw(store, registry);
  REQUIRE(admit(gw, read("acme"), 30) == 30);  // 70 left under v1
  REQUIRE(registry.publish(build(spec(2, TokenBucket{.rate = kSlow, .burst = 20}))).ok());
  auto r = gw.decide(read("acme"), Nanos{0});
  REQUIRE(r.ok());
  CHECK(r->decision.allowed);
  CHECK(r->decision.version == 2);
  CHECK(r->decision.remaining == 19);  // min(70, 20) − 1
  CHECK(admit(gw, read("acme"), 40) == 19);
}

TEST_CASE("redis gateway: an upgrade hands out no fresh burst") {
  GatewayStore store = make_store("gw-up");
  RuleRegistry registry(build(spec(1, TokenBucket{.rate = kSlow, .burst = 10})));
  Gateway gw(store, registry);
  REQUIRE(admit(gw, read("acme"), 10) == 10);  // empty under v1
  REQUIRE(registry.publish(build(spec(2, TokenBucket{.rate = kSlow, .burst = 1000}))).ok());
  auto r = gw.decide(read("acme"), Nanos{0});
  REQUIRE(r.ok());
  CHECK_FALSE(r->decision.allowed);
  CHECK(r->decision.version == 2);
  CHECK(r->decision.reason == Reason::kOverLimit);
  // A tenant never seen before gets the new burst.
  CHECK(admit(gw, read("newcomer"), 1000) == 1000);
}

TEST_CASE("redis gateway: switching kind keeps what was left, never more") {
  GatewayStore store = make_store("gw-kind");
  RuleRegistry registry(build(spec(1, TokenBucket{.rate = kSlow, .burst = 50})));
  Gateway gw(store, registry);
  REQUIRE(admit(gw, read("acme"), 45) == 45);  // 5 tokens left
  REQUIRE(registry.publish(build(spec(2, FixedWindow{.limit = 30, .window = 1h}))).ok());
  auto r = gw.decide(read("acme"), Nanos{0});
  REQUIRE(r.ok());
  CHECK(r->decision.version == 2);
  CHECK(r->decision.remaining == 4);  // the window's count leaves min(30, 5) − 1
  CHECK(admit(gw, read("acme"), 10) == 4);
  // And back to a bucket: what the window still allowed (0), not the burst.
  REQUIRE(registry.publish(build(spec(3, TokenBucket{.rate = kSlow, .burst = 50}))).ok());
  auto back = gw.decide(read("acme"), Nanos{0});
  REQUIRE(back.ok());
  CHECK_FALSE(back->decision.allowed);
  CHECK(back->decision.version == 3);
}

TEST_CASE("redis gateway: a process still on older rules is decided by the newer rule") {
  GatewayStore store_a = make_store("gw-rollout");
  // Another process: its own registry and store object, the same Redis and prefix.
  GatewayStore store_b({.pool = quota::testing::redis_pool(2), .prefix = store_a.options().prefix});
  RuleRegistry new_rules(build(spec(2, TokenBucket{.rate = kSlow, .burst = 5})));
  RuleRegistry old_rules(build(spec(1, TokenBucket{.rate = kSlow, .burst = 100})));
  Gateway rolled_out(store_a, new_rules);
  Gateway lagging(store_b, old_rules);
  REQUIRE(admit(rolled_out, read("acme"), 2) == 2);  // 3 left under v2
  auto r = lagging.decide(read("acme"), Nanos{0});
  REQUIRE(r.ok());
  CHECK(r->decision.allowed);
  CHECK(r->decision.version == 2);    // the rule that decided
  CHECK(r->decision.remaining == 2);  // not 100 − 1
  CHECK(admit(lagging, read("acme"), 10) == 2);
}

TEST_CASE("redis gateway: user and tenant levels are all-or-nothing in one script") {
  GatewayStore store = make_store("gw-levels");
  // The tenant's budget is one-off (rate 0), so server time passing adds nothing to it.
  const quota::gateway::RulePolicy tenant_policy =
      TokenBucket{.rate = {.units = 0, .per = 1s}, .burst = 5};
  RuleRegistry registry(build(spec(1, tenant_policy, TokenBucket{.rate = kSlow, .burst = 3})));
  Gateway gw(store, registry);
  // Alice takes her 3 (user level), Bob 2: the tenant (5) is empty.
  CHECK(admit(gw, read("acme", "alice"), 5) == 3);
  CHECK(admit(gw, read("acme", "bob"), 2) == 2);
  // Carol's user level allows but the tenant denies: nothing is deducted from Carol.
  auto carol = gw.decide(read("acme", "carol"), Nanos{0});
  REQUIRE(carol.ok());
  CHECK_FALSE(carol->decision.allowed);
  CHECK(carol->rule == "tenant");
  // Put 5 units back into the tenant level by hand: Carol's user level, written without
  // a deduction, still holds all 3.
  auto refunded = store.refund(tenant_policy, 1, "{acme}read", 5, Nanos{0}, Nanos{0});
  REQUIRE(refunded.ok());
  CHECK(*refunded == 5 * quota::kMicrosPerUnit);
  CHECK(admit(gw, read("acme", "carol"), 10) == 3);
}

TEST_CASE("redis gateway: a global denial gives the tenant's deduction back") {
  GatewayStore store = make_store("gw-global");
  RuleRegistry registry(build(spec(1, TokenBucket{.rate = kSlow, .burst = 10}, std::nullopt,
                                   TokenBucket{.rate = kSlow, .burst = 4})));
  Gateway gw(store, registry);
  CHECK(admit(gw, read("a"), 3) == 3);
  CHECK(admit(gw, read("b"), 3) == 1);  // the global budget (4) is spent
  auto denied = gw.decide(read("b"), Nanos{0});
  REQUIRE(denied.ok());
  CHECK_FALSE(denied->decision.allowed);
  CHECK(denied->rule == "global");
  // b's tenant level got every denied request back: 9 left, not 9 − 3.
  RuleRegistry no_global(build(spec(2, TokenBucket{.rate = kSlow, .burst = 10})));
  Gateway tenant_only(store, no_global);
  CHECK(admit(tenant_only, read("b"), 20) == 9);
}

TEST_CASE("redis gateway: a shadow global rule counts would-deny and admits") {
  GatewayStore store = make_store("gw-shadow");
  quota::gateway::Metrics metrics;
  RuleRegistry registry(build(spec(1, TokenBucket{.rate = kSlow, .burst = 10}, std::nullopt,
                                   TokenBucket{.rate = kSlow, .burst = 2}, /*shadow=*/true),
                              &metrics));
  Gateway gw(store, registry);
  int shadowed = 0;
  for (int i = 0; i < 5; ++i) {
    auto r = gw.decide(read("acme"), Nanos{0});
    REQUIRE(r.ok());
    CHECK(r->decision.allowed);
    if (r->decision.reason == Reason::kShadow) ++shadowed;
  }
  CHECK(shadowed == 3);
  std::uint64_t would_deny = 0;
  for (const auto& c : metrics.snapshot()) {
    if (c->labels().rule == "global")
      would_deny += c->count(quota::gateway::Outcome::kShadowWouldDeny);
  }
  CHECK(would_deny == 3);
}

TEST_CASE("redis gateway: estimate, then settle refunds the surplus once") {
  GatewayStore store = make_store("gw-settle");
  RuleRegistry registry(build(spec(1, TokenBucket{.rate = kSlow, .burst = 1000})));
  Gateway gw(store, registry);
  auto est = gw.acquire_estimate(read("acme"), 600, Nanos{0});
  REQUIRE(est.ok());
  REQUIRE(est->decision.allowed);
  REQUIRE(est->ticket.has_value());
  CHECK(est->decision.remaining == 400);
  auto settled = gw.settle(*est->ticket, 150, Nanos{0});
  REQUIRE(settled.ok());
  REQUIRE(settled->refunded.size() == 1);
  CHECK(settled->refunded[0] == 450 * quota::kMicrosPerUnit);
  CHECK_FALSE(gw.settle(*est->ticket, 150, Nanos{0}).ok());  // never twice
  auto r = gw.decide(read("acme"), Nanos{0});
  REQUIRE(r.ok());
  CHECK(r->decision.remaining == 849);
}

TEST_CASE("redis gateway: 8 threads on one budget admit exactly the burst") {
  GatewayStore store = make_store("gw-threads");
  // Rate 0: a one-off budget of 200, so server time cannot add any.
  RuleRegistry registry(build(spec(1, TokenBucket{.rate = {.units = 0, .per = 1s}, .burst = 200})));
  Gateway gw(store, registry);
  std::atomic<int> admitted{0}, errors{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 60; ++i) {
        auto r = gw.decide(read("hot"), Nanos{0});
        if (!r.ok()) {
          errors.fetch_add(1);
        } else if (r->decision.allowed) {
          admitted.fetch_add(1);
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  CHECK(errors.load() == 0);
  CHECK(admitted.load() == 200);
}

TEST_CASE("redis gateway: rules outside the exact range, corrupted keys, TTLs") {
  SECTION("a rule the Lua twin cannot decide exactly is rejected, naming the bound") {
    auto s =
        GatewayStore::check(TokenBucket{.rate = {.units = 1, .per = 1s}, .burst = 3'000'000'000});
    CHECK(s.code() == absl::StatusCode::kInvalidArgument);
    CHECK(s.message().find("2000000000") != std::string::npos);
    auto w = GatewayStore::check(FixedWindow{.limit = 10, .window = Nanos{1500}});
    CHECK(w.code() == absl::StatusCode::kInvalidArgument);
    CHECK(w.message().find("whole microseconds") != std::string::npos);
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
      auto r = store.decide(bad, 1, 1, Nanos{0});
      CHECK(r.status() == expected);
      const LevelCheck ok[] = {{.policy = &fine, .key = "{acme}read", .shadow = false}};
      auto d = store.decide(ok, 1, 1, Nanos{0});
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
    CHECK((*ttl)->integer > 19'000);  // ~20 s + the 1 s margin
    CHECK((*ttl)->integer <= 21'000);
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

TEST_CASE("redis gateway: each of thousands of distinct policies gets its own arguments") {
  // More distinct policies than the store keeps formatted (4096): the first ones come
  // from its cache when used again, the last ones are formatted per call; either way a
  // fresh key's first decision leaves burst - 1.
  GatewayStore store = make_store("gw-policies");
  constexpr int kPolicies = 4200;
  std::vector<quota::gateway::RulePolicy> policies;
  for (int i = 0; i < kPolicies; ++i) {
    if (i % 2 == 0) {
      policies.push_back(TokenBucket{.rate = {.units = 1, .per = 1s}, .burst = 10 + i});
    } else {
      policies.push_back(FixedWindow{.limit = 10 + i, .window = std::chrono::hours(1)});
    }
  }
  int wrong = 0;
  auto first_decision = [&](int i, const std::string& key) {
    const LevelCheck level[] = {{.policy = &policies[i], .key = key, .shadow = false}};
    auto d = store.decide(level, 1, 1, Nanos{0});
    if (!d.ok() || d->parts.size() != 1 || !d->parts[0].allowed ||
        d->parts[0].remaining != 10 + i - 1) {
      ++wrong;
    }
  };
  for (int i = 0; i < kPolicies; ++i) first_decision(i, "{p}" + std::to_string(i));
  CHECK(wrong == 0);
  for (int i : {0, 1, 2, kPolicies - 2, kPolicies - 1}) {
    first_decision(i, "{q}" + std::to_string(i));
  }
  CHECK(wrong == 0);
}

TEST_CASE("redis gateway: an attempt is replayed by another process, never charged twice") {
  GatewayStore store_a = make_store("gw-attempt");
  GatewayStore store_b({.pool = quota::testing::redis_pool(2),
                        .prefix = store_a.options().prefix,
                        .time = quota::redis::TimeSource::kServer,
                        .ttl_margin = std::chrono::milliseconds(1000),
                        .cluster = nullptr,
                        .attempt_pending = std::chrono::milliseconds(300)});
  RuleRegistry registry_a(build(spec(1, TokenBucket{.rate = kSlow, .burst = 10})));
  RuleRegistry registry_b(build(spec(1, TokenBucket{.rate = kSlow, .burst = 10})));
  Gateway a(store_a, registry_a);
  Gateway b(store_b, registry_b);
  Request req = read("acme");
  req.attempt_id = "req-1";
  auto first = a.decide(req, Nanos{0});
  REQUIRE(first.ok());
  CHECK(first->decision.allowed);
  CHECK_FALSE(first->replayed);
  CHECK(first->decision.remaining == 9);
  // The caller lost the answer and retries through another gateway process.
  auto retry = b.decide(req, Nanos{0});
  REQUIRE(retry.ok());
  CHECK(retry->replayed);
  CHECK(retry->decision.allowed == first->decision.allowed);
  CHECK(retry->decision.remaining == first->decision.remaining);
  CHECK(retry->decision.reset_after == first->decision.reset_after);
  CHECK(retry->decision.version == first->decision.version);
  // Charged once: 9 left.
  Request plain = read("acme");
  auto next = b.decide(plain, Nanos{0});
  REQUIRE(next.ok());
  CHECK(next->decision.remaining == 8);
  SECTION("the same id for another request is InvalidArgument and changes nothing") {
    auto r = b.acquire_estimate(req, 3, Nanos{0});  // cost 3, not 1
    CHECK(r.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK(b.decide(plain, Nanos{0})->decision.remaining == 7);
  }
  SECTION("an attempt still being decided elsewhere is Aborted until it is recorded or lapses") {
    auto key = store_b.redis_key("{acme}read");
    REQUIRE(key.ok());
    // A process began "req-2" and died before recording it.
    Request second = read("acme");
    second.attempt_id = "req-2";
    const std::string fingerprint = "1|{acme}read";
    auto began = store_b.begin_attempt("{acme}read", "req-2", fingerprint);
    REQUIRE(began.ok());
    REQUIRE_FALSE(began->has_value());
    auto busy = b.decide(second, Nanos{0});
    CHECK(busy.status().code() == absl::StatusCode::kAborted);
    std::this_thread::sleep_for(400ms);  // attempt_pending is 300 ms
    auto decided = b.decide(second, Nanos{0});
    REQUIRE(decided.ok());
    CHECK_FALSE(decided->replayed);
    CHECK(decided->decision.remaining == 7);
  }
}

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
void set_legacy(const std::string& key, const std::vector<std::int64_t>& fields) {
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

TEST_CASE("redis gateway: a state out of range in the current form is QUOTA_CORRUPT") {
  GatewayStore store = make_store("gw-corrupt72");
  const quota::gateway::RulePolicy tb = TokenBucket{.rate = kSlow, .burst = 10};
  auto key = store.redis_key("{acme}read");
  REQUIRE(key.ok());
  const LevelCheck level[] = {{.policy = &tb, .key = "{acme}read", .shadow = false}};
  REQUIRE(store.decide(level, 1, 1, Nanos{0}).ok());
  REQUIRE(admin({"STRLEN", *key})->integer == 72);
  SECTION("all bits set") { admin({"SET", *key, std::string(72, '\xff')}); }
  SECTION("kind 3") {
    auto v = admin({"GET", *key});
    std::string s(v->str, v->len);
    REQUIRE(s.size() == 72);
    s[39] = 3;  // the kind, first byte of the parameters after the 39 bytes of state
    admin({"SET", *key, s});
  }
  auto d = store.decide(level, 1, 1, Nanos{0});
  CHECK(d.status().code() == absl::StatusCode::kDataLoss);
  CHECK(d.status().message().find(*key) != std::string::npos);
}

TEST_CASE("redis gateway: a key takes fewer bytes than in the earlier form (MEMORY USAGE)") {
  GatewayStore store = make_store("gw-memory");
  const quota::gateway::RulePolicy tb = TokenBucket{.rate = {.units = 1, .per = 1s}, .burst = 10};
  const LevelCheck level[] = {{.policy = &tb, .key = "{acme}read", .shadow = false}};
  REQUIRE(store.decide(level, 1, 1, Nanos{0}).ok());
  auto key = store.redis_key("{acme}read");
  auto old_key = store.redis_key("{acme}reax");  // as long
  REQUIRE(key.ok());
  REQUIRE(old_key.ok());
  // The same state in the earlier form, with a TTL too.
  set_legacy(*old_key,
             {1, 1, 1, 1'000'000'000, 10, 1, 1000, 1'000'000, 10'000'000'000, 9'000'000, 0, 5, 0});
  admin({"PEXPIRE", *old_key, "60000"});
  const long long now_bytes = admin({"MEMORY", "USAGE", *key})->integer;
  const long long old_bytes = admin({"MEMORY", "USAGE", *old_key})->integer;
  std::printf(
      "MEMORY USAGE of one gateway key (key of %zu bytes): %lld bytes (earlier form: %lld)\n",
      key->size(), now_bytes, old_bytes);
  CHECK(now_bytes < old_bytes);
}

TEST_CASE("redis gateway: a busy key's TTL is kept, never below its idle time plus the margin") {
  // The twin keeps a key's TTL while the expiry it set last still covers the idle time +
  // margin (the state overwritten in place: SETRANGE, the value a raw string of 72 bytes,
  // MEMORY USAGE that of the same value written new), and sets one margin more when a
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
    auto d = store.decide(level, 1, cost, Nanos{0});
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
      CHECK(admin({"STRLEN", *key})->integer == 72);
      CHECK(std::string(admin({"OBJECT", "ENCODING", *key})->str) == "raw");
      CHECK(admin({"MEMORY", "USAGE", *key})->integer == as_new());
    }
    last_pttl = pttl;
  }
  CHECK(kept > 0);
}
