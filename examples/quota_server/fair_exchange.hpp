// examples/quota_server/fair_exchange.hpp — how quota-servers on one Redis divide each
// fair-share budget (a global rule with `fair_share:`, docs/gateway.md "Fair shares of a
// global budget").
//
// fair_share_options(store, holders, holder) is what the Checker's Redis gateways
// (checker.hpp: unleased and leased) are built with. --fair-share-holders N = 1: no
// exchange; each server's allocator divides the whole budget among its own tenants only.
// N > 1: a quota::redis::RedisFairAsksExchange on the budgets' Redis (the GatewayStore's
// connections, deadline and in-flight guard), this server named by its --instance-id:
// each server's allocator divides the whole budget by every server's asks (those of
// period n − 2, the same view everywhere; include/quota/gateway/fair_limits.hpp), so a
// tenant gets its share wherever its traffic arrives, and Σ over the servers of the
// shares stays within budget − reserve. A period whose exchange fails (Redis, the
// deadline) falls back at that server to ⌊budget / N⌋ among its own tenants, counted in
// quota_fair_share_fallback_periods_total (not in quota_redis_errors_total).
//
// Periods labelled on the wall clock: a Gateway counts allocation periods on its `now`,
// the server's monotonic clock, which starts at each host's boot; the exchange names its
// hashes by those counts. WallClockPeriods shifts both counts of each call by the whole
// number of periods nearest to (wall clock − monotonic clock), so servers on different
// hosts whose wall clocks agree to well within a period label one period alike, their
// period boundaries apart by less than one period (on one host: the same shift). A step
// of the wall clock moves the shift: one period's label is skipped or repeated at that
// server (a report then late: quota_fair_share_late_reports_total).
//
// Thread safety: any thread (the exchange holds no state; the clocks are read per call).
//
//   gateway::GatewayOptions o = fair_share_options(counted.store(), 3, "gw-1:4711");
//   gateway::Gateway<CountedRedisStore> gw(counted, registry, o);
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>

#include "absl/status/statusor.h"
#include "quota/gateway/fair_asks_exchange.hpp"
#include "quota/gateway/request.hpp"
#include "quota/redis/fair_asks_exchange.hpp"
#include "quota/redis/gateway_store.hpp"
#include "quota/units.hpp"

namespace quota::server {

class WallClockPeriods final : public gateway::FairAsksExchange {
 public:
  explicit WallClockPeriods(std::shared_ptr<gateway::FairAsksExchange> inner)
      : inner_(std::move(inner)) {}

  absl::StatusOr<gateway::FairAsksView> exchange(
      std::string_view budget_key, Nanos period, std::int64_t reported,
      std::span<const std::pair<std::string, std::int64_t>> asks, std::int64_t read) override {
    const std::int64_t s = shift(period);
    return inner_->exchange(budget_key, period, reported + s, asks, read + s);
  }

  // The whole number of `period`s (> 0) nearest to wall clock − monotonic clock, now.
  static std::int64_t shift(Nanos period) {
    using std::chrono::nanoseconds;
    const std::int64_t wall =
        std::chrono::duration_cast<nanoseconds>(std::chrono::system_clock::now().time_since_epoch())
            .count();
    const std::int64_t mono =
        std::chrono::duration_cast<nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
            .count();
    const std::int64_t d = wall - mono, p = period.count();
    std::int64_t q = d / p, r = d % p;
    if (r < 0) {
      --q;
      r += p;
    }
    return r >= p - r ? q + 1 : q;  // r in [0, p): rounded to the nearer multiple
  }

 private:
  const std::shared_ptr<gateway::FairAsksExchange> inner_;
};

// The fair-share part of the GatewayOptions of a gateway on `store`: see the top of this
// file. `holders` ≥ 1; `holder` (with holders > 1) non-empty, without '|' (options.hpp).
inline gateway::GatewayOptions fair_share_options(const redis::GatewayStore& store,
                                                  std::int64_t holders, const std::string& holder) {
  gateway::GatewayOptions o;
  o.fair_share_holders = holders;
  if (holders > 1) {
    o.fair_share_exchange = std::make_shared<WallClockPeriods>(
        std::make_shared<redis::RedisFairAsksExchange>(store, holder));
  }
  return o;
}

}  // namespace quota::server
