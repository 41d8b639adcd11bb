// examples/quota_server/backend/checker.hpp — one rate-limit check, the part gRPC and HTTP share.
//
// A CheckRequest names a tenant, its plan, an optional user, a route class of the rule
// file and an optional cost. Checker::resolve() fills the server's defaults
// (--default-plan, --default-route) and validates everything up front — ids, the route on
// the rule set's whitelist, a tenant rule that applies, the cost within [1, --max-cost] —
// so that bad input is an InvalidArgument (or NotFound: no tenant rule) naming the field,
// with nothing deducted. Checker::check() then decides with one quota::gateway::Gateway:
// over a ShardedStore<KeyPolicy> in process, or with --redis over the leased backend of
// redis_leases.hpp on a redis::GatewayStore (budgets shared by every server on that Redis;
// a rule without `lease:` passes through to Redis, a request with an attempt id is
// decided there with its record shared by every server; a Redis that cannot answer gives
// the route's fail mode, kUnavailable when it fails closed; a Redis that refuses AUTH is
// kUnavailable; in process `lease:` is ignored, with a note on stderr once). With Redis
// each fair-share budget is divided among --fair-share-holders servers (fair_exchange.hpp).
// So:
//   - no cost: Gateway::decide, every budget paying what the rule file says;
//   - a cost c: every budget the route pays by estimate or by its default `cost` pays c
//     (gateway::Request::cost); budgets with a fixed `costs` entry pay that entry;
//   - an estimate e (given, or the route's prompt_factor of prompt_tokens and max_output):
//     Gateway::acquire_estimate, e paid as a cost would be, and a ticket that settle()
//     settles once with the actual. With Redis the tickets live there beside the tenant's
//     budgets (quota/redis/tickets.hpp): any server settles any server's ticket.
// The answer carries the Gateway's Result (decision, deciding rule, version) and what the
// protocols need of the deciding rule: its RateLimit-Policy description (quota/http.hpp)
// and its rate as "units per period" (Envoy's current_limit). With envoyproxy/ratelimit
// rules (LoadedRules::envoy, envoy_rules.hpp) only check_envoy() decides: the matched
// limit keyed by the domain and the descriptor's entries, on the in-process store or, with
// Redis, one GatewayStore decision on that key (envoy_redis.hpp: shared by every server).
//
// Thread safety: resolve() and check() may be called from any thread at once (the store
// is sharded, the Gateway thread-safe on it). A check runs under a Pin: publish() (a hot
// reload) waits until no Pin is held, so every decision taken under one Pin — all the
// descriptors of one gRPC call — uses one whole rule set, and its rule, rate and version
// are that set's.
//
//   quota::server::Checker checker(rules, {.max_cost = 1000});
//   auto req = checker.resolve({.tenant = "acme", .plan = "free", .route = "read"});
//   if (!req.ok()) return req.status();            // nothing deducted
//   auto pin = checker.pin();
//   auto c = checker.check(pin, *req, clock.now());  // c->result.decision.allowed, ...
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "quota/clock.hpp"
#include "quota/gateway/gateway.hpp"
#include "quota/gateway/key_state.hpp"
#include "quota/gateway/rules/rule_registry.hpp"
#include "quota/gateway/rules/rules.hpp"
#include "quota/http.hpp"
#include "quota/redis/transport/node_watch.hpp"
#include "quota/store/sharded_store.hpp"
#include "rules/envoy_rules.hpp"

namespace quota::gateway {
class LeaseMetrics;
}  // namespace quota::gateway

