// examples/quota_server/redis_leases.hpp — leased rules on quota-server's Redis budgets.
//
// A rule whose `lease:` option is on or auto (docs/gateway.md "Leased rules in the
// gateway") is decided, when the server keeps its budgets in Redis, by
// quota::gateway::LeasedBackend over the server's CountedRedisStore: each server takes
// grants of `lease.units` from the budget in Redis (a revocation check, then one
// GatewayStore decision with the grant id as its attempt, so a lost reply is replayed,
// never taken twice), records each in a quota::redis::RedisGrantLedger (a hash beside the
// budget, in its slot) and then decides locally from what it holds. Redis is asked three
// times per grant instead of once per check; every server on that Redis shares each budget
// within
// A(T) <= r·T + B + Σ units held <= r·T + B + servers·(units + low_water).
//
// RedisLeases bundles the three parts (metrics, record, backend) with the lifetimes the
// backend needs. has_leases() says whether a rule file asks for any lease: the Checker
// (checker.hpp) decides through the leased backend only while the rule set in force
// does, and never a request with an attempt id (the leased backend would keep its record
// in this process; on Redis directly it is shared by every server and rule set).
//
// In process (no --redis*) a lease has nothing to lease from — the server's own store is
// the authority — so `lease:` options are ignored there (the Checker logs a note once).
//
// Thread safety: RedisLeases::backend as LeasedBackend (any thread); has_leases() pure.
//
//   quota::server::CountedRedisStore counted(*store, stats.decisions);
//   quota::server::RedisLeases leases(counted);
//   quota::gateway::Gateway<quota::server::RedisLeases::Backend> gw(leases.backend, registry);
//   std::string text = quota::gateway::render_prometheus(leases.metrics);
#pragma once

#include <algorithm>
#include <string_view>

#include "counted_redis_store.hpp"
#include "quota/gateway/lease_metrics.hpp"
#include "quota/gateway/leased_backend.hpp"
#include "quota/redis/grant_ledger.hpp"
#include "quota/rules/rule_parser.hpp"

namespace quota::server {

struct RedisLeases {
  using Backend = gateway::LeasedBackend<CountedRedisStore, redis::RedisGrantLedger>;

  // `store` must outlive this. A fresh incarnation per process start: a restarted server
  // holds nothing.
  explicit RedisLeases(CountedRedisStore& store)
      : ledger(store.store()), backend(store, ledger, {.metrics = &metrics}) {}

  gateway::LeaseMetrics metrics;  // per level: quota_lease_* on /metrics
  redis::RedisGrantLedger ledger;
  Backend backend;
};

// True when a rule of the quota-format rule file `text` has `lease:` on or auto. A text
// that does not parse has none (the loader reports its error).
inline bool has_leases(std::string_view text, std::string_view path) {
  auto spec = quota::rules::parse_rules(text, path);
  if (!spec.ok()) return false;
  return std::any_of(spec->rules.begin(), spec->rules.end(),
                     [](const gateway::RuleSpec& r) { return r.lease.enabled(); });
}

}  // namespace quota::server
