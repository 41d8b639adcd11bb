// Tests for quota/gateway/gateway.hpp: decisions through rules, multi-level budgets,
// shadow mode, idempotent attempts, rule changes through the registry.
#include "quota/gateway/gateway.hpp"

#include <catch2/catch.hpp>
#include <chrono>
#include <string>

#include "quota/http.hpp"
#include "quota/store/local_store.hpp"
#include "quota/store/sharded_store.hpp"
#include "support/gateway_rules.hpp"

using namespace std::chrono_literals;
using quota::Nanos;
using quota::Reason;
using quota::TokenBucket;
using quota::gateway::Gateway;
using quota::gateway::KeyPolicy;
using quota::gateway::Level;
using quota::gateway::Outcome;
using quota::gateway::RuleRegistry;
using quota::testing::basic_spec;
using quota::testing::build;

namespace {

const quota::gateway::Request kRead{.who = {.tenant = "acme", .plan = "free"}, .route = "read"};
const quota::gateway::Request kCreate{.who = {.tenant = "acme", .plan = "free"}, .route = "create"};

}  // namespace

TEST_CASE("costs per route class: read = 1, create = 5, on separate budgets") {
  RuleRegistry registry(build(basic_spec(3, 1, 20)));
  quota::LocalStore<KeyPolicy> store;
  Gateway gw(store, registry);
  auto r = gw.decide(kCreate, Nanos{0});
  REQUIRE(r.ok());
  CHECK(r->decision.allowed);
  CHECK(r->decision.remaining == 15);
  CHECK(r->decision.version == 3);
  CHECK(r->rule == "free");
  CHECK(gw.decide(kRead, Nanos{0})->decision.remaining == 19);
  for (int i = 0; i < 3; ++i) REQUIRE(gw.decide(kCreate, Nanos{0})->decision.allowed);
  auto denied = gw.decide(kCreate, Nanos{0});
  CHECK_FALSE(denied->decision.allowed);
  CHECK(denied->decision.reason == Reason::kOverLimit);
  CHECK(denied->decision.retry_after == 5s);  // 5 units at 1/s
  CHECK(denied->decision.version == 3);
  // Unknown route: an error, and no key is created.
  CHECK(gw.decide({.who = kRead.who, .route = "admin"}, Nanos{0}).status().code() ==
        absl::StatusCode::kInvalidArgument);
  CHECK(store.size() == 2);
}

TEST_CASE("a rule change through the registry: the version travels with the state") {
  RuleRegistry registry(build(basic_spec(1, 10, 100)));
  quota::ShardedStore<KeyPolicy> store;
  Gateway gw(store, registry);
  for (int i = 0; i < 95; ++i) REQUIRE(gw.decide(kRead, Nanos{0})->decision.allowed);
  // Downgrade to burst 20: the 5 left (+10 refilled in 1 s at the old rate) = 15, not 20.
  REQUIRE(registry.publish(build(basic_spec(2, 1, 20))).ok());
  auto r = gw.decide(kRead, 1s);
  CHECK(r->decision.version == 2);
  CHECK(r->decision.remaining == 14);
  // Upgrade: no fresh burst either.
  REQUIRE(registry.publish(build(basic_spec(3, 1000, 5000))).ok());
  auto u = gw.decide(kRead, 1s);
  CHECK(u->decision.version == 3);
  CHECK(u->decision.remaining == 13);
}

