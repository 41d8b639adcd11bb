// examples/quota_server/api/grpc/budget_service.cpp — the definitions of budget_service.hpp:
// quota.v1.Budget's Estimate and Settle on a Checker.
#include "api/grpc/budget_service.hpp"

#include <string>
#include <utility>

#include "absl/strings/str_format.h"
#include "quota/decision.hpp"

namespace quota::server {

BudgetServiceImpl::BudgetServiceImpl(Checker& checker, ServerStats& stats,
                                     std::function<Nanos()> now)
    : checker_(checker),
      stats_(stats),
      now_(now ? std::move(now) : [] { return SteadyClock{}.now(); }) {}

grpc::Status BudgetServiceImpl::Estimate(grpc::ServerContext*,
                                         const quota::v1::EstimateRequest* request,
                                         quota::v1::EstimateResponse* response) {
  const TimedCall timed(stats_);
  CheckRequest req{.tenant = request->tenant(),
                   .plan = request->plan(),
                   .user = request->user(),
                   .route = request->route()};
  if (request->estimate() != 0) req.estimate = request->estimate();
  if (request->has_prompt_tokens()) req.prompt_tokens = request->prompt_tokens();
  if (request->has_max_output()) req.max_output = request->max_output();
  const Checker::Pin pin = checker_.pin();
  auto resolved = checker_.resolve(std::move(req));
  if (resolved.ok() && !resolved->estimate) {
    resolved = absl::InvalidArgumentError(
        "estimate is missing (or prompt_tokens and max_output, on a route with a "
        "prompt_factor)");
  }
  if (!resolved.ok()) return fail(Api::kGrpc, resolved.status());
  auto c = checker_.check(pin, *resolved, now_());
  if (!c.ok()) return fail(Api::kGrpc, c.status());
  const Decision& d = c->result.decision;
  if (d.reason == Reason::kUnavailable) {
    return fail(Api::kGrpc, absl::UnavailableError(absl::StrFormat(
                                "the budget store cannot decide (route \"%s\" fails closed)",
                                resolved->route)));
  }
  stats_.observe(*resolved, *c);
  response->set_allowed(d.allowed);
  response->set_remaining(d.remaining < 0 ? 0 : d.remaining);
  response->set_retry_after_ms(d.allowed ? 0 : ceil_ms(d.retry_after));
  response->set_reset_after_ms(ceil_ms(d.reset_after));
  response->set_rule(c->result.rule);
  response->set_applied_rule_version(d.version);
  response->set_reason(std::string(to_string(d.reason)));
  response->set_ticket(c->ticket.value_or(0));
  response->set_estimate(*resolved->estimate);
  stats_.count(Api::kGrpc, d.allowed ? Answer::kOk : Answer::kOverLimit);
  return grpc::Status::OK;
}

grpc::Status BudgetServiceImpl::Settle(grpc::ServerContext*,
                                       const quota::v1::SettleRequest* request,
                                       quota::v1::SettleResponse* response) {
  const TimedCall timed(stats_);
  auto settled = checker_.settle(request->tenant(), request->ticket(), request->actual(), now_());
  stats_.count_settle(settled);
  if (!settled.ok()) {
    absl::Status s = settled.status();
    if (s.code() == absl::StatusCode::kDeadlineExceeded) {
      s = absl::FailedPreconditionError(s.message());  // expired (see the top of the header)
    }
    return fail(Api::kSettle, s);
  }
  response->set_estimate(settled->estimate);
  response->set_actual(settled->actual);
  response->set_surplus(settled->surplus);
  response->set_deficit(settled->deficit);
  stats_.count(Api::kSettle, Answer::kOk);
  return grpc::Status::OK;
}

grpc::Status BudgetServiceImpl::fail(Api api, const absl::Status& s) {
  stats_.count(api, answer_of(s));
  return to_grpc(s);
}

}  // namespace quota::server
