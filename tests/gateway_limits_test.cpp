// Tests for the rule model of quota/gateway/rules/rule_spec.hpp and rules.hpp through the
// Gateway, in-process: named limits shared by route classes, several limits on one scope,
// per-limit costs (fixed and estimated), all or nothing across them (one atomic step per
// scope), and the rule changes that convert a named limit's state.
#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdint>
#include <string>
#include <thread>
#include <variant>

#include "quota/gateway/gateway.hpp"
#include "quota/policy/fixed_window.hpp"
#include "quota/store/local_store.hpp"
#include "quota/store/sharded_store.hpp"
#include "support/gateway_rules.hpp"

using namespace std::chrono_literals;
using quota::FixedWindow;
using quota::Nanos;
using quota::Reason;
using quota::TokenBucket;
using quota::gateway::Gateway;
using quota::gateway::KeyPolicy;
using quota::gateway::Level;
using quota::gateway::Request;
using quota::gateway::RouteCost;
using quota::gateway::RuleRegistry;
using quota::gateway::RuleSetSpec;
using quota::gateway::RuleSpec;
using quota::testing::build;

namespace {

Request on(const char* route, const char* tenant = "acme", const char* user = "") {
  return {.who = {.tenant = tenant, .plan = "free", .user = user}, .route = route};
}

// One tenant budget of 100 units/s, burst 20, shared by read (1 unit) and create (5).
RuleSetSpec shared_budget(std::uint64_t version = 1, std::int64_t burst = 20) {
  return {.version = version,
          .routes = {{.name = "read", .costs = {{.limit = "units", .units = 1}}},
                     {.name = "create", .costs = {{.limit = "units", .units = 5}}}},
          .rules = {{.level = Level::kTenant,
                     .plan = "free",
                     .name = "free-units",
                     .policy = TokenBucket{.rate = {100, 1s}, .burst = burst},
                     .limit = "units"}}};
}

}  // namespace

TEMPLATE_TEST_CASE(
    "one tenant budget shared by its routes: 20 reads or 4 creates, then 2 "
    "creates per 100 ms",
    "", quota::LocalStore<KeyPolicy>, quota::ShardedStore<KeyPolicy>) {
  RuleRegistry registry(build(shared_budget()));
  TestType store;
  Gateway gw(store, registry);
  SECTION("20 reads empty it, then a create is denied too") {
    for (int i = 0; i < 20; ++i) REQUIRE(gw.decide(on("read"), Nanos{0})->decision.allowed);
    auto create = gw.decide(on("create"), Nanos{0});
    REQUIRE(create.ok());
    CHECK_FALSE(create->decision.allowed);
    CHECK(create->decision.reason == Reason::kOverLimit);
    CHECK(create->decision.retry_after == 50ms);  // 5 units at 100/s
    CHECK(create->rule == "free-units");
  }
  SECTION("4 creates empty it; then 2 creates per 100 ms") {
    for (int i = 0; i < 4; ++i) {
      auto c = gw.decide(on("create"), Nanos{0});
      REQUIRE(c->decision.allowed);
      CHECK(c->decision.remaining == 15 - 5 * i);
    }
    CHECK_FALSE(gw.decide(on("read"), Nanos{0})->decision.allowed);
    for (int step = 1; step <= 5; ++step) {
      const Nanos t = step * 100ms;
      CHECK(gw.decide(on("create"), t)->decision.allowed);
      CHECK(gw.decide(on("create"), t)->decision.allowed);
      CHECK_FALSE(gw.decide(on("create"), t)->decision.allowed);
    }
  }
  SECTION("another tenant has its own budget") {
    for (int i = 0; i < 4; ++i) REQUIRE(gw.decide(on("create"), Nanos{0})->decision.allowed);
    CHECK(gw.decide(on("create", "globex"), Nanos{0})->decision.allowed);
  }
}

