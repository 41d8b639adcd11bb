// Differential test of the whole Gateway (gateway.hpp) in process against the Gateway
// over Redis (redis/gateway_store.hpp), on random rule sets of the rule model
// (rule_spec.hpp): several named limits per scope shared by route classes with their own
// costs, route classes' own budgets, user and global levels, shadow, enforce_percent,
// per-request caps, estimates settled later — and rule changes published while requests
// run, so every budget's state is converted between kinds and parameters. Both gateways
// read one RuleRegistry and decide on the caller's clock; every Result (decision, rule,
// cap) and every settlement must be identical.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "quota/gateway/gateway.hpp"
#include "quota/redis/gateway_store.hpp"
#include "quota/store/local_store.hpp"
#include "support/gateway_rules.hpp"
#include "support/printers.hpp"
#include "support/redis_server.hpp"
#include "support/seed.hpp"

using namespace std::chrono_literals;
using quota::FixedWindow;
using quota::Nanos;
using quota::Reason;
using quota::SlidingLog;
using quota::SlidingWindowEstimate;
using quota::TokenBucket;
using quota::gateway::Gateway;
using quota::gateway::KeyPolicy;
using quota::gateway::Level;
using quota::gateway::Request;
using quota::gateway::RouteClass;
using quota::gateway::RouteCost;
using quota::gateway::RulePolicy;
using quota::gateway::RuleRegistry;
using quota::gateway::RuleSetSpec;
using quota::gateway::RuleSpec;
using quota::testing::build;

