// quota/redis/grant_ledger.hpp — the record of lease grants in Redis, beside each budget.
//
// `RedisGrantLedger` is the GrantRecorder (gateway/grant_ledger.hpp) of a LeasedBackend
// over `GatewayStore`: each grant is written into a hash next to the budget it was taken
// from — `<the key's Redis key>:grants`, in the key's hash slot (one node on a cluster) —
// field = grant id, value = "<incarnation> <version> <units> <granted_at> <expires_at>"
// (times in nanoseconds of the server's clock). The write also drops the fields that
// expired more than `keep` ago and sets the hash's TTL, so a key leased for ever keeps a
// bounded record. An operator lists a key's grants still outstanding with
// `outstanding(key)`, at the server's time.
//
// The grant itself is one GatewayStore decision with the grant id as its attempt
// (recorded in the same script call, so a retried grant is replayed, never taken twice);
// the record is a second call, made once per grant: a grant whose record failed is still
// held and counted (LeaseCounters::record_failures). `replay` answers nothing: over
// Redis idempotency is the attempt record's.
//
// Thread safety: any thread (as GatewayStore).
//
//   quota::redis::GatewayStore store({.pool = pool});
//   quota::redis::RedisGrantLedger ledger(store);
//   quota::gateway::LeasedBackend<quota::redis::GatewayStore, quota::redis::RedisGrantLedger>
//       leased(store, ledger);
//   auto grants = ledger.outstanding("{~global}read");   // StatusOr<vector<GrantRecord>>
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "quota/gateway/grant_ledger.hpp"
#include "quota/redis/gateway_store.hpp"
#include "quota/redis/transport/script.hpp"

namespace quota::redis {

// KEYS[1]: the hash. ARGV: grant id, record, its granted_at (ns), keep (ns), TTL (ms).
// Fields that expired before granted_at - keep are dropped.
inline constexpr const char* kGrantRecordLua = R"lua(
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
local horizon = tonumber(ARGV[3]) - tonumber(ARGV[4])
local all = redis.call('HGETALL', KEYS[1])
for i = 1, #all, 2 do
  local expires = tonumber(string.match(all[i + 1], '(%d+)$'))
  if expires and expires < horizon then redis.call('HDEL', KEYS[1], all[i]) end
end
redis.call('PEXPIRE', KEYS[1], ARGV[5])
return 1
)lua";

// KEYS[1]: the hash. Reply: {server seconds, microseconds, field, value, ...}.
inline constexpr const char* kGrantListLua = R"lua(
local t = redis.call('TIME')
local out = {t[1], t[2]}
local all = redis.call('HGETALL', KEYS[1])
for i = 1, #all do out[#out + 1] = all[i] end
return out
)lua";

class RedisGrantLedger {
 public:
  // `store` must outlive the ledger. Records are kept `keep` past their expiry.
  explicit RedisGrantLedger(const GatewayStore& store, Nanos keep = std::chrono::minutes(1))
      : store_(store),
        keep_(keep),
        record_(kGrantRecordLua, store.options().pool, store.options().cluster, {},
                store.options().limits),
        list_(kGrantListLua, store.options().pool, store.options().cluster, {},
              store.options().limits) {}

  absl::Status record(const gateway::GrantRecord& g) {
    auto key = hash_key(g.key);
    if (!key.ok()) return key.status();
    const std::int64_t life = (g.expires_at - g.granted_at + keep_).count();
    const std::int64_t ttl_ms = std::max<std::int64_t>(1, life / 1'000'000 + 1);
    auto reply = record_.run({*key}, {g.grant_id,
                                      absl::StrCat(g.incarnation, " ", g.version, " ", g.units, " ",
                                                   g.granted_at.count(), " ", g.expires_at.count()),
                                      absl::StrCat(g.granted_at.count()),
                                      absl::StrCat(keep_.count()), absl::StrCat(ttl_ms)});
    if (!reply.ok()) return reply.status();
    if ((*reply)->type == REDIS_REPLY_ERROR) {
      return absl::InternalError(
          absl::StrCat("grant record: ", absl::string_view((*reply)->str, (*reply)->len)));
    }
    return absl::OkStatus();
  }

  std::optional<gateway::GrantRecord> replay(std::string_view) { return std::nullopt; }

  // The grants of `key` not expired at the server's time now, by grant id.
  absl::StatusOr<std::vector<gateway::GrantRecord>> outstanding(std::string_view key) {
    auto hash = hash_key(key);
    if (!hash.ok()) return hash.status();
    auto reply = list_.run({*hash}, {});
    if (!reply.ok()) return reply.status();
    const redisReply& r = **reply;
    const auto text = [&](std::size_t i) {
      return absl::string_view(r.element[i]->str, r.element[i]->len);
    };
    std::int64_t sec = 0, usec = 0;
    if (r.type != REDIS_REPLY_ARRAY || r.elements < 2 || r.elements % 2 != 0 ||
        !absl::SimpleAtoi(text(0), &sec) || !absl::SimpleAtoi(text(1), &usec)) {
      return absl::InternalError("grant list: malformed reply");
    }
    const Nanos now{sec * 1'000'000'000 + usec * 1'000};
    std::vector<gateway::GrantRecord> out;
    for (std::size_t i = 2; i + 1 < r.elements; i += 2) {
      gateway::GrantRecord g{.key = std::string(key), .grant_id = std::string(text(i))};
      const std::vector<absl::string_view> f = absl::StrSplit(text(i + 1), ' ');
      std::int64_t granted = 0, expires = 0;
      if (f.size() != 5 || !absl::SimpleAtoi(f[0], &g.incarnation) ||
          !absl::SimpleAtoi(f[1], &g.version) || !absl::SimpleAtoi(f[2], &g.units) ||
          !absl::SimpleAtoi(f[3], &granted) || !absl::SimpleAtoi(f[4], &expires)) {
        return absl::DataLossError(absl::StrCat("grant list: malformed record of ", g.grant_id));
      }
      g.granted_at = Nanos{granted};
      g.expires_at = Nanos{expires};
      if (now < g.expires_at) out.push_back(std::move(g));
    }
    std::sort(out.begin(), out.end(),
              [](const auto& a, const auto& b) { return a.grant_id < b.grant_id; });
    return out;
  }

 private:
  absl::StatusOr<std::string> hash_key(std::string_view key) const {
    auto k = store_.redis_key(key);
    if (!k.ok()) return k.status();
    return absl::StrCat(*k, ":grants");
  }

  const GatewayStore& store_;
  Nanos keep_;
  Script record_;
  Script list_;
};

static_assert(gateway::GrantRecorder<RedisGrantLedger>);

}  // namespace quota::redis