TEST_CASE("multi-level budgets: all allow or nothing is deducted") {
  auto spec = basic_spec(1, 1, 10);  // tenant: 10 burst
  spec.rules.push_back({.level = Level::kUser,
                        .plan = "free",
                        .route = "read",
                        .name = "free-user",
                        .policy = TokenBucket{.rate = {.units = 1, .per = 1s}, .burst = 4}});
  spec.rules.push_back({.level = Level::kGlobal,
                        .route = "read",
                        .name = "global",
                        .policy = TokenBucket{.rate = {.units = 1, .per = 1s}, .burst = 7}});
  quota::gateway::Metrics metrics;
  RuleRegistry registry(build(spec, &metrics));
  quota::LocalStore<KeyPolicy> store;
  Gateway gw(store, registry);
  auto user = [](const char* tenant, const char* u) {
    return quota::gateway::Request{.who = {.tenant = tenant, .plan = "free", .user = u},
                                   .route = "read"};
  };
  // User u1 of acme: 4 pass, the 5th is denied by the user level...
  for (int i = 0; i < 4; ++i) REQUIRE(gw.decide(user("acme", "u1"), Nanos{0})->decision.allowed);
  auto d = gw.decide(user("acme", "u1"), Nanos{0});
  CHECK_FALSE(d->decision.allowed);
  CHECK(d->rule == "free-user");
  // ...and nothing was taken from the tenant (10 − 4 = 6) or the global (7 − 4 = 3) level.
  auto tenant_state = store.update(
      KeyPolicy{.policy = &registry.current()
                               ->find(Level::kTenant, {.tenant = "acme", .plan = "free"}, "read")
                               ->policy,
                .version = 1},
      "{acme}read", Nanos{0},
      [](quota::gateway::KeyState& s) { return std::get<TokenBucket::State>(s.state).tokens; });
  CHECK(*tenant_state == quota::to_micro(6));
  // Another tenant's users share the global level: 3 left, the 4th is denied there and
  // the user and tenant levels of "beta" get their unit back.
  for (int i = 0; i < 3; ++i) REQUIRE(gw.decide(user("beta", "u9"), Nanos{0})->decision.allowed);
  auto g = gw.decide(user("beta", "u9"), Nanos{0});
  CHECK_FALSE(g->decision.allowed);
  CHECK(g->rule == "global");
  CHECK(g->decision.retry_after == 1s);
  // After 1 s the global level holds 1 unit: u9 passes once, then global denies again.
  CHECK(gw.decide(user("beta", "u9"), 1s)->decision.allowed);
  CHECK_FALSE(gw.decide(user("beta", "u9"), 1s)->decision.allowed);
  // Counters: denials counted on the level that denied.
  auto count = [&](const char* rule, Outcome o) {
    for (const auto& c : metrics.snapshot()) {
      if (c->labels().rule == rule && c->labels().route == "read") return c->count(o);
    }
    return std::uint64_t{999};
  };
  CHECK(count("free-user", Outcome::kDenied) == 1);  // u1's 5th
  CHECK(count("global", Outcome::kDenied) == 2);     // u9's two denials
  CHECK(count("free", Outcome::kAllowed) == 8);
  CHECK(count("global", Outcome::kAllowed) == 8);
}

TEST_CASE("shadow mode: decide and record, always allow, count would-deny") {
  auto spec = basic_spec(1, 1, 3);
  for (auto& r : spec.rules) r.shadow = true;
  quota::gateway::Metrics metrics;
  RuleRegistry registry(build(spec, &metrics));
  quota::LocalStore<KeyPolicy> store;
  Gateway gw(store, registry);
  int shadow = 0;
  for (int i = 0; i < 10; ++i) {
    auto r = gw.decide(kRead, Nanos{0});
    REQUIRE(r.ok());
    CHECK(r->decision.allowed);
    if (r->decision.reason == Reason::kShadow) ++shadow;
  }
  CHECK(shadow == 7);  // 3 fit the budget, 7 would have been denied
  const auto series = metrics.snapshot();
  std::uint64_t would_deny = 0;
  std::uint64_t allowed = 0;
  for (const auto& c : series) {
    if (c->labels().route != "read") continue;
    would_deny += c->count(Outcome::kShadowWouldDeny);
    allowed += c->count(Outcome::kAllowed);
  }
  CHECK(would_deny == 7);
  CHECK(allowed == 3);
  // A shadow admission is a 200 with its own reason.
  CHECK(
      quota::http::answer(gw.decide(kRead, Nanos{0})->decision,
                          *quota::http::describe("free", TokenBucket{.rate = {1, 1s}, .burst = 3}))
          .status == 200);
}

