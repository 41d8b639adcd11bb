// examples/quota_server/shared_rules.hpp — one rule set for every quota-server, kept in
// Redis: what is stored where, and the four calls on it.
//
// `quota-server publish` stores a rule file's text under a new version; every server
// started with --rules-from-redis decides with the latest version (rule_subscriber.hpp)
// and writes a heartbeat; `quota-server instances` lists the heartbeats
// (rules_admin.hpp). Two keys, both with the hash tag {NAME} (--rules-key, default
// quota-rules), so they share one slot and a Redis Cluster node:
//   {NAME}:rules      hash: version (decimal, the rule set's version), format (quota or
//                     envoy), text (the rule file), published_ms (Redis's clock)
//   {NAME}:instances  hash: instance id → "APPLIED_VERSION TIME_MS ADDRESS" (TIME_MS on
//                     Redis's clock); a field older than kForgetInstance is removed by the
//                     next heartbeat of any instance, the key expires after it
// Every call is one Lua script (redis::Script: standalone, Cluster or the Sentinels'
// primary), so it is atomic: publish() is a compare-and-set on the version — it stores
// only when the version in Redis is still the one the publisher validated against — so
// versions only grow and a published text is always one that validated whole.
//
// Errors: a Redis that cannot answer is kUnavailable (AUTH refused: kUnauthenticated);
// a publish that lost the race with another is kAborted; a malformed entry kDataLoss.
//
// Thread safety: every method may be called from any thread (redis::Script).
//
//   quota::server::SharedRules shared(connections, "quota-rules");
//   auto latest = shared.fetch(/*known=*/0);       // version, format and text
//   shared.heartbeat({.id = "host:123", .applied = 4, .address = "127.0.0.1:8080"});
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "quota/redis/transport/reply.hpp"
#include "quota/redis/transport/script.hpp"
#include "redis_backend.hpp"

namespace quota::server {

// A heartbeat older than this is forgotten (milliseconds of Redis's clock).
inline constexpr std::int64_t kForgetInstanceMs = 60'000;

// The published rule set as fetch() reads it. `text` and `format` are empty when the
// version is the one the caller already knows (or 0: nothing published).
struct PublishedRules {
  std::uint64_t version = 0;
  std::string format{};
  std::string text{};
};

// One instance's heartbeat: its id, the version it applied, where it serves.
struct Heartbeat {
  std::string id{};
  std::uint64_t applied = 0;
  std::string address{};
};

// A heartbeat as instances() lists it, with its age on Redis's clock.
struct InstanceEntry {
  Heartbeat beat{};
  std::int64_t age_ms = 0;
};

struct InstanceList {
  std::uint64_t published = 0;  // the latest published version (0: none)
  std::vector<InstanceEntry> instances{};
};

namespace detail {

// ARGV: the version the caller knows. Returns {version} when it is still that one (or
// {"0"}: nothing published), else {version, format, text}.
inline constexpr const char* kFetchScript = R"lua(
local v = redis.call('HGET', KEYS[1], 'version')
if not v then return {'0'} end
if v == ARGV[1] then return {v} end
local t = redis.call('HMGET', KEYS[1], 'format', 'text')
return {v, t[1], t[2]}
)lua";

// ARGV: the version validated against, the new version, format, text. Stores when the
// version in Redis is still the first argument; else the error "CONFLICT <version>".
inline constexpr const char* kPublishScript = R"lua(
local v = redis.call('HGET', KEYS[1], 'version') or '0'
if v ~= ARGV[1] then return redis.error_reply('CONFLICT ' .. v) end
local t = redis.call('TIME')
redis.call('HSET', KEYS[1], 'version', ARGV[2], 'format', ARGV[3], 'text', ARGV[4],
           'published_ms', tostring(t[1] * 1000 + math.floor(t[2] / 1000)))
return ARGV[2]
)lua";

// KEYS: the instances hash. ARGV: id, applied version, address, forget after (ms).
inline constexpr const char* kHeartbeatScript = R"lua(
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2] .. ' ' .. now .. ' ' .. ARGV[3])
local all = redis.call('HGETALL', KEYS[1])
for i = 1, #all, 2 do
  local at = tonumber(string.match(all[i + 1], '^%d+ (%d+)'))
  if at == nil or now - at > tonumber(ARGV[4]) then redis.call('HDEL', KEYS[1], all[i]) end
end
redis.call('PEXPIRE', KEYS[1], ARGV[4])
return tostring(now)
)lua";

// KEYS: the instances hash, the rules hash. Returns {now_ms, published version, id,
// value, id, value, ...}.
inline constexpr const char* kInstancesScript = R"lua(
local t = redis.call('TIME')
local out = {tostring(t[1] * 1000 + math.floor(t[2] / 1000)),
             redis.call('HGET', KEYS[2], 'version') or '0'}
local all = redis.call('HGETALL', KEYS[1])
for i = 1, #all do out[#out + 1] = all[i] end
return out
)lua";

