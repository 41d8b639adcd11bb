// tests/support/gateway_rules.hpp — rule sets shared by the gateway tests.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <iterator>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <catch2/catch.hpp>

#include "quota/gateway/backend.hpp"
#include "quota/gateway/rules/rules.hpp"
#include "quota/policy/token_bucket.hpp"

namespace quota::testing {

// The budgets `levels` (an array or a vector of LevelChecks), each costing `cost` units:
// for tests that call a backend's decide() directly.
template <class Levels>
std::vector<gateway::LevelCheck> with_cost(const Levels& levels, std::int64_t cost) {
  std::vector<gateway::LevelCheck> out(std::begin(levels), std::end(levels));
  for (gateway::LevelCheck& l : out) l.cost = cost;
  return out;
}

// Routes read (1 unit) and create (5 units); plan "free" gets a token bucket of
// `burst` units refilled at `rate_units` per second on each route (at least 5 on create,
// so that create can pass).
inline gateway::RuleSetSpec basic_spec(std::uint64_t version, std::int64_t rate_units = 10,
                                       std::int64_t burst = 20) {
  using namespace std::chrono_literals;
  gateway::RuleSetSpec spec;
  spec.version = version;
  spec.routes = {{.name = "read", .cost = 1}, {.name = "create", .cost = 5}};
  for (const char* route : {"read", "create"}) {
    spec.rules.push_back({.level = gateway::Level::kTenant,
                          .tenant = "",
                          .plan = "free",
                          .route = route,
                          .name = "free",
                          .policy = TokenBucket{.rate = {.units = rate_units, .per = 1s},
                                                .burst = std::string_view(route) == "create"
                                                             ? std::max<std::int64_t>(burst, 5)
                                                             : burst},
                          .shadow = false});
  }
  return spec;
}

// The emergency bucket of the fail-mode tests: 5/s, burst 5, for at most 2 s per outage
// (outage allowance 15 units).
inline const gateway::EmergencyBucket kTestEmergency{
    .rate = {.units = 5, .per = std::chrono::seconds(1)},
    .burst = 5,
    .max_duration = std::chrono::seconds(2)};

// basic_spec at 1 unit/s with `burst`, where read fails open (kTestEmergency) and create
// fails closed.
inline gateway::RuleSetSpec fail_open_spec(std::int64_t burst) {
  auto s = basic_spec(1, 1, burst);
  s.routes[0].fail_mode = gateway::FailMode::kOpen;
  s.routes[0].emergency = kTestEmergency;
  return s;
}

// One route "read" (cost 1); plan "free" gets `tenant` on the tenant level, and optional
// user and global rules (named "tenant", "user", "global").
inline gateway::RuleSetSpec levels_spec(std::uint64_t version, gateway::RulePolicy tenant,
                                        std::optional<gateway::RulePolicy> user = std::nullopt,
                                        std::optional<gateway::RulePolicy> global = std::nullopt,
                                        bool global_shadow = false) {
  gateway::RuleSetSpec s;
  s.version = version;
  s.routes = {{.name = "read", .cost = 1}};
  auto add = [&](gateway::Level level, const char* name, const gateway::RulePolicy& policy,
                 bool shadow) {
    s.rules.push_back({.level = level,
                       .tenant = "",
                       .plan = level == gateway::Level::kGlobal ? "" : "free",
                       .route = "read",
                       .name = name,
                       .policy = policy,
                       .shadow = shadow});
  };
  add(gateway::Level::kTenant, "tenant", tenant, false);
  if (user) add(gateway::Level::kUser, "user", *user, false);
  if (global) add(gateway::Level::kGlobal, "global", *global, global_shadow);
  return s;
}

// Route "call" (cost 1, or the request's); plan "free"'s tenant limit and the global rule
// `global_name` are buckets that never run out here (rate 0, burst 10^9); the global one
// has fair shares `fair`: for the tests of fair shares, where only the allocator refuses.
inline gateway::RuleSetSpec fair_share_spec(std::string global_name, gateway::FairShareSpec fair) {
  using namespace std::chrono_literals;
  gateway::RuleSetSpec s{.version = 1, .routes = {{.name = "call", .cost = 1}}, .rules = {}};
  s.rules.push_back({.level = gateway::Level::kTenant,
                     .plan = "free",
                     .route = "call",
                     .name = "tenant",
                     .policy = TokenBucket{.rate = {0, 1s}, .burst = 1'000'000'000}});
  s.rules.push_back({.level = gateway::Level::kGlobal,
                     .route = "call",
                     .name = std::move(global_name),
                     .policy = TokenBucket{.rate = {0, 1s}, .burst = 1'000'000'000},
                     .fair_share = std::move(fair)});
  return s;
}

inline std::shared_ptr<const gateway::RuleSet> build(gateway::RuleSetSpec spec,
                                                     gateway::Metrics* metrics = nullptr) {
  auto set = gateway::RuleSet::create(std::move(spec), metrics);
  INFO(set.status().ToString());
  REQUIRE(set.ok());
  return *set;
}

}  // namespace quota::testing