namespace quota::server {

class CountedRedisStore;  // counted_redis_store.hpp
struct RedisLeases;       // redis_leases.hpp
struct RedisMemory;       // redis_memory.hpp

struct CheckRequest {
  std::string tenant{};
  std::string plan{};                  // "" → --default-plan
  std::string user{};                  // optional: enables user-level rules
  std::string route{};                 // "" → --default-route
  std::optional<std::int64_t> cost{};  // absent: the rule file's costs
  std::string attempt_id{};            // optional: a retry replays the first decision
  // An estimate: units deducted now and settled later with the actual (settle()): given,
  // or the route's estimate of an LLM call's prompt tokens and max output (its
  // prompt_factor: quota/gateway/rules/estimate_formula.hpp). Never with `cost`.
  std::optional<std::int64_t> estimate{};
  std::optional<std::int64_t> prompt_tokens{};
  std::optional<std::int64_t> max_output{};
};

struct CheckerOptions {
  std::string default_plan{};
  std::string default_route{};
  std::int64_t max_cost = 1'000'000;  // the largest cost one request may ask for
  std::size_t max_keys = 10'000'000;  // the store's bound on keys
  // Budgets in Redis (quota/redis/gateway_store.hpp through counted_redis_store.hpp),
  // shared by every server on it; null: in process. Must outlive the Checker.
  CountedRedisStore* redis = nullptr;
  // With Redis: the servers dividing each fair-share budget and this server's name among
  // them (fair_exchange.hpp). In process only 1 (options.hpp refuses more).
  std::int64_t fair_share_holders = 1;
  std::string instance_id{};
  // How long an estimate's ticket may be settled (GatewayOptions::ticket_ttl); with Redis
  // the tickets live there (quota/redis/tickets.hpp), so any server settles any ticket.
  Nanos ticket_ttl{std::chrono::minutes(10)};
  // In process: a budget the store creates starts with its whole budget spent at this
  // time (StoreOptions::assume_spent_at), so that a restarted server admits nothing the
  // contract would not have admitted over both lives. nullopt: budgets start full.
  std::optional<Nanos> budgets_spent_at = std::nullopt;
};

// A rule's rate as Envoy describes a limit: `units` per `per` (a token bucket's refill
// rate; a window policy's limit per window).
struct RateInfo {
  std::int64_t units = 0;
  Nanos per{0};
};

// The rules a Checker decides with: quota's rule set, or an envoyproxy/ratelimit file
// (envoy_rules.hpp; then `rules` is null).
struct LoadedRules {
  std::shared_ptr<const gateway::RuleSet> rules{};
  std::shared_ptr<const EnvoyRules> envoy{};
  std::uint64_t version() const { return envoy ? envoy->version : rules->version(); }
};

// One descriptor decided by an envoyproxy/ratelimit file: its limit (null: none applies,
// or another matched limit replaces it) and, when limited, the store's decision.
struct EnvoyChecked {
  const EnvoyRateLimit* limit = nullptr;
  Decision decision{};
};

struct Checked {
  gateway::Result result{};
  // An admitted estimate's ticket, for settle().
  std::optional<gateway::TicketId> ticket{};
  // The deciding rule (Result::rule) described for the RateLimit headers and Envoy's
  // current_limit; absent when the decision names no rule of the set (a route's
  // per-request cap).
  std::optional<http::PolicyInfo> policy{};
  std::optional<RateInfo> rate{};
};

// A time the APIs answer in whole milliseconds: rounded up; -1 for never.
inline std::int64_t ceil_ms(Nanos d) {
  if (d == kNever) return -1;
  if (d.count() <= 0) return 0;
  return d.count() / 1'000'000 + (d.count() % 1'000'000 != 0);
}

// The rate of a gateway rule policy (see RateInfo).
inline RateInfo rate_of(const gateway::RulePolicy& p) {
  return std::visit(
      [](const auto& x) -> RateInfo {
        if constexpr (requires { x.rate; }) {
          return {.units = x.rate.units, .per = x.rate.per};
        } else {
          return {.units = x.limit, .per = x.window};
        }
      },
      p);
}

class Checker {
 public:
  using Store = ShardedStore<gateway::KeyPolicy>;

  // `rules` were built counting into `metrics`; both must outlive the Checker.
  Checker(std::shared_ptr<const gateway::RuleSet> rules, CheckerOptions options);

  // Decides with `loaded`: quota's rule set, or an envoyproxy/ratelimit file (then only
  // check_envoy() decides; resolve() refuses every request).
  Checker(LoadedRules loaded, CheckerOptions options);

  ~Checker();  // out of line: RedisLeases is complete in checker.cpp only

  // `req` with the server's defaults filled in, validated against the rules in force
  // (see the top of this file). Decides nothing.
  absl::StatusOr<CheckRequest> resolve(CheckRequest req) const;

  // Held while deciding: no rule set is published meanwhile (see the top of this file).
  using Pin = std::shared_lock<std::shared_mutex>;
  Pin pin() const { return Pin(publish_mu_); }

  // Decides a request resolve() returned, under `pin`. Errors: those of the Gateway (an attempt id
  // reused with another cost, ...), kUnavailable when Redis refuses AUTH; a store that cannot
  // decide is a decision with reason kUnavailable (fail closed) or kFailOpen, per the route's fail
  // mode.
  absl::StatusOr<Checked> check(const Pin& pin, const CheckRequest& req, Nanos now);

  // Settles `tenant`'s ticket (of a check with an estimate) with the actual units, once
  // (quota/gateway/settle.hpp): NotFound (unknown, forgotten or another tenant's),
  // FailedPrecondition (settled already), DeadlineExceeded (expired: the
  // estimate stays spent; the Redis transport never answers DeadlineExceeded, so it
  // always means this), InvalidArgument (an actual outside [0, --max-cost], a tenant id
  // that is not one) change nothing; Unavailable: the store could not settle it now.
  absl::StatusOr<gateway::SettleResult> settle(std::string_view tenant, gateway::TicketId ticket,
                                               std::int64_t actual, Nanos now);

