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

#include <cstdint>
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
#include "quota/decision.hpp"
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
                       std::int64_t max_cost = 1'000'000, std::function<Nanos()> now = {});

  grpc::Status ShouldRateLimit(grpc::ServerContext*, const rls::RateLimitRequest* request,
                               rls::RateLimitResponse* response) override;

  // One ShouldRateLimit call, from gRPC or from POST /json (envoy_json.hpp), counted on
  // /metrics under `api`. The same answer and status codes whichever protocol asks.
  grpc::Status decide(const rls::RateLimitRequest& request, rls::RateLimitResponse* response,
                      Api api);

 private:
  // The limits of a call's descriptors as envoyproxy/ratelimit selects them: each
  // descriptor's match, then every limit named in a matched limit's `replaces` (an
  // unlimited one's too) dropped — only a limit with a `name` can be, and an unlimited
  // one stays unlimited.
  static std::vector<const EnvoyRateLimit*> select_limits(
      const EnvoyRules& rules, const std::vector<EnvoyDescriptor>& descriptors);

  // ShouldRateLimit with envoyproxy/ratelimit rules (envoy_rules.hpp): every descriptor
  // validated, its limit selected, then decided in order, each an independent budget.
  grpc::Status envoy_call(const Checker::Pin& pin, const EnvoyRules& rules,
                          const rls::RateLimitRequest& req, rls::RateLimitResponse* response,
                          Api api);

  // The label a decision of `l` is counted under (decision_stats.hpp near-limit): with
  // detailed_metric the request's own path (EnvoyRules::metric_name) while fewer than
  // kMaxDetailedLabels such labels were counted by this server, else the limit's name.
  // Only a decision the near-limit counter takes is given a new label.
  std::string metric_label(const EnvoyRateLimit& l, EnvoyRules::Entries entries, const Decision& d,
                           std::int64_t capacity);

  grpc::Status fail(const absl::Status& s, Api api);

  Checker& checker_;
  ServerStats& stats_;
  std::string domain_;
  std::int64_t max_cost_;
  std::function<Nanos()> now_;
  std::mutex detailed_mu_;
  std::unordered_set<std::string> detailed_;  // detailed_metric labels given out
};

}  // namespace quota::server