namespace {

using Rng = std::mt19937_64;

bool one_in(Rng& rng, int n) { return std::uniform_int_distribution<int>(0, n - 1)(rng) == 0; }

template <class T>
const T& pick(Rng& rng, const std::vector<T>& v) {
  return v[std::uniform_int_distribution<std::size_t>(0, v.size() - 1)(rng)];
}

// Policies the Redis twin takes, holding at least 12 units (every fixed cost below fits),
// of all four kinds: fractional rates, rate 0, windows that divide 1 s or are whole
// seconds, sliding logs of any window, estimates.
RulePolicy random_policy(Rng& rng) {
  const std::int64_t burst = std::uniform_int_distribution<std::int64_t>(12, 60)(rng);
  switch (std::uniform_int_distribution<int>(0, 11)(rng)) {
    case 8:
      return SlidingLog{.limit = burst, .window = 1s};
    case 9:
      return SlidingLog{.limit = burst, .window = Nanos{12'345'678}};
    case 10:
      return SlidingWindowEstimate{.limit = burst, .window = 10ms};
    case 11:
      return SlidingWindowEstimate{.limit = burst, .window = 60s};
    case 0:
      return TokenBucket{.rate = {.units = 1, .per = 3s}, .burst = burst};
    case 1:
      return TokenBucket{.rate = {.units = 7, .per = 2s}, .burst = burst};
    case 2:
      return TokenBucket{.rate = {.units = 1000, .per = 1s}, .burst = burst};
    case 3:
      return TokenBucket{.rate = {.units = 0, .per = 1s}, .burst = burst};
    case 4:
      return TokenBucket{.rate = {.units = 3, .per = 7ms}, .burst = burst};
    case 5:
      return FixedWindow{.limit = burst, .window = 1s};
    case 6:
      return FixedWindow{.limit = burst, .window = 10ms};
    default:
      return FixedWindow{.limit = burst, .window = 60s};
  }
}

// Rollout and caps on a rule, now and then.
void roll_out(Rng& rng, RuleSpec& r) {
  r.shadow = one_in(rng, 10);
  if (one_in(rng, 6)) r.enforce_percent = pick(rng, std::vector<int>{0, 30, 50, 90});
  if (one_in(rng, 12)) r.max_cost = 4;
}

// A random rule set of the motivating shapes. Routes read, create (fixed costs) and chat
// (its estimate against "tokens" when that limit exists). Plan "free" (tenants a, b, c;
// c with rules of its own now and then) and plan "pro" (tenant d).
RuleSetSpec random_spec(Rng& rng, std::uint64_t version) {
  RuleSetSpec spec{.version = version};
  spec.shadow_all = one_in(rng, 40);
  std::vector<std::string> limits;
  for (const char* l : {"units", "tokens", "req"}) {
    if (limits.empty() || one_in(rng, 2)) limits.push_back(l);
  }
  const bool user_limit = one_in(rng, 2);
  std::uniform_int_distribution<std::int64_t> cost(1, 6);
  for (const char* name : {"read", "create", "chat"}) {
    RouteClass route{.name = name, .cost = std::uniform_int_distribution<std::int64_t>(1, 6)(rng)};
    for (const std::string& l : limits) {
      if (route.costs.empty() || one_in(rng, 2)) {
        const bool estimate = std::string(name) == "chat" && l == "tokens";
        route.costs.push_back({.limit = l, .units = cost(rng), .estimate = estimate});
      }
    }
    if (user_limit && std::string(name) != "create") {
      route.costs.push_back({.limit = "ureq", .units = 1});
    }
    if (one_in(rng, 10)) route.max_cost = 5;
    spec.routes.push_back(std::move(route));
  }
  // Every limit must be paid by some route class: the last one pays what nobody does.
  for (const std::string& l : limits) {
    const bool paid = std::any_of(spec.routes.begin(), spec.routes.end(), [&](const RouteClass& r) {
      return std::any_of(r.costs.begin(), r.costs.end(),
                         [&](const RouteCost& c) { return c.limit == l; });
    });
    if (!paid) spec.routes.back().costs.push_back({.limit = l, .units = 1});
  }
  auto add = [&](RuleSpec r) {
    r.policy = random_policy(rng);
    roll_out(rng, r);
    spec.rules.push_back(std::move(r));
  };
  for (const char* plan : {"free", "pro"}) {
    for (const std::string& l : limits) {
      add({.level = Level::kTenant, .plan = plan, .name = plan + ("-" + l), .limit = l});
    }
    if (user_limit) add({.level = Level::kUser, .plan = plan, .name = "user", .limit = "ureq"});
    if (one_in(rng, 3))
      add({.level = Level::kTenant, .plan = plan, .route = "create", .name = "create"});
  }
  if (one_in(rng, 2)) {
    add({.level = Level::kTenant, .tenant = "c", .name = "c-" + limits[0], .limit = limits[0]});
  }
  if (one_in(rng, 3)) add({.level = Level::kGlobal, .route = "read", .name = "global"});
  return spec;
}

void check_same(const quota::gateway::Result& local, const quota::gateway::Result& redis) {
  CHECK(local.decision == redis.decision);
  CHECK(local.rule == redis.rule);
  CHECK(local.request_cap == redis.request_cap);
  CHECK_FALSE(redis.replayed);
}

}  // namespace

