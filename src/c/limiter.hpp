// src/c/limiter.hpp — what one quota_handle holds: rules, a store and the Gateway on it.
//
// Limiter::open() checks a quota_config and builds, from the C++ library's parts: the rule
// set (quota::rules: a file or its text, counting into the limiter's Metrics), the store
// (a ShardedStore in process, its budgets spent at open unless
// QUOTA_OPT_OUT_RESTART_SAFETY; or a redis::GatewayStore on one server, a Cluster or
// Sentinel, with failover safety, the clock-step guard, the eviction check and the
// breaker on unless opted out, WAIT durability and coalescing when asked, under a
// LeasedBackend so that rules with `lease:` are leased; in QUOTA_MODE_NON_BLOCKING that
// backend posts every grant request to a RenewalThread of the limiter's and refuses rules
// without `lease: {mode: on}`), and one gateway::Gateway over it. decide(), settle(),
// reload() and metrics() are the C calls after their arguments were read (quota.cpp
// checks pointers and reads the structs at the caller's size, struct_size.hpp;
// the strings are read here, each with its field's name in errors).
//
// Guarantees: those of the Gateway (gateway.hpp): all or nothing over the levels, attempts
// replayed, an estimate settled once, a reload whole or not at all. Nothing throws: the
// C++ library reports by absl::Status and quota.cpp catches what the standard library
// may still throw (std::bad_alloc).
//
// Thread safety: every member from any thread at once (the Gateway's and the store's).
//
//   auto limiter = Limiter::open(config);       // an error names the field or rule
//   quota_decision d{.size = sizeof d};
//   absl::Status s = (*limiter)->decide(request, d);
#pragma once

#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "quota/c/quota.h"
#include "quota/clock.hpp"
#include "quota/gateway/gateway.hpp"
#include "quota/gateway/leases/lease_metrics.hpp"
#include "quota/gateway/leases/lease_revocation.hpp"
#include "quota/gateway/leases/leased_backend.hpp"
#include "quota/gateway/metrics.hpp"
#include "quota/http.hpp"
#include "quota/lease/renewal_thread.hpp"
#include "quota/redis/gateway_store.hpp"
#include "quota/redis/gateway_store_setup.hpp"
#include "quota/redis/grant_ledger.hpp"
#include "quota/rules/rule_file.hpp"
#include "quota/store/sharded_store.hpp"

namespace quota::c_api {

// The bytes of `s`, named `field` in errors: InvalidArgument for a null pointer with a
// length, more than `max` bytes, or a NUL inside (a length that covers a terminator).
inline absl::StatusOr<std::string_view> read(quota_str s, std::string_view field, std::size_t max) {
  if (s.data == nullptr) {
    if (s.len == 0) return std::string_view{};
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: a null pointer with a length of %d", field, s.len));
  }
  if (s.len > max) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: %d bytes, at most %d", field, s.len, max));
  }
  if (const void* nul = std::memchr(s.data, 0, s.len); nul != nullptr) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: a NUL byte at offset %d of %d (does the length count a terminator?)",
                        field, static_cast<const char*>(nul) - s.data, s.len));
  }
  return std::string_view(s.data, s.len);
}

// "host:port[,host:port...]" as endpoints; `field` names it in errors.
inline absl::StatusOr<std::vector<redis::Endpoint>> endpoints(std::string_view text,
                                                              std::string_view field) {
  std::vector<redis::Endpoint> out;
  if (text.empty())
    return absl::InvalidArgumentError(absl::StrFormat("%s: no address given", field));
  for (absl::string_view a : absl::StrSplit(quota::detail::to_absl(text), ',')) {
    const std::size_t colon = a.rfind(':');
    int port = 0;
    if (colon == absl::string_view::npos || colon == 0 ||
        !absl::SimpleAtoi(a.substr(colon + 1), &port) || port < 1 || port > 65535) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s: \"%s\" is not host:port (port 1-65535)", field, a));
    }
    out.push_back({.host = std::string(a.substr(0, colon)), .port = port});
  }
  return out;
}

