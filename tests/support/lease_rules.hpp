// tests/support/lease_rules.hpp — rule sets and holders shared by the lease tests of the
// gateway (gateway_lease*_test.cpp, redis/redis_gateway_lease_test.cpp).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>

#include "quota/gateway/gateway.hpp"
#include "quota/gateway/leases/leased_backend.hpp"
#include "quota/gateway/rules/rule_registry.hpp"
#include "support/gateway_rules.hpp"

namespace quota::testing {

// One route "read" (cost 1): plan "free" gets `tenant` on the tenant level (rule
// "tenant") and everyone shares `global` (rule "global"); each with its lease option.
inline gateway::RuleSetSpec lease_levels_spec(std::uint64_t version, TokenBucket tenant,
                                              gateway::LeaseSpec tenant_lease, TokenBucket global,
                                              gateway::LeaseSpec global_lease) {
  gateway::RuleSetSpec s = levels_spec(version, tenant, std::nullopt, global);
  for (gateway::RuleSpec& r : s.rules) {
    r.lease = r.level == gateway::Level::kGlobal ? global_lease : tenant_lease;
  }
  return s;
}

// A lease of `units` with `low_water`, expiring after `expiry`.
inline gateway::LeaseSpec lease_on(std::int64_t units, std::int64_t low_water, Nanos expiry) {
  return {
      .mode = gateway::LeaseMode::kOn, .units = units, .expiry = expiry, .low_water = low_water};
}

// One gateway process over a shared inner backend: its own incarnation, lease state,
// rule registry and Gateway.
template <class Inner, class Ledger = GrantLedger>
struct LeaseHolder {
  using Backend = gateway::LeasedBackend<Inner, Ledger>;
  LeaseHolder(Inner& inner, Ledger& ledger, std::shared_ptr<const gateway::RuleSet> rules,
              std::uint64_t incarnation, gateway::LeaseMetrics* metrics = nullptr)
      : registry(std::move(rules)),
        backend(inner, ledger, {.incarnation = incarnation, .metrics = metrics}),
        gateway(backend, registry) {}

  gateway::RuleRegistry registry;
  Backend backend;
  gateway::Gateway gateway;
};

}  // namespace quota::testing