  // Whether the budget store can decide now (GET /readyz): in process always; with Redis,
  // a probe decision of 1 unit on a key of its own ("readyz", a bucket that never runs
  // dry) through the same store, connections and guards as every check — so a Redis that
  // is down, refuses AUTH, evicts keys or runs its clock ahead is not ready. At most one
  // probe per `kReadyProbeEvery`; callers in between get the last answer.
  static constexpr Nanos kReadyProbeEvery{std::chrono::seconds(1)};
  absl::Status store_ready(Nanos now);

  // The version of the rule set in force.
  std::uint64_t rule_version() const {
    return envoy_mode() ? envoy_version_.load(std::memory_order_relaxed)
                        : registry_.current()->version();
  }

  // The lease counters (quota_lease_* on /metrics); null in process (nothing is leased).
  const gateway::LeaseMetrics* lease_metrics() const;
  // With Redis, each primary's memory in use and limit (redis_memory.hpp); empty in
  // process.
  std::vector<RedisMemory> redis_memory() const;
  // With Redis, the failovers its connections saw (node_watch.hpp: a node with another
  // identity at a reconnect); nullopt in process.
  std::optional<redis::NodeWatchStats> redis_nodes() const;
  // Whether the revocation subscription is up (with Redis); nullopt in process.
  std::optional<bool> revocations_subscribed() const;

  // What each fair-share budget of the rules in force holds (quota_fair_share_* on
  // /metrics).
  std::vector<gateway::FairLimitStats> fair_shares() const;

  // An operator's release of `rule`'s reserve to `tenant`, `units` for `duration` from
  // `now` (the admin API): Gateway::release_reserve, at this server (with several
  // servers, each one's part of the reserve: release at each).
  absl::Status release_reserve(std::string_view rule, std::string_view tenant, std::int64_t units,
                               Nanos duration, Nanos now);
  // The reserve releases kept (quota_fair_share_reserve_* on /metrics).
  std::vector<gateway::ReserveRelease> reserve_releases() const;

  // True when the rules are an envoyproxy/ratelimit file (fixed at construction).
  bool envoy_mode() const { return envoy_version_.load(std::memory_order_relaxed) > 0; }

  // The envoyproxy/ratelimit rules in force while `pin` is held (null in quota's format).
  const EnvoyRules* envoy_rules([[maybe_unused]] const Pin& pin) const { return envoy_.get(); }

  // Decides `cost` units for a descriptor's entries with the envoyproxy/ratelimit rules,
  // under `pin`. `replaced`: names of limits another descriptor of the call replaces.
  // The budget of a descriptor is keyed by the domain and its entries, keys and values.
  absl::StatusOr<EnvoyChecked> check_envoy(
      const Pin& pin, std::span<const std::pair<std::string, std::string>> entries,
      std::int64_t cost, std::span<const std::string> replaced, Nanos now);

  // Makes `next` the rules in force once no check is pinned: FailedPrecondition unless
  // its version is greater, or when its format is not the one the Checker started with;
  // with Redis, an envoyproxy/ratelimit file whose limits Redis cannot keep is refused.
  absl::Status publish(LoadedRules next);

 private:
  // The Gateway's rule set while the rules are an envoyproxy/ratelimit file: one route
  // class, no rules (every Gateway check fails; resolve() refuses first).
  static std::shared_ptr<const gateway::RuleSet> placeholder_rules();

  // In process there is nothing to lease from: `lease:` options are noted once, and the
  // rules decide as unleased. (On Redis the backend is leased: a rule without a lease
  // passes through it to Redis.)
  void note_ignored_leases(const gateway::RuleSet& rules);

  // On a route with a prompt_factor, a request without a cost or estimate of its own gets
  // the estimate of its prompt_tokens and max_output as its estimate (both required);
  // elsewhere, and beside a cost or an estimate, those two are refused. A cost and an
  // estimate are exclusive.
  static absl::Status fill_estimate(const gateway::RuleSet& rules, CheckRequest& req);

  static gateway::Identity identity(const CheckRequest& req) {
    return {.tenant = req.tenant, .plan = req.plan, .user = req.user};
  }

  // Finds the deciding rule among the budgets of `req` (by name) and describes it.
  void describe(const CheckRequest& req, Checked& out) const;

  CheckerOptions options_;
  mutable std::shared_mutex publish_mu_;  // shared: a check; exclusive: publish()
  Store store_;
  gateway::RuleRegistry registry_;
  std::unique_ptr<RedisLeases> leases_;  // with Redis
  // Over store_ in process; with Redis over the leased backend of leases_.
  std::unique_ptr<gateway::Gateway> gateway_;
  std::atomic<bool> lease_noted_{false};
  std::shared_ptr<const EnvoyRules> envoy_;  // guarded by publish_mu_ (read under a Pin)
  std::mutex ready_mu_;                      // the last store_ready() probe:
  absl::Status ready_;
  bool ready_probed_ = false;
  Nanos ready_probed_at_{0};
  std::atomic<std::uint64_t> envoy_version_{0};
};

}  // namespace quota::server