inline std::string element(const redisReply& r, std::size_t i) {
  return i < r.elements && r.element[i] != nullptr ? std::string(redis::reply_string(*r.element[i]))
                                                   : std::string();
}

}  // namespace detail

class SharedRules {
 public:
  // `connections`: one of pool, cluster, sentinel set (redis_backend.hpp). `name`: the
  // keys' hash tag (--rules-key).
  SharedRules(const RedisConnections& connections, std::string name)
      : rules_key_(absl::StrCat("{", name, "}:rules")),
        instances_key_(absl::StrCat("{", name, "}:instances")),
        fetch_(script(detail::kFetchScript, connections)),
        publish_(script(detail::kPublishScript, connections)),
        heartbeat_(script(detail::kHeartbeatScript, connections)),
        instances_(script(detail::kInstancesScript, connections)) {}

  const std::string& rules_key() const { return rules_key_; }
  const std::string& instances_key() const { return instances_key_; }

  // The latest published version; with its format and text unless it is `known`.
  absl::StatusOr<PublishedRules> fetch(std::uint64_t known) {
    auto r = fetch_->run({rules_key_}, {absl::StrCat(known)});
    if (!r.ok()) return r.status();
    if (absl::Status s = redis::error_status(**r); !s.ok()) return s;
    const redisReply& reply = **r;
    PublishedRules out;
    if (reply.type != REDIS_REPLY_ARRAY || (reply.elements != 1 && reply.elements != 3) ||
        !absl::SimpleAtoi(detail::element(reply, 0), &out.version)) {
      return absl::DataLossError(absl::StrCat("redis ", rules_key_, ": malformed rules entry"));
    }
    if (reply.elements == 3) {
      out.format = detail::element(reply, 1);
      out.text = detail::element(reply, 2);
    }
    return out;
  }

  // Stores `text` (in `format`) as version `next` if the version in Redis is still
  // `validated_against`; kAborted naming the version found otherwise.
  absl::Status publish(std::uint64_t validated_against, std::uint64_t next, std::string_view format,
                       std::string_view text) {
    auto r = publish_->run({rules_key_}, {absl::StrCat(validated_against), absl::StrCat(next),
                                          std::string(format), std::string(text)});
    if (!r.ok()) return r.status();
    if (redis::is_error(**r, "CONFLICT")) {
      return absl::AbortedError(absl::StrCat(
          "another publish got in first: ", std::string(redis::reply_string(**r).substr(9)),
          " is published"));
    }
    return redis::error_status(**r);
  }

  // Writes `beat`, dated by Redis's clock, and forgets heartbeats older than
  // kForgetInstanceMs.
  absl::Status heartbeat(const Heartbeat& beat) {
    auto r = heartbeat_->run({instances_key_}, {beat.id, absl::StrCat(beat.applied), beat.address,
                                                absl::StrCat(kForgetInstanceMs)});
    if (!r.ok()) return r.status();
    return redis::error_status(**r);
  }

  // The heartbeats, with their ages, and the latest published version.
  absl::StatusOr<InstanceList> instances() {
    auto r = instances_->run({instances_key_, rules_key_}, {});
    if (!r.ok()) return r.status();
    if (absl::Status s = redis::error_status(**r); !s.ok()) return s;
    const redisReply& reply = **r;
    InstanceList out;
    std::int64_t now_ms = 0;
    if (reply.type != REDIS_REPLY_ARRAY || reply.elements < 2 || reply.elements % 2 != 0 ||
        !absl::SimpleAtoi(detail::element(reply, 0), &now_ms) ||
        !absl::SimpleAtoi(detail::element(reply, 1), &out.published)) {
      return absl::DataLossError(absl::StrCat("redis ", instances_key_, ": malformed reply"));
    }
    for (std::size_t i = 2; i + 1 < reply.elements; i += 2) {
      const std::vector<std::string> parts =
          absl::StrSplit(detail::element(reply, i + 1), absl::MaxSplits(' ', 2));
      InstanceEntry e;
      std::int64_t at_ms = 0;
      e.beat.id = detail::element(reply, i);
      if (parts.size() < 2 || !absl::SimpleAtoi(parts[0], &e.beat.applied) ||
          !absl::SimpleAtoi(parts[1], &at_ms)) {
        continue;  // not a heartbeat of this version of the server: not listed
      }
      if (parts.size() == 3) e.beat.address = parts[2];
      e.age_ms = now_ms - at_ms;
      out.instances.push_back(std::move(e));
    }
    return out;
  }

 private:
  static std::unique_ptr<redis::Script> script(const char* text, const RedisConnections& c) {
    return std::make_unique<redis::Script>(text, c.sentinel ? c.sentinel->pool() : c.pool,
                                           c.cluster);
  }

  const std::string rules_key_;
  const std::string instances_key_;
  const std::unique_ptr<redis::Script> fetch_, publish_, heartbeat_, instances_;
};

}  // namespace quota::server
