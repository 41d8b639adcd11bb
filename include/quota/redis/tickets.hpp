// quota/redis/tickets.hpp — estimate tickets kept in Redis: any process settles any ticket, once.
//
// RedisTickets is the gateway::TicketStore (gateway/settle.hpp) of processes that share
// their budgets in Redis (redis::GatewayStore). A Gateway given one (GatewayOptions::
// tickets) writes each estimate's ticket to Redis beside its tenant's budgets — key
// `<prefix>t{tenant}<16 hex digits>`, the tenant's hash slot — so a settle that reaches
// another process behind the load balancer finds it. Each step is one script call on the
// ticket's key, so it is atomic:
//   - issue: a random 64-bit id (an existing key is never overwritten), the tenant, the
//     levels and estimate the settle needs, and an expiry one ttl after issue on the
//     SERVER's clock (one clock for every process); the key is kept for 2·ttl, so a late
//     settle gets DeadlineExceeded rather than NotFound, and is then forgotten by Redis;
//   - take: exactly one caller, whatever process, gets an open ticket of the tenant that
//     names it (the tenant is part of the key); it is marked with that caller's random
//     token. NotFound (unknown, forgotten, another tenant's), FailedPrecondition
//     (settled, or being settled), DeadlineExceeded (past its expiry) change nothing;
//   - done / put_back: the taker (by its token) marks it settled, or open again.
// What is lost is never more budget: a process that dies between take and done leaves the
// ticket taken until Redis forgets it, and its estimate (or what was not yet given back)
// spent; a ticket written by a write that failover loses settles NotFound, its estimate
// spent; an unsettled ticket expires with its estimate kept. The same durability (WAIT
// replicas) and call limits as the GatewayStore's scripts apply.
//
// Thread-safe: ids, the takers' tokens (at most 65,536 settles in flight per process) and
// their generator under one mutex, never held during a call; the connections are the
// pool's or the cluster's.
//
//   auto tickets = std::make_shared<quota::redis::RedisTickets>(store_options);
//   quota::gateway::Gateway gw(store, registry, {.tickets = tickets});
//   auto est = gw.acquire_estimate(req, 4096, now);       // written to Redis
//   other_gw.settle("acme", *est->ticket, 1234, later);   // in any process on that Redis
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <variant>
#include <vector>

#include <hiredis/hiredis.h>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "quota/detail/mutex.hpp"
#include "quota/gateway/settle.hpp"
#include "quota/gateway/store_key.hpp"
#include "quota/redis/gateway_store.hpp"
#include "quota/redis/gateway_store_options.hpp"
#include "quota/redis/transport/reply.hpp"
#include "quota/redis/transport/script.hpp"
#include "quota/units.hpp"

namespace quota::redis {

// The ticket script. KEYS[1]: the ticket. ARGV[1]: the step; ARGV[2]: the tenant.
//   'i' ARGV[3] ttl ms, ARGV[4] the record → {1} written, {0} the key exists
//   't' ARGV[3] the taker's token → {1, record}; {0} unknown, {2} another tenant's,
//       {3} settled or being settled, {4, expiry ms, now ms} expired
//   'd' / 'p' ARGV[3] the taker's token → {1} settled / open again; {0}, {2}, {3} as 't'
inline constexpr const char* kTicketLua = R"lua(
local op, tenant = ARGV[1], ARGV[2]
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if op == 'i' then
  if redis.call('EXISTS', KEYS[1]) == 1 then return {0} end
  local ttl = tonumber(ARGV[3])
  redis.call('HSET', KEYS[1], 's', 'o', 't', tenant, 'x', string.format('%.0f', now + ttl),
             'b', ARGV[4])
  redis.call('PEXPIRE', KEYS[1], 2 * ttl)
  return {1}
end
local v = redis.call('HMGET', KEYS[1], 's', 't', 'x', 'b')
if not v[1] then return {0} end
if v[2] ~= tenant then return {2} end
if op == 't' then
  if v[1] ~= 'o' then return {3} end
  if now > tonumber(v[3]) then return {4, v[3], string.format('%.0f', now)} end
  redis.call('HSET', KEYS[1], 's', ARGV[3])
  return {1, v[4]}
end
if v[1] ~= ARGV[3] then return {3} end
if op == 'd' then
  redis.call('HSET', KEYS[1], 's', 'd')
else
  redis.call('HSET', KEYS[1], 's', 'o')
end
return {1}
)lua";

class RedisTickets final : public gateway::TicketStore {
 public:
  // On `options`' server (its pool, cluster or sentinel, prefix, replicas and limits):
  // give it the options of the GatewayStore whose budgets the tickets settle.
  explicit RedisTickets(const GatewayStoreOptions& options, Nanos ttl = std::chrono::minutes(10))
      : prefix_(options.prefix),
        ttl_(std::max(std::chrono::ceil<std::chrono::milliseconds>(ttl),
                      std::chrono::milliseconds(1))),
        script_(kTicketLua, pool_of(options), options.cluster,
                {.replicas = options.replicas, .timeout = options.replica_timeout},
                options.limits) {}

