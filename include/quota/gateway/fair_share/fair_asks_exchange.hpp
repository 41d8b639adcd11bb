// quota/gateway/fair_share/fair_asks_exchange.hpp — how the holders of a fair-share budget learn
// where its demand is.
//
// With several gateway processes (holders) admitting one fair-share budget
// (fair_limits.hpp), each holder, at its first request of allocation period n, reports
// the units each tenant asked it in its last period with requests (normally n − 1) and
// reads the asks every holder reported for period n − 2: the latest period whose reports
// are closed. The first read of a period's asks closes them (seals them) for everyone, so
// every holder that allocates from period n − 2 gets exactly the same view and computes
// the same shares (holder_split.hpp). A report into a period already sealed is late: it
// is dropped, and `late` says so; the late holder's tenants then have no part for that
// period (share 0: they may borrow up to the water level) unless the view has them.
//
// An implementation: quota::redis::RedisFairAsksExchange (redis/fair_asks_exchange.hpp),
// one script call per holder, budget and period. When the exchange fails, FairLimits
// falls back to the fixed part ⌊budget / holders⌋ for that period (fair_limits.hpp).
//
// Holders meet only if they number periods alike and start them together: a period is
// ⌊(now + GatewayOptions::fair_share_clock_offset) / period⌋ of each holder's own clock.
// Holders whose `now` is a per-host clock (SteadyClock: time since boot) set the offset to
// steady_to_wall_offset(), so every period starts at a multiple of the period on the wall
// clock, wherever the holder runs (within the hosts' clock agreement, which must be well
// under a period: a holder whose first request of a period comes after the others sealed
// its last one reports late).
//
// Thread safety: exchange() may be called from any thread (implementations must allow
// it); FairLimits calls it under the budget's mutex, once per period.
//
//   struct Mine : quota::gateway::FairAsksExchange { ... };
//   quota::gateway::GatewayOptions o{.fair_share_holders = 3,
//                                    .fair_share_exchange = std::make_shared<Mine>()};
#pragma once

#include <chrono>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "quota/fair/holder_split.hpp"
#include "quota/units.hpp"

namespace quota::gateway {

// The asks of one period at all holders: by tenant (sorted), each with its total and
// this holder's own asks (weights 1).
struct FairAsksView {
  std::vector<fair::HolderDemand> tenants;
  bool late = false;  // this holder's report came after its period was sealed: dropped
};

class FairAsksExchange {
 public:
  virtual ~FairAsksExchange() = default;
  // Reports `asks` (by tenant, sorted, each > 0) of period `reported` of the budget
  // `budget_key` (periods of `period`), then returns the view of period `read` (sealing
  // it). An error: nothing is known of the other holders this period.
  virtual absl::StatusOr<FairAsksView> exchange(
      std::string_view budget_key, Nanos period, std::int64_t reported,
      std::span<const std::pair<std::string, std::int64_t>> asks, std::int64_t read) = 0;
};

// The wall clock (system_clock) minus SteadyClock's time, now: the steady clock read
// before and after the wall clock, their midpoint taken. Measure it once, at start, and
// keep it (GatewayOptions::fair_share_clock_offset): both clocks advance alike, so it stays
// right until the wall clock is stepped.
inline Nanos steady_to_wall_offset() {
  using std::chrono::duration_cast;
  const auto before = std::chrono::steady_clock::now().time_since_epoch();
  const auto wall = std::chrono::system_clock::now().time_since_epoch();
  const auto after = std::chrono::steady_clock::now().time_since_epoch();
  return duration_cast<Nanos>(wall) - duration_cast<Nanos>(before) -
         duration_cast<Nanos>(after - before) / 2;
}

}  // namespace quota::gateway
