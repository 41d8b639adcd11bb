// Tests for the sliding log and the two-window estimator as gateway rules
// (quota/gateway/key_state.hpp, rule_kinds.hpp) through Gateway over LocalStore and
// ShardedStore: an exact "any 60 s" tenant limit, settle's refund and charge, and all or
// nothing across a log and a token bucket.
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdint>
#include <variant>
#include <vector>

#include "quota/gateway/gateway.hpp"
#include "quota/store/local_store.hpp"
#include "quota/store/sharded_store.hpp"
#include "support/gateway_rules.hpp"

using namespace std::chrono_literals;
using quota::Nanos;
using quota::SlidingLog;
using quota::SlidingWindowEstimate;
using quota::TokenBucket;
using quota::gateway::Gateway;
using quota::gateway::KeyPolicy;
using quota::gateway::KeyState;
using quota::gateway::RulePolicy;
using quota::gateway::RuleRegistry;
using quota::testing::build;
using quota::testing::levels_spec;

namespace {

const quota::gateway::Request kRead{.who = {.tenant = "acme", .plan = "free"}, .route = "read"};

// The tenant key's state, read without deciding.
template <class Store, class Fn>
auto inspect(Store& store, const RulePolicy& policy, Nanos now, Fn fn) {
  const KeyPolicy kp{.policy = &policy, .version = 1};
  auto r = store.update(kp, "{acme}read", now, [&](KeyState& s) { return fn(s); });
  REQUIRE(r.ok());
  return *r;
}

}  // namespace

