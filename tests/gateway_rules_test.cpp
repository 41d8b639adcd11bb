// Tests for quota/gateway/rules/rules.hpp: whitelisted routes, keys from identity, validated
// and versioned rule sets, and reloads under traffic.
#include "quota/gateway/rules/rules.hpp"

#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "quota/gateway/gateway.hpp"
#include "quota/store/sharded_store.hpp"
#include "support/gateway_rules.hpp"

using namespace std::chrono_literals;
using quota::Nanos;
using quota::TokenBucket;
using quota::gateway::Identity;
using quota::gateway::Level;
using quota::gateway::RuleSet;
using quota::gateway::RuleSetSpec;
using quota::testing::basic_spec;
using quota::testing::build;

TEST_CASE("plan: keys come from the tenant id and a whitelisted route class") {
  auto rules = build(basic_spec(1));
  auto checks = rules->plan({.tenant = "acme", .plan = "free"}, "read");
  REQUIRE(checks.ok());
  REQUIRE(checks->size() == 1);
  CHECK((*checks)[0].key == "{acme}read");
  CHECK((*checks)[0].rule->name == "free");
  CHECK(rules->route("create").value()->cost == 5);
}

TEST_CASE("an unknown route class is a clear error, never a new key") {
  auto rules = build(basic_spec(1));
  auto r = rules->plan({.tenant = "acme", .plan = "free"}, "delete");
  CHECK(r.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(r.status().message()).find("unknown route class \"delete\"") !=
        std::string::npos);
  // A raw URL is not a route class.
  CHECK(rules->plan({.tenant = "acme", .plan = "free"}, "/v1/items?id=3").status().code() ==
        absl::StatusCode::kInvalidArgument);
}

TEST_CASE("identities are bounded and restricted; a tenant without a rule is NotFound") {
  auto rules = build(basic_spec(1));
  CHECK(rules->plan({.tenant = std::string(128, 'a'), .plan = "free"}, "read").ok());
  CHECK(rules->plan({.tenant = std::string(129, 'a'), .plan = "free"}, "read").status().code() ==
        absl::StatusCode::kInvalidArgument);
  CHECK(rules->plan({.tenant = "", .plan = "free"}, "read").status().code() ==
        absl::StatusCode::kInvalidArgument);
  // Braces would let a caller pick another tenant's hash slot; colons and spaces are out too.
  for (const char* bad : {"a}b", "{x", "a b", "a:b", "a\nb"}) {
    INFO(bad);
    CHECK(rules->plan({.tenant = bad, .plan = "free"}, "read").status().code() ==
          absl::StatusCode::kInvalidArgument);
  }
  CHECK(rules->plan({.tenant = "acme", .plan = "gold"}, "read").status().code() ==
        absl::StatusCode::kNotFound);
}

TEST_CASE("a tenant's own rule wins over its plan's; user and global levels are added") {
  auto spec = basic_spec(4);
  spec.rules.push_back({.level = Level::kTenant,
                        .tenant = "big",
                        .route = "read",
                        .name = "big",
                        .policy = TokenBucket{.rate = {1000, 1s}, .burst = 1000}});
  spec.rules.push_back({.level = Level::kUser,
                        .plan = "free",
                        .route = "read",
                        .name = "free-user",
                        .policy = TokenBucket{.rate = {1, 1s}, .burst = 5}});
  spec.rules.push_back({.level = Level::kGlobal,
                        .route = "read",
                        .name = "global",
                        .policy = TokenBucket{.rate = {10000, 1s}, .burst = 10000}});
  auto rules = build(spec);
  auto big = rules->plan({.tenant = "big", .plan = "free"}, "read");
  REQUIRE(big.ok());
  REQUIRE(big->size() == 2);  // no user given: tenant + global
  CHECK((*big)[0].rule->name == "big");
  CHECK((*big)[1].key == "{~global}read");
  auto user = rules->plan({.tenant = "acme", .plan = "free", .user = "u-1"}, "read");
  REQUIRE(user.ok());
  REQUIRE(user->size() == 3);
  CHECK((*user)[0].key == "{acme}read/u-1");
  CHECK((*user)[0].rule->level == Level::kUser);
  CHECK((*user)[1].key == "{acme}read");
  CHECK((*user)[2].rule->level == Level::kGlobal);
}

