// examples/quota_server/backend/checker.cpp — the definitions of checker.hpp: one
// rate-limit check on the Gateway, in process or with Redis.
#include "backend/checker.hpp"

#include <algorithm>
#include <cstdio>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "backend/counted_redis_store.hpp"
#include "backend/envoy_redis.hpp"
#include "backend/fair_exchange.hpp"
#include "backend/redis_leases.hpp"
#include "backend/redis_memory.hpp"
#include "quota/gateway/leases/lease_revocation.hpp"
#include "quota/gateway/rules/estimate_formula.hpp"
#include "quota/redis/gateway_store_setup.hpp"
#include "quota/redis/tickets.hpp"

namespace quota::server {

Checker::Checker(std::shared_ptr<const gateway::RuleSet> rules, CheckerOptions options)
    : options_(std::move(options)),
      store_(StoreOptions{.max_keys = options_.max_keys,
                          .assume_spent_at = options_.budgets_spent_at.value_or(Nanos::min())}),
      registry_(std::move(rules)) {
  if (options_.redis != nullptr) {
    leases_ = std::make_unique<RedisLeases>(*options_.redis);
    // A rule with `lease.revoke: at_once` revokes its grants at the authority before a
    // change to it is installed; every server's ledger hears of it through pub/sub.
    gateway::revoke_on_publish(registry_, leases_->ledger);
    gateway::GatewayOptions o = fair_share_options(
        options_.redis->store(), options_.fair_share_holders, options_.instance_id);
    o.tickets = std::make_shared<redis::RedisTickets>(options_.redis->store().options(),
                                                      options_.ticket_ttl);
    gateway_ = std::make_unique<gateway::Gateway>(leases_->backend, registry_, std::move(o));
  } else {
    gateway_ = std::make_unique<gateway::Gateway>(
        store_, registry_, gateway::GatewayOptions{.ticket_ttl = options_.ticket_ttl});
  }
  note_ignored_leases(*registry_.current());
}

Checker::Checker(LoadedRules loaded, CheckerOptions options)
    : Checker(loaded.rules ? loaded.rules : placeholder_rules(), std::move(options)) {
  envoy_ = std::move(loaded.envoy);
  if (envoy_) envoy_version_.store(envoy_->version, std::memory_order_relaxed);
}

Checker::~Checker() = default;

absl::StatusOr<CheckRequest> Checker::resolve(CheckRequest req) const {
  if (envoy_mode()) {
    return absl::InvalidArgumentError(
        "the rule file is in envoyproxy/ratelimit's format: only gRPC ShouldRateLimit and "
        "POST /json decide with it");
  }
  if (req.tenant.empty()) return absl::InvalidArgumentError("tenant is missing");
  if (req.plan.empty()) req.plan = options_.default_plan;
  if (req.route.empty()) req.route = options_.default_route;
  if (req.plan.empty()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "plan is missing for tenant \"%s\" (and the server has no --default-plan)", req.tenant));
  }
  if (req.route.empty()) {
    return absl::InvalidArgumentError("route is missing (and the server has no --default-route)");
  }
  const auto rules = registry_.current();
  if (auto s = fill_estimate(*rules, req); !s.ok()) return s;
  const std::optional<std::int64_t> units = req.cost ? req.cost : req.estimate;
  if (units && (*units < 1 || *units > options_.max_cost)) {
    return absl::InvalidArgumentError(absl::StrFormat("%s %d is outside [1, %d] (--max-cost)",
                                                      req.cost ? "cost" : "estimate", *units,
                                                      options_.max_cost));
  }
  auto planned = rules->plan(identity(req), req.route, {.estimate = units});
  if (!planned.ok()) return planned.status();
  // A cost is what the budgets paying by estimate pay; a route whose every budget has a
  // fixed cost would ignore it: refused rather than silently replaced.
  if (units && std::none_of(planned->begin(), planned->end(),
                            [](const gateway::Check& c) { return c.estimate; })) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "route \"%s\" has fixed costs for every budget of plan \"%s\": a request %s (%d) "
        "is not accepted",
        req.route, req.plan, req.cost ? "cost" : "estimate", *units));
  }
  if (req.estimate && !req.attempt_id.empty()) {
    return absl::InvalidArgumentError(
        "an estimate takes no attempt_id: its ticket is what a retry settles or lets expire");
  }
  return req;
}

