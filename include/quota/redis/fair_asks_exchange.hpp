// quota/redis/fair_asks_exchange.hpp — the holders' asks of fair-share budgets in Redis.
//
// `RedisFairAsksExchange` is the FairAsksExchange (gateway/fair_share/fair_asks_exchange.hpp) of
// gateway processes that share a Redis (the GatewayStore's server, pool and limits). One
// hash per budget and allocation period, `<prefix>{~fair}<budget key>:<period>` (every
// such hash in the `~fair` slot: one node on a cluster), field `<holder>|<tenant>` =
// units asked, plus the field `!sealed` once the period was read. One script call per
// holder, budget and period:
//   - unless the reported period's hash is sealed, it writes this holder's asks into it
//     (else the report is late and dropped: the reply says so);
//   - it seals the read period's hash and returns its fields;
//   - both hashes get a TTL of `ttl` (default: a minute), at least four periods.
// The reply is parsed here: each tenant's total over the holders and this holder's own
// asks, sorted by tenant. A holder name that is empty or contains '|' makes every
// exchange() InvalidArgument (FairLimits then falls back to its fixed part).
//
// Thread safety: any thread (as GatewayStore; the script holds no state).
//
//   quota::redis::GatewayStore store({.pool = pool});
//   auto ex = std::make_shared<quota::redis::RedisFairAsksExchange>(store, "gw-1");
//   quota::gateway::Gateway gw(backend, registry, {.fair_share_holders = 3,
//                                                  .fair_share_exchange = ex});
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "quota/detail/keyed_states.hpp"
#include "quota/gateway/fair_share/fair_asks_exchange.hpp"
#include "quota/redis/gateway_store.hpp"
#include "quota/redis/transport/script.hpp"

namespace quota::redis {

// KEYS[1]: the reported period's hash, KEYS[2]: the read period's hash. ARGV[1]: the
// holder, ARGV[2]: TTL (ms), then tenant, asks pairs. Reply: {late (0/1), field, value...}.
inline constexpr const char* kFairAsksLua = R"lua(
local late = 0
if #ARGV > 2 then
  if redis.call('HEXISTS', KEYS[1], '!sealed') == 1 then
    late = 1
  else
    for i = 3, #ARGV, 2 do redis.call('HSET', KEYS[1], ARGV[1] .. '|' .. ARGV[i], ARGV[i + 1]) end
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
  end
end
redis.call('HSET', KEYS[2], '!sealed', '1')
redis.call('PEXPIRE', KEYS[2], ARGV[2])
local out = {late}
local all = redis.call('HGETALL', KEYS[2])
for i = 1, #all do out[#out + 1] = all[i] end
return out
)lua";

class RedisFairAsksExchange final : public gateway::FairAsksExchange {
 public:
  // `store` must outlive the exchange.
  RedisFairAsksExchange(const GatewayStore& store, std::string holder,
                        Nanos ttl = std::chrono::minutes(1))
      : prefix_(store.options().prefix),
        holder_(std::move(holder)),
        ttl_ms_(std::max<std::int64_t>(1, ttl.count() / 1'000'000)),
        script_(kFairAsksLua, store.options().pool, store.options().cluster, {},
                store.options().limits) {}

  absl::StatusOr<gateway::FairAsksView> exchange(
      std::string_view budget_key, Nanos period, std::int64_t reported,
      std::span<const std::pair<std::string, std::int64_t>> asks, std::int64_t read) override {
    if (holder_.empty() || holder_.find('|') != std::string::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat("fair asks: holder name \"", holder_, "\" must be non-empty, without '|'"));
    }
    // Kept at least four periods: the read period is two behind the current one.
    const std::int64_t ttl_ms =
        std::max(ttl_ms_, std::min<std::int64_t>(period.count() / 250'000, kMaxTtlMs));
    std::vector<std::string> args{holder_, absl::StrCat(ttl_ms)};
    for (const auto& [tenant, n] : asks) {
      args.push_back(tenant);
      args.push_back(absl::StrCat(n));
    }
    auto reply = script_.run({hash(budget_key, reported), hash(budget_key, read)}, args);
    if (!reply.ok()) return reply.status();
    const redisReply& r = **reply;
    if (r.type == REDIS_REPLY_ERROR) {
      return absl::UnavailableError(absl::StrCat("fair asks: ", absl::string_view(r.str, r.len)));
    }
    if (r.type != REDIS_REPLY_ARRAY || r.elements < 1 || r.elements % 2 != 1 ||
        r.element[0]->type != REDIS_REPLY_INTEGER) {
      return absl::InternalError("fair asks: malformed reply");
    }
    gateway::FairAsksView view{.tenants = {}, .late = r.element[0]->integer != 0};
    std::map<std::string, fair::HolderDemand, std::less<>> by_tenant;
    for (std::size_t i = 1; i + 1 < r.elements; i += 2) {
      const absl::string_view field(r.element[i]->str, r.element[i]->len);
      const absl::string_view value(r.element[i + 1]->str, r.element[i + 1]->len);
      if (field == "!sealed") continue;
      const std::size_t bar = field.find('|');
      std::int64_t n = 0;
      if (bar == absl::string_view::npos || !absl::SimpleAtoi(value, &n) || n < 0) {
        return absl::DataLossError(absl::StrCat("fair asks: malformed field ", field));
      }
      const absl::string_view tenant = field.substr(bar + 1);
      auto it = by_tenant.find(tenant);
      if (it == by_tenant.end())
        it = by_tenant
                 .emplace(std::string(tenant), fair::HolderDemand{.tenant = std::string(tenant)})
                 .first;
      it->second.total = std::min(it->second.total + n, fair::kMaxBudget);
      if (field.substr(0, bar) == holder_) it->second.local = std::min(n, it->second.total);
    }
    for (auto& [tenant, d] : by_tenant) view.tenants.push_back(std::move(d));
    return view;
  }

 private:
  std::string hash(std::string_view budget_key, std::int64_t period) const {
    return absl::StrCat(prefix_, "{~fair}", quota::detail::to_absl(budget_key), ":", period);
  }

  static constexpr std::int64_t kMaxTtlMs = std::int64_t{1} << 40;  // ~35 years
  const std::string prefix_;
  const std::string holder_;
  const std::int64_t ttl_ms_;
  Script script_;
};

}  // namespace quota::redis
