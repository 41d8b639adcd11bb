// quota/redis/grant_ledger.hpp — the record of lease grants in Redis, beside each budget.
//
// `RedisGrantLedger` is the GrantRecorder (lease/grant_ledger.hpp) of a LeasedBackend
// over `GatewayStore`: each grant is written into a hash next to the budget it was taken
// from — `<the key's Redis key>:grants`, in the key's hash slot (one node on a cluster) —
// field = grant id, value = "<incarnation> <version> <units> <granted_at> <expires_at>
// <asked_version> <rule id>" (times in nanoseconds of the server's clock). The write also drops the
// fields that expired more than `keep` ago and sets the hash's TTL, so a key leased for ever keeps
// a bounded record. An operator lists a key's grants still outstanding with `outstanding(key)`, at
// the server's time.
//
// A grant is three script calls: `revoked_below` (below), then one GatewayStore decision
// with the grant id as its attempt (recorded in the same script call, so a retried grant
// is replayed, never taken twice), then the record: a grant whose record failed is still
// held and counted (LeaseCounters::record_failures). `replay` answers nothing: over
// Redis idempotency is the attempt record's.
//
// Revocations (gateway/leases/lease_revocation.hpp) live in one hash, `<prefix>{~lease}revoked`
// (rule id → the version below which its grants are revoked; kept, never expired), and
// are announced on the channel `<prefix>lease:revoked` ("<below> <rule id>"): `revoke`
// raises the rule's version (never lowers it) and PUBLISHes, in one script call, so every
// gateway that installs the same set may call it. `subscribe` starts, on first use, one
// Subscriber (transport/subscriber.hpp) on the pool's ConnectionConfig (or
// RevocationFeed::connection); each message reaches every listener on its thread, and
// after every (re)subscribe the whole hash is read and delivered, so a revocation
// published while the subscription was down reaches the listeners when it is back. While
// it is down (`subscribed()` false), holders learn of a revocation only when the
// authority refuses their next grant: the change reaches them within one expiry. On a
// Redis Cluster the subscription is at one node (a PUBLISH on any node reaches the
// subscribers of every node): at each connect the next node of the cluster's map (the
// seed before a map is loaded), so a node that fails over or leaves holds it down only
// until the next reconnect. A node cut off from the cluster bus but answering keeps the
// subscription up and hears nothing: the same fallback.
//
// Thread safety: any thread (as GatewayStore).
//
//   quota::redis::GatewayStore store({.pool = pool});
//   quota::redis::RedisGrantLedger ledger(store);
//   quota::gateway::LeasedBackend<quota::redis::GatewayStore, quota::redis::RedisGrantLedger>
//       leased(store, ledger);
//   auto grants = ledger.outstanding("{~global}read");   // StatusOr<vector<GrantRecord>>
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "quota/lease/grant_ledger.hpp"
#include "quota/redis/gateway_store.hpp"
#include "quota/redis/transport/script.hpp"
#include "quota/redis/transport/subscriber.hpp"

namespace quota::redis {

// KEYS[1]: the hash. ARGV: grant id, record, its granted_at (ns), keep (ns), TTL (ms).
// Fields that expired before granted_at - keep are dropped (expires_at: the 5th field).
inline constexpr const char* kGrantRecordLua = R"lua(
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
local horizon = tonumber(ARGV[3]) - tonumber(ARGV[4])
local all = redis.call('HGETALL', KEYS[1])
for i = 1, #all, 2 do
  local expires = tonumber(string.match(all[i + 1], '^%S+ %S+ %S+ %S+ (%d+)'))
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

// KEYS[1]: the revocations hash. ARGV: rule id, below, channel. The rule's version only
// rises; the one standing is published ("<below> <rule id>") and returned.
inline constexpr const char* kRevokeLua = R"lua(
local below = tonumber(ARGV[2])
local cur = tonumber(redis.call('HGET', KEYS[1], ARGV[1]) or '0')
if below > cur then
  redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
  cur = below
end
redis.call('PUBLISH', ARGV[3], string.format('%d', cur) .. ' ' .. ARGV[1])
return string.format('%d', cur)
)lua";

