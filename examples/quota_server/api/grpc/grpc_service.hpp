// examples/quota_server/api/grpc/grpc_service.hpp — envoy.service.ratelimit.v3.RateLimitService
// over gRPC: ShouldRateLimit on a Checker; decide() is the same call for POST /json
// (envoy_json.hpp).
//
// A call is mapped (descriptors.hpp: every descriptor resolved and validated first, so
// bad input deducts nothing), decided descriptor by descriptor in request order, and
// answered with Envoy's RateLimitResponse; its dynamic_metadata carries
// {"applied_rule_version": N}, the version of the rule set that decided every descriptor
// of the call (one set per call: Checker::Pin). gRPC status codes:
//   INVALID_ARGUMENT  bad input: empty or unknown domain, no descriptors, a missing tenant,
//                     an unknown entry key or route, a cost outside [1, --max-cost], ...;
//                     the message names the descriptor and field
//   NOT_FOUND         no tenant rule applies to a descriptor's tenant and plan
//   UNAVAILABLE       the store cannot decide and the route fails closed — Envoy then
//                     applies its own failure mode (pass, or deny with failure_mode_deny)
//   other codes       as the Gateway returned them (an attempt id reused, ...)
// A call that fails after some descriptors were decided keeps their deductions (they
// were decided as independent checks).
//
// With an envoyproxy/ratelimit file (envoy_rules.hpp) the descriptors are its own: each
// matched as that format matches; a limit named in another matched limit's `replaces`
// answers as no limit; `unlimited` is OK with limit_remaining 4294967295;
// `requests_per_unit: 0` is OVER_LIMIT with remaining 0 and no Retry-After; shadow_mode
// answers OK whatever the budget decided.
//
// Thread safety: gRPC calls ShouldRateLimit from its thread pool; Checker and
// ServerStats are thread-safe.
//
//   quota::server::RateLimitServiceImpl service(checker, stats, "api");
//   grpc::ServerBuilder b;  b.RegisterService(&service);
#pragma once

#include <algorithm>
#include <functional>
#include <mutex>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "api/grpc/descriptors.hpp"
#include "backend/checker.hpp"
#include "envoy/service/ratelimit/v3/rls.grpc.pb.h"
#include "quota/clock.hpp"
#include "stats/server_stats.hpp"

namespace quota::server {

// The gRPC status for an absl::Status (the codes are numbered alike).
inline grpc::Status to_grpc(const absl::Status& s) {
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(s.message()));
}

// The most detailed_metric labels one server counts under (each a series of
// quota_near_limit_total); past it, a value's decisions count under its limit's name.
inline constexpr std::size_t kMaxDetailedLabels = 1000;

class RateLimitServiceImpl final : public rls::RateLimitService::Service {
 public:
  // `now`: the clock decisions are taken at (tests pass a manual one); empty: the
  // process's steady clock.
  RateLimitServiceImpl(Checker& checker, ServerStats& stats, std::string domain,
                       std::int64_t max_cost = 1'000'000, std::function<Nanos()> now = {})
      : checker_(checker),
        stats_(stats),
        domain_(std::move(domain)),
        max_cost_(max_cost),
        now_(now ? std::move(now) : [] { return SteadyClock{}.now(); }) {}

  grpc::Status ShouldRateLimit(grpc::ServerContext*, const rls::RateLimitRequest* request,
                               rls::RateLimitResponse* response) override {
    return decide(*request, response, Api::kGrpc);
  }

  // One ShouldRateLimit call, from gRPC or from POST /json (envoy_json.hpp), counted on
  // /metrics under `api`. The same answer and status codes whichever protocol asks.
  grpc::Status decide(const rls::RateLimitRequest& request, rls::RateLimitResponse* response,
                      Api api) {
    const TimedCall timed(stats_);
    const Checker::Pin pin = checker_.pin();  // one rule set for every descriptor
    if (const EnvoyRules* envoy = checker_.envoy_rules(pin); envoy != nullptr) {
      return envoy_call(pin, *envoy, request, response, api);
    }
    auto checks = map_request(request, checker_, domain_);
    if (!checks.ok()) return fail(checks.status(), api);
    std::vector<Checked> checked;
    checked.reserve(checks->size());
    for (std::size_t i = 0; i < checks->size(); ++i) {
      auto c = checker_.check(pin, (*checks)[i], now_());
      if (!c.ok()) {
        return fail(absl::Status(c.status().code(),
                                 absl::StrFormat("descriptors[%d]: %s", i, c.status().message())),
                    api);
      }
      if (c->result.decision.reason == Reason::kUnavailable) {
        return fail(absl::UnavailableError(absl::StrFormat(
                        "descriptors[%d]: the budget store cannot decide (route \"%s\" fails "
                        "closed)",
                        i, (*checks)[i].route)),
                    api);
      }
      stats_.observe((*checks)[i], *c);
      checked.push_back(*std::move(c));
    }
    *response = build_response(checked);
    // The version of the one rule set that decided every descriptor (the call is pinned).
    (*response->mutable_dynamic_metadata()->mutable_fields())["applied_rule_version"]
        .set_number_value(static_cast<double>(checker_.rule_version()));
    stats_.count(api, response->overall_code() == rls::RateLimitResponse::OVER_LIMIT
                          ? Answer::kOverLimit
                          : Answer::kOk);
    return grpc::Status::OK;
  }

