// examples/quota_server/rules/shared_rules.hpp — one rule set for every quota-server, kept in
// Redis: what is stored where, and the four calls on it.
//
// `quota-server publish` stores a rule file's text under a new version; every server
// started with --rules-from-redis decides with the latest version (rule_subscriber.hpp)
// and writes a heartbeat; `quota-server instances` lists the heartbeats
// (rules_admin.hpp). Two keys, both with the hash tag {NAME} (--rules-key, default
// quota-rules), so they share one slot and a Redis Cluster node:
//   {NAME}:rules      hash: version (decimal, the rule set's version), format (quota or
//                     envoy), text (the rule file), digest (rules_digest, 16 hex digits),
//                     published_ms (Redis's clock)
//   {NAME}:instances  hash: instance id → "APPLIED_VERSION TIME_MS ADDRESS digest=HEX"
//                     and, while it refuses the published version, " refused=VERSION:HEX"
//                     (TIME_MS on Redis's clock); a field older than kForgetInstance is
//                     removed by the next heartbeat of any instance, the key expires after it
//
// The digest names the rules, the version only their place in the sequence: after Redis
// lost its data a publish starts again at version 1, and a version a server already
// applied can come back with other rules. A server compares both (rule_subscriber.hpp).
// It is FNV-1a 64 of the format, a newline and the exact text: stable across processes
// and builds (absl::Hash is seeded per process), in the code already (no hashing library
// for one call; Debian's abseil has no absl/crc), and 64 bits make an accidental match of
// two rule sets negligible. It is no defence against someone who can write the keys: they
// can publish any rules anyway.
//
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
//   auto latest = shared.fetch(/*known=*/0);       // version, digest, format and text
//   shared.heartbeat({.id = "host:123", .applied = 4, .address = "127.0.0.1:8080",
//                     .digest = latest->digest});
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "backend/redis_backend.hpp"
#include "quota/redis/transport/reply.hpp"
#include "quota/redis/transport/script.hpp"

namespace quota::server {

// A heartbeat older than this is forgotten (milliseconds of Redis's clock).
inline constexpr std::int64_t kForgetInstanceMs = 60'000;

// The digest of a rule set published as `format` with `text`: FNV-1a 64 of the format, a
// newline and the text (0 is never returned: it means "none" in the structs below).
inline std::uint64_t rules_digest(std::string_view format, std::string_view text) {
  std::uint64_t h = 14695981039346656037ull;  // FNV-1a 64's offset basis and prime
  const auto add = [&h](std::string_view bytes) {
    for (const char c : bytes) {
      h ^= static_cast<unsigned char>(c);
      h *= 1099511628211ull;
    }
  };
  add(format);
  add("\n");
  add(text);
  return h == 0 ? 1 : h;
}

// A digest as it is stored, logged and shown: 16 lowercase hex digits ("none" for 0).
inline std::string digest_hex(std::uint64_t digest) {
  return digest == 0 ? std::string("none") : absl::StrCat(absl::Hex(digest, absl::kZeroPad16));
}

// The published rule set as fetch() reads it. `text` and `format` are empty when the
// version and digest are the ones the caller already knows (or version 0: nothing
// published, digest 0).
struct PublishedRules {
  std::uint64_t version = 0;
  std::uint64_t digest = 0;
  std::string format{};
  std::string text{};
};

// A published version and its digest (0, 0: none).
struct RulesId {
  std::uint64_t version = 0;
  std::uint64_t digest = 0;
  friend bool operator==(const RulesId&, const RulesId&) = default;
};

// One instance's heartbeat: its id, the version and digest it applied, where it serves,
// and the published version it refuses (rule_subscriber.hpp; version 0: none).
struct Heartbeat {
  std::string id{};
  std::uint64_t applied = 0;
  std::string address{};
  std::uint64_t digest = 0;
  RulesId refused{};
};

// A heartbeat as instances() lists it, with its age on Redis's clock.
struct InstanceEntry {
  Heartbeat beat{};
  std::int64_t age_ms = 0;
};

struct InstanceList {
  std::uint64_t published = 0;         // the latest published version (0: none)
  std::uint64_t published_digest = 0;  // its digest (0: none)
  std::vector<InstanceEntry> instances{};
};

namespace detail {

// ARGV: the version and digest (hex) the caller knows. Returns {version, digest} when
// they are still those ({"0", ""}: nothing published; a digest "" when the entry has
// none, and then the version alone decides), else {version, digest, format, text}.
inline constexpr const char* kFetchScript = R"lua(
local r = redis.call('HMGET', KEYS[1], 'version', 'digest')
local v, d = r[1], r[2] or ''
if not v then return {'0', ''} end
if v == ARGV[1] and (d == '' or d == ARGV[2]) then return {v, d} end
local t = redis.call('HMGET', KEYS[1], 'format', 'text')
return {v, d, t[1], t[2]}
)lua";

// ARGV: the version validated against, the new version, format, text, digest. Stores
// when the version in Redis is still the first argument; else the error
// "CONFLICT <version>".
inline constexpr const char* kPublishScript = R"lua(
local v = redis.call('HGET', KEYS[1], 'version') or '0'
if v ~= ARGV[1] then return redis.error_reply('CONFLICT ' .. v) end
local t = redis.call('TIME')
redis.call('HSET', KEYS[1], 'version', ARGV[2], 'format', ARGV[3], 'text', ARGV[4],
           'digest', ARGV[5], 'published_ms', tostring(t[1] * 1000 + math.floor(t[2] / 1000)))
return ARGV[2]
)lua";

