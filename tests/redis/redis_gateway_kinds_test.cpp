// Tests of the sliding log and the window estimate as gateway rules on Redis
// (quota/redis/twin/gateway_windows.hpp): each step is decided by the Redis twin and by
// the in-process KeyState (StoreBackend over LocalStore<KeyPolicy>) and must agree in
// every field; the expected values are also asserted from the policies' semantics. Then
// rule changes to and from the other kinds, TTLs, attempts, corrupt keys and the range.
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "quota/gateway/backend.hpp"
#include "quota/gateway/gateway.hpp"
#include "quota/redis/gateway_store.hpp"
#include "quota/store/local_store.hpp"
#include "support/gateway_fixtures.hpp"
#include "support/gateway_rules.hpp"
#include "support/printers.hpp"
#include "support/redis_server.hpp"

using namespace std::chrono_literals;
using quota::Decision;
using quota::FixedWindow;
using quota::MicroUnits;
using quota::Nanos;
using quota::SlidingLog;
using quota::SlidingWindowEstimate;
using quota::to_micro;
using quota::TokenBucket;
using quota::gateway::KeyPolicy;
using quota::gateway::LevelCheck;
using quota::gateway::RulePolicy;
using quota::redis::GatewayStore;
using quota::testing::make_store;
using quota::testing::with_cost;

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

// The Redis gateway (caller's time) and the in-process one side by side: every call goes
// to both, the results must be equal, and the Redis one is returned.
class Both {
 public:
  explicit Both(const std::string& name)
      : local_store_({.max_keys = 1000}),
        local_(local_store_),
        redis_({.pool = quota::testing::redis_pool(1),
                .prefix = quota::testing::unique_prefix(name),
                .time = quota::redis::TimeSource::kCaller,
                .ttl_margin = 1h}) {}

  Decision decide(const RulePolicy& p, std::uint64_t version, const std::string& key,
                  std::int64_t cost) {
    const LevelCheck level[] = {{.policy = &p, .key = key, .shadow = false}};
    return decide_levels(with_cost(level, cost), version).back();
  }
  std::vector<Decision> decide_levels(const std::vector<LevelCheck>& levels,
                                      std::uint64_t version) {
    auto l = local_.decide(levels, version, now);
    auto r = redis_.decide(levels, version, now);
    REQUIRE(l.ok());
    INFO(r.status().ToString());
    REQUIRE(r.ok());
    REQUIRE(l->parts.size() == r->parts.size());
    for (std::size_t i = 0; i < l->parts.size(); ++i) CHECK(l->parts[i] == r->parts[i]);
    return {r->parts.begin(), r->parts.end()};
  }
  MicroUnits refund(const RulePolicy& p, std::uint64_t version, const std::string& key,
                    std::int64_t units, Nanos spent_at) {
    auto l = local_.refund(p, version, key, units, spent_at, now);
    auto r = redis_.refund(p, version, key, units, spent_at, now);
    REQUIRE(l.ok());
    INFO(r.status().ToString());
    REQUIRE(r.ok());
    CHECK(*l == *r);
    return *r;
  }
  MicroUnits charge(const RulePolicy& p, std::uint64_t version, const std::string& key,
                    std::int64_t units) {
    auto l = local_.charge(p, version, key, units, now);
    auto r = redis_.charge(p, version, key, units, now);
    REQUIRE(l.ok());
    INFO(r.status().ToString());
    REQUIRE(r.ok());
    CHECK(*l == *r);
    return *r;
  }
  GatewayStore& redis() { return redis_; }

  Nanos now{1'764'000'000'000'000'000};  // a whole second: window starts are round

 private:
  quota::LocalStore<KeyPolicy> local_store_;
  quota::gateway::StoreBackend<quota::LocalStore<KeyPolicy>> local_;
  GatewayStore redis_;
};

}  // namespace

