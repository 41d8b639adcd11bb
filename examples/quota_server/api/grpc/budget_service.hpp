// examples/quota_server/api/grpc/budget_service.hpp — quota.v1.Budget over gRPC
// (proto/quota/v1/budget.proto): Estimate and Settle on a Checker, the gRPC twins of POST
// /v1/check with an estimate and POST /v1/settle (http_api.hpp).
//
// Estimate resolves the request as a check (checker.hpp: defaults filled, everything
// validated before anything is deducted) that must carry an estimate — its `estimate`
// units, or prompt_tokens and max_output on a route with a prompt_factor — and answers the
// decision with the ticket of an admitted one. Settle settles a ticket once, at any
// server on the same Redis (quota/redis/tickets.hpp). Status codes are absl's, numbered
// alike (to_grpc), except an expired ticket: FAILED_PRECONDITION naming the expiry, since
// a gRPC client reads DEADLINE_EXCEEDED as its own call timing out. Calls are counted on
// /metrics as api "grpc" (Estimate) and "settle" (Settle), and settles by outcome.
//
// Thread safety: gRPC calls from its thread pool; Checker and ServerStats are thread-safe.
//
//   quota::server::BudgetServiceImpl budget(checker, stats);
//   grpc::ServerBuilder b;  b.RegisterService(&budget);
#pragma once

#include <functional>

#include <grpcpp/grpcpp.h>

#include "absl/status/status.h"
#include "api/grpc/grpc_service.hpp"
#include "backend/checker.hpp"
#include "quota/clock.hpp"
#include "quota/v1/budget.grpc.pb.h"
#include "stats/server_stats.hpp"

namespace quota::server {

class BudgetServiceImpl final : public quota::v1::Budget::Service {
 public:
  // `now`: the clock decisions are taken at; empty: the process's steady clock.
  BudgetServiceImpl(Checker& checker, ServerStats& stats, std::function<Nanos()> now = {});

  grpc::Status Estimate(grpc::ServerContext*, const quota::v1::EstimateRequest* request,
                        quota::v1::EstimateResponse* response) override;

  grpc::Status Settle(grpc::ServerContext*, const quota::v1::SettleRequest* request,
                      quota::v1::SettleResponse* response) override;

 private:
  grpc::Status fail(Api api, const absl::Status& s);

  Checker& checker_;
  ServerStats& stats_;
  std::function<Nanos()> now_;
};

}  // namespace quota::server
