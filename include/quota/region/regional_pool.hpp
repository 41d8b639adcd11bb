// quota/region/regional_pool.hpp — a region's global budgets from one grant pool in the
// region's own Redis, shared by every gateway process of the region, refilled from a
// central redis::GatewayStore.
//
// `RegionalPool<Ledger>` is BasicRegionalPool (basic_regional_pool.hpp: the guarantees,
// the bound, the refill and the wait for it) over the region's Redis (pool_script.hpp:
// one record per global key, `<prefix><key>`) and the central store's attempts (a lost
// grant reply is replayed by the grant id). `PooledRegion` is a region's whole backend:
// tenant levels at the region's own GatewayStore, global levels from the pool, all or
// nothing across the two (scope_router.hpp).
//
// Thread safety: any thread; processes of a region share the pool through Redis.
//
//   quota::redis::GatewayStore regional({.pool = eu_redis});
//   quota::redis::GatewayStore central({.pool = central_redis});
//   quota::redis::RedisGrantLedger ledger(central);
//   quota::region::RegionalPool<> pool(eu_redis, central, ledger, {.region = 0xe1});
//   quota::region::PooledRegion<> backend(regional, pool);
//   quota::gateway::Gateway gw(backend, registry);
#pragma once

#include <memory>
#include <utility>

#include "quota/gateway/backend.hpp"
#include "quota/lease/grant_ledger.hpp"
#include "quota/redis/gateway_store.hpp"
#include "quota/redis/grant_ledger.hpp"
#include "quota/region/basic_regional_pool.hpp"
#include "quota/region/pool_script.hpp"
#include "quota/region/scope_router.hpp"

namespace quota::region {

namespace detail {
// Holds the pool's record; a base before BasicRegionalPool, which refers to it.
struct OwnedPoolScript {
  OwnedPoolScript(std::shared_ptr<redis::ConnectionPool> regional, const PoolOptions& options)
      : script(std::move(regional), options.prefix) {}
  PoolScript script;
};
}  // namespace detail

template <GrantRecorder Ledger = redis::RedisGrantLedger>
class RegionalPool : private detail::OwnedPoolScript,
                     public BasicRegionalPool<Ledger, PoolScript, redis::GatewayStore> {
 public:
  // `central` and `ledger` must outlive the pool.
  RegionalPool(std::shared_ptr<redis::ConnectionPool> regional, redis::GatewayStore& central,
               Ledger& ledger, PoolOptions options = {})
      : detail::OwnedPoolScript(std::move(regional), options),
        BasicRegionalPool<Ledger, PoolScript, redis::GatewayStore>(script, central, ledger,
                                                                   std::move(options)) {}
};

// A region's whole backend: its tenants at its own store, the global levels from its pool.
template <gateway::GatewayBackend Regional = redis::GatewayStore,
          GrantRecorder Ledger = redis::RedisGrantLedger>
using PooledRegion = ScopeRouter<Regional, RegionalPool<Ledger>>;

}  // namespace quota::region