TEST_CASE("idempotent attempts: the first decision is replayed; another request is an error") {
  RuleRegistry registry(build(basic_spec(1, 1, 2)));
  quota::LocalStore<KeyPolicy> store;
  Gateway gw(store, registry, {.attempt_ttl = 10s});
  auto first = gw.decide({.who = kRead.who, .route = "read", .attempt_id = "a-1"}, Nanos{0});
  REQUIRE(first.ok());
  CHECK(first->decision.allowed);
  CHECK_FALSE(first->replayed);
  for (int i = 0; i < 5; ++i) {
    auto again = gw.decide({.who = kRead.who, .route = "read", .attempt_id = "a-1"}, 1ms);
    REQUIRE(again.ok());
    CHECK(again->replayed);
    CHECK(again->decision == first->decision);
  }
  // Only one unit was spent: one more passes, then the budget is empty.
  CHECK(gw.decide(kRead, 1ms)->decision.allowed);
  CHECK_FALSE(gw.decide(kRead, 1ms)->decision.allowed);
  // The same id for another route of the tenant (key and cost differ): InvalidArgument.
  CHECK(
      gw.decide({.who = kRead.who, .route = "create", .attempt_id = "a-1"}, 1ms).status().code() ==
      absl::StatusCode::kInvalidArgument);
  // Another tenant's "a-1" is another attempt (gateway_attempts_test.cpp has more).
  auto other = gw.decide(
      {.who = {.tenant = "other", .plan = "free"}, .route = "read", .attempt_id = "a-1"}, 1ms);
  REQUIRE(other.ok());
  CHECK_FALSE(other->replayed);
  CHECK(other->decision.allowed);
  // A denied first decision is replayed as a denial too.
  auto denied = gw.decide({.who = kRead.who, .route = "read", .attempt_id = "a-2"}, 2ms);
  REQUIRE_FALSE(denied->decision.allowed);
  auto replay = gw.decide({.who = kRead.who, .route = "read", .attempt_id = "a-2"}, 5s);
  CHECK(replay->replayed);
  CHECK_FALSE(replay->decision.allowed);
  // After the ttl the id is forgotten: a new decision.
  auto fresh = gw.decide({.who = kRead.who, .route = "read", .attempt_id = "a-1"}, 11s);
  CHECK_FALSE(fresh->replayed);
  CHECK(fresh->decision.allowed);
  // Malformed ids.
  CHECK(gw.decide({.who = kRead.who, .route = "read", .attempt_id = std::string(129, 'x')}, 11s)
            .status()
            .code() == absl::StatusCode::kInvalidArgument);
}

TEST_CASE("the attempt cache is bounded") {
  quota::AttemptCache cache(10s, 2);
  REQUIRE(cache.begin("a", "f", Nanos{0}).ok());
  cache.finish("a", {});
  REQUIRE(cache.begin("b", "f", Nanos{0}).ok());
  // "b" is in progress: a duplicate is told to retry, not decided twice.
  CHECK(cache.begin("b", "f", Nanos{0}).status().code() == absl::StatusCode::kAborted);
  CHECK(cache.begin("c", "f", 1s).status().code() == absl::StatusCode::kResourceExhausted);
  CHECK(cache.begin("c", "f", 10s).ok());  // expired ids swept
  CHECK(cache.size() == 1);
}

TEST_CASE("a full attempt cache decides nothing") {
  RuleRegistry registry(build(basic_spec(1, 1, 2)));
  quota::LocalStore<KeyPolicy> store;
  Gateway gw(store, registry, {.attempt_ttl = 10s, .max_attempts = 1});
  REQUIRE(gw.decide({.who = kRead.who, .route = "read", .attempt_id = "a"}, Nanos{0}).ok());
  auto full = gw.decide({.who = kRead.who, .route = "read", .attempt_id = "b"}, Nanos{0});
  CHECK(full.status().code() == absl::StatusCode::kResourceExhausted);
  // "b" took nothing: one unit of the burst of 2 is still there.
  auto plain = gw.decide(kRead, Nanos{0});
  REQUIRE(plain.ok());
  CHECK(plain->decision.allowed);
  CHECK(plain->decision.remaining == 0);
}

TEST_CASE("switching a rule's kind through the registry keeps what was left") {
  RuleRegistry registry(build(basic_spec(1, 1, 50)));
  quota::LocalStore<KeyPolicy> store;
  Gateway gw(store, registry);
  for (int i = 0; i < 46; ++i) REQUIRE(gw.decide(kRead, Nanos{0})->decision.allowed);  // 4 left
  auto spec = basic_spec(2);
  spec.rules[0].policy = quota::FixedWindow{.limit = 30, .window = 60s};
  REQUIRE(registry.publish(build(spec)).ok());
  // Not a fresh window of 30: the 4 units left (+1 refilled at the old rate by 1 s).
  int admitted = 0;
  while (gw.decide(kRead, 1s)->decision.allowed) ++admitted;
  CHECK(admitted == 5);
  auto d = gw.decide(kRead, 1s);
  CHECK(d->decision.version == 2);
  CHECK(d->decision.retry_after == 59s);  // the window policy's own next window
  auto next = gw.decide(kRead, 60s);
  CHECK(next->decision.allowed);
  CHECK(next->decision.remaining == 29);
}