// A request's own time (QUOTA_REQUEST_NOW), in [0, kMaxNow] (the library's clock reads
// from 0; the bound keeps every sum of a time and a period within 64 bits), else the
// monotonic clock.
inline constexpr std::int64_t kMaxNow = std::int64_t{1} << 62;
inline absl::StatusOr<Nanos> time_of(std::uint32_t flags, std::int64_t now_ns) {
  if ((flags & QUOTA_REQUEST_NOW) == 0) return SteadyClock{}.now();
  if (now_ns < 0 || now_ns > kMaxNow) {
    return absl::InvalidArgumentError(
        absl::StrFormat("now_ns: %d, outside [0, 2^62] (quota_now_ns()'s clock)", now_ns));
  }
  return Nanos(now_ns);
}

// One rule's RateLimit fields as far as they are fixed: the RateLimit-Policy value and
// the quoted name RateLimit starts with (quota/http.hpp), formatted once per rule set.
struct PolicyFields {
  std::string policy;  // `"name";q=100;w=60`
  std::string name;    // `"name"`

  static std::optional<PolicyFields> of(std::string_view rule, const gateway::RulePolicy& p) {
    auto info = http::describe(rule, p);
    if (!info.ok()) return std::nullopt;
    return PolicyFields{.policy = http::policy_field(*info),
                        .name = http::detail::sf_string(info->name)};
  }
};

// The fields of every rule name of one rule set; nullopt for a name two rules with
// different policies share (found by planning the request instead).
struct Policies {
  std::uint64_t version = 0;
  absl::flat_hash_map<std::string, std::optional<PolicyFields>> by_name;

  static std::shared_ptr<const Policies> of(const gateway::RuleSet& rules) {
    auto out = std::make_shared<Policies>();
    out->version = rules.version();
    rules.for_each_rule([&](const gateway::Rule& r) {
      std::optional<PolicyFields> fields = PolicyFields::of(r.name, r.policy);
      auto [it, added] = out->by_name.try_emplace(r.name, fields);
      if (!added && (!it->second.has_value() || !fields.has_value() ||
                     it->second->policy != fields->policy)) {
        it->second = std::nullopt;
      }
    });
    return out;
  }
};

class Limiter {
 public:
  using Leased = gateway::LeasedBackend<redis::GatewayStore, redis::RedisGrantLedger>;

  static absl::StatusOr<std::unique_ptr<Limiter>> open(const quota_config& c) {
    auto out = std::unique_ptr<Limiter>(new Limiter(c));
    auto rules = out->load(c.rules_path, c.rules_text, "rules_path", "rules_text");
    if (!rules.ok()) return rules.status();
    if (auto s = out->open_store(c); !s.ok()) return s;
    if (auto s = out->store_takes(**rules); !s.ok()) return s;
    out->set_policies(Policies::of(**rules));
    out->registry_ = std::make_unique<gateway::RuleRegistry>(*std::move(rules));
    if (out->redis_ != nullptr) {
      out->ledger_ = std::make_unique<redis::RedisGrantLedger>(*out->redis_);
      if (out->non_blocking_) out->renewals_ = std::make_unique<quota::detail::RenewalThread>();
      out->leased_ =
          std::make_unique<Leased>(*out->redis_, *out->ledger_,
                                   gateway::LeasedBackendOptions{.metrics = &out->lease_metrics_,
                                                                 .renewals = out->renewals_.get()});
      gateway::revoke_on_publish(*out->registry_, *out->ledger_);
      out->gateway_ = std::make_unique<gateway::Gateway>(*out->leased_, *out->registry_);
    } else {
      out->gateway_ = std::make_unique<gateway::Gateway>(*out->memory_, *out->registry_);
    }
    return out;
  }