TEST_CASE("plan: the longest ids, route and limit make keys of exactly kMaxLevelKeyBytes, whole") {
  using quota::gateway::kMaxIdBytes;
  using quota::gateway::kMaxNameBytes;
  const std::string tenant(kMaxIdBytes, 'T');
  const std::string user(kMaxIdBytes, 'u');
  const std::string route(kMaxNameBytes, 'r');
  const std::string limit(kMaxNameBytes, 'l');
  RuleSetSpec spec{.version = 1, .routes = {{.name = route, .cost = 1}}, .rules = {}};
  for (Level level : {Level::kUser, Level::kTenant}) {
    spec.rules.push_back({.level = level,
                          .tenant = tenant,
                          .route = route,
                          .name = "own",
                          .policy = TokenBucket{.rate = {1, 1s}, .burst = 5},
                          .limit = limit});
  }
  spec.rules.push_back({.level = Level::kGlobal,
                        .route = route,
                        .name = "all",
                        .policy = TokenBucket{.rate = {1, 1s}, .burst = 5},
                        .limit = limit});
  auto rules = build(spec);
  auto checks = rules->plan({.tenant = tenant, .plan = "free", .user = user}, route);
  REQUIRE(checks.ok());
  REQUIRE(checks->size() == 3);
  const std::string user_key = "{" + tenant + "}" + route + "#" + limit + "/" + user;
  CHECK(user_key.size() == quota::gateway::kMaxLevelKeyBytes);
  CHECK((*checks)[0].key == user_key);
  CHECK((*checks)[1].key == "{" + tenant + "}" + route + "#" + limit);
  CHECK((*checks)[2].key == "{~global}" + route + "#" + limit);
  // Copies keep the whole key.
  const quota::gateway::Check copy = (*checks)[0];
  CHECK(copy.key == user_key);
  // The tenant's own rules were found by their full ids (not by the plan: there is none).
  CHECK((*checks)[0].rule->name == "own");
  CHECK((*checks)[1].rule->name == "own");
}

TEST_CASE("RuleSet::create rejects bad sets and names the entry") {
  auto expect_error = [](RuleSetSpec spec, const std::string& needle) {
    auto r = RuleSet::create(std::move(spec));
    INFO(r.status().ToString());
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK(std::string(r.status().message()).find(needle) != std::string::npos);
  };
  auto unknown_route = basic_spec(1);
  unknown_route.rules[0].route = "delete";
  expect_error(unknown_route, "rules[0]: unknown route class");
  auto dup = basic_spec(1);
  dup.rules.push_back(dup.rules[0]);
  expect_error(dup, "rules[2]: a tenant rule for p:free on route \"read\" is already defined");
  auto tiny = basic_spec(1);  // create costs 5 > burst 4: could never pass
  tiny.rules[1].policy = TokenBucket{.rate = {10, 1s}, .burst = 4};
  expect_error(tiny, "rules[1]: route \"create\" costs 5 units but the policy holds only 4");
  auto bad_policy = basic_spec(1);
  bad_policy.rules[0].policy = TokenBucket{.rate = {1, 0s}, .burst = 1};
  expect_error(bad_policy, "rules[0]: rate.per must be positive");
  auto both = basic_spec(1);
  both.rules[0].tenant = "acme";
  expect_error(both, "rules[0]: set exactly one of tenant and plan");
  auto route_twice = basic_spec(1);
  route_twice.routes.push_back({.name = "read", .cost = 1});
  expect_error(route_twice, "routes[2]: route class \"read\" listed twice");
  auto bad_name = basic_spec(1);
  bad_name.routes[0].name = "Read";
  expect_error(bad_name, "routes[0]: route name contains byte 0x52");
  auto open_route = basic_spec(1);
  open_route.routes[1].fail_mode = quota::gateway::FailMode::kOpen;
  open_route.routes[1].emergency = {.rate = {1, 1s}, .burst = 2, .max_duration = 10s};
  expect_error(open_route, "routes[1]: cost 5 exceeds emergency.burst 2");
}

