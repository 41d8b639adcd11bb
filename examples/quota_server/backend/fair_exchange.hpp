// examples/quota_server/backend/fair_exchange.hpp — how quota-servers on one Redis divide each
// fair-share budget (a global rule with `fair_share:`, docs/gateway/fair_share.md "Fair shares of a
// global budget").
//
// fair_share_options(store, holders, holder) is what the Checker's Redis gateways
// (checker.hpp: unleased and leased) are built with. --fair-share-holders N = 1: no
// exchange; each server's allocator divides the whole budget among its own tenants only.
// N > 1: a quota::redis::RedisFairAsksExchange on the budgets' Redis (the GatewayStore's
// connections, deadline and in-flight guard), this server named by its --instance-id:
// each server's allocator divides the whole budget by every server's asks (those of
// period n − 2, the same view everywhere; include/quota/gateway/fair_share/fair_limits.hpp), so a
// tenant gets its share wherever its traffic arrives, and Σ over the servers of the
// shares stays within budget − reserve. A period whose exchange fails (Redis, the
// deadline) falls back at that server to ⌊budget / N⌋ among its own tenants, counted in
// quota_fair_share_fallback_periods_total (not in quota_redis_errors_total).
//
// Periods start together on every host: the gateways number them on the server's
// monotonic clock plus the wall clock's offset from it, measured once when the Checker is
// built (GatewayOptions::fair_share_clock_offset, gateway::steady_to_wall_offset()), so a
// period starts at a multiple of the period on the wall clock wherever the server runs
// (servers whose clocks agree to well within a period meet; a step of the wall clock is
// seen at the next restart).
//
// Thread safety: any thread (the exchange holds no state).
//
//   gateway::GatewayOptions o = fair_share_options(counted.store(), 3, "gw-1:4711");
//   gateway::Gateway gw(counted, registry, o);
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "quota/gateway/fair_share/fair_asks_exchange.hpp"
#include "quota/gateway/request.hpp"
#include "quota/redis/fair_asks_exchange.hpp"
#include "quota/redis/gateway_store.hpp"

namespace quota::server {

// The fair-share part of the GatewayOptions of a gateway on `store`: see the top of this
// file. `holders` ≥ 1; `holder` (with holders > 1) non-empty, without '|' (options.hpp).
inline gateway::GatewayOptions fair_share_options(const redis::GatewayStore& store,
                                                  std::int64_t holders, const std::string& holder) {
  gateway::GatewayOptions o;
  o.fair_share_holders = holders;
  if (holders > 1) {
    o.fair_share_exchange = std::make_shared<redis::RedisFairAsksExchange>(store, holder);
    o.fair_share_clock_offset = gateway::steady_to_wall_offset();
  }
  return o;
}

}  // namespace quota::server
