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
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <string_view>
#include <thread>

#include <grpcpp/grpcpp.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "api/grpc/budget_service.hpp"
#include "api/grpc/grpc_service.hpp"
#include "api/http/envoy_json.hpp"
#include "api/http/http_api.hpp"
#include "api/http/http_listener.hpp"
#include "backend/checker.hpp"
#include "config/options.hpp"
#include "quota/gateway/metrics.hpp"
#include "stats/server_stats.hpp"

namespace quota::server {

class Listeners {
 public:
  // Everything must outlive the listeners.
  Listeners(const Options& o, Checker& checker, ServerStats& stats, gateway::Metrics& metrics)
      : o_(o),
        checker_(checker),
        service_(checker, stats, o.domain, o.max_cost),
        budget_(checker, stats),
        http_(o.http) {
    add_http_api(http_, {.checker = &checker,
                         .stats = &stats,
                         .metrics = &metrics,
                         .ready = &ready_,
                         .auth = o.auth_headers,
                         .admin_token = o.admin_token,
                         .listener = &http_});
    add_envoy_json_api(http_, service_);  // POST /json, envoyproxy/ratelimit's
  }
  Listeners(const Listeners&) = delete;
  Listeners& operator=(const Listeners&) = delete;
  ~Listeners() { stop(); }

  // Binds and serves both; `rules` (where the rules come from) and `domain` (the RLS
  // domain answered) for the start line.
  absl::Status start(std::string_view rules, std::string_view domain) {
    grpc::ServerBuilder builder;
    int grpc_port = 0;
    builder.AddListeningPort(absl::StrCat(o_.host, ":", o_.grpc_port),
                             grpc::InsecureServerCredentials(), &grpc_port);
    builder.RegisterService(&service_);
    builder.RegisterService(&budget_);
    grpc_ = builder.BuildAndStart();
    if (grpc_ == nullptr || grpc_port == 0) {
      return absl::UnavailableError(
          absl::StrFormat("cannot listen for gRPC on %s:%d", o_.host, o_.grpc_port));
    }
    std::printf("grpc listening on %s:%d (domain \"%s\", rules %s version %llu)\n", o_.host.c_str(),
                grpc_port, std::string(domain).c_str(), std::string(rules).c_str(),
                static_cast<unsigned long long>(checker_.rule_version()));
    std::fflush(stdout);
    http_port_ = o_.http_port == 0                           ? http_.bind_to_any_port(o_.host)
                 : http_.bind_to_port(o_.host, o_.http_port) ? o_.http_port
                                                             : -1;
    if (http_port_ <= 0) {
      grpc_->Shutdown();
      grpc_.reset();
      return absl::UnavailableError(
          absl::StrFormat("cannot listen for HTTP on %s:%d", o_.host, o_.http_port));
    }
    http_thread_ = std::thread([this] { http_.listen_after_bind(); });
    std::printf("http listening on %s:%d\n", o_.host.c_str(), http_port_);
    std::fflush(stdout);
    ready_.store(true, std::memory_order_release);
    return absl::OkStatus();
  }

  // Where HTTP is served ("host:port"), once started.
  std::string http_address() const { return absl::StrCat(o_.host, ":", http_port_); }

  void stop() {
    ready_.store(false, std::memory_order_release);
    if (grpc_ != nullptr) {
      grpc_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(5));
      grpc_.reset();
    }
    if (http_thread_.joinable()) {
      http_.stop();
      http_thread_.join();
    }
  }

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