TEST_CASE("several limits on one tenant: per minute, per day, per month, and requests") {
  // Tokens: 1,000 per minute, 20,000 per day, 300,000 per 30 days (fixed windows), and a
  // request rate of 2 per second beside them. The LLM route pays its estimate in tokens
  // and 1 request.
  RuleSetSpec spec{.version = 1,
                   .routes = {{.name = "complete",
                               .costs = {{.limit = "tokens-min", .units = 1, .estimate = true},
                                         {.limit = "tokens-day", .units = 1, .estimate = true},
                                         {.limit = "tokens-month", .units = 1, .estimate = true},
                                         {.limit = "requests", .units = 1}}}},
                   .rules = {}};
  const auto limit = [&](const char* name, quota::gateway::RulePolicy policy) {
    spec.rules.push_back(
        {.level = Level::kTenant, .plan = "free", .name = name, .policy = policy, .limit = name});
  };
  limit("requests", TokenBucket{.rate = {2, 1s}, .burst = 2});
  limit("tokens-min", FixedWindow{.limit = 1'000, .window = 1min});
  limit("tokens-day", FixedWindow{.limit = 20'000, .window = 24h});
  limit("tokens-month", FixedWindow{.limit = 300'000, .window = 24h * 30});
  RuleRegistry registry(build(spec));
  quota::LocalStore<KeyPolicy> store;
  Gateway gw(store, registry);

  auto big = gw.acquire_estimate(on("complete"), 900, Nanos{0});
  REQUIRE(big.ok());
  REQUIRE(big->decision.allowed);
  // The answer describes one limit, the most restrictive: tokens-min, with 100 left and
  // room for no more request of 900 (the request rate, 1 of 2 left, has room for one);
  // its remaining and reset, never the request rate's remaining beside the month's reset.
  CHECK(big->rule == "tokens-min");
  CHECK(big->decision.remaining == 100);
  CHECK(big->decision.reset_after == 1min);
  // 900 + 200 tokens do not fit this minute: denied, and nothing is deducted anywhere —
  // the request limit (decided first) gets its request back.
  auto over = gw.acquire_estimate(on("complete"), 200, Nanos{0});
  REQUIRE(over.ok());
  CHECK_FALSE(over->decision.allowed);
  CHECK(over->rule == "tokens-min");
  CHECK(over->decision.retry_after == 1min);
  auto small = gw.acquire_estimate(on("complete"), 100, Nanos{0});
  REQUIRE(small->decision.allowed);
  // Now the request limit is empty: a 1-token request is denied by it.
  auto third = gw.acquire_estimate(on("complete"), 1, Nanos{0});
  CHECK_FALSE(third->decision.allowed);
  CHECK(third->rule == "requests");
  // The day limit: 20 minutes of 1,000 tokens each fill it; the 21st minute is denied by
  // the day limit although its minute is fresh.
  std::int64_t spent = 1'000;
  for (int minute = 1; spent < 20'000; ++minute) {
    auto r = gw.acquire_estimate(on("complete"), 1'000, minute * 1min);
    REQUIRE(r->decision.allowed);
    spent += 1'000;
  }
  auto day = gw.acquire_estimate(on("complete"), 1'000, 30min);
  REQUIRE(day.ok());
  CHECK_FALSE(day->decision.allowed);
  CHECK(day->rule == "tokens-day");
}

TEST_CASE("a settle corrects only the budgets paid by estimate") {
  RuleSetSpec spec{.version = 1,
                   .routes = {{.name = "complete",
                               .costs = {{.limit = "tokens", .units = 1, .estimate = true},
                                         {.limit = "requests", .units = 1}}}},
                   .rules = {}};
  spec.rules.push_back({.level = Level::kTenant,
                        .plan = "free",
                        .name = "tokens",
                        .policy = TokenBucket{.rate = {0, 1s}, .burst = 1'000},
                        .limit = "tokens"});
  spec.rules.push_back({.level = Level::kTenant,
                        .plan = "free",
                        .name = "requests",
                        .policy = TokenBucket{.rate = {0, 1s}, .burst = 10},
                        .limit = "requests"});
  RuleRegistry registry(build(spec));
  quota::LocalStore<KeyPolicy> store;
  Gateway gw(store, registry);
  auto r = gw.acquire_estimate(on("complete"), 500, Nanos{0});
  REQUIRE(r->decision.allowed);
  REQUIRE(r->ticket.has_value());
  auto settled = gw.settle("acme", *r->ticket, 100, 1s);
  REQUIRE(settled.ok());
  REQUIRE(settled->refunded.size() == 1);  // the token budget only
  CHECK(settled->refunded[0] == quota::to_micro(400));
  // 900 tokens left after the refund, 9 requests.
  auto probe = gw.acquire_estimate(on("complete"), 900, 2s);
  REQUIRE(probe->decision.allowed);
  CHECK(probe->decision.remaining == 0);
  auto requests_left = gw.decide(on("complete"), 3s);  // estimate budgets take units = 1
  REQUIRE(requests_left.ok());
  CHECK_FALSE(requests_left->decision.allowed);
  CHECK(requests_left->rule == "tokens");
}

TEST_CASE("a user request limit beside a tenant token budget, each with its own cost") {
  RuleSetSpec spec{.version = 1,
                   .routes = {{.name = "search",
                               .costs = {{.limit = "user-requests", .units = 1},
                                         {.limit = "tokens", .units = 50}}}},
                   .rules = {}};
  spec.rules.push_back({.level = Level::kUser,
                        .plan = "free",
                        .name = "user-requests",
                        .policy = FixedWindow{.limit = 10, .window = 10s},
                        .limit = "user-requests"});
  spec.rules.push_back({.level = Level::kTenant,
                        .plan = "free",
                        .name = "tokens",
                        .policy = TokenBucket{.rate = {0, 1s}, .burst = 1'000},
                        .limit = "tokens"});
  RuleRegistry registry(build(spec));
  quota::LocalStore<KeyPolicy> store;
  Gateway gw(store, registry);
  // u-1 makes 10 requests in 10 s (500 tokens of the tenant's 1,000); the 11th is denied
  // by the user limit and takes no tokens.
  for (int i = 0; i < 10; ++i) {
    REQUIRE(gw.decide(on("search", "acme", "u-1"), Nanos{0})->decision.allowed);
  }
  auto eleventh = gw.decide(on("search", "acme", "u-1"), Nanos{0});
  CHECK_FALSE(eleventh->decision.allowed);
  CHECK(eleventh->rule == "user-requests");
  // u-2 has its own 10 requests but shares the tenant's tokens: 500 left, so 10 pass and
  // empty it, and then u-3's first request is denied by the tenant budget.
  for (int i = 0; i < 10; ++i) {
    REQUIRE(gw.decide(on("search", "acme", "u-2"), Nanos{0})->decision.allowed);
  }
  auto u3 = gw.decide(on("search", "acme", "u-3"), Nanos{0});
  CHECK_FALSE(u3->decision.allowed);
  CHECK(u3->rule == "tokens");
  // u-3's denial gave its user limit back: all 10 still there after the window.
  auto u3_user = store.apply(KeyPolicy{.policy = &spec.rules[0].policy, .version = 1},
                             "{acme}#user-requests/u-3", Nanos{0}, 10);
  REQUIRE(u3_user.ok());
  CHECK(u3_user->allowed);
}

TEST_CASE("a tenant's own limit replaces its plan's of the same name, and converts its state") {
  RuleSetSpec spec = shared_budget(1);
  spec.rules.push_back({.level = Level::kTenant,
                        .tenant = "acme",
                        .name = "acme-units",
                        .policy = TokenBucket{.rate = {100, 1s}, .burst = 40},
                        .limit = "units"});
  RuleRegistry registry(build(spec));
  quota::LocalStore<KeyPolicy> store;
  Gateway gw(store, registry);
  for (int i = 0; i < 8; ++i) REQUIRE(gw.decide(on("create"), Nanos{0})->decision.allowed);
  auto ninth = gw.decide(on("create"), Nanos{0});
  CHECK_FALSE(ninth->decision.allowed);
  CHECK(ninth->rule == "acme-units");
  // Version 2 drops acme's own rule: the plan's burst 20 applies to the same key, whose
  // state is converted: empty stays empty (no fresh burst).
  REQUIRE(registry.publish(build(shared_budget(2))).ok());
  auto after = gw.decide(on("read"), Nanos{0});
  CHECK_FALSE(after->decision.allowed);
  CHECK(after->decision.version == 2);
}

TEST_CASE("invalid limits and costs are refused, naming the entry") {
  const auto error = [](const RuleSetSpec& spec) {
    auto set = quota::gateway::RuleSet::create(spec);
    REQUIRE_FALSE(set.ok());
    CHECK(set.status().code() == absl::StatusCode::kInvalidArgument);
    return std::string(set.status().message());
  };
  SECTION("a cost entry for a limit no rule defines") {
    RuleSetSpec spec = shared_budget();
    spec.routes[0].costs.push_back({.limit = "tokens", .units = 1});
    CHECK_THAT(error(spec), Catch::Contains("routes[0]") && Catch::Contains("\"tokens\""));
  }
  SECTION("a shared limit no route pays") {
    RuleSetSpec spec = shared_budget();
    spec.rules.push_back(spec.rules[0]);
    spec.rules[1].limit = "unpaid";
    CHECK_THAT(error(spec), Catch::Contains("rules[1]") && Catch::Contains("never be decided"));
  }
  SECTION("a rule with neither route nor limit") {
    RuleSetSpec spec = shared_budget();
    spec.rules[0].limit = "";
    CHECK_THAT(error(spec), Catch::StartsWith("rules[0]"));
  }
  SECTION("a cost above the capacity") {
    RuleSetSpec spec = shared_budget(1, 4);
    CHECK_THAT(error(spec), Catch::Contains("rules[0]") && Catch::Contains("\"create\" costs 5"));
  }
  SECTION("the same limit twice on one scope") {
    RuleSetSpec spec = shared_budget();
    spec.rules.push_back(spec.rules[0]);
    CHECK_THAT(error(spec), Catch::Contains("rules[1]") && Catch::Contains("already defined"));
  }
  SECTION("a limit listed twice in one route's costs") {
    RuleSetSpec spec = shared_budget();
    spec.routes[1].costs.push_back({.limit = "units", .units = 2});
    CHECK_THAT(error(spec), Catch::Contains("routes[1]") && Catch::Contains("listed twice"));
  }
  SECTION("enforce_percent outside 0..100") {
    RuleSetSpec spec = shared_budget();
    spec.rules[0].enforce_percent = 101;
    CHECK_THAT(error(spec), Catch::Contains("rules[0]") && Catch::Contains("enforce_percent"));
  }
  SECTION("a zero cost") {
    RuleSetSpec spec = shared_budget();
    spec.routes[0].costs[0].units = 0;
    CHECK_THAT(error(spec), Catch::Contains("routes[0]") && Catch::Contains("units"));
  }
}

TEST_CASE("the limits of one scope are one atomic step: no call sees a deduction given back") {
  // "both" pays 1 on limit a (10 units, no refill) and 1 on limit b (1 unit, spent): every
  // such request is denied by b after a was deducted. An observer reading a's state from
  // another thread must never see that deduction (in-process, a's give-back happens under
  // the same locks as the deduction).
  RuleSetSpec spec{.version = 1,
                   .routes = {{.name = "both",
                               .costs = {{.limit = "a", .units = 1}, {.limit = "b", .units = 1}}},
                              {.name = "only-b", .costs = {{.limit = "b", .units = 1}}}},
                   .rules = {}};
  for (const char* name : {"a", "b"}) {
    spec.rules.push_back({.level = Level::kTenant,
                          .plan = "free",
                          .name = name,
                          .policy = TokenBucket{.rate = {0, 1s}, .burst = name[0] == 'a' ? 10 : 1},
                          .limit = name});
  }
  RuleRegistry registry(build(spec));
  quota::ShardedStore<KeyPolicy> store;
  Gateway gw(store, registry);
  REQUIRE(gw.decide(on("only-b"), Nanos{0})->decision.allowed);  // b is spent
  REQUIRE_FALSE(gw.decide(on("both"), Nanos{0})->decision.allowed);
  const quota::gateway::RulePolicy a_policy = spec.rules[0].policy;
  std::atomic<bool> done{false};
  std::atomic<int> seen_lower{0};
  std::thread observer([&] {
    while (!done.load()) {
      auto tokens = store.update(
          KeyPolicy{.policy = &a_policy, .version = 1}, "{acme}#a", Nanos{0},
          [](quota::gateway::KeyState& s) { return std::get<TokenBucket::State>(s.state).tokens; });
      if (tokens.ok() && *tokens != quota::to_micro(10)) seen_lower.fetch_add(1);
    }
  });
  int denied = 0;
  for (int i = 0; i < 20'000; ++i) {
    denied += gw.decide(on("both"), Nanos{0})->decision.allowed ? 0 : 1;
  }
  done.store(true);
  observer.join();
  CHECK(denied == 20'000);
  CHECK(seen_lower.load() == 0);
}
