// quota/gateway/fair_asks_exchange.hpp — how the holders of a fair-share budget learn
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
// Thread safety: exchange() may be called from any thread (implementations must allow
// it); FairLimits calls it under the budget's mutex, once per period.
//
//   struct Mine : quota::gateway::FairAsksExchange { ... };
//   quota::gateway::GatewayOptions o{.fair_share_holders = 3,
//                                    .fair_share_exchange = std::make_shared<Mine>()};
#pragma once

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

}  // namespace quota::gateway
