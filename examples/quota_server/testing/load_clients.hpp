// examples/quota_server/testing/load_clients.hpp — client threads that spend one tenant's
// budget through a running quota-server, for the tests where several servers share one
// budget (redis_test.cpp, lease_test.cpp).
//
// `grpc_client` and `http_client` each ask for 1 unit of tenant "shared" as fast as they
// can (`grpc_request_client` sends a request of the caller's, `http_tenant_client` names
// the tenant), until a steady-clock deadline or 20,000 calls, and log every admission with the
// time the call was sent and answered and the server it went to; denials are counted. The
// first call without a decision (a gRPC error, an HTTP status other than 200) stops the
// client and is kept in `Log::error`, so a test can require none. The admissions of all
// clients together are what a test hands to the envelope verifier.
//
// Thread safety: any number of clients may share one Log (its mutex).
//
//   quota::testing::Log log;
//   std::thread t(quota::testing::grpc_client, grpc_port, /*server=*/0, until, std::ref(log));
#pragma once

#include <httplib.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include <grpcpp/grpcpp.h>
#include <catch2/catch.hpp>

#include "absl/numeric/int128.h"
#include "envoy/service/ratelimit/v3/rls.grpc.pb.h"
#include "quota/verify/envelope.hpp"

namespace quota::testing {

namespace rls = envoy::service::ratelimit::v3;

// The steady clock in nanoseconds: the time base of Admission.
inline std::int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

struct Admission {
  std::int64_t sent = 0;
  std::int64_t answered = 0;
  int server = 0;
};

struct Log {
  std::mutex mu;
  std::vector<Admission> admitted;
  long long denied = 0;
  std::string error;

  // One call's answer (`got`: 1 admitted, 0 denied, -1 no decision, `why`); false when
  // the client must stop (no decision: `why` kept as the error).
  bool record(int got, const std::string& why, std::int64_t sent, std::int64_t answered,
              int server) {
    std::lock_guard lock(mu);
    if (got < 0) {
      error = why;
      return false;
    }
    if (got == 1) {
      admitted.push_back({sent, answered, server});
    } else {
      ++denied;
    }
    return true;
  }
};

// The admissions of `log`, at the times their calls were answered, against the token
// bucket's envelope r·T + B + extra, where extra = ⌈longest admitted call · r⌉ + 1 units
// allows for the time a call takes between its decision and its answer.
inline verify::TokenBucketReport token_bucket_verdict(const Log& log, Rate rate,
                                                      std::int64_t burst) {
  std::int64_t longest = 0;
  std::vector<verify::AdmittedEvent> events;
  for (const Admission& x : log.admitted) {
    longest = std::max(longest, x.answered - x.sent);
    events.push_back({.time_ns = x.answered, .cost = 1});
  }
  std::sort(events.begin(), events.end(),
            [](const auto& l, const auto& r) { return l.time_ns < r.time_ns; });
  const absl::int128 per = rate.per.count();
  const auto extra =
      static_cast<std::int64_t>((absl::int128(longest) * rate.units + per - 1) / per) + 1;
  auto report = verify::verify_token_bucket(events, rate, burst, extra);
  REQUIRE(report.ok());
  UNSCOPED_INFO("admitted " << events.size() << ", denied " << log.denied
                            << ", longest admitted call " << longest << " ns, extra " << extra
                            << ", required burst " << report->required_burst());
  return *report;
}

// A ShouldRateLimit request of 1 unit for `tenant` in domain "quota".
inline rls::RateLimitRequest one_unit(const std::string& tenant) {
  rls::RateLimitRequest req;
  req.set_domain("quota");
  auto* e = req.add_descriptors()->add_entries();
  e->set_key("tenant");
  e->set_value(tenant);
  return req;
}

// One /v1/check of 1 unit for `tenant`: 1 admitted, 0 denied, -1 no decision (`error`).
inline int http_check(httplib::Client& c, const std::string& tenant, std::string* error = nullptr) {
  auto r = c.Post("/v1/check", R"({"tenant":")" + tenant + R"("})", "application/json");
  if (!r || r->status != 200) {
    if (error != nullptr) *error = "http: " + (r ? r->body : std::string("no answer"));
    return -1;
  }
  return r->body.find("\"allowed\":true") != std::string::npos ? 1 : 0;
}

// POST /v1/check for `tenant` (1 unit): the status and the body; a call without an answer
// fails the test.
inline std::pair<int, std::string> post_check(int port, const std::string& tenant) {
  httplib::Client c("127.0.0.1", port);
  c.set_read_timeout(10);
  auto r = c.Post("/v1/check", R"({"tenant":")" + tenant + R"("})", "application/json");
  REQUIRE(r);
  return {r->status, r->body};
}

// Sends `req` over gRPC until `until` (now_ns) or 20,000 calls; OK is an admission.
inline void grpc_request_client(int port, int server, const rls::RateLimitRequest& req,
                                std::int64_t until, Log& log) {
  auto stub = rls::RateLimitService::NewStub(
      grpc::CreateChannel("127.0.0.1:" + std::to_string(port), grpc::InsecureChannelCredentials()));
  for (int n = 0; n < 20'000 && now_ns() < until; ++n) {
    rls::RateLimitResponse resp;
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    const std::int64_t sent = now_ns();
    const grpc::Status s = stub->ShouldRateLimit(&ctx, req, &resp);
    const std::int64_t answered = now_ns();
    const int got = !s.ok() ? -1 : resp.overall_code() == rls::RateLimitResponse::OK ? 1 : 0;
    if (!log.record(got, "grpc: " + s.error_message(), sent, answered, server)) return;
  }
}

// Checks 1 unit for "shared" over gRPC until `until` (now_ns) or 20,000 calls.
inline void grpc_client(int port, int server, std::int64_t until, Log& log) {
  grpc_request_client(port, server, one_unit("shared"), until, log);
}

// Checks 1 unit for `tenant` over HTTP /v1/check until `until` or 20,000 calls.
inline void http_tenant_client(int port, int server, const std::string& tenant, std::int64_t until,
                               Log& log) {
  httplib::Client c("127.0.0.1", port);
  c.set_read_timeout(10);
  for (int n = 0; n < 20'000 && now_ns() < until; ++n) {
    const std::int64_t sent = now_ns();
    std::string error;
    const int got = http_check(c, tenant, &error);
    if (!log.record(got, error, sent, now_ns(), server)) return;
  }
}

// The same for "shared".
inline void http_client(int port, int server, std::int64_t until, Log& log) {
  http_tenant_client(port, server, "shared", until, log);
}

}  // namespace quota::testing
