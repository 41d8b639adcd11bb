// tests/redis/support/fair_holders.hpp — what the tests of fair shares over Redis share:
// several gateway processes (holders) of one leased global budget with `fair_share`, each
// with its own connections, store, grant record, lease state and allocator, and
// optionally a fair asks exchange (redis/fair_asks_exchange.hpp); the rule set they
// decide; and the global envelope checked on what they admitted.
//
// The rule set: route "call" (the request's cost); plan "free" gets a tenant budget that
// never runs out; everyone shares `global` (leased, kFairLeaseUnits at a time with
// kFairLowWater) with the given fair_share option.
//
// The envelope check uses Catch2 assertions: call it on the test's own thread only.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <catch2/catch.hpp>

#include "quota/gateway/gateway.hpp"
#include "quota/gateway/leases/leased_backend.hpp"
#include "quota/redis/fair_asks_exchange.hpp"
#include "quota/redis/gateway_store.hpp"
#include "quota/redis/grant_ledger.hpp"
#include "quota/verify/envelope.hpp"
#include "support/gateway_rules.hpp"
#include "support/redis_server.hpp"

namespace quota::testing {

inline constexpr std::int64_t kFairLeaseUnits = 100, kFairLowWater = 20;

inline gateway::RuleSetSpec fair_holders_spec(TokenBucket global, gateway::FairShareSpec fair) {
  gateway::RuleSetSpec s{.version = 1, .routes = {{.name = "call", .cost = 1}}, .rules = {}};
  s.rules.push_back(
      {.level = gateway::Level::kTenant,
       .plan = "free",
       .route = "call",
       .name = "tenant",
       .policy = TokenBucket{.rate = {1'000, std::chrono::seconds(1)}, .burst = 1'000'000}});
  s.rules.push_back({.level = gateway::Level::kGlobal,
                     .route = "call",
                     .name = "global",
                     .policy = global,
                     .lease = {.mode = gateway::LeaseMode::kOn,
                               .units = kFairLeaseUnits,
                               .expiry = std::chrono::minutes(1),
                               .low_water = kFairLowWater},
                     .fair_share = std::move(fair)});
  return s;
}

// How the holders learn each other's asks: not at all (each divides its fixed part), or
// through Redis, over the store's pool or `pool` when given.
struct FairExchange {
  bool enabled = false;
  std::shared_ptr<redis::ConnectionPool> pool{};
};

// One gateway process.
struct FairHolder {
  using Backend = gateway::LeasedBackend<redis::GatewayStore, redis::RedisGrantLedger>;
  FairHolder(const std::string& prefix, std::shared_ptr<const gateway::RuleSet> rules,
             std::int64_t holders, std::uint64_t incarnation, const std::string& name,
             const FairExchange& exchange)
      : store({.pool = redis_pool(2), .prefix = prefix}),
        exchange_store(
            {.pool = exchange.pool ? exchange.pool : store.options().pool, .prefix = prefix}),
        ledger(store),
        registry(std::move(rules)),
        backend(store, ledger, {.incarnation = incarnation, .metrics = &metrics}),
        gateway(backend, registry,
                {.fair_share_holders = holders,
                 .fair_share_exchange =
                     exchange.enabled
                         ? std::make_shared<redis::RedisFairAsksExchange>(exchange_store, name)
                         : nullptr}) {}
  redis::GatewayStore store;
  redis::GatewayStore exchange_store;
  redis::RedisGrantLedger ledger;
  gateway::LeaseMetrics metrics;
  gateway::RuleRegistry registry;
  Backend backend;
  gateway::Gateway gateway;
};

// `holders` processes "h0", "h1", ... on a fresh key space, incarnations from
// `incarnation`.
inline std::vector<std::unique_ptr<FairHolder>> fair_holders(const std::string& test,
                                                             const gateway::RuleSetSpec& s,
                                                             int holders, std::uint64_t incarnation,
                                                             const FairExchange& exchange) {
  const std::string prefix = unique_prefix(test);
  auto rules = build(s);
  std::vector<std::unique_ptr<FairHolder>> ps;
  for (int i = 0; i < holders; ++i) {
    ps.push_back(std::make_unique<FairHolder>(prefix, rules, holders, incarnation + i,
                                              "h" + std::to_string(i), exchange));
  }
  return ps;
}

inline gateway::Request fair_call(const std::string& tenant, std::int64_t units) {
  return {.who = {.tenant = tenant, .plan = "free"}, .route = "call", .cost = units};
}

// The envelope on what the holders admitted (`log`, any order): r·T + B + Σ outstanding
// grants, Σ at most H·(units + low_water); and exactly: admitted + held = granted ≤ B.
// Returns the units granted.
inline std::int64_t check_fair_envelope(std::vector<verify::AdmittedEvent> log,
                                        const TokenBucket& global,
                                        const std::vector<std::unique_ptr<FairHolder>>& ps) {
  std::sort(log.begin(), log.end(),
            [](const auto& a, const auto& b) { return a.time_ns < b.time_ns; });
  const auto holders = static_cast<std::int64_t>(ps.size());
  auto report = verify::verify_token_bucket(log, global.rate, global.burst,
                                            holders * (kFairLeaseUnits + kFairLowWater));
  REQUIRE(report.ok());
  std::printf("%zu admissions; %s\n", log.size(), verify::to_string(*report).c_str());
  CHECK(report->holds());
  std::int64_t admitted = 0, granted = 0, held = 0;
  for (const auto& e : log) admitted += e.cost;
  for (const auto& p : ps) {
    granted += p->metrics.at(gateway::Level::kGlobal).units_granted.load();
    held += p->metrics.at(gateway::Level::kGlobal).units_held.load();
  }
  CHECK(admitted + held == granted);
  CHECK(granted <= global.burst);
  return granted;
}

}  // namespace quota::testing
