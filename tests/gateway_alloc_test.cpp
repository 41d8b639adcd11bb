// Tests that a warmed-up Gateway decides on an in-process store without heap allocation
// (quota/gateway/gateway.hpp, backend.hpp, rules.hpp): the per-request level lists are
// inline (CheckVector), keys are built in place, and rules are looked up by keys built
// on the stack; metrics counters are atomics.
//
// The instrument: tests/support/count_new.hpp (replaces every global operator new and
// delete of this executable and counts this thread's allocations); the assertions run
// under every preset.
#include <algorithm>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <new>
#include <string>

#include "quota/gateway/gateway.hpp"
#include "quota/store/local_store.hpp"
#include "quota/store/sharded_store.hpp"
#include "support/count_new.hpp"

using quota::testing::allocations_in;

using namespace std::chrono_literals;
using quota::Nanos;
using quota::TokenBucket;
using quota::gateway::Gateway;
using quota::gateway::KeyPolicy;
using quota::gateway::Level;
using quota::gateway::Request;
using quota::gateway::RuleRegistry;
using quota::gateway::RuleSet;
using quota::gateway::RuleSetSpec;

namespace {

// Route "read" (cost 1): a tenant rule, and with `three` a user and a global rule, all
// refilled at 10^6 units/s; the global rule's burst is `global_burst`. Counted in
// `metrics` (per-rule atomic counters, no sink).
std::shared_ptr<const RuleSet> rules(bool three, std::int64_t global_burst,
                                     quota::gateway::Metrics& metrics) {
  const TokenBucket fast{.rate = {.units = 1'000'000, .per = 1s}, .burst = 1'000};
  RuleSetSpec spec{.version = 7, .routes = {{.name = "read", .cost = 1}}, .rules = {}};
  spec.rules.push_back(
      {.level = Level::kTenant, .plan = "free", .route = "read", .name = "free", .policy = fast});
  if (three) {
    spec.rules.push_back(
        {.level = Level::kUser, .plan = "free", .route = "read", .name = "user", .policy = fast});
    spec.rules.push_back({.level = Level::kGlobal,
                          .route = "read",
                          .name = "global",
                          .policy = TokenBucket{.rate = fast.rate, .burst = global_burst}});
  }
  auto set = RuleSet::create(std::move(spec), &metrics);
  REQUIRE(set.ok());
  return *set;
}

struct Counted {
  std::int64_t allocations = 0;
  int allowed = 0;
  int errors = 0;
  std::uint64_t tenant_allowed = 0;  // the tenant rule's `allowed` counter
};

// `n` decisions of a warmed-up gateway, `step` ns apart, counted.
template <class Store>
Counted steady_decisions(const Request& req, bool three, std::int64_t global_burst,
                         std::int64_t step, int n) {
  quota::gateway::Metrics metrics;
  RuleRegistry registry(rules(three, global_burst, metrics));
  Store store;
  Gateway gw(store, registry);
  std::int64_t now = 0;
  for (int i = 0; i < 100; ++i) {
    now += step;
    REQUIRE(gw.decide(req, Nanos{now}).ok());
  }
  Counted c;
  c.allocations = allocations_in([&] {
    for (int i = 0; i < n; ++i) {
      now += step;
      auto r = gw.decide(req, Nanos{now});
      if (!r.ok()) {
        ++c.errors;
      } else if (r->decision.allowed) {
        ++c.allowed;
      }
    }
  });
  const quota::gateway::Rule* tenant = registry.current()->find(Level::kTenant, req.who, "read");
  REQUIRE(tenant != nullptr);
  REQUIRE(tenant->counters != nullptr);
  c.tenant_allowed = tenant->counters->count(quota::gateway::Outcome::kAllowed);
  return c;
}

}  // namespace

TEST_CASE("the allocation counter counts this thread's allocations") {
  // The instrument must be able to see an allocation, or zero below proves nothing.
  std::string s;
  const std::int64_t n = allocations_in([&] { s.assign(100, 'x'); });
  CHECK(n == 1);
  CHECK(s.size() == 100);
}

TEMPLATE_TEST_CASE("a warmed-up gateway decides without heap allocation", "",
                   quota::LocalStore<KeyPolicy>, quota::ShardedStore<KeyPolicy>) {
  // Long ids: every key and scope is far beyond std::string's inline capacity. Rule
  // names stay within it: Result::rule is a std::string copy of the deciding rule's name
  // (the Result outlives the rule set), one allocation per decision when the name is
  // longer than 15 bytes (libstdc++).
  const std::string tenant(quota::gateway::kMaxIdBytes, 't');
  const std::string user(quota::gateway::kMaxIdBytes, 'u');
  const Request one{.who = {.tenant = "acme", .plan = "free"}, .route = "read"};
  const Request one_long{.who = {.tenant = tenant, .plan = "free"}, .route = "read"};
  const Request three{.who = {.tenant = "acme", .plan = "free", .user = "u1"}, .route = "read"};
  const Request three_long{.who = {.tenant = tenant, .plan = "free", .user = user},
                           .route = "read"};
  constexpr int kN = 1000;

  SECTION("admitted, 1 and 3 levels") {
    for (const Request* req : {&one, &one_long}) {
      const Counted c = steady_decisions<TestType>(*req, false, 1000, 1000, kN);
      INFO("tenant " << req->who.tenant.size() << " bytes");
      CHECK(c.errors == 0);
      CHECK(c.allowed == kN);
      CHECK(c.tenant_allowed >= static_cast<std::uint64_t>(kN));  // metrics were recorded
      CHECK(c.allocations == 0);
    }
    for (const Request* req : {&three, &three_long}) {
      const Counted c = steady_decisions<TestType>(*req, true, 1000, 1000, kN);
      INFO("tenant " << req->who.tenant.size() << " bytes");
      CHECK(c.errors == 0);
      CHECK(c.allowed == kN);
      CHECK(c.tenant_allowed >= static_cast<std::uint64_t>(kN));
      CHECK(c.allocations == 0);
    }
  }
  SECTION("denied by the global level: the user and tenant levels are given back") {
    // The global bucket (burst 10) is empty after the warm-up and the clock stands still.
    for (const Request* req : {&three, &three_long}) {
      const Counted c = steady_decisions<TestType>(*req, true, 10, 0, kN);
      INFO("tenant " << req->who.tenant.size() << " bytes");
      CHECK(c.errors == 0);
      CHECK(c.allowed == 0);
      CHECK(c.allocations == 0);
    }
  }
}