 private:
  // The limits of a call's descriptors as envoyproxy/ratelimit selects them: each
  // descriptor's match, then every limit named in a matched limit's `replaces` (an
  // unlimited one's too) dropped — only a limit with a `name` can be, and an unlimited
  // one stays unlimited.
  static std::vector<const EnvoyRateLimit*> select_limits(
      const EnvoyRules& rules, const std::vector<EnvoyDescriptor>& descriptors) {
    std::vector<const EnvoyRateLimit*> limits;
    std::vector<std::string> replaced;
    for (const EnvoyDescriptor& d : descriptors) {
      const EnvoyRateLimit* l = rules.match(d.entries);
      limits.push_back(l);
      if (l != nullptr) replaced.insert(replaced.end(), l->replaces.begin(), l->replaces.end());
    }
    for (const EnvoyRateLimit*& l : limits) {
      if (l != nullptr && !l->unlimited && l->named &&
          std::find(replaced.begin(), replaced.end(), l->name) != replaced.end()) {
        l = nullptr;
      }
    }
    return limits;
  }

  // ShouldRateLimit with envoyproxy/ratelimit rules (envoy_rules.hpp): every descriptor
  // validated, its limit selected, then decided in order, each an independent budget.
  grpc::Status envoy_call(const Checker::Pin& pin, const EnvoyRules& rules,
                          const rls::RateLimitRequest& req, rls::RateLimitResponse* response,
                          Api api) {
    auto prepared = map_envoy_request(req, rules.domain, max_cost_);
    if (!prepared.ok()) return fail(prepared.status(), api);
    const std::vector<const EnvoyRateLimit*> limits = select_limits(rules, *prepared);
    std::vector<Checked> checked;
    const Nanos now = now_();
    for (std::size_t i = 0; i < prepared->size(); ++i) {
      const auto& [entries, cost] = (*prepared)[i];
      const EnvoyRateLimit* l = limits[i];
      Checked out;
      if (l == nullptr || l->unlimited) {
        // No limit: OK, remaining 0 (none) or 4294967295 (unlimited), as envoyproxy/ratelimit.
        out.result.decision = Decision{.allowed = true,
                                       .remaining = l ? kUnlimitedRemaining : 0,
                                       .retry_after = Nanos{0},
                                       .reset_after = kNever,
                                       .version = rules.version,
                                       .reason = Reason::kAllowed};
        checked.push_back(std::move(out));
        continue;
      }
      Decision d;
      if (l->blocks()) {
        d = EnvoyRateLimit::blocked(rules.version);
        out.policy = http::PolicyInfo{.name = l->name, .quota = 0, .window_seconds = 0};
        out.rate = RateInfo{.units = 0, .per = l->per};
      } else {
        // check_envoy matches the entries again under the same pin (the same limit); the
        // replacement was applied above, so none is passed on.
        auto c = checker_.check_envoy(pin, entries, cost, {}, now);
        if (!c.ok()) {
          // Bad input (a key longer than the store takes) stays INVALID_ARGUMENT; anything
          // else is the store failing to decide.
          const bool bad_input = c.status().code() == absl::StatusCode::kInvalidArgument;
          return fail(
              absl::Status(
                  bad_input ? absl::StatusCode::kInvalidArgument : absl::StatusCode::kUnavailable,
                  absl::StrFormat(
                      "descriptors[%d]: %s%s", i,
                      bad_input ? "" : "the budget store cannot decide: ", c.status().message())),
              api);
        }
        d = c->decision;
        auto info = http::describe(l->name, l->policy);
        if (info.ok()) out.policy = *std::move(info);
        out.rate = rate_of(l->policy);
        if (out.policy) {
          stats_.decisions.observe_decision(metric_label(*l, entries, d, out.policy->quota),
                                            d.remaining, out.policy->quota, d.allowed);
        }
      }
      out.result.decision = l->answer(d);  // shadow mode: decided, answered OK
      out.result.rule = l->name;
      checked.push_back(std::move(out));
    }
    *response = build_response(checked);
    for (int i = 0; i < response->statuses_size(); ++i) {
      const EnvoyRateLimit* l = limits[static_cast<std::size_t>(i)];
      if (l == nullptr || l->unlimited) continue;
      auto* limit = response->mutable_statuses(i)->mutable_current_limit();
      limit->set_requests_per_unit(static_cast<std::uint32_t>(l->requests_per_unit));
      limit->set_unit(static_cast<rls::RateLimitResponse::RateLimit::Unit>(l->unit));
    }
    (*response->mutable_dynamic_metadata()->mutable_fields())["applied_rule_version"]
        .set_number_value(static_cast<double>(rules.version));
    stats_.count(api, response->overall_code() == rls::RateLimitResponse::OVER_LIMIT
                          ? Answer::kOverLimit
                          : Answer::kOk);
    return grpc::Status::OK;
  }

  // The label a decision of `l` is counted under (decision_stats.hpp near-limit): with
  // detailed_metric the request's own path (EnvoyRules::metric_name) while fewer than
  // kMaxDetailedLabels such labels were counted by this server, else the limit's name.
  // Only a decision the near-limit counter takes is given a new label.
  std::string metric_label(const EnvoyRateLimit& l, EnvoyRules::Entries entries, const Decision& d,
                           std::int64_t capacity) {
    const bool near = d.allowed && capacity > 0 && d.remaining * 10 < capacity;
    if (!l.detailed_metric || !near) return l.name;
    std::string label = EnvoyRules::metric_name(l, entries);
    std::lock_guard lock(detailed_mu_);
    if (detailed_.contains(label)) return label;
    if (detailed_.size() >= kMaxDetailedLabels) return l.name;
    detailed_.insert(label);
    return label;
  }

  grpc::Status fail(const absl::Status& s, Api api) {
    stats_.count(api, answer_of(s));
    return to_grpc(s);
  }

  Checker& checker_;
  ServerStats& stats_;
  std::string domain_;
  std::int64_t max_cost_;
  std::function<Nanos()> now_;
  std::mutex detailed_mu_;
  std::unordered_set<std::string> detailed_;  // detailed_metric labels given out
};

}  // namespace quota::server