  Nanos ttl() const override { return ttl_; }

  // Writes `t` (its expires_at is not used: the server's clock dates the ticket).
  absl::StatusOr<gateway::TicketId> issue(gateway::Ticket t, Nanos /*now*/) override {
    if (auto s = gateway::check_id(t.tenant, "tenant"); !s.ok()) return s;
    const std::string record = encode(t);
    // A taken id is drawn again; two draws meeting an existing key is a broken generator.
    for (int tries = 0; tries < 2; ++tries) {
      const gateway::TicketId id = draw();
      auto reply = script_.run(
          {key(t.tenant, id)},
          {"i", t.tenant, absl::StrCat(std::chrono::ceil<std::chrono::milliseconds>(ttl_).count()),
           record});
      auto code = code_of(reply, "issue");
      if (!code.ok()) return code.status();
      if (*code == 1) return id;
    }
    return absl::InternalError("redis tickets: two random ticket ids were both taken");
  }

  absl::StatusOr<gateway::Ticket> take(std::string_view tenant, gateway::TicketId id,
                                       Nanos /*now*/) override {
    if (auto s = gateway::check_id(tenant, "tenant"); !s.ok()) return s;
    const std::string token = absl::StrFormat("k%016x", draw());
    {
      quota::detail::MutexLock lock(mu_);
      if (tokens_.size() >= kMaxTakenAtOnce) {
        return absl::ResourceExhaustedError(absl::StrFormat(
            "redis tickets: %d settles in flight in this process; retry", tokens_.size()));
      }
      if (!tokens_.try_emplace(id, token).second) {
        return absl::FailedPreconditionError(
            absl::StrFormat("ticket %d: already being settled", id));
      }
    }
    auto reply = script_.run({key(tenant, id)}, {"t", std::string(tenant), token});
    auto code = code_of(reply, "take");
    if (!code.ok() || *code != 1) forget_token(id);
    if (!code.ok()) return code.status();
    const redisReply& r = **reply;
    switch (*code) {
      case 1: {
        auto t = r.elements == 2 ? decode(reply_string(*r.element[1])) : std::nullopt;
        if (!t.has_value()) {
          close(tenant, id, "p");
          return absl::InternalError(
              absl::StrFormat("ticket %d: its record in Redis is malformed; nothing settled", id));
        }
        t->tenant = std::string(tenant);
        return *std::move(t);
      }
      case 3:
        return absl::FailedPreconditionError(
            absl::StrFormat("ticket %d: already settled (or being settled)", id));
      case 4:
        return absl::DeadlineExceededError(absl::StrFormat(
            "ticket %d: expired at %s ms (now %s ms, the Redis server's clock); the estimate "
            "stays spent",
            id, r.elements > 1 ? reply_string(*r.element[1]) : "?",
            r.elements > 2 ? reply_string(*r.element[2]) : "?"));
      default:  // 0 (no record of this tenant's) or 2 (the record names another tenant)
        return gateway::unknown_ticket(id, tenant);
    }
  }

  void done(std::string_view tenant, gateway::TicketId id) override { close(tenant, id, "d"); }
  void put_back(std::string_view tenant, gateway::TicketId id) override { close(tenant, id, "p"); }

  // The Redis key of `tenant`'s ticket `id` (tests and operators).
  std::string key(std::string_view tenant, gateway::TicketId id) const {
    return absl::StrFormat("%st{%s}%016x", prefix_, tenant, id);
  }

 private:
  // Settles in flight in this process at once (each from take to done/put_back).
  static constexpr std::size_t kMaxTakenAtOnce = 1 << 16;

  gateway::TicketId draw() {
    quota::detail::MutexLock lock(mu_);
    gateway::TicketId id = 0;
    while (id == 0) id = gen_();
    return id;
  }

  // The integer the script answered first, or the call's error.
  static absl::StatusOr<long long> code_of(const absl::StatusOr<Reply>& reply, const char* step) {
    if (!reply.ok()) return reply.status();
    const redisReply& r = **reply;
    if (r.type == REDIS_REPLY_ERROR) {
      return absl::UnavailableError(
          absl::StrCat("redis tickets (", step, "): ", detail::av(reply_string(r))));
    }
    if (r.type != REDIS_REPLY_ARRAY || r.elements < 1 ||
        r.element[0]->type != REDIS_REPLY_INTEGER) {
      return absl::InternalError(absl::StrCat("redis tickets (", step, "): a malformed reply"));
    }
    return r.element[0]->integer;
  }

  void forget_token(gateway::TicketId id) {
    quota::detail::MutexLock lock(mu_);
    tokens_.erase(id);
  }