TEST_CASE("redis gateway: a sliding log decides, refunds and charges like KeyState") {
  Both both("gw-log");
  const RulePolicy log = SlidingLog{.limit = 5, .window = 10s};
  const Nanos t0 = both.now;
  CHECK(both.decide(log, 1, "{acme}log", 2).remaining == 3);
  both.now = t0 + 1s;
  CHECK(both.decide(log, 1, "{acme}log", 3).remaining == 0);
  both.now = t0 + 2s;
  const Decision denied = both.decide(log, 1, "{acme}log", 2);
  CHECK_FALSE(denied.allowed);
  CHECK(denied.retry_after == 8s);  // the 2 units of t0 leave at t0 + 10 s
  CHECK(denied.reset_after == 9s);  // the newest event leaves at t0 + 11 s
  // A refund quoting t0 takes back only what was logged at or before t0 (2 units), not
  // the later request's 3.
  CHECK(both.refund(log, 1, "{acme}log", 4, t0) == to_micro(2));
  CHECK(both.decide(log, 1, "{acme}log", 2).remaining == 0);
  CHECK(both.refund(log, 1, "{acme}log", 1, t0 + 2s) == to_micro(1));
  // A charge beyond the budget: what fits is counted now, the rest is debt (capped at the
  // limit), paid before later costs.
  CHECK(both.charge(log, 1, "{acme}log", 9) == to_micro(5));
  both.now = t0 + 12s;  // t0 + 1 s's and t0 + 2 s's events have left
  const Decision paying = both.decide(log, 1, "{acme}log", 1);
  CHECK_FALSE(paying.allowed);
  both.now = t0 + 30s;
  CHECK(both.decide(log, 1, "{acme}log", 1).allowed);
  // The events that left are trimmed from the list: only this decision's is there.
  auto list = both.redis().log_key("{acme}log");
  REQUIRE(list.ok());
  CHECK(admin({"LLEN", *list})->integer == 1);
}

TEST_CASE("redis gateway: a window estimate decides, refunds and charges like KeyState") {
  Both both("gw-est");
  const RulePolicy est = SlidingWindowEstimate{.limit = 10, .window = 10s};
  const Nanos t0 = both.now;  // the start of a window
  CHECK(both.decide(est, 1, "{acme}est", 8).remaining == 2);
  both.now = t0 + 15s;  // half into the next window: prev 8 weighs 4
  const Decision d = both.decide(est, 1, "{acme}est", 6);
  CHECK(d.allowed);
  CHECK(d.remaining == 0);
  const Decision denied = both.decide(est, 1, "{acme}est", 1);
  CHECK_FALSE(denied.allowed);
  CHECK(denied.retry_after > Nanos{0});
  CHECK(denied.reset_after == 15s);  // cur > 0: the end of the window after this one
  // Refunds: units spent in the previous window come off prev, in the current off cur,
  // earlier ones nothing.
  CHECK(both.refund(est, 1, "{acme}est", 3, t0 + 1s) == to_micro(3));
  CHECK(both.refund(est, 1, "{acme}est", 2, t0 + 15s) == to_micro(2));
  CHECK(both.refund(est, 1, "{acme}est", 2, t0 - 1s) == 0);
  CHECK(both.charge(est, 1, "{acme}est", 30) > 0);  // debt, capped at the limit
  for (int i = 0; i < 8; ++i) {
    both.now += 3s;
    both.decide(est, 1, "{acme}est", 2);
  }
}

TEST_CASE("redis gateway: rule changes to and from the log and the estimate keep what was spent") {
  Both both("gw-conv");
  const RulePolicy tb = TokenBucket{.rate = {.units = 1, .per = 1h}, .burst = 10};
  const RulePolicy fw = FixedWindow{.limit = 12, .window = 60s};
  const RulePolicy log = SlidingLog{.limit = 8, .window = 60s};
  const RulePolicy est = SlidingWindowEstimate{.limit = 20, .window = 60s};
  const RulePolicy log_big = SlidingLog{.limit = 30, .window = 1s};
  const std::string key = "{acme}conv";
  CHECK(both.decide(tb, 1, key, 4).remaining == 6);
  // token bucket → log: remaining = min(6, 8), the 2 it lacks counted at the change
  CHECK(both.decide(log, 2, key, 1).remaining == 5);
  // log → estimate: min(5, 20) = 5
  both.now += 1s;
  CHECK(both.decide(est, 3, key, 1).remaining == 4);
  // estimate → fixed window → log → token bucket: never more than what remained
  both.now += 1s;
  CHECK(both.decide(fw, 4, key, 1).remaining == 3);
  CHECK(both.decide(log_big, 5, key, 1).remaining == 2);
  both.now += 1s;  // the log's window (1 s) has passed: all 30 back
  CHECK(both.decide(log_big, 5, key, 1).remaining == 29);
  CHECK(both.decide(tb, 6, key, 2).remaining == 8);
  // an older rule set does not roll the key back: decided by version 6's bucket
  const Decision old = both.decide(log, 2, key, 1);
  CHECK(old.version == 6);
  CHECK(old.remaining == 7);
  // debt moves into a window kind's debt: a bucket charged deep, then a log
  CHECK(both.charge(tb, 6, key, 15) > 0);
  both.decide(log, 7, key, 1);
  both.now += 61s;
  both.decide(log, 7, key, 1);
  both.decide(est, 8, key, 3);
  both.decide(tb, 9, key, 1);
}

