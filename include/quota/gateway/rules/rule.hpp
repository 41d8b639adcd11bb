// quota/gateway/rules/rule.hpp — one validated rule of a RuleSet, and what a plan asks of a
// request: the values RuleSet (rules.hpp) hands out and the gateway decides with.
//
// A Rule is built only by RuleSet::create, so its fields are valid: `id` names it uniquely
// and stably across rule sets (level, scope, route, limit; what lease revocations and rule
// conversions key on), `name` is a label. A Check is one budget a request must pass: the
// rule, the store key, the cost in whole units, and whether the check is in shadow.
// rollout_bucket fixes a tenant's place in a rule's enforce_percent rollout for good.
//
// Thread safety: values; a Rule inside a RuleSet is immutable (its counters are atomic).
//
//   for (const quota::gateway::Check& c : *(*rules)->plan(id, "create")) {
//     std::cout << c.rule->name << " " << c.key.view() << " " << c.cost << "\n";
//   }
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "quota/gateway/key_state.hpp"
#include "quota/gateway/metrics.hpp"
#include "quota/gateway/rules/rule_spec.hpp"
#include "quota/gateway/store_key.hpp"

namespace quota::gateway {

// A validated rule inside a RuleSet.
struct Rule {
  std::string id{};  // unique in its set and stable across sets: level, scope, route, limit
  std::string name{};
  Level level = Level::kTenant;
  RulePolicy policy{};
  bool shadow = false;
  std::string limit{};
  int enforce_percent = 100;
  std::int64_t max_cost = 0;                 // 0: no per-request cap
  LeaseSpec lease{};                         // lease_spec.hpp; off by default
  FairShareSpec fair_share{};                // fair_share_spec.hpp; off by default
  std::shared_ptr<RuleCounters> counters{};  // null when the set was built without Metrics
};

// One budget a request must pass, and what the request pays there.
struct Check {
  const Rule* rule = nullptr;
  StoreKey key{};
  std::int64_t cost = 1;  // whole units
  bool estimate = false;  // the cost is the request's estimate: settled later
  bool shadow = false;    // decided and counted, never denies (the rule, its rollout, a switch)
};

// What RuleSet::plan needs of a request beyond its identity and route.
struct PlanOptions {
  std::optional<std::int64_t> estimate{};  // Gateway::acquire_estimate's estimate
  bool shadow_all = false;                 // RuleRegistry::set_shadow_all
};

// The rollout bucket of a tenant, 0..99: FNV-1a (64-bit) of the id, mod 100. Fixed for
// good, so that a tenant is always in or always out of a rule's enforce_percent, and
// raising the percentage only adds tenants.
inline int rollout_bucket(std::string_view tenant) {
  std::uint64_t h = 14695981039346656037ull;
  for (char c : tenant) {
    h ^= static_cast<unsigned char>(c);
    h *= 1099511628211ull;
  }
  return static_cast<int>(h % 100);
}

}  // namespace quota::gateway