// KEYS[1]: the revocations hash. ARGV[1]: a rule id, or nothing for all of them.
inline constexpr const char* kRevokedLua = R"lua(
if ARGV[1] then return redis.call('HGET', KEYS[1], ARGV[1]) or '0' end
return redis.call('HGETALL', KEYS[1])
)lua";

// Where the ledger's revocation subscription connects, and how it watches the link
// (transport/subscriber.hpp).
struct RevocationFeed {
  // Default: the store's pool's config, or on a cluster each node of its map in turn;
  // given, always this one.
  std::optional<ConnectionConfig> connection{};
  std::chrono::milliseconds ping_every{1000};
  std::chrono::milliseconds backoff_min{10};
  std::chrono::milliseconds backoff_max{1000};
};

class RedisGrantLedger {
 public:
  // `store` must outlive the ledger. Records are kept `keep` past their expiry.
  explicit RedisGrantLedger(const GatewayStore& store, Nanos keep = std::chrono::minutes(1),
                            RevocationFeed feed = {})
      : store_(store),
        keep_(keep),
        feed_(std::move(feed)),
        record_(kGrantRecordLua, store.options().pool, store.options().cluster, {},
                store.options().limits),
        list_(kGrantListLua, store.options().pool, store.options().cluster, {},
              store.options().limits),
        revoke_(kRevokeLua, store.options().pool, store.options().cluster, {},
                store.options().limits),
        revoked_(kRevokedLua, store.options().pool, store.options().cluster, {},
                 store.options().limits) {}
  ~RedisGrantLedger() {
    std::unique_ptr<Subscriber> sub;
    {
      std::lock_guard<std::mutex> lock(listeners_mu_);
      sub = std::move(subscriber_);
    }
    sub.reset();  // stopped and joined outside the lock its callbacks take
  }
  RedisGrantLedger(const RedisGrantLedger&) = delete;
  RedisGrantLedger& operator=(const RedisGrantLedger&) = delete;

  // -- Revocations (RevocationAuthority) --

  absl::Status revoke(const Revocation& r) {
    auto reply =
        revoke_.run({revocations_key()}, {r.rule, absl::StrCat(r.below), revocations_channel()});
    if (!reply.ok()) return reply.status();
    if ((*reply)->type == REDIS_REPLY_ERROR) {
      return absl::InternalError(
          absl::StrCat("revoke: ", absl::string_view((*reply)->str, (*reply)->len)));
    }
    return absl::OkStatus();
  }

  absl::StatusOr<std::uint64_t> revoked_below(std::string_view rule) {
    auto reply = revoked_.run({revocations_key()}, {std::string(rule)});
    if (!reply.ok()) return reply.status();
    std::uint64_t below = 0;
    if ((*reply)->type != REDIS_REPLY_STRING ||
        !absl::SimpleAtoi(absl::string_view((*reply)->str, (*reply)->len), &below)) {
      return absl::InternalError("revoked_below: malformed reply");
    }
    return below;
  }

  // Every revocation recorded, by rule id.
  absl::StatusOr<std::vector<Revocation>> revocations() {
    auto reply = revoked_.run({revocations_key()}, {});
    if (!reply.ok()) return reply.status();
    const redisReply& r = **reply;
    if (r.type != REDIS_REPLY_ARRAY || r.elements % 2 != 0) {
      return absl::InternalError("revocations: malformed reply");
    }
    std::vector<Revocation> out;
    for (std::size_t i = 0; i + 1 < r.elements; i += 2) {
      Revocation rev{.rule = std::string(reply_string(*r.element[i])), .below = 0};
      if (!absl::SimpleAtoi(detail::av(reply_string(*r.element[i + 1])), &rev.below)) {
        return absl::DataLossError(absl::StrCat("revocations: malformed version of ", rev.rule));
      }
      out.push_back(std::move(rev));
    }
    return out;
  }