TEST_CASE("the registry only accepts increasing versions") {
  quota::gateway::RuleRegistry registry(build(basic_spec(5)));
  CHECK(registry.current()->version() == 5);
  CHECK(registry.publish(build(basic_spec(5))).code() == absl::StatusCode::kFailedPrecondition);
  CHECK(registry.publish(build(basic_spec(4))).code() == absl::StatusCode::kFailedPrecondition);
  CHECK(registry.publish(build(basic_spec(6))).ok());
  CHECK(registry.current()->version() == 6);
}

// Version v's rule set: burst = 10·v on every route, so a decision can be matched to the
// set it used: its version and the rule name "v<version>" must agree, and a fresh key's
// remaining must be 10·v − cost.
static RuleSetSpec versioned_spec(std::uint64_t v) {
  auto spec = basic_spec(v, 1, static_cast<std::int64_t>(10 * v));
  for (auto& r : spec.rules) r.name = "v" + std::to_string(v);
  return spec;
}

TEST_CASE("reload under 8 threads: every decision carries the version of a whole rule set") {
  quota::gateway::RuleRegistry registry(build(versioned_spec(1)));
  quota::ShardedStore<quota::gateway::KeyPolicy> store;
  quota::gateway::Gateway gateway(store, registry);
  constexpr int kThreads = 8;
  constexpr int kMinPerThread = 2000;
  constexpr std::uint64_t kVersions = 200;
  std::atomic<int> started{0};
  std::atomic<bool> writer_done{false};
  std::atomic<int> bad{0};
  std::atomic<std::uint64_t> first_seen_max{0};
  std::atomic<std::uint64_t> last_seen_min{kVersions + 1};
  std::thread writer([&] {
    while (started.load() < kThreads) std::this_thread::yield();
    for (std::uint64_t v = 2; v <= kVersions; ++v) {
      // Built outside the registry: readers never wait for this.
      auto next = RuleSet::create(versioned_spec(v));
      if (!next.ok() || !registry.publish(*next).ok()) bad.fetch_add(1);
    }
    writer_done = true;
  });
  std::vector<std::thread> readers;
  for (int t = 0; t < kThreads; ++t) {
    readers.emplace_back([&, t] {
      std::uint64_t last = 0;
      std::uint64_t first = 0;
      // Keep deciding until the writer is done (and then once more), at least kMinPerThread.
      bool after_done = false;
      for (int i = 0; i < kMinPerThread || !after_done; ++i) {
        after_done = writer_done.load();
        // A fresh tenant per request: remaining tells which burst the decision used.
        const std::string tenant = "t" + std::to_string(t) + "-" + std::to_string(i);
        auto r =
            gateway.decide({.who = {.tenant = tenant, .plan = "free"}, .route = "read"}, Nanos{0});
        if (!r.ok()) {
          bad.fetch_add(1);
          continue;
        }
        const std::uint64_t v = r->decision.version;
        const bool consistent = r->rule == "v" + std::to_string(v) &&
                                r->decision.remaining == static_cast<std::int64_t>(10 * v) - 1 &&
                                r->decision.allowed;
        // Versions seen by one thread never go backwards.
        if (!consistent || v < last) bad.fetch_add(1);
        last = v;
        if (i == 0) {
          first = v;
          started.fetch_add(1);
        }
      }
      std::uint64_t m = first_seen_max.load();
      while (first > m && !first_seen_max.compare_exchange_weak(m, first)) {
      }
      std::uint64_t n = last_seen_min.load();
      while (last < n && !last_seen_min.compare_exchange_weak(n, last)) {
      }
    });
  }
  for (auto& th : readers) th.join();
  writer.join();
  CHECK(bad.load() == 0);
  // Every reader decided under version 1 first and under the last version at the end:
  // the reloads really happened during the traffic.
  CHECK(first_seen_max.load() == 1);
  CHECK(last_seen_min.load() == kVersions);
  CHECK(registry.current()->version() == kVersions);
}
