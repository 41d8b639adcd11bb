// tests/redis/support/gateway_fixtures.hpp — what the tests of the gateway over Redis
// (quota/redis/gateway_store.hpp) share: a fresh store on the test server, rule sets of
// tenant, user and global levels on one route "read", and a request on it.
//
// The helpers use Catch2 assertions: call them on the test's own thread only.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>

#include <catch2/catch.hpp>

#include "quota/gateway/gateway.hpp"
#include "quota/redis/gateway_store.hpp"
#include "support/gateway_rules.hpp"
#include "support/redis_server.hpp"

namespace quota::testing {

// A fresh key space per call (Catch runs a test case again for each SECTION).
inline redis::GatewayStore make_store(const std::string& test) {
  static int runs = 0;
  return redis::GatewayStore(
      {.pool = redis_pool(4), .prefix = unique_prefix(test + "-" + std::to_string(++runs))});
}

// levels_spec (support/gateway_rules.hpp): `tenant`, and optionally `user` and `global`.
inline gateway::RuleSetSpec spec(std::uint64_t version, gateway::RulePolicy tenant,
                                 std::optional<gateway::RulePolicy> user = std::nullopt,
                                 std::optional<gateway::RulePolicy> global = std::nullopt,
                                 bool global_shadow = false) {
  return levels_spec(version, std::move(tenant), std::move(user), std::move(global), global_shadow);
}

// A request of plan "free" on route "read".
inline gateway::Request read(const char* tenant, const char* user = "") {
  return {.who = {.tenant = tenant, .plan = "free", .user = user}, .route = "read"};
}

// Decides `n` requests; returns how many were admitted.
template <class G>
int admit(G& gw, const gateway::Request& req, int n) {
  int admitted = 0;
  for (int i = 0; i < n; ++i) {
    auto r = gw.decide(req, Nanos{0});
    REQUIRE(r.ok());
    if (r->decision.allowed) ++admitted;
  }
  return admitted;
}

// A slow rate, so that server time passing during a test refills nothing measurable.
inline constexpr Rate kSlow{.units = 1, .per = std::chrono::hours(1)};

}  // namespace quota::testing