  std::uint64_t subscribe(RevocationListener fn) {
    std::lock_guard<std::mutex> lock(listeners_mu_);
    listeners_.emplace_back(++last_listener_, std::move(fn));
    const GatewayStoreOptions& so = store_.options();
    if (subscriber_ == nullptr &&
        (feed_.connection || so.pool != nullptr || so.cluster != nullptr)) {
      SubscriberOptions o{.connection = feed_.connection     ? *feed_.connection
                                        : so.pool != nullptr ? so.pool->config()
                                                             : so.cluster->config(),
                          .connect_to = {},
                          .channels = {revocations_channel()},
                          .ping_every = feed_.ping_every,
                          .backoff_min = feed_.backoff_min,
                          .backoff_max = feed_.backoff_max};
      if (!feed_.connection && so.pool == nullptr) o.connect_to = next_node(so.cluster);
      subscriber_ = std::make_unique<Subscriber>(
          std::move(o), [this](std::string_view, std::string_view m) { heard(m); },
          [this] { return caught_up(); });
    }
    return last_listener_;
  }
  void unsubscribe(std::uint64_t id) {
    std::lock_guard<std::mutex> lock(listeners_mu_);
    std::erase_if(listeners_, [&](const auto& l) { return l.first == id; });
  }

  // Whether the revocation subscription is up now, and how many times it came up.
  bool subscribed() const {
    std::lock_guard<std::mutex> lock(listeners_mu_);
    return subscriber_ != nullptr && subscriber_->subscribed();
  }
  std::uint64_t subscriptions() const {
    std::lock_guard<std::mutex> lock(listeners_mu_);
    return subscriber_ == nullptr ? 0 : subscriber_->subscriptions();
  }

  absl::Status record(const GrantRecord& g) {
    auto key = hash_key(g.key);
    if (!key.ok()) return key.status();
    const std::int64_t life = (g.expires_at - g.granted_at + keep_).count();
    const std::int64_t ttl_ms = std::max<std::int64_t>(1, life / 1'000'000 + 1);
    auto reply = record_.run(
        {*key},
        {g.grant_id,
         absl::StrCat(g.incarnation, " ", g.version, " ", g.units, " ", g.granted_at.count(), " ",
                      g.expires_at.count(), " ", g.asked_version, " ", g.rule),
         absl::StrCat(g.granted_at.count()), absl::StrCat(keep_.count()), absl::StrCat(ttl_ms)});
    if (!reply.ok()) return reply.status();
    if ((*reply)->type == REDIS_REPLY_ERROR) {
      return absl::InternalError(
          absl::StrCat("grant record: ", absl::string_view((*reply)->str, (*reply)->len)));
    }
    return absl::OkStatus();
  }

  std::optional<GrantRecord> replay(std::string_view) { return std::nullopt; }