TEST_CASE("random rule sets with rule changes: the Gateway over Redis decides as in process") {
  const std::uint64_t seed = quota::testing::test_seed(20261202);
  INFO("seed " << seed);
  Rng rng(seed);

  std::uint64_t version = 1;
  RuleRegistry registry(build(random_spec(rng, version)));
  quota::LocalStore<KeyPolicy> local_store({.max_keys = 1'000'000});
  Gateway local(local_store, registry);
  // A long TTL margin: keys must not expire in wall-clock time during the test while the
  // simulated clock says they are still in use.
  quota::redis::GatewayStore redis_store({.pool = quota::testing::redis_pool(2),
                                          .prefix = quota::testing::unique_prefix("gwsets"),
                                          .time = quota::redis::TimeSource::kCaller,
                                          .ttl_margin = 1h});
  Gateway redis(redis_store, registry);

  const std::vector<std::string> tenants = {"a", "b", "c", "d"};
  const std::vector<std::string> users = {"", "u1", "u2"};
  const std::vector<std::string> routes = {"read", "create", "chat"};
  struct Open {
    quota::gateway::TicketId local, redis;
    std::string tenant;
  };
  std::vector<Open> open;  // estimates not yet settled

  std::int64_t now_ns = 1'764'000'000'123'456'789;
  int decisions = 0, denials = 0, shadowed = 0, capped = 0, estimates = 0, settles = 0, expired = 0,
      changes = 0;
  constexpr int kOps = 8'000;
  for (int op = 0; op < kOps; ++op) {
    const int step = std::uniform_int_distribution<int>(0, 19)(rng);
    if (step < 12) {
      now_ns += std::uniform_int_distribution<std::int64_t>(0, 3'000'000)(rng);
    } else if (step < 19) {
      now_ns += std::uniform_int_distribution<std::int64_t>(0, 2'000'000'000)(rng);
    } else {
      now_ns += std::uniform_int_distribution<std::int64_t>(0, 400'000'000'000)(rng);
    }
    const Nanos now{now_ns};
    if (one_in(rng, 40)) {
      REQUIRE(registry.publish(build(random_spec(rng, ++version))).ok());
      ++changes;
    }
    const std::string& tenant = pick(rng, tenants);
    const Request req{
        .who = {.tenant = tenant, .plan = tenant == "d" ? "pro" : "free", .user = pick(rng, users)},
        .route = pick(rng, routes)};
    INFO("op " << op << " at " << now_ns << " ns, version " << version << ", tenant " << tenant
               << ", user " << req.who.user << ", route " << req.route);
    const int what = std::uniform_int_distribution<int>(0, 9)(rng);
    if (what < 6) {
      auto l = local.decide(req, now);
      auto r = redis.decide(req, now);
      INFO(l.status().ToString() << " / " << r.status().ToString());
      REQUIRE(l.ok());
      REQUIRE(r.ok());
      check_same(*l, *r);
      ++decisions;
      if (!l->decision.allowed) ++denials;
      if (l->decision.reason == Reason::kShadow) ++shadowed;
      if (l->decision.reason == Reason::kRequestTooLarge) ++capped;
    } else if (what < 8) {
      const std::int64_t estimate = std::uniform_int_distribution<std::int64_t>(0, 14)(rng);
      auto l = local.acquire_estimate(req, estimate, now);
      auto r = redis.acquire_estimate(req, estimate, now);
      INFO(l.status().ToString() << " / " << r.status().ToString());
      REQUIRE(l.ok());
      REQUIRE(r.ok());
      CHECK(l->decision == r->decision);
      CHECK(l->rule == r->rule);
      CHECK(l->request_cap == r->request_cap);
      REQUIRE(l->ticket.has_value() == r->ticket.has_value());
      if (l->ticket) open.push_back({*l->ticket, *r->ticket, tenant});
      if (l->decision.reason == Reason::kRequestTooLarge) ++capped;
      ++estimates;
    } else if (!open.empty()) {
      const std::size_t i = std::uniform_int_distribution<std::size_t>(0, open.size() - 1)(rng);
      const Open t = open[i];
      open.erase(open.begin() + static_cast<std::ptrdiff_t>(i));
      const std::int64_t actual = std::uniform_int_distribution<std::int64_t>(0, 20)(rng);
      auto l = local.settle(t.tenant, t.local, actual, now);
      auto r = redis.settle(t.tenant, t.redis, actual, now);
      INFO(l.status().ToString() << " / " << r.status().ToString());
      // A ticket past its lifetime is refused alike, the estimate left spent on both.
      REQUIRE(l.ok() == r.ok());
      if (!l.ok()) {
        CHECK(l.status().code() == r.status().code());
        ++expired;
        continue;
      }
      CHECK(l->surplus == r->surplus);
      CHECK(l->deficit == r->deficit);
      CHECK(l->refunded == r->refunded);
      CHECK(l->debt == r->debt);
      ++settles;
    }
  }
  std::printf(
      "gateway rule sets differential: %d decisions (%d denied, %d shadow, %d over a cap), "
      "%d estimates, %d settled (%d after their ticket expired), %d rule changes\n",
      decisions, denials, shadowed, capped, estimates, settles, expired, changes);
  // The trace went through every path.
  CHECK(decisions > 4000);
  CHECK(denials > 300);
  CHECK(shadowed > 20);
  CHECK(capped > 20);
  CHECK(estimates > 1200);
  CHECK(settles > 150);
  CHECK(changes > 100);
}