TEMPLATE_TEST_CASE("a sliding-log tenant rule holds in every 60 s, decided exactly", "",
                   quota::LocalStore<KeyPolicy>, quota::ShardedStore<KeyPolicy>) {
  const RulePolicy log = SlidingLog{.limit = 3, .window = 60s};
  RuleRegistry registry(build(levels_spec(1, log)));
  TestType store;
  Gateway gw(store, registry);
  auto at = [&](Nanos t) {
    auto r = gw.decide(kRead, t);
    REQUIRE(r.ok());
    CHECK(r->rule == "tenant");
    return r->decision;
  };
  CHECK(at(0s).remaining == 2);
  CHECK(at(30s).remaining == 1);
  CHECK(at(59'999ms).remaining == 0);
  // Full until the event at 0 leaves the window (t − 60 s, t], at exactly 60 s.
  auto d = at(59'999'500us);
  CHECK_FALSE(d.allowed);
  CHECK(d.retry_after == 500us);
  CHECK_FALSE(at(60s - 1ns).allowed);
  d = at(60s);
  CHECK(d.allowed);
  CHECK(d.remaining == 0);
  // The event at 30 s leaves at 90 s, not a nanosecond earlier.
  d = at(90s - 1ns);
  CHECK_FALSE(d.allowed);
  CHECK(d.retry_after == 1ns);
  CHECK(at(90s).allowed);
  // Now 59.999 s, 60 s and 90 s count; the first leaves at 119.999 s.
  d = at(119'998ms);
  CHECK_FALSE(d.allowed);
  CHECK(d.retry_after == 1ms);
  CHECK(at(119'999ms).allowed);
  // No aligned boundary lets more through: at most 3 in any 60 s of the admissions.
  const std::vector<Nanos> admitted{0s, 30s, 59'999ms, 60s, 90s, 119'999ms};
  for (Nanos start : admitted) {
    int n = 0;
    for (Nanos e : admitted) n += e >= start && e < start + 60s;
    CHECK(n <= 3);
  }
}

TEMPLATE_TEST_CASE("settle refunds a surplus to a log and to an estimator", "",
                   quota::LocalStore<KeyPolicy>, quota::ShardedStore<KeyPolicy>) {
  for (const RulePolicy& policy :
       {RulePolicy{SlidingLog{.limit = 100, .window = 60s}},
        RulePolicy{SlidingWindowEstimate{.limit = 100, .window = 60s}}}) {
    INFO(policy.index());
    RuleRegistry registry(build(levels_spec(1, policy)));
    TestType store;
    Gateway gw(store, registry);
    auto est = gw.acquire_estimate(kRead, 30, Nanos{0});
    REQUIRE(est.ok());
    REQUIRE(est->ticket.has_value());
    CHECK(est->decision.remaining == 70);
    auto s = gw.settle("acme", *est->ticket, 12, 1s);
    REQUIRE(s.ok());
    CHECK(s->refunded == std::vector<quota::MicroUnits>{quota::to_micro(18)});
    auto d = gw.decide(kRead, 1s);
    REQUIRE(d.ok());
    CHECK(d->decision.remaining == 87);  // 100 − 12 − 1
  }
}

TEMPLATE_TEST_CASE("a refund after the window: the log gives nothing, the estimator its prev", "",
                   quota::LocalStore<KeyPolicy>, quota::ShardedStore<KeyPolicy>) {
  SECTION("sliding log: the estimate's event left at 60 s; nothing is still counted") {
    const RulePolicy log = SlidingLog{.limit = 100, .window = 60s};
    RuleRegistry registry(build(levels_spec(1, log)));
    TestType store;
    Gateway gw(store, registry);
    auto est = gw.acquire_estimate(kRead, 30, Nanos{0});
    REQUIRE(est.ok());
    auto s = gw.settle("acme", *est->ticket, 12, 61s);
    REQUIRE(s.ok());
    CHECK(s->refunded == std::vector<quota::MicroUnits>{0});
    CHECK(gw.decide(kRead, 61s)->decision.remaining == 99);
  }
  SECTION("estimator: the estimate is the previous window's count; 18 come off it") {
    const RulePolicy est_p = SlidingWindowEstimate{.limit = 100, .window = 60s};
    RuleRegistry registry(build(levels_spec(1, est_p)));
    TestType store;
    Gateway gw(store, registry);
    auto est = gw.acquire_estimate(kRead, 30, Nanos{0});
    REQUIRE(est.ok());
    auto s = gw.settle("acme", *est->ticket, 12, 61s);
    REQUIRE(s.ok());
    CHECK(s->refunded == std::vector<quota::MicroUnits>{quota::to_micro(18)});
    // prev 12 at 1 s into the window: floor(100 − 12 + 12·1/60) = 88, then 1 is taken.
    CHECK(gw.decide(kRead, 61s)->decision.remaining == 87);
  }
}

TEMPLATE_TEST_CASE("settle charges a deficit to a log: counted now, the rest as debt", "",
                   quota::LocalStore<KeyPolicy>, quota::ShardedStore<KeyPolicy>) {
  const RulePolicy log = SlidingLog{.limit = 10, .window = 60s};
  RuleRegistry registry(build(levels_spec(1, log)));
  TestType store;
  Gateway gw(store, registry, {.charge_deficit = true});
  auto est = gw.acquire_estimate(kRead, 4, Nanos{0});
  REQUIRE(est.ok());
  auto s = gw.settle("acme", *est->ticket, 20, 1s);  // deficit 16: 6 fit now, 10 become debt
  REQUIRE(s.ok());
  CHECK(s->debt == std::vector<quota::MicroUnits>{quota::to_micro(10)});
  CHECK(inspect(store, log, 1s, [](KeyState& k) { return k.debt; }) == quota::to_micro(10));
  CHECK_FALSE(gw.decide(kRead, 2s)->decision.allowed);
  // 60 s: the 4 units of 0 s leave and pay 4 of the debt; 61 s: the 6 of 1 s leave and
  // pay the other 6. The debt is counted as admitted then, so it leaves at 120 s and 121 s.
  CHECK_FALSE(gw.decide(kRead, 60s)->decision.allowed);
  CHECK_FALSE(gw.decide(kRead, 61s)->decision.allowed);
  CHECK(inspect(store, log, 61s, [](KeyState& k) { return k.debt; }) == 0);
  CHECK_FALSE(gw.decide(kRead, 120s - 1ns)->decision.allowed);
  auto d = gw.decide(kRead, 120s);
  CHECK(d->decision.allowed);
  CHECK(d->decision.remaining == 3);
}

TEMPLATE_TEST_CASE("settle charges a deficit to an estimator: counted now, the rest as debt", "",
                   quota::LocalStore<KeyPolicy>, quota::ShardedStore<KeyPolicy>) {
  const RulePolicy est_p = SlidingWindowEstimate{.limit = 10, .window = 60s};
  RuleRegistry registry(build(levels_spec(1, est_p)));
  TestType store;
  Gateway gw(store, registry, {.charge_deficit = true});
  auto est = gw.acquire_estimate(kRead, 4, Nanos{0});
  REQUIRE(est.ok());
  auto s = gw.settle("acme", *est->ticket, 20, 1s);
  REQUIRE(s.ok());
  CHECK(s->debt == std::vector<quota::MicroUnits>{quota::to_micro(10)});
  CHECK_FALSE(gw.decide(kRead, 2s)->decision.allowed);
  // 121 s (window 2): both counters are 0, the debt of 10 is counted in cur.
  CHECK_FALSE(gw.decide(kRead, 121s)->decision.allowed);
  CHECK(inspect(store, est_p, 121s, [](KeyState& k) { return k.debt; }) == 0);
  // 210 s (window 3, 30 s in): prev 10 weighs 1/2: floor(10 − 10 + 5) = 5 remain.
  auto d = gw.decide(kRead, 210s);
  CHECK(d->decision.allowed);
  CHECK(d->decision.remaining == 4);
}

TEMPLATE_TEST_CASE("all or nothing across a log and a token bucket: the log is restored exactly",
                   "", quota::LocalStore<KeyPolicy>, quota::ShardedStore<KeyPolicy>) {
  const RulePolicy log = SlidingLog{.limit = 5, .window = 60s};
  const RulePolicy global = TokenBucket{.rate = {.units = 0, .per = 1s}, .burst = 3};
  RuleRegistry registry(build(levels_spec(1, log, std::nullopt, global)));
  TestType store;
  Gateway gw(store, registry);
  for (Nanos t : {0s, 1s, 2s}) CHECK(gw.decide(kRead, t)->decision.allowed);
  // The log admits the fourth, the global bucket denies it: the log's event is given back.
  auto d = gw.decide(kRead, 3s);
  CHECK_FALSE(d->decision.allowed);
  CHECK(d->rule == "global");
  struct View {
    std::size_t events;
    std::int64_t used;
    Nanos idle_at;
  };
  auto view = inspect(store, log, 3s, [&](KeyState& k) {
    const auto& st = std::get<SlidingLog::State>(k.state);
    return View{st.events(), st.used(), Nanos{k.idle_at}};
  });
  CHECK(view.events == 3);
  CHECK(view.used == 3);
  CHECK(view.idle_at == 62s);  // as if the denied request had never come
}

TEST_CASE("a log refund takes back the newest events at or before spent_at, still counted") {
  const RulePolicy log = SlidingLog{.limit = 10, .window = 60s};
  const KeyPolicy kp{.policy = &log, .version = 1};
  KeyState s = kp.init(Nanos{0});
  REQUIRE(kp.apply(s, 0s, 2).allowed);
  REQUIRE(kp.apply(s, 10s, 3).allowed);  // the request being settled
  REQUIRE(kp.apply(s, 20s, 4).allowed);  // another request's, later: it stays
  // 5 back, spent at 10 s: the 3 of 10 s, then 2 of 0 s; the event at 20 s is untouched.
  CHECK(quota::gateway::refund(s, 5, 10s, 20s) == quota::to_micro(5));
  const auto& st = std::get<SlidingLog::State>(s.state);
  CHECK(st.events() == 1);
  CHECK(st.used() == 4);
  CHECK(kp.idle_at(s) == 80s);
  // Nothing at or before 10 s is left to take back.
  CHECK(quota::gateway::refund(s, 5, 10s, 20s) == 0);
  // A partial take keeps the event with the rest of its units.
  REQUIRE(kp.apply(s, 30s, 5).allowed);
  CHECK(quota::gateway::refund(s, 2, 30s, 30s) == quota::to_micro(2));
  CHECK(st.events() == 2);
  CHECK(st.used() == 7);
  // Expired events are not taken back: at 85 s only the event at 30 s (3 units) counts.
  CHECK(quota::gateway::refund(s, 9, 85s, 85s) == quota::to_micro(3));
  CHECK(st.events() == 0);
  CHECK(kp.idle_at(s) == 85s);
}

TEST_CASE("an estimator refund takes from the window the units were spent in") {
  const RulePolicy est_p = SlidingWindowEstimate{.limit = 10, .window = 10s};
  const KeyPolicy kp{.policy = &est_p, .version = 1};
  KeyState s = kp.init(Nanos{0});
  REQUIRE(kp.apply(s, 1s, 6).allowed);
  CHECK(quota::gateway::refund(s, 2, 1s, 2s) == quota::to_micro(2));  // cur 4
  CHECK(std::get<SlidingWindowEstimate::State>(s.state).cur == 4);
  CHECK(quota::gateway::refund(s, 3, 1s, 12s) == quota::to_micro(3));  // from prev: 1
  CHECK(std::get<SlidingWindowEstimate::State>(s.state).prev == 1);
  CHECK(quota::gateway::refund(s, 3, 1s, 21s) == 0);  // no longer counted
  CHECK(kp.idle_at(s) == 21s);
}