  // The grants of `key` not expired at the server's time now, by grant id.
  absl::StatusOr<std::vector<GrantRecord>> outstanding(std::string_view key) {
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
    std::vector<GrantRecord> out;
    for (std::size_t i = 2; i + 1 < r.elements; i += 2) {
      GrantRecord g{.key = std::string(key), .grant_id = std::string(text(i))};
      const std::vector<absl::string_view> f = absl::StrSplit(text(i + 1), absl::MaxSplits(' ', 6));
      std::int64_t granted = 0, expires = 0;
      if ((f.size() != 5 && f.size() != 7) || !absl::SimpleAtoi(f[0], &g.incarnation) ||
          !absl::SimpleAtoi(f[1], &g.version) || !absl::SimpleAtoi(f[2], &g.units) ||
          !absl::SimpleAtoi(f[3], &granted) || !absl::SimpleAtoi(f[4], &expires)) {
        return absl::DataLossError(absl::StrCat("grant list: malformed record of ", g.grant_id));
      }
      if (f.size() == 7) {
        if (!absl::SimpleAtoi(f[5], &g.asked_version)) {
          return absl::DataLossError(absl::StrCat("grant list: malformed record of ", g.grant_id));
        }
        g.rule = std::string(f[6]);
      }
      g.granted_at = Nanos{granted};
      g.expires_at = Nanos{expires};
      if (now < g.expires_at) out.push_back(std::move(g));
    }
    // Revoked: the rules' revocations (another slot: one more call per rule listed).
    std::vector<std::pair<std::string, std::uint64_t>> below;
    for (auto& g : out) {
      if (g.rule.empty()) continue;
      auto it = std::find_if(below.begin(), below.end(),
                             [&](const auto& b) { return b.first == g.rule; });
      if (it == below.end()) {
        auto v = revoked_below(g.rule);
        if (!v.ok()) return v.status();
        it = below.insert(below.end(), {g.rule, *v});
      }
      g.revoked = g.asked_version < it->second;
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

  std::string revocations_key() const {
    return absl::StrCat(store_.options().prefix, "{~lease}revoked");
  }
  std::string revocations_channel() const {
    return absl::StrCat(store_.options().prefix, "lease:revoked");
  }

  // A message "<below> <rule id>" from the channel.
  void heard(std::string_view message) {
    const std::size_t space = message.find(' ');
    Revocation r{};
    if (space == std::string_view::npos ||
        !absl::SimpleAtoi(detail::av(message.substr(0, space)), &r.below)) {
      return;  // not ours: nothing to drop
    }
    r.rule = std::string(message.substr(space + 1));
    deliver(r);
  }

  // Where a subscription on a cluster connects: the node after the last one it connected
  // to, by host and port, among those of the cluster's map (called on the subscriber's
  // thread only), so a reconnect moves on from a node that failed or left.
  static std::function<ConnectionConfig()> next_node(std::shared_ptr<ClusterPool> cluster) {
    return [cluster = std::move(cluster), last = std::make_shared<std::pair<std::string, int>>()] {
      std::vector<ConnectionConfig> nodes = cluster->node_configs();
      const auto key = [](const ConnectionConfig& c) { return std::tie(c.host, c.port); };
      std::sort(nodes.begin(), nodes.end(),
                [&](const auto& a, const auto& b) { return key(a) < key(b); });
      auto it = std::find_if(nodes.begin(), nodes.end(), [&](const ConnectionConfig& c) {
        return key(c) > std::tie(last->first, last->second);
      });
      const ConnectionConfig next = it != nodes.end() ? *it : nodes.front();
      *last = {next.host, next.port};
      return next;
    };
  }

  // After each (re)subscribe: what may have been published while it was down. A failed
  // read fails the subscription (the Subscriber tries again after its backoff; meanwhile
  // the authority refuses the next grant under an older version).
  bool caught_up() {
    auto all = revocations();
    if (!all.ok()) return false;
    for (const auto& r : *all) deliver(r);
    return true;
  }

  void deliver(const Revocation& r) {
    std::lock_guard<std::mutex> lock(listeners_mu_);
    for (const auto& [id, fn] : listeners_) fn(r);
  }

  const GatewayStore& store_;
  Nanos keep_;
  RevocationFeed feed_;
  Script record_;
  Script list_;
  Script revoke_;
  Script revoked_;
  mutable std::mutex listeners_mu_;
  std::uint64_t last_listener_ = 0;
  std::vector<std::pair<std::uint64_t, RevocationListener>> listeners_;
  std::unique_ptr<Subscriber> subscriber_;
};

static_assert(GrantRecorder<RedisGrantLedger>);
static_assert(RevocationAuthority<RedisGrantLedger>);

}  // namespace quota::redis
