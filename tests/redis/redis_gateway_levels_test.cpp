// Tests of the gateway's levels over Redis: user + tenant all-or-nothing in one script,
// the global level given back when it denies, shadow mode, estimate-then-settle, many
// threads on one budget, and attempts replayed by another process.
#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <catch2/catch.hpp>

#include "quota/gateway/gateway.hpp"
#include "quota/redis/gateway_store.hpp"
#include "support/gateway_fixtures.hpp"
#include "support/gateway_rules.hpp"
#include "support/printers.hpp"
#include "support/redis_server.hpp"

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

TEST_CASE("redis gateway: a global denial gives each tenant level back its own cost") {
  GatewayStore store = make_store("gw-global-costs");
  // One-off budgets (rate 0): server time passing adds nothing.
  const quota::gateway::RulePolicy user = TokenBucket{.rate = {.units = 0, .per = 1s}, .burst = 10};
  const quota::gateway::RulePolicy tenant =
      TokenBucket{.rate = {.units = 0, .per = 1s}, .burst = 20};
  const quota::gateway::RulePolicy global =
      TokenBucket{.rate = {.units = 0, .per = 1s}, .burst = 4};
  const LevelCheck levels[] = {
      {.policy = &user, .key = "{acme}read/u1", .shadow = false, .cost = 2},
      {.policy = &tenant, .key = "{acme}read", .shadow = false, .cost = 5},
      {.policy = &global, .key = "{~global}read", .shadow = false, .cost = 3}};
  auto first = store.decide(levels, 1, Nanos{0});
  REQUIRE(first.ok());
  REQUIRE(first->parts.size() == 3);
  CHECK(first->parts[0].remaining == 8);
  CHECK(first->parts[1].remaining == 15);
  CHECK(first->parts[2].remaining == 1);
  // The global level (1 left) denies the next: the user level gets its 2 back, the tenant
  // level its 5.
  auto denied = store.decide(levels, 1, Nanos{0});
  REQUIRE(denied.ok());
  REQUIRE(denied->parts.size() == 3);
  CHECK(denied->parts[0].allowed);
  CHECK(denied->parts[1].allowed);
  CHECK_FALSE(denied->parts[2].allowed);
  const LevelCheck tenant_levels[] = {levels[0], levels[1]};
  auto after = store.decide(with_cost(tenant_levels, 1), 1, Nanos{0});
  REQUIRE(after.ok());
  REQUIRE(after->parts.size() == 2);
  CHECK(after->parts[0].remaining == 7);
  CHECK(after->parts[1].remaining == 14);
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
  auto settled = gw.settle("acme", *est->ticket, 150, Nanos{0});
  REQUIRE(settled.ok());
  REQUIRE(settled->refunded.size() == 1);
  CHECK(settled->refunded[0] == 450 * quota::kMicrosPerUnit);
  CHECK_FALSE(gw.settle("acme", *est->ticket, 150, Nanos{0}).ok());  // never twice
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
}

TEST_CASE("redis gateway: an attempt decides shadow levels and levels' own costs as decide does") {
  // A shadow level over its limit never stops the call, and each level pays its own cost,
  // with an attempt as without one (the attempt's call carries the same shadow flags).
  GatewayStore store = make_store("gw-attempt-shadow");
  const quota::gateway::RulePolicy user = TokenBucket{.rate = kSlow, .burst = 1};
  const quota::gateway::RulePolicy tenant = TokenBucket{.rate = kSlow, .burst = 10};
  for (const bool with_attempt : {false, true}) {
    INFO("with an attempt: " << with_attempt);
    const char* tenant_id = with_attempt ? "with" : "without";
    const std::pair<std::string, std::string> keys{std::string("{") + tenant_id + "}read/u-1",
                                                   std::string("{") + tenant_id + "}read"};
    const LevelCheck checks[] = {
        {.policy = &user, .key = keys.first, .shadow = true, .cost = 1},
        {.policy = &tenant, .key = keys.second, .shadow = false, .cost = 5}};
    int step = 0;
    auto run = [&]() -> quota::gateway::LevelsResult {
      if (!with_attempt) {
        auto r = store.decide(checks, 1, Nanos{0});
        REQUIRE(r.ok());
        return *r;
      }
      const std::string id = "a-" + std::to_string(++step);
      const quota::gateway::AttemptRequest attempt{
          .id = id, .fingerprint = id, .deadline = {}, .ttl = 60s};
      auto r = store.decide_attempt(checks, 1, Nanos{0}, attempt);
      REQUIRE(r.ok());
      return r->levels;
    };
    const auto first = run();  // the user's one unit spent, 5 of the tenant's
    REQUIRE(first.parts.size() == 2);
    CHECK(first.parts[0].allowed);
    CHECK(first.parts[1].remaining == 5);
    const auto second = run();  // the shadow user level denies; the tenant still decides
    REQUIRE(second.parts.size() == 2);
    CHECK_FALSE(second.parts[0].allowed);
    CHECK(second.parts[1].allowed);
    CHECK(second.parts[1].remaining == 0);
  }
}