// KEYS: the instances hash. ARGV: id, applied version, the rest of the value (address
// and digests), forget after (ms).
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

// KEYS: the instances hash, the rules hash. Returns {now_ms, published version, its
// digest, format, text, id, value, id, value, ...}; format and text are "" unless the
// entry has no digest (then the caller computes it).
inline constexpr const char* kInstancesScript = R"lua(
local t = redis.call('TIME')
local r = redis.call('HMGET', KEYS[2], 'version', 'digest', 'format', 'text')
local out = {tostring(t[1] * 1000 + math.floor(t[2] / 1000)), r[1] or '0', r[2] or '', '', ''}
if r[1] and not r[2] then out[4], out[5] = r[3] or '', r[4] or '' end
local all = redis.call('HGETALL', KEYS[1])
for i = 1, #all do out[#out + 1] = all[i] end
return out
)lua";

inline std::string element(const redisReply& r, std::size_t i) {
  return i < r.elements && r.element[i] != nullptr ? std::string(redis::reply_string(*r.element[i]))
                                                   : std::string();
}

// Debian's abseil has its own string_view, not std's.
inline absl::string_view absl_view(std::string_view v) { return {v.data(), v.size()}; }

// A stored digest: 16 hex digits, or "" (an entry without one: 0).
inline bool parse_digest(std::string_view hex, std::uint64_t* digest) {
  *digest = 0;
  return hex.empty() ||
         (hex.size() == 16 && absl::SimpleHexAtoi(absl_view(hex), digest) && *digest != 0);
}

// The heartbeat value's rest ("ADDRESS digest=HEX[ refused=VERSION:HEX]") for `beat`.
inline std::string heartbeat_rest(const Heartbeat& beat) {
  std::string out = absl::StrCat(beat.address, " digest=", digest_hex(beat.digest));
  if (beat.refused.version != 0) {
    absl::StrAppend(&out, " refused=", beat.refused.version, ":", digest_hex(beat.refused.digest));
  }
  return out;
}