  void close(std::string_view tenant, gateway::TicketId id, const char* op) {
    std::string token;
    {
      quota::detail::MutexLock lock(mu_);
      auto it = tokens_.find(id);
      if (it == tokens_.end()) return;
      token = std::move(it->second);
      tokens_.erase(it);
    }
    // A failure leaves the ticket taken: it settles no more, and Redis forgets it.
    (void)script_.run({key(tenant, id)}, {op, std::string(tenant), token});
  }

  // The record: "estimate acquired_ns spent_ns levels" then, per level, "version kind a b
  // c scope_size record_at record_size key_bytes:key" (a, b, c: the policy's parameters).
  static std::string encode(const gateway::Ticket& t) {
    std::string out = absl::StrCat(t.estimate, " ", t.acquired_at.count(), " ", t.spent_at.count(),
                                   " ", t.levels.size());
    for (const gateway::TicketLevel& l : t.levels) {
      const auto [a, b, c] = std::visit(
          [](const auto& p) -> std::tuple<std::int64_t, std::int64_t, std::int64_t> {
            if constexpr (requires { p.burst; }) {
              return {p.rate.units, p.rate.per.count(), p.burst};
            } else {
              return {p.limit, p.window.count(), 0};
            }
          },
          l.policy);
      absl::StrAppend(&out, " ", l.version, " ", l.policy.index(), " ", a, " ", b, " ", c, " ",
                      l.layout.scope_size, " ", l.layout.record_at, " ", l.layout.record_size, " ",
                      l.key.size(), ":", l.key);
    }
    return out;
  }

  // The ticket encode() wrote, or nullopt for anything else.
  static std::optional<gateway::Ticket> decode(std::string_view s) {
    gateway::Ticket t;
    auto next = [&s](auto& v) {
      const std::size_t space = s.find(' ');
      const std::string_view word = s.substr(0, space);
      s = space == std::string_view::npos ? std::string_view() : s.substr(space + 1);
      return absl::SimpleAtoi(detail::av(word), &v);
    };
    std::int64_t acquired = 0, spent = 0;
    std::size_t n = 0;
    if (!next(t.estimate) || !next(acquired) || !next(spent) || !next(n) || n > kGatewayMaxLevels) {
      return std::nullopt;
    }
    t.acquired_at = Nanos{acquired};
    t.spent_at = Nanos{spent};
    for (std::size_t i = 0; i < n; ++i) {
      gateway::TicketLevel l;
      std::size_t kind = 0, key_size = 0;
      std::int64_t a = 0, b = 0, c = 0;
      std::uint32_t scope = 0, at = 0, size = 0;
      if (!next(l.version) || !next(kind) || !next(a) || !next(b) || !next(c) || !next(scope) ||
          !next(at) || !next(size)) {
        return std::nullopt;
      }
      const std::size_t colon = s.find(':');
      if (colon == std::string_view::npos ||
          !absl::SimpleAtoi(detail::av(s.substr(0, colon)), &key_size) ||
          key_size > gateway::kMaxLevelKeyBytes || s.size() - colon - 1 < key_size ||
          scope > key_size || at > key_size ||
          size > key_size - std::min<std::size_t>(at, key_size)) {
        return std::nullopt;
      }
      l.key = std::string(s.substr(colon + 1, key_size));
      s = s.substr(std::min(s.size(), colon + 1 + key_size + 1));
      l.layout = {.scope_size = static_cast<std::uint16_t>(scope),
                  .record_at = static_cast<std::uint16_t>(at),
                  .record_size = static_cast<std::uint16_t>(size)};
      switch (kind) {
        case 0:
          l.policy = TokenBucket{.rate = {.units = a, .per = Nanos{b}}, .burst = c};
          break;
        case 1:
          l.policy = FixedWindow{.limit = a, .window = Nanos{b}};
          break;
        case 2:
          l.policy = SlidingLog{.limit = a, .window = Nanos{b}};
          break;
        case 3:
          l.policy = SlidingWindowEstimate{.limit = a, .window = Nanos{b}};
          break;
        default:
          return std::nullopt;
      }
      t.levels.push_back(std::move(l));
    }
    if (!s.empty()) return std::nullopt;
    return t;
  }

  std::string prefix_;
  Nanos ttl_;
  Script script_;
  quota::detail::Mutex mu_;
  // Seeded from the OS: ids of processes sharing a Redis are drawn independently.
  std::mt19937_64 gen_ ABSL_GUARDED_BY(mu_){std::uint64_t{std::random_device{}()} << 32 |
                                            std::random_device{}()};
  // The tokens of this process's takes not yet done or put back.
  absl::flat_hash_map<gateway::TicketId, std::string> tokens_ ABSL_GUARDED_BY(mu_);
};

}  // namespace quota::redis
