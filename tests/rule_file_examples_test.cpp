// Tests for the example rule files (examples/rules/*.yaml): each is loaded with
// quota::rules::load_rule_file and its decisions asserted through a Gateway over an
// in-process store, so that the contract each file's comment states holds.
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "quota/gateway/gateway.hpp"
#include "quota/http.hpp"
#include "quota/rules/rule_file.hpp"
#include "quota/store/local_store.hpp"

using namespace std::chrono_literals;
using quota::Nanos;
using quota::Reason;
using quota::gateway::Gateway;
using quota::gateway::KeyPolicy;
using quota::gateway::Request;
using quota::gateway::RuleRegistry;

namespace {

std::shared_ptr<const quota::gateway::RuleSet> example(const char* name) {
  auto set = quota::rules::load_rule_file(std::string(QUOTA_RULES_EXAMPLES_DIR) + "/" + name);
  INFO(name << ": " << set.status().ToString());
  REQUIRE(set.ok());
  return *set;
}

// A gateway over its own in-process store, on one example's rules.
struct Example {
  explicit Example(const char* name) : registry(example(name)), gw(store, registry) {}
  RuleRegistry registry;
  quota::LocalStore<KeyPolicy> store;
  Gateway gw;
};

Request req(const char* route, const char* tenant, const char* plan, const char* user = "") {
  return {.who = {.tenant = tenant, .plan = plan, .user = user}, .route = route};
}

}  // namespace

TEST_CASE("shared-tenant-budget.yaml: 20 reads or 4 creates, then 2 creates per 100 ms") {
  Example e("shared-tenant-budget.yaml");
  const Request read = req("read", "acme", "free"), create = req("create", "acme", "free");
  SECTION("reads and creates draw on one budget") {
    for (int i = 0; i < 15; ++i) REQUIRE(e.gw.decide(read, Nanos{0})->decision.allowed);
    REQUIRE(e.gw.decide(create, Nanos{0})->decision.allowed);  // 5 left: one create
    CHECK_FALSE(e.gw.decide(read, Nanos{0})->decision.allowed);
  }
  SECTION("4 creates, then 2 per 100 ms") {
    for (int i = 0; i < 4; ++i) REQUIRE(e.gw.decide(create, Nanos{0})->decision.allowed);
    CHECK_FALSE(e.gw.decide(create, Nanos{0})->decision.allowed);
    for (int step = 1; step <= 10; ++step) {
      CHECK(e.gw.decide(create, step * 100ms)->decision.allowed);
      CHECK(e.gw.decide(create, step * 100ms)->decision.allowed);
      CHECK_FALSE(e.gw.decide(create, step * 100ms)->decision.allowed);
    }
  }
}