absl::StatusOr<Checked> Checker::check([[maybe_unused]] const Pin& pin, const CheckRequest& req,
                                       Nanos now) {
  const gateway::Request r{
      .who = identity(req), .route = req.route, .cost = req.cost, .attempt_id = req.attempt_id};
  Checked out;
  // An estimate is deducted with a ticket for settle(); anything else decided now.
  auto decided = [&]() -> absl::StatusOr<gateway::Result> {
    if (!req.estimate) return gateway_->decide(r, now);
    auto estimated = gateway_->acquire_estimate(r, *req.estimate, now);
    if (!estimated.ok()) return estimated.status();
    out.ticket = estimated->ticket;
    return gateway::Result{.decision = estimated->decision,
                           .rule = std::move(estimated->rule),
                           .replayed = false,
                           .request_cap = estimated->request_cap};
  }();
  if (!decided.ok()) {
    // Redis refused our credentials, or is a server no decision may be made on (an
    // evicting maxmemory-policy): the server cannot decide (never the fail-open
    // answer a route may give an outage).
    if (decided.status().code() == absl::StatusCode::kUnauthenticated) {
      return absl::UnavailableError(
          absl::StrCat("the budget store cannot decide: redis authentication failed: ",
                       decided.status().message()));
    }
    if (decided.status().code() == absl::StatusCode::kFailedPrecondition) {
      const bool evicting = absl::StrContains(decided.status().message(), "maxmemory-policy");
      return absl::UnavailableError(
          absl::StrCat("the budget store cannot decide: ", decided.status().message(),
                       evicting ? " (quota-server: --redis-allow-evicting)" : ""));
    }
    return decided.status();
  }
  out.result = *std::move(decided);
  describe(req, out);
  return out;
}

absl::StatusOr<gateway::SettleResult> Checker::settle(std::string_view tenant,
                                                      gateway::TicketId ticket, std::int64_t actual,
                                                      Nanos now) {
  if (envoy_mode()) {
    return absl::InvalidArgumentError(
        "the rule file is in envoyproxy/ratelimit's format: it has no estimates to settle");
  }
  if (actual < 0 || actual > options_.max_cost) {
    return absl::InvalidArgumentError(
        absl::StrFormat("actual %d is outside [0, %d] (--max-cost)", actual, options_.max_cost));
  }
  return gateway_->settle(tenant, ticket, actual, now);
}

absl::Status Checker::store_ready(Nanos now) {
  if (options_.redis == nullptr) return absl::OkStatus();
  std::lock_guard lock(ready_mu_);
  if (ready_probed_ && now - ready_probed_at_ < kReadyProbeEvery) return ready_;
  ready_ = redis::probe(*options_.redis, "readyz", rule_version(), now);
  ready_probed_ = true;
  ready_probed_at_ = now;
  return ready_;
}

const gateway::LeaseMetrics* Checker::lease_metrics() const {
  return leases_ ? &leases_->metrics : nullptr;
}

std::vector<RedisMemory> Checker::redis_memory() const {
  if (options_.redis == nullptr) return {};
  return server::redis_memory(options_.redis->store());
}

std::optional<redis::NodeWatchStats> Checker::redis_nodes() const {
  if (options_.redis == nullptr) return std::nullopt;
  return options_.redis->store().node_watch_stats();
}

std::optional<bool> Checker::revocations_subscribed() const {
  return leases_ ? std::optional<bool>(leases_->ledger.subscribed()) : std::nullopt;
}

std::vector<gateway::FairLimitStats> Checker::fair_shares() const {
  return gateway_->fair_shares();
}

absl::Status Checker::release_reserve(std::string_view rule, std::string_view tenant,
                                      std::int64_t units, Nanos duration, Nanos now) {
  if (envoy_mode()) {
    return absl::InvalidArgumentError(
        "the rule file is in envoyproxy/ratelimit's format: it has no fair-share reserve");
  }
  return gateway_->release_reserve(rule, tenant, units, now + duration, now);
}

std::vector<gateway::ReserveRelease> Checker::reserve_releases() const {
  return gateway_->reserve_releases();
}

