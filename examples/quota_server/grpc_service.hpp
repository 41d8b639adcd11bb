// examples/quota_server/grpc_service.hpp — envoy.service.ratelimit.v3.RateLimitService over
// gRPC: ShouldRateLimit on a Checker.
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
// Thread safety: gRPC calls ShouldRateLimit from its thread pool; Checker and
// ServerStats are thread-safe.
//
//   quota::server::RateLimitServiceImpl service(checker, stats, "api");
//   grpc::ServerBuilder b;  b.RegisterService(&service);
#pragma once

#include <string>
#include <utility>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "checker.hpp"
#include "descriptors.hpp"
#include "envoy/service/ratelimit/v3/rls.grpc.pb.h"
#include "quota/clock.hpp"
#include "server_stats.hpp"

namespace quota::server {

// The gRPC status for an absl::Status (the codes are numbered alike).
inline grpc::Status to_grpc(const absl::Status& s) {
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(s.message()));
}

class RateLimitServiceImpl final : public rls::RateLimitService::Service {
 public:
  RateLimitServiceImpl(Checker& checker, ServerStats& stats, std::string domain)
      : checker_(checker), stats_(stats), domain_(std::move(domain)) {}

  grpc::Status ShouldRateLimit(grpc::ServerContext*, const rls::RateLimitRequest* request,
                               rls::RateLimitResponse* response) override {
    const Checker::Pin pin = checker_.pin();  // one rule set for every descriptor
    auto checks = map_request(*request, checker_, domain_);
    if (!checks.ok()) return fail(checks.status());
    std::vector<Checked> checked;
    checked.reserve(checks->size());
    for (std::size_t i = 0; i < checks->size(); ++i) {
      auto c = checker_.check(pin, (*checks)[i], clock_.now());
      if (!c.ok()) {
        return fail(absl::Status(c.status().code(),
                                 absl::StrFormat("descriptors[%d]: %s", i, c.status().message())));
      }
      if (c->result.decision.reason == Reason::kUnavailable) {
        return fail(absl::UnavailableError(absl::StrFormat(
            "descriptors[%d]: the budget store cannot decide (route \"%s\" fails closed)", i,
            (*checks)[i].route)));
      }
      checked.push_back(*std::move(c));
    }
    *response = build_response(checked);
    // The version of the one rule set that decided every descriptor (the call is pinned).
    (*response->mutable_dynamic_metadata()->mutable_fields())["applied_rule_version"]
        .set_number_value(static_cast<double>(checker_.rule_version()));
    stats_.count(Api::kGrpc, response->overall_code() == rls::RateLimitResponse::OVER_LIMIT
                                 ? Answer::kOverLimit
                                 : Answer::kOk);
    return grpc::Status::OK;
  }

 private:
  grpc::Status fail(const absl::Status& s) {
    stats_.count(Api::kGrpc, answer_of(s));
    return to_grpc(s);
  }

  Checker& checker_;
  ServerStats& stats_;
  std::string domain_;
  SteadyClock clock_;
};

}  // namespace quota::server