TEST_CASE("llm-tokens.yaml: minute, day and 30-day token limits beside a request limit") {
  Example e("llm-tokens.yaml");
  const Request r = req("completion", "acme", "pro");
  // The minute's million tokens in one estimate; the next token waits for the refill.
  auto big = e.gw.acquire_estimate(r, 1'000'000, Nanos{0});
  REQUIRE(big->decision.allowed);
  auto more = e.gw.acquire_estimate(r, 1'000, Nanos{0});
  CHECK_FALSE(more->decision.allowed);
  CHECK(more->rule == "tokens-minute");
  CHECK(more->decision.retry_after == 60ms);  // 1,000 tokens at 1,000,000/min
  // Settled at 400,000 actual: 600,000 tokens come back to every estimated limit.
  auto settled = e.gw.settle("acme", *big->ticket, 400'000, 1s);
  REQUIRE(settled.ok());
  REQUIRE(settled->refunded.size() == 3);
  // The day: 20 million in one day; the minute bucket refills in between.
  for (int minute = 1; minute <= 20; ++minute) {
    auto d = e.gw.acquire_estimate(r, 990'000, minute * 1min);
    INFO("minute " << minute);
    REQUIRE(d.ok());
    if (minute < 20) CHECK(d->decision.allowed);
    if (minute == 20) {
      CHECK_FALSE(d->decision.allowed);  // 400,000 + 20 · 990,000 > 20,000,000
      CHECK(d->rule == "tokens-day");
    }
  }
  // Requests: a burst of 60, then 10 per second.
  Example q("llm-tokens.yaml");
  for (int i = 0; i < 60; ++i) REQUIRE(q.gw.acquire_estimate(r, 1, Nanos{0})->decision.allowed);
  auto sixty_first = q.gw.acquire_estimate(r, 1, Nanos{0});
  CHECK_FALSE(sixty_first->decision.allowed);
  CHECK(sixty_first->rule == "requests");
  CHECK(sixty_first->decision.retry_after == 100ms);
}

TEST_CASE("user-beside-tenant.yaml: 10 requests per user per 10 s, one tenant token budget") {
  Example e("user-beside-tenant.yaml");
  for (int i = 0; i < 10; ++i) {
    REQUIRE(e.gw.acquire_estimate(req("chat", "acme", "team", "u-1"), 1'000, Nanos{0})
                ->decision.allowed);
  }
  auto eleventh = e.gw.acquire_estimate(req("chat", "acme", "team", "u-1"), 1'000, Nanos{0});
  CHECK_FALSE(eleventh->decision.allowed);
  CHECK(eleventh->rule == "user-requests");
  // Another user of the same tenant: its own 10 requests, the tenant's tokens shared
  // (10,000 spent by u-1): 90,000 left.
  CHECK(e.gw.acquire_estimate(req("chat", "acme", "team", "u-2"), 90'000, Nanos{0})
            ->decision.allowed);
  auto empty = e.gw.acquire_estimate(req("chat", "acme", "team", "u-3"), 1'000, Nanos{0});
  CHECK_FALSE(empty->decision.allowed);
  CHECK(empty->rule == "tenant-tokens");
  // After the user window, u-1 may again (tokens refilled by then: 100,000/min).
  CHECK(e.gw.acquire_estimate(req("chat", "acme", "team", "u-1"), 1'000, 10s)->decision.allowed);
}

TEST_CASE("shadow-beside-enforce.yaml: the trial global rule never denies") {
  Example e("shadow-beside-enforce.yaml");
  // 5,000 per minute for everyone, in shadow: 250 tenants · 20 reads = 5,000 pass, and
  // the next 20 tenants' reads pass too (shadow), each denied only by its own budget.
  int shadowed = 0;
  for (int t = 0; t < 300; ++t) {
    const std::string tenant = "t-" + std::to_string(t);
    const Request read{.who = {.tenant = tenant, .plan = "free"}, .route = "read"};
    for (int i = 0; i < 20; ++i) {
      auto d = e.gw.decide(read, Nanos{0});
      REQUIRE(d->decision.allowed);
      shadowed += d->decision.reason == Reason::kShadow ? 1 : 0;
    }
    auto own = e.gw.decide(read, Nanos{0});
    CHECK_FALSE(own->decision.allowed);
    CHECK(own->rule == "free-read");
  }
  CHECK(shadowed == 300 * 20 - 5'000);
}

TEST_CASE("enforce-percent.yaml: enforced for a quarter of the tenants, the same ones") {
  Example e("enforce-percent.yaml");
  int enforced = 0;
  for (int t = 0; t < 200; ++t) {
    const std::string tenant = "tenant-" + std::to_string(t);
    const Request read{.who = {.tenant = tenant, .plan = "pro"}, .route = "read"};
    for (int i = 0; i < 100; ++i) REQUIRE(e.gw.decide(read, Nanos{0})->decision.allowed);
    auto over = e.gw.decide(read, Nanos{0});
    const bool in = quota::gateway::rollout_bucket(tenant) < 25;
    CHECK(over->decision.allowed == !in);
    enforced += in ? 1 : 0;
  }
  CHECK(enforced > 200 * 15 / 100);
  CHECK(enforced < 200 * 35 / 100);
}

TEST_CASE("global-switch.yaml: every rule in shadow, until the switch is off") {
  Example e("global-switch.yaml");
  const Request create = req("create", "acme", "free");
  for (int i = 0; i < 30; ++i) {
    auto d = e.gw.decide(create, Nanos{0});
    REQUIRE(d->decision.allowed);
    CHECK(d->decision.reason == (i < 20 ? Reason::kAllowed : Reason::kShadow));
  }
  // The same file with the switch off (a reload), the window still full: denied.
  auto off = quota::gateway::RuleSet::create([] {
    auto text = quota::rules::parse_rules(
        "version: 2\nroutes: [{name: read}, {name: create, cost: 5}]\nrules:\n"
        "  - {name: free-create, level: tenant, plan: free, route: create,\n"
        "     fixed_window: {limit: 100, window: 1min}}\n",
        "off.yaml");
    REQUIRE(text.ok());
    return *text;
  }());
  REQUIRE(off.ok());
  REQUIRE(e.registry.publish(*off).ok());
  CHECK_FALSE(e.gw.decide(create, 1s)->decision.allowed);
}

TEST_CASE("request-cap.yaml: over 10 units on the rule, over 50 on the route: 413") {
  Example e("request-cap.yaml");
  const Request batch = req("batch", "acme", "free");
  auto over_rule = e.gw.acquire_estimate(batch, 11, Nanos{0});
  CHECK(over_rule->decision.reason == Reason::kRequestTooLarge);
  CHECK(over_rule->request_cap == 10);
  CHECK(quota::http::answer(over_rule->decision, {.name = "free-batch", .quota = 40}).status ==
        413);
  CHECK(e.gw.acquire_estimate(batch, 10, Nanos{0})->decision.allowed);
  // Nothing was deducted by the refused request: 30 of 40 left.
  CHECK(e.gw.acquire_estimate(batch, 10, Nanos{0})->decision.remaining == 20);
}