TEST_CASE("redis gateway: levels of the new kinds are all or nothing, shadow included") {
  Both both("gw-levels");
  const RulePolicy log = SlidingLog{.limit = 5, .window = 10s};
  const RulePolicy est = SlidingWindowEstimate{.limit = 3, .window = 10s};
  const std::vector<LevelCheck> levels = {{.policy = &log, .key = "{acme}u", .shadow = false},
                                          {.policy = &est, .key = "{acme}t", .shadow = false}};
  both.decide_levels(with_cost(levels, 2), 1);
  // the estimate denies 2 more: the log's deduction is not written
  const auto denied = both.decide_levels(with_cost(levels, 2), 1);
  CHECK_FALSE(denied.back().allowed);
  CHECK(both.decide(log, 1, "{acme}u", 3).remaining == 0);
  std::vector<LevelCheck> shadowed = levels;
  shadowed[0].shadow = true;
  const auto past = both.decide_levels(with_cost(shadowed, 1), 1);
  REQUIRE(past.size() == 2);
  CHECK_FALSE(past[0].allowed);
  CHECK(past[1].allowed);
}

TEST_CASE("redis gateway: a log's list expires with its record, never before it") {
  GatewayStore store = make_store("gw-log-ttl");
  const RulePolicy log = SlidingLog{.limit = 5, .window = 20s};
  const LevelCheck level[] = {{.policy = &log, .key = "{acme}ttl", .shadow = false}};
  auto d = store.decide(with_cost(level, 2), 1, Nanos{0});
  REQUIRE(d.ok());
  auto key = store.redis_key("{acme}ttl");
  REQUIRE(key.ok());
  const std::string list = *store.log_key("{acme}ttl");
  // (the list first: read later, the record's TTL can only be lower)
  const long long events = admin({"PTTL", list})->integer;
  const long long record = admin({"PTTL", *key})->integer;
  const long long margin = store.options().ttl_margin.count();
  CHECK(record > 20'000 + margin - 100);  // the event leaves in 20 s, plus the margin
  CHECK(record <= 20'000 + margin);
  CHECK(events >= record);
  // The record gone (expired) with the list still there: the key is fresh again, the list
  // replaced.
  admin({"DEL", *key});
  auto fresh = store.decide(with_cost(level, 1), 1, Nanos{0});
  REQUIRE(fresh.ok());
  CHECK(fresh->parts[0].remaining == 4);
  CHECK(admin({"LLEN", list})->integer == 1);
  // Debt: neither the record nor its list expires.
  REQUIRE(store.charge(log, 1, "{acme}ttl", 9, Nanos{0}).ok());
  CHECK(admin({"PTTL", *key})->integer == -1);
  CHECK(admin({"PTTL", list})->integer == -1);
  // An estimate's key: until both counters are 0 (two windows at most), plus the margin.
  const RulePolicy est = SlidingWindowEstimate{.limit = 5, .window = 20s};
  const LevelCheck elevel[] = {{.policy = &est, .key = "{acme}ettl", .shadow = false}};
  auto e = store.decide(with_cost(elevel, 1), 1, Nanos{0});
  REQUIRE(e.ok());
  auto ekey = store.redis_key("{acme}ettl");
  REQUIRE(ekey.ok());
  const long long ettl = admin({"PTTL", *ekey})->integer;
  const long long need =
      std::chrono::ceil<std::chrono::milliseconds>(e->parts[0].reset_after).count() + margin;
  CHECK(ettl >= need - 100);
  CHECK(ettl <= need);
  CHECK(e->parts[0].reset_after > 20s);
}

TEST_CASE("redis gateway: attempts over a sliding log replay without deducting again") {
  GatewayStore store = make_store("gw-log-attempt");
  quota::gateway::RuleRegistry registry(
      quota::testing::build(quota::testing::levels_spec(1, SlidingLog{.limit = 3, .window = 60s})));
  quota::gateway::Gateway gw(store, registry);
  quota::gateway::Request req = quota::testing::read("acme");
  req.attempt_id = "req-1";
  auto first = gw.decide(req, Nanos{0});
  REQUIRE(first.ok());
  CHECK(first->decision.allowed);
  auto again = gw.decide(req, Nanos{0});
  REQUIRE(again.ok());
  CHECK(again->replayed);
  CHECK(again->decision == first->decision);
  req.attempt_id = "req-2";
  auto second = gw.decide(req, Nanos{0});
  REQUIRE(second.ok());
  CHECK(second->decision.remaining == first->decision.remaining - 1);
}

TEST_CASE("redis gateway: a corrupt log or estimate is DataLoss naming the key") {
  GatewayStore store = make_store("gw-kinds-corrupt");
  const RulePolicy log = SlidingLog{.limit = 5, .window = 60s};
  const RulePolicy est = SlidingWindowEstimate{.limit = 5, .window = 60s};
  const LevelCheck lg[] = {{.policy = &log, .key = "{acme}log", .shadow = false}};
  const LevelCheck es[] = {{.policy = &est, .key = "{acme}est", .shadow = false}};
  REQUIRE(store.decide(with_cost(lg, 2), 1, Nanos{0}).ok());
  REQUIRE(store.decide(with_cost(es, 2), 1, Nanos{0}).ok());
  auto key = store.redis_key("{acme}log");
  auto ekey = store.redis_key("{acme}est");
  REQUIRE(key.ok());
  REQUIRE(ekey.ok());
  const std::string list = *store.log_key("{acme}log");
  auto expect_corrupt = [&](const LevelCheck* level, const std::string& named) {
    const std::vector<LevelCheck> one(level, level + 1);
    auto d = store.decide(with_cost(one, 1), 1, Nanos{0});
    CHECK(d.status().code() == absl::StatusCode::kDataLoss);
    CHECK(d.status().message().find(named) != std::string::npos);
  };
  SECTION("the record without its events") {
    admin({"DEL", list});
    expect_corrupt(lg, *key);
  }
  SECTION("a malformed event") {
    admin({"RPUSH", list, "not an event"});
    expect_corrupt(lg, list);
  }
  SECTION("the list key of another type") {
    admin({"DEL", list});
    admin({"SET", list, "x"});
    expect_corrupt(lg, list);
  }
  SECTION("an estimate whose previous window counts more than its limit") {
    auto v = admin({"GET", *ekey});
    std::string s(v->str, v->len);
    REQUIRE(s.size() == quota::redis::kGatewayHeaderBytes + quota::redis::kGatewayRecordBytes +
                            quota::redis::kGatewayEntryBytes);
    // c (prev) of the one record: after the header (10), units (6) and micro-units (3)
    s[19] = 6;
    admin({"SET", *ekey, s});
    expect_corrupt(es, *ekey);
  }
}

TEST_CASE("redis gateway: the new kinds' exact range is checked, naming the bound") {
  CHECK(GatewayStore::check(SlidingLog{.limit = 1'000'000'000'000, .window = 9'000'000s}).ok());
  auto log_window =
      GatewayStore::check(SlidingLog{.limit = 5, .window = Nanos{9'000'000'000'000'001}});
  CHECK(log_window.code() == absl::StatusCode::kInvalidArgument);
  CHECK(log_window.message().find("9000000000000000 ns") != std::string::npos);
  CHECK(log_window.message().find("the Redis gateway store") != std::string::npos);
  auto limit = GatewayStore::check(SlidingLog{.limit = 1'000'000'000'001, .window = 1s});
  CHECK(limit.code() == absl::StatusCode::kInvalidArgument);
  CHECK(limit.message().find("at most 1000000000000 units") != std::string::npos);
  CHECK(GatewayStore::check(SlidingWindowEstimate{.limit = 1'000'000'000'000, .window = 4'500'000s})
            .ok());
  auto est_long = GatewayStore::check(SlidingWindowEstimate{.limit = 5, .window = 4'500'001s});
  CHECK(est_long.code() == absl::StatusCode::kInvalidArgument);
  CHECK(est_long.message().find("4500000 s") != std::string::npos);
  auto est_grid = GatewayStore::check(SlidingWindowEstimate{.limit = 5, .window = Nanos{1500}});
  CHECK(est_grid.code() == absl::StatusCode::kInvalidArgument);
  CHECK(est_grid.message().find("divides 1 s") != std::string::npos);
  CHECK(est_grid.message().find("the Redis gateway store") != std::string::npos);
}

TEST_CASE("redis gateway: failover safety refuses a sliding log level, deciding nothing") {
  GatewayStore store({.pool = quota::testing::redis_pool(1),
                      .prefix = quota::testing::unique_prefix("gw-log-failover"),
                      .failover_safety = true});
  const RulePolicy log = SlidingLog{.limit = 5, .window = 10s};
  const RulePolicy bucket = TokenBucket{.rate = {.units = 1, .per = 1s}, .burst = 5};
  // A token bucket level first, so a deduction before the refusal would show.
  const LevelCheck levels[] = {{.policy = &bucket, .key = "{acme}units"},
                               {.policy = &log, .key = "{acme}log"}};
  auto r = store.decide(levels, 1, Nanos{0});
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(r.status().message().find("failover_safety") != std::string::npos);
  CHECK(r.status().message().find("sliding_log") != std::string::npos);
  // The bucket alone: untouched, all 5 left.
  auto alone = store.decide(std::span(levels, 1), 1, Nanos{0});
  REQUIRE(alone.ok());
  REQUIRE(alone->parts.size() == 1);
  CHECK(alone->parts[0].allowed);
  CHECK(alone->parts[0].remaining == 4);
}
