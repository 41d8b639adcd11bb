// examples/quota_server/listeners.hpp — quota-server's front ends on one Checker: gRPC
// (Envoy's RLS v3, grpc_service.hpp; quota.v1.Budget, budget_service.hpp) and HTTP (http_api.hpp,
// envoy_json.hpp, on the listener of http_listener.hpp), started and stopped together.
//
// start() binds both (--grpc-port, --http-port; 0: any free port), prints one line per
// listener on stdout ("grpc listening on HOST:PORT (...)", "http listening on HOST:PORT"
// — what tests and operators wait for) and serves until stop(). A port that cannot be
// bound is an error naming it; nothing is left listening then. /readyz answers ready
// from the end of start() until stop() begins (then 503, so a load balancer drains the
// server first); stop() lets in-flight calls finish, gRPC's for at most 5 s.
//
// Thread safety: start() and stop() from one thread, once each; the calls are served on
// gRPC's threads and the HTTP listener's.
//
//   quota::server::Listeners listeners(options, checker, stats, metrics);
//   if (auto s = listeners.start("rules.yaml", "quota"); !s.ok()) return 1;
//   ... wait for SIGTERM ...
//   listeners.stop();
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <string_view>
#include <thread>

#include <grpcpp/grpcpp.h>

#include "absl/status/status.h"
#include "api/grpc/budget_service.hpp"
#include "api/grpc/grpc_service.hpp"
#include "api/http/http_listener.hpp"
#include "backend/checker.hpp"
#include "config/options.hpp"
#include "quota/gateway/metrics.hpp"
#include "stats/server_stats.hpp"

namespace quota::server {

class Listeners {
 public:
  // Everything must outlive the listeners.
  Listeners(const Options& o, Checker& checker, ServerStats& stats, gateway::Metrics& metrics);
  Listeners(const Listeners&) = delete;
  Listeners& operator=(const Listeners&) = delete;
  ~Listeners();

  // Binds and serves both; `rules` (where the rules come from) and `domain` (the RLS
  // domain answered) for the start line.
  absl::Status start(std::string_view rules, std::string_view domain);

  // Where HTTP is served ("host:port"), once started.
  std::string http_address() const;

  void stop();

 private:
  const Options& o_;
  Checker& checker_;
  RateLimitServiceImpl service_;
  BudgetServiceImpl budget_;  // quota.v1.Budget: estimates and settles
  // No client can stall the others: idle connections hold no thread, slow requests are
  // cut off, large bodies refused unread (http_listener.hpp).
  HttpListener http_;
  std::unique_ptr<grpc::Server> grpc_;
  std::thread http_thread_;
  int http_port_ = 0;
  std::atomic<bool> ready_{false};
};

}  // namespace quota::server