  absl::Status decide(const quota_request& r, quota_decision& out) {
    auto tenant = read(r.tenant, "tenant", QUOTA_MAX_ID_BYTES);
    auto plan = read(r.plan, "plan", QUOTA_MAX_NAME_BYTES);
    auto user = read(r.user, "user", QUOTA_MAX_ID_BYTES);
    auto route = read(r.route, "route", QUOTA_MAX_NAME_BYTES);
    auto attempt = read(r.attempt_id, "attempt_id", QUOTA_MAX_ATTEMPT_ID_BYTES);
    for (const auto* s : {&tenant, &plan, &user, &route, &attempt}) {
      if (!s->ok()) return s->status();
    }
    if (tenant->empty()) return absl::InvalidArgumentError("tenant: empty");
    if (plan->empty()) return absl::InvalidArgumentError("plan: empty");
    if (route->empty()) return absl::InvalidArgumentError("route: empty");
    if ((r.flags & ~kRequestFlags) != 0) {
      return absl::InvalidArgumentError(
          absl::StrFormat("flags: unknown bits 0x%x", r.flags & ~kRequestFlags));
    }
    const bool with_cost = (r.flags & QUOTA_REQUEST_COST) != 0;
    const bool with_estimate = (r.flags & QUOTA_REQUEST_ESTIMATE) != 0;
    if (with_cost && with_estimate) {
      return absl::InvalidArgumentError("flags: a cost and an estimate, at most one");
    }
    if (with_cost && r.cost < 1) {
      return absl::InvalidArgumentError(absl::StrFormat("cost: %d, at least 1", r.cost));
    }
    if (with_estimate && r.estimate < 1) {
      return absl::InvalidArgumentError(absl::StrFormat("estimate: %d, at least 1", r.estimate));
    }
    const gateway::Request req{
        .who = {.tenant = *tenant, .plan = *plan, .user = *user},
        .route = *route,
        .cost = with_cost ? std::optional<std::int64_t>(r.cost) : std::nullopt,
        .attempt_id = *attempt};
    const auto at = time_of(r.flags, r.now_ns);
    if (!at.ok()) return at.status();
    const Nanos now = *at;
    std::uint64_t ticket = 0;
    gateway::Result result;
    if (with_estimate) {
      auto e = gateway_->acquire_estimate(req, r.estimate, now);
      if (!e.ok()) return e.status();
      result = {.decision = e->decision, .rule = std::move(e->rule), .request_cap = e->request_cap};
      ticket = e->ticket.value_or(0);
    } else {
      auto d = gateway_->decide(req, now);
      if (!d.ok()) return d.status();
      result = *std::move(d);
    }
    fill(result, ticket, out);
    if ((r.flags & QUOTA_REQUEST_HTTP) != 0) {
      answer(req, with_estimate ? std::optional(r.estimate) : req.cost, result, out);
    }
    return absl::OkStatus();
  }

  absl::StatusOr<gateway::SettleResult> settle(const quota_settle_request& r) {
    if ((r.flags & ~std::uint32_t{QUOTA_REQUEST_NOW}) != 0) {
      return absl::InvalidArgumentError(
          absl::StrFormat("flags: 0x%x, only QUOTA_REQUEST_NOW", r.flags));
    }
    if (r.actual < 0) {
      return absl::InvalidArgumentError(absl::StrFormat("actual: %d, at least 0", r.actual));
    }
    const auto at = time_of(r.flags, r.now_ns);
    if (!at.ok()) return at.status();
    auto tenant = read(r.tenant, "tenant", QUOTA_MAX_ID_BYTES);
    if (!tenant.ok()) return tenant.status();
    auto settled = gateway_->settle(*tenant, r.ticket, r.actual, *at);
    if (settled.status().code() == absl::StatusCode::kDeadlineExceeded) {
      // The ticket expired (not the store): a precondition of the call.
      return absl::FailedPreconditionError(settled.status().message());
    }
    return settled;
  }

  // Loads and publishes a new rule set; its version, or why nothing changed.
  absl::StatusOr<std::uint64_t> reload(quota_str path, quota_str text) {
    std::lock_guard<std::mutex> lock(reload_mu_);  // one successor of the set in force
    auto next = load(path, text, "path", "text");
    if (!next.ok()) return next.status();
    if (auto s = store_takes(**next); !s.ok()) return s;
    const std::uint64_t version = (*next)->version();
    auto described = Policies::of(**next);
    if (auto s = registry_->publish(*std::move(next)); !s.ok()) return s;
    set_policies(std::move(described));
    return version;
  }

  ~Limiter() {
    if (renewals_ != nullptr) renewals_->stop();  // no grant lands on a backend being destroyed
  }

