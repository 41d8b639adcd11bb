// examples/quota_server/backend/redis_leases.hpp — leased rules on quota-server's Redis budgets.
//
// A rule whose `lease:` option is on or auto (docs/gateway/leases.md "Leased rules in the
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
// backend needs. The Checker (checker.hpp) decides every check through its backend: a
// rule without a lease passes through to Redis, and so does a request with an attempt id
// (its record is kept in Redis, shared by every server and rule set).
//
// In process (no --redis*) a lease has nothing to lease from — the server's own store is
// the authority — so `lease:` options are ignored there (the Checker logs a note once).
//
// Thread safety: RedisLeases::backend as LeasedBackend (any thread).
//
//   quota::server::CountedRedisStore counted(*store, stats.decisions);
//   quota::server::RedisLeases leases(counted);
//   quota::gateway::Gateway gw(leases.backend, registry);
//   std::string text = quota::gateway::render_prometheus(leases.metrics);
#pragma once

#include "backend/counted_redis_store.hpp"
#include "quota/gateway/leases/lease_metrics.hpp"
#include "quota/gateway/leases/leased_backend.hpp"
#include "quota/redis/grant_ledger.hpp"

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

}  // namespace quota::server
