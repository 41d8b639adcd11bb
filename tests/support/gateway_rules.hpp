// tests/support/gateway_rules.hpp — rule sets shared by the gateway tests.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string_view>

#include <catch2/catch.hpp>

#include "quota/gateway/rules.hpp"
#include "quota/policy/token_bucket.hpp"

namespace quota::testing {

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

inline std::shared_ptr<const gateway::RuleSet> build(gateway::RuleSetSpec spec,
                                                     gateway::Metrics* metrics = nullptr) {
  auto set = gateway::RuleSet::create(std::move(spec), metrics);
  INFO(set.status().ToString());
  REQUIRE(set.ok());
  return *set;
}

}  // namespace quota::testing
