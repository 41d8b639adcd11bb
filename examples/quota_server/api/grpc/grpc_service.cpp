// examples/quota_server/api/grpc/grpc_service.cpp — the definitions of grpc_service.hpp:
// ShouldRateLimit on a Checker, for gRPC and for POST /json.
#include "api/grpc/grpc_service.hpp"

#include <algorithm>
#include <utility>

#include "absl/strings/str_format.h"
#include "quota/http.hpp"

namespace quota::server {

RateLimitServiceImpl::RateLimitServiceImpl(Checker& checker, ServerStats& stats, std::string domain,
                                           std::int64_t max_cost, std::function<Nanos()> now)
    : checker_(checker),
      stats_(stats),
      domain_(std::move(domain)),
      max_cost_(max_cost),
      now_(now ? std::move(now) : [] { return SteadyClock{}.now(); }) {}

grpc::Status RateLimitServiceImpl::ShouldRateLimit(grpc::ServerContext*,
                                                   const rls::RateLimitRequest* request,
                                                   rls::RateLimitResponse* response) {
  return decide(*request, response, Api::kGrpc);
}

grpc::Status RateLimitServiceImpl::decide(const rls::RateLimitRequest& request,
                                          rls::RateLimitResponse* response, Api api) {
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

std::vector<const EnvoyRateLimit*> RateLimitServiceImpl::select_limits(
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

grpc::Status RateLimitServiceImpl::envoy_call(const Checker::Pin& pin, const EnvoyRules& rules,
                                              const rls::RateLimitRequest& req,
                                              rls::RateLimitResponse* response, Api api) {
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

std::string RateLimitServiceImpl::metric_label(const EnvoyRateLimit& l, EnvoyRules::Entries entries,
                                               const Decision& d, std::int64_t capacity) {
  const bool near = d.allowed && capacity > 0 && d.remaining * 10 < capacity;
  if (!l.detailed_metric || !near) return l.name;
  std::string label = EnvoyRules::metric_name(l, entries);
  std::lock_guard lock(detailed_mu_);
  if (detailed_.contains(label)) return label;
  if (detailed_.size() >= kMaxDetailedLabels) return l.name;
  detailed_.insert(label);
  return label;
}

grpc::Status RateLimitServiceImpl::fail(const absl::Status& s, Api api) {
  stats_.count(api, answer_of(s));
  return to_grpc(s);
}

}  // namespace quota::server