// Reads a heartbeat value's words after APPLIED_VERSION TIME_MS into `beat`: the address
// (the first word that is not KEY=VALUE) and the digests. A heartbeat written before the
// digests existed has none (0); a word this server does not know is skipped.
inline void read_heartbeat_rest(std::span<const std::string> words, Heartbeat& beat) {
  constexpr std::string_view kDigest = "digest=", kRefused = "refused=";
  bool address = false;
  for (const std::string_view w : words) {
    if (w.starts_with(kDigest)) {
      parse_digest(w.substr(kDigest.size()), &beat.digest);
    } else if (w.starts_with(kRefused)) {
      const std::size_t colon = w.find(':');
      if (colon == std::string_view::npos ||
          !absl::SimpleAtoi(absl_view(w.substr(kRefused.size(), colon - kRefused.size())),
                            &beat.refused.version) ||
          !parse_digest(w.substr(colon + 1), &beat.refused.digest)) {
        beat.refused = {};
      }
    } else if (!address && w.find('=') == std::string_view::npos) {
      beat.address = std::string(w);
      address = true;
    }
  }
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

  // The latest published version and its digest; with its format and text unless they
  // are `known`. An entry without a digest (written before digests, or by hand) gets the
  // digest of its text, and is compared by version alone.
  absl::StatusOr<PublishedRules> fetch(RulesId known) {
    auto r = fetch_->run({rules_key_}, {absl::StrCat(known.version),
                                        known.digest == 0 ? "" : digest_hex(known.digest)});
    if (!r.ok()) return r.status();
    if (absl::Status s = redis::error_status(**r); !s.ok()) return s;
    const redisReply& reply = **r;
    PublishedRules out;
    if (reply.type != REDIS_REPLY_ARRAY || (reply.elements != 2 && reply.elements != 4) ||
        !absl::SimpleAtoi(detail::element(reply, 0), &out.version) ||
        !detail::parse_digest(detail::element(reply, 1), &out.digest)) {
      return absl::DataLossError(absl::StrCat("redis ", rules_key_, ": malformed rules entry"));
    }
    if (reply.elements == 4) {
      out.format = detail::element(reply, 2);
      out.text = detail::element(reply, 3);
      if (out.digest == 0) out.digest = rules_digest(out.format, out.text);
    } else if (out.digest == 0 && out.version != 0) {
      out.digest = known.digest;  // no digest stored, and the version is the known one
    }
    return out;
  }
  // The same, knowing only a version (or nothing: 0).
  absl::StatusOr<PublishedRules> fetch(std::uint64_t known_version) {
    return fetch(RulesId{.version = known_version});
  }

  // Stores `text` (in `format`) as version `next`, with its digest, if the version in
  // Redis is still `validated_against`; kAborted naming the version found otherwise.
  absl::Status publish(std::uint64_t validated_against, std::uint64_t next, std::string_view format,
                       std::string_view text) {
    auto r = publish_->run(
        {rules_key_}, {absl::StrCat(validated_against), absl::StrCat(next), std::string(format),
                       std::string(text), digest_hex(rules_digest(format, text))});
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
    auto r = heartbeat_->run({instances_key_},
                             {beat.id, absl::StrCat(beat.applied), detail::heartbeat_rest(beat),
                              absl::StrCat(kForgetInstanceMs)});
    if (!r.ok()) return r.status();
    return redis::error_status(**r);
  }

  // The heartbeats, with their ages, and the latest published version and digest.
  absl::StatusOr<InstanceList> instances() {
    auto r = instances_->run({instances_key_, rules_key_}, {});
    if (!r.ok()) return r.status();
    if (absl::Status s = redis::error_status(**r); !s.ok()) return s;
    const redisReply& reply = **r;
    InstanceList out;
    std::int64_t now_ms = 0;
    if (reply.type != REDIS_REPLY_ARRAY || reply.elements < 5 || reply.elements % 2 != 1 ||
        !absl::SimpleAtoi(detail::element(reply, 0), &now_ms) ||
        !absl::SimpleAtoi(detail::element(reply, 1), &out.published) ||
        !detail::parse_digest(detail::element(reply, 2), &out.published_digest)) {
      return absl::DataLossError(absl::StrCat("redis ", instances_key_, ": malformed reply"));
    }
    if (out.published != 0 && out.published_digest == 0) {
      out.published_digest = rules_digest(detail::element(reply, 3), detail::element(reply, 4));
    }
    for (std::size_t i = 5; i + 1 < reply.elements; i += 2) {
      const std::string value = detail::element(reply, i + 1);
      const std::vector<std::string> words = absl::StrSplit(value, ' ', absl::SkipEmpty());
      InstanceEntry e;
      std::int64_t at_ms = 0;
      e.beat.id = detail::element(reply, i);
      if (words.size() < 2 || !absl::SimpleAtoi(words[0], &e.beat.applied) ||
          !absl::SimpleAtoi(words[1], &at_ms)) {
        continue;  // not a heartbeat of this version of the server: not listed
      }
      detail::read_heartbeat_rest(std::span(words).subspan(2), e.beat);
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
