// examples/quota_server/listeners.cpp — the definitions of listeners.hpp: quota-server's
// gRPC and HTTP front ends, started and stopped together.
#include "listeners.hpp"

#include <chrono>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "api/http/envoy_json.hpp"
#include "api/http/http_api.hpp"

namespace quota::server {

Listeners::Listeners(const Options& o, Checker& checker, ServerStats& stats,
                     gateway::Metrics& metrics)
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

Listeners::~Listeners() { stop(); }

absl::Status Listeners::start(std::string_view rules, std::string_view domain) {
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

std::string Listeners::http_address() const { return absl::StrCat(o_.host, ":", http_port_); }

void Listeners::stop() {
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

}  // namespace quota::server