absl::StatusOr<EnvoyChecked> Checker::check_envoy(
    const Pin& pin, std::span<const std::pair<std::string, std::string>> entries, std::int64_t cost,
    std::span<const std::string> replaced, Nanos now) {
  const EnvoyRules* rules = envoy_rules(pin);
  EnvoyChecked out;
  if (rules == nullptr) return absl::FailedPreconditionError("no envoyproxy/ratelimit rules");
  out.limit = rules->match(entries);
  if (out.limit != nullptr &&
      std::find(replaced.begin(), replaced.end(), out.limit->name) != replaced.end()) {
    out.limit = nullptr;
  }
  if (out.limit == nullptr || out.limit->unlimited) return out;
  const std::string key = rules->budget_key(entries);
  if (options_.redis != nullptr) {
    const std::string redis_key = redis_envoy_key(key);
    const gateway::LevelCheck level{
        .policy = &out.limit->policy, .key = redis_key, .shadow = false, .cost = cost};
    auto r = options_.redis->decide(std::span(&level, 1), rules->version, now);
    if (!r.ok()) return r.status();
    if (r->parts.size() != 1) return absl::InternalError("redis: no decision for the descriptor");
    out.decision = r->parts[0];
    return out;
  }
  auto d = store_.apply(gateway::KeyPolicy{.policy = &out.limit->policy, .version = rules->version},
                        key, now, cost);
  if (!d.ok()) return d.status();
  out.decision = *d;
  return out;
}

absl::Status Checker::publish(LoadedRules next) {
  if (options_.redis != nullptr && next.envoy != nullptr) {
    if (auto s = check_envoy_for_redis(*next.envoy); !s.ok()) return s;
  }
  if (envoy_mode() != (next.envoy != nullptr)) {
    return absl::FailedPreconditionError(
        "the rule file changed format (quota's / envoyproxy/ratelimit's): restart to switch");
  }
  std::unique_lock lock(publish_mu_);
  if (next.rules) {
    const std::shared_ptr<const gateway::RuleSet> rules = next.rules;
    absl::Status s = registry_.publish(std::move(next.rules));
    if (s.ok()) note_ignored_leases(*rules);
    return s;
  }
  if (next.envoy->version <= envoy_->version) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "version %d is not greater than the current %d", next.envoy->version, envoy_->version));
  }
  envoy_version_.store(next.envoy->version, std::memory_order_relaxed);
  envoy_ = std::move(next.envoy);
  return absl::OkStatus();
}

std::shared_ptr<const gateway::RuleSet> Checker::placeholder_rules() {
  gateway::RuleSetSpec spec;
  gateway::RouteClass route;
  route.name = "envoy";
  spec.routes.push_back(std::move(route));
  return *gateway::RuleSet::create(spec);
}

void Checker::note_ignored_leases(const gateway::RuleSet& rules) {
  if (leases_ != nullptr || lease_noted_.load(std::memory_order_relaxed)) return;
  bool leased = false;
  rules.for_each_rule([&](const gateway::Rule& r) { leased = leased || r.lease.enabled(); });
  if (leased && !lease_noted_.exchange(true)) {
    std::fprintf(stderr,
                 "quota-server: note: `lease:` options are ignored: the budgets are in "
                 "process, with nothing to lease from (they apply with --redis*)\n");
  }
}

absl::Status Checker::fill_estimate(const gateway::RuleSet& rules, CheckRequest& req) {
  auto route = rules.route(req.route);
  if (!route.ok()) return route.status();
  if (req.cost && req.estimate) {
    return absl::InvalidArgumentError(
        "cost and estimate are exclusive: a cost is decided now, an estimate settled later");
  }
  const bool given = req.prompt_tokens.has_value() || req.max_output.has_value();
  if (given && (req.cost || req.estimate)) {
    return absl::InvalidArgumentError(absl::StrCat(
        req.cost ? "cost" : "estimate",
        " and prompt_tokens/max_output are exclusive: the route's prompt_factor makes the "
        "estimate of the last two"));
  }
  if (req.cost || req.estimate || (!given && !(*route)->estimate_formula.enabled())) {
    return absl::OkStatus();
  }
  auto estimate = gateway::estimate_of(req.route, (*route)->estimate_formula, req.prompt_tokens,
                                       req.max_output);
  if (!estimate.ok()) return estimate.status();
  req.estimate = *estimate;
  return absl::OkStatus();
}

void Checker::describe(const CheckRequest& req, Checked& out) const {
  const auto rules = registry_.current();
  auto planned =
      rules->plan(identity(req), req.route, {.estimate = req.cost ? req.cost : req.estimate});
  if (!planned.ok()) return;
  for (const gateway::Check& c : *planned) {
    if (c.rule->name != out.result.rule) continue;
    auto info = http::describe(c.rule->name, c.rule->policy);
    if (info.ok()) out.policy = *std::move(info);
    out.rate = rate_of(c.rule->policy);
    return;
  }
}

}  // namespace quota::server