  std::string metrics() const {
    std::string out = gateway::render_prometheus(metrics_);
    if (leased_ != nullptr) out += gateway::render_prometheus(lease_metrics_);
    return out;
  }

 private:
  static constexpr std::uint32_t kRequestFlags =
      QUOTA_REQUEST_COST | QUOTA_REQUEST_ESTIMATE | QUOTA_REQUEST_NOW | QUOTA_REQUEST_HTTP;
  static constexpr std::uint32_t kOptOuts =
      QUOTA_OPT_OUT_RESTART_SAFETY | QUOTA_OPT_OUT_FAILOVER_SAFETY | QUOTA_OPT_OUT_CLOCK_GUARD |
      QUOTA_OPT_OUT_EVICTION_CHECK | QUOTA_OPT_OUT_BREAKER;

  explicit Limiter(const quota_config& c)
      : opt_out_(c.opt_out), non_blocking_(c.mode == QUOTA_MODE_NON_BLOCKING) {}

  // The rule set of a file (`path`) or of text, exactly one; without a `version:` a
  // reload's set is the next version.
  absl::StatusOr<std::shared_ptr<const gateway::RuleSet>> load(quota_str path, quota_str text,
                                                               std::string_view path_field,
                                                               std::string_view text_field) {
    auto p = read(path, path_field, 4096);
    if (!p.ok()) return p.status();
    auto t = read(text, text_field, QUOTA_MAX_RULES_BYTES);
    if (!t.ok()) return t.status();
    if (p->empty() == t->empty()) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s and %s: exactly one must be given", path_field, text_field));
    }
    std::string yaml;
    std::string name = "rules";
    if (!p->empty()) {
      name = std::string(*p);
      auto read_text = rules::detail::read_file(name);
      if (!read_text.ok()) return read_text.status();
      yaml = *std::move(read_text);
      if (yaml.size() > QUOTA_MAX_RULES_BYTES) {
        return absl::InvalidArgumentError(
            absl::StrFormat("%s: %d bytes, at most %d", name, yaml.size(), QUOTA_MAX_RULES_BYTES));
      }
    } else {
      yaml = std::string(*t);
    }
    if (registry_ == nullptr) return rules::load_rules(yaml, name, &metrics_);
    return rules::load_next_rules(registry_->current()->version(), yaml, name, &metrics_);
  }

  absl::Status open_store(const quota_config& c) {
    if (c.store < QUOTA_STORE_IN_PROCESS || c.store > QUOTA_STORE_REDIS_SENTINEL) {
      return absl::InvalidArgumentError(absl::StrFormat("store: unknown kind %d", c.store));
    }
    const auto kind = static_cast<quota_store_kind>(c.store);
    if (c.max_keys < 0) return absl::InvalidArgumentError("max_keys: below 0");
    if ((c.opt_out & ~kOptOuts) != 0) {
      return absl::InvalidArgumentError(
          absl::StrFormat("opt_out: unknown bits 0x%x", c.opt_out & ~kOptOuts));
    }
    if (c.mode != QUOTA_MODE_BLOCKING && c.mode != QUOTA_MODE_NON_BLOCKING) {
      return absl::InvalidArgumentError(absl::StrFormat("mode: unknown mode %d", c.mode));
    }
    if (non_blocking_ && kind == QUOTA_STORE_IN_PROCESS) {
      return absl::InvalidArgumentError(
          "mode: QUOTA_MODE_NON_BLOCKING is for a Redis store (in process nothing blocks)");
    }
    if (kind == QUOTA_STORE_IN_PROCESS) {
      // Durability and coalescing asked of a store that has neither: refused, not ignored.
      for (const auto& [field, value] :
           {std::pair{"redis_replicas", c.redis_replicas},
            std::pair{"redis_replica_timeout_ms", c.redis_replica_timeout_ms},
            std::pair{"redis_coalesce", c.redis_coalesce},
            std::pair{"redis_coalesce_calls", c.redis_coalesce_calls}}) {
        if (value != 0) {
          return absl::InvalidArgumentError(absl::StrFormat(
              "%s: %d, but the store is in process (a Redis store's option)", field, value));
        }
      }
      const bool fresh = (c.opt_out & QUOTA_OPT_OUT_RESTART_SAFETY) != 0;
      memory_ = std::make_unique<ShardedStore<gateway::KeyPolicy>>(StoreOptions{
          .max_keys = c.max_keys == 0 ? 1'000'000 : static_cast<std::size_t>(c.max_keys),
          .assume_spent_at = fresh ? Nanos::min() : SteadyClock{}.now()});
      return absl::OkStatus();
    }
    if (kind != QUOTA_STORE_REDIS && kind != QUOTA_STORE_REDIS_CLUSTER &&
        kind != QUOTA_STORE_REDIS_SENTINEL) {
      return absl::InvalidArgumentError(absl::StrFormat("store: unknown kind %d", c.store));
    }
    if (c.redis_deadline_ms < 0 || c.redis_deadline_ms > 60'000) {
      return absl::InvalidArgumentError("redis_deadline_ms: outside [0, 60000]");
    }
    if (c.redis_connections < 0 || c.redis_connections > 1024) {
      return absl::InvalidArgumentError("redis_connections: outside [0, 1024]");
    }
    if (auto s = check_durability(c); !s.ok()) return s;
    auto addresses = read(c.redis_addresses, "redis_addresses", 4096);
    auto master = read(c.redis_sentinel_master, "redis_sentinel_master", 256);
    auto username = read(c.redis_username, "redis_username", 256);
    auto password = read(c.redis_password, "redis_password", 4096);
    auto sentinel_password = read(c.redis_sentinel_password, "redis_sentinel_password", 4096);
    for (const auto* s : {&addresses, &master, &username, &password, &sentinel_password}) {
      if (!s->ok()) return s->status();
    }
    auto nodes = endpoints(*addresses, "redis_addresses");
    if (!nodes.ok()) return nodes.status();
    if (kind == QUOTA_STORE_REDIS && nodes->size() != 1) {
      return absl::InvalidArgumentError("redis_addresses: one host:port for QUOTA_STORE_REDIS");
    }
    if (kind == QUOTA_STORE_REDIS_SENTINEL && master->empty()) {
      return absl::InvalidArgumentError(
          "redis_sentinel_master: empty (QUOTA_STORE_REDIS_SENTINEL needs the name)");
    }
    redis::RedisSetup setup{.topology = kind == QUOTA_STORE_REDIS ? redis::RedisTopology::kServer
                                        : kind == QUOTA_STORE_REDIS_CLUSTER
                                            ? redis::RedisTopology::kCluster
                                            : redis::RedisTopology::kSentinel,
                            .nodes = *std::move(nodes),
                            .sentinel_master = std::string(*master),
                            .username = std::string(*username),
                            .password = std::string(*password),
                            .sentinel_password = std::string(*sentinel_password)};
    if (c.redis_deadline_ms > 0) setup.deadline = std::chrono::milliseconds(c.redis_deadline_ms);
    if (c.redis_connections > 0) setup.connections = static_cast<std::size_t>(c.redis_connections);
    setup.replicas = static_cast<int>(c.redis_replicas);
    if (c.redis_replica_timeout_ms > 0)
      setup.replica_timeout = std::chrono::milliseconds(c.redis_replica_timeout_ms);
    setup.coalesce = static_cast<int>(c.redis_coalesce);
    if (c.redis_coalesce_calls > 0) setup.coalesce_calls = static_cast<int>(c.redis_coalesce_calls);
    // The safe defaults of RedisSetup, each opt-out bit turning one off.
    if ((c.opt_out & QUOTA_OPT_OUT_BREAKER) != 0) setup.breaker_failures = 0;
    setup.allow_evicting = (c.opt_out & QUOTA_OPT_OUT_EVICTION_CHECK) != 0;
    setup.failover_safety = (c.opt_out & QUOTA_OPT_OUT_FAILOVER_SAFETY) == 0;
    if ((c.opt_out & QUOTA_OPT_OUT_CLOCK_GUARD) != 0)
      setup.clock_guard = std::chrono::milliseconds(0);
    redis_ = redis::make_gateway_store(setup);
    if (auto s = redis::probe(*redis_, "c-open", 0, SteadyClock{}.now()); !s.ok()) {
      // Options the store refused (it answers every call so, before any I/O) are the
      // caller's to fix; anything else is the store not reachable now.
      if (s.code() == absl::StatusCode::kInvalidArgument) {
        return absl::InvalidArgumentError(absl::StrCat("redis options: ", s.message()));
      }
      return absl::UnavailableError(absl::StrCat("the store cannot decide: ", s.message()));
    }
    return absl::OkStatus();
  }

  // WAIT and coalescing (ABI 2's fields): within the bounds quota-server's flags take
  // (gateway_store_setup.hpp), and not set where the C fields' 0 means "off" would make
  // them meaningless. The store checks the rest when it is built (a WAIT timeout below the
  // call's deadline, the coalescing range): open_store() reports that as InvalidArgument.
  static absl::Status check_durability(const quota_config& c) {
    if (c.redis_replicas < 0 || c.redis_replicas > redis::kMaxReplicas) {
      return absl::InvalidArgumentError(absl::StrFormat("redis_replicas: %d, outside [0, %d]",
                                                        c.redis_replicas, redis::kMaxReplicas));
    }
    if (c.redis_replica_timeout_ms < 0 ||
        c.redis_replica_timeout_ms > redis::kMaxReplicaTimeout.count()) {
      return absl::InvalidArgumentError(
          absl::StrFormat("redis_replica_timeout_ms: %d, outside [0, %d]",
                          c.redis_replica_timeout_ms, redis::kMaxReplicaTimeout.count()));
    }
    if (c.redis_replicas == 0 && c.redis_replica_timeout_ms != 0) {
      return absl::InvalidArgumentError("redis_replica_timeout_ms: set without redis_replicas");
    }
    if (c.redis_coalesce_calls < 0 || c.redis_coalesce_calls > redis::kMaxCoalesceCalls) {
      return absl::InvalidArgumentError(absl::StrFormat("redis_coalesce_calls: %d, outside [0, %d]",
                                                        c.redis_coalesce_calls,
                                                        redis::kMaxCoalesceCalls));
    }
    if (c.redis_coalesce < 2 && c.redis_coalesce_calls != 0) {
      return absl::InvalidArgumentError("redis_coalesce_calls: set without redis_coalesce >= 2");
    }
    return absl::OkStatus();
  }

  // Whether the store can decide every rule of `rules` (a Redis store: each policy, and
  // no sliding_log under failover safety); errors name the rule.
  absl::Status store_takes(const gateway::RuleSet& rules) const {
    if (redis_ == nullptr) return absl::OkStatus();
    if ((opt_out_ & QUOTA_OPT_OUT_FAILOVER_SAFETY) == 0) {
      if (const gateway::Rule* r = redis::refused_under_failover_safety(rules)) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "rule \"%s\" is a sliding_log, which failover safety does not take (after a "
            "failover its log cannot be read as spent); use another policy, or "
            "QUOTA_OPT_OUT_FAILOVER_SAFETY",
            r->name));
      }
    }
    absl::Status out;
    rules.for_each_rule([&](const gateway::Rule& r) {
      if (!out.ok()) return;
      if (non_blocking_ && r.lease.mode != gateway::LeaseMode::kOn) {
        out = absl::InvalidArgumentError(absl::StrFormat(
            "rule \"%s\" has no `lease: {mode: on}`, which QUOTA_MODE_NON_BLOCKING needs of "
            "every rule (each level is decided from grants held, never by a round trip)",
            r.name));
        return;
      }
      if (auto s = redis::GatewayStore::check(r.policy); !s.ok()) {
        out = absl::InvalidArgumentError(absl::StrFormat("rule \"%s\": %s", r.name, s.message()));
      }
    });
    return out;
  }

  static void fill(const gateway::Result& r, std::uint64_t ticket, quota_decision& out) {
    const Decision& d = r.decision;
    out.allowed = d.allowed ? 1 : 0;
    out.reason = static_cast<std::int32_t>(d.reason);
    out.remaining = d.remaining;
    out.retry_after_ns = d.retry_after == kNever ? -1 : d.retry_after.count();
    out.reset_after_ns = d.reset_after.count();
    out.rule_version = d.version;
    out.ticket = ticket;
    out.replayed = r.replayed ? 1 : 0;
    out.rule_len = std::min(r.rule.size(), std::size_t{QUOTA_MAX_NAME_BYTES});
    std::memcpy(out.rule, r.rule.data(), out.rule_len);
    out.rule[out.rule_len] = '\0';
    out.http_status = 0;
    out.retry_after_s = -1;
    out.ratelimit[0] = out.ratelimit_policy[0] = '\0';
    out.ratelimit_len = out.ratelimit_policy_len = 0;
  }

  // The rule set's policy descriptions (set at open and at each reload).
  std::shared_ptr<const Policies> policies() const {
    std::lock_guard<std::mutex> lock(policies_mu_);
    return policies_;
  }
  void set_policies(std::shared_ptr<const Policies> p) {
    std::lock_guard<std::mutex> lock(policies_mu_);
    policies_ = std::move(p);
  }

  // The HTTP answer (quota/http.hpp's status line, and its fields written into the
  // decision without allocating) with the deciding rule's fields: from the set that
  // decided, or — a name two rules share, a set replaced meanwhile — the deciding rule
  // found among the request's budgets in the set in force. Cannot fail: the decision is
  // already taken. The values fit: a name of at most QUOTA_MAX_NAME_BYTES and two integers
  // are far below QUOTA_HEADER_BYTES (a longer one would be left out).
  void answer(const gateway::Request& req, std::optional<std::int64_t> estimate,
              const gateway::Result& r, quota_decision& out) const {
    const http::StatusLine line = http::status_line(r.decision);
    out.http_status = line.status;
    out.retry_after_s = line.retry_after_seconds;
    const auto described = policies();
    const PolicyFields* fields = nullptr;
    std::optional<PolicyFields> planned_fields;
    auto it = described->by_name.find(r.rule);
    if (described->version == r.decision.version && it != described->by_name.end() &&
        it->second.has_value()) {
      fields = &*it->second;
    } else if (auto planned =
                   registry_->current()->plan(req.who, req.route, {.estimate = estimate});
               planned.ok()) {
      for (const gateway::Check& c : *planned) {
        if (c.rule->name != r.rule) continue;
        planned_fields = PolicyFields::of(c.rule->name, c.rule->policy);
        fields = planned_fields ? &*planned_fields : nullptr;
        break;
      }
    }
    if (fields == nullptr) return;  // no rule to describe: no RateLimit fields
    if (fields->policy.size() < QUOTA_HEADER_BYTES) {
      std::memcpy(out.ratelimit_policy, fields->policy.data(), fields->policy.size());
      out.ratelimit_policy[fields->policy.size()] = '\0';
      out.ratelimit_policy_len = fields->policy.size();
    }
    if (!line.ratelimit) return;
    char params[http::kRateLimitParamsBytes];
    const std::size_t n = http::ratelimit_params(r.decision, params);
    if (fields->name.size() + n < QUOTA_HEADER_BYTES) {
      std::memcpy(out.ratelimit, fields->name.data(), fields->name.size());
      std::memcpy(out.ratelimit + fields->name.size(), params, n);
      out.ratelimit[fields->name.size() + n] = '\0';
      out.ratelimit_len = fields->name.size() + n;
    }
  }

  const std::uint32_t opt_out_;
  const bool non_blocking_;
  gateway::Metrics metrics_;
  gateway::LeaseMetrics lease_metrics_;
  std::unique_ptr<ShardedStore<gateway::KeyPolicy>> memory_;
  std::unique_ptr<redis::GatewayStore> redis_;
  std::unique_ptr<gateway::RuleRegistry> registry_;
  std::unique_ptr<redis::RedisGrantLedger> ledger_;
  std::unique_ptr<quota::detail::RenewalThread> renewals_;  // non-blocking only
  std::unique_ptr<Leased> leased_;
  std::unique_ptr<gateway::Gateway> gateway_;
  std::mutex reload_mu_;
  mutable std::mutex policies_mu_;
  std::shared_ptr<const Policies> policies_;
};

}  // namespace quota::c_api
