// examples/quota_server/api/http/envoy_json.hpp — envoyproxy/ratelimit's `POST /json`: the RLS
// ShouldRateLimit call as JSON over HTTP/1.1.
//
//   POST /json  a RateLimitRequest in protobuf's JSON mapping, as envoyproxy/ratelimit
//               takes it: {"domain": "edge", "descriptors": [{"entries": [{"key": "k",
//               "value": "v"}]}], "hits_addend": 1} (field names in either spelling,
//               hits_addend or hitsAddend) → the RateLimitResponse in the same mapping
//               ({"overallCode": "OVER_LIMIT", "statuses": [{"code": "OVER_LIMIT",
//               "currentLimit": {"requestsPerUnit": 1, "unit": "MINUTE"}}, ...]}), with
//               status 200 when overallCode is OK and 429 when it is OVER_LIMIT, and the
//               response's response_headers_to_add (Retry-After, RateLimit-Policy,
//               RateLimit) also sent as HTTP headers.
//
// The call is RateLimitServiceImpl::decide (grpc_service.hpp): the same decision, the same
// budgets and the same errors as gRPC, with either rule format. Errors are answered
// {"error": "<code>", "message": "..."}: 400 for a body over kMaxEnvoyJsonBytes, JSON that
// is not a RateLimitRequest (an unknown field included) or a call gRPC answers
// INVALID_ARGUMENT; 404 NOT_FOUND; 503 with `Retry-After: 1` when the store cannot decide
// (envoyproxy/ratelimit answers 400 to every error; quota keeps a store outage apart from
// a client's mistake, DESIGN §1); 500 otherwise. The calls count on /metrics as
// api="check", the JSON check API.
//
// Thread safety: the handler may run on any listener worker; the service is thread-safe.
//
//   quota::server::HttpListener http({});
//   quota::server::add_envoy_json_api(http, service);
#pragma once

#include <httplib.h>

#include <cctype>
#include <cstddef>
#include <string>
#include <string_view>

#include <google/protobuf/util/json_util.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "api/grpc/grpc_service.hpp"
#include "api/http/http_errors.hpp"
#include "api/http/json.hpp"
#include "stats/server_stats.hpp"

namespace quota::server {

inline constexpr std::size_t kMaxEnvoyJsonBytes = 65536;

namespace detail {

// An error answer of POST /json: quota-server's (http_errors.hpp).
inline void envoy_json_error(httplib::Response& res, absl::StatusCode code,
                             std::string_view message) {
  set_error(res, absl::Status(code, absl::string_view(message.data(), message.size())));
}

}  // namespace detail

// Registers POST /json on `server` (see the top of this file). `service` must outlive it.
inline void add_envoy_json_api(httplib::Server& server, RateLimitServiceImpl& service) {
  server.Post("/json", [&service](const httplib::Request& req, httplib::Response& res) {
    if (req.body.size() > kMaxEnvoyJsonBytes) {
      return detail::envoy_json_error(res, absl::StatusCode::kInvalidArgument,
                                      absl::StrFormat("body is %d bytes; at most %d are accepted",
                                                      req.body.size(), kMaxEnvoyJsonBytes));
    }
    rls::RateLimitRequest request;
    google::protobuf::util::JsonParseOptions parse;
    parse.ignore_unknown_fields = false;  // a misspelt field is an error, never ignored
    if (auto s = google::protobuf::util::JsonStringToMessage(req.body, &request, parse); !s.ok()) {
      return detail::envoy_json_error(
          res, absl::StatusCode::kInvalidArgument,
          absl::StrCat("the body is not a RateLimitRequest in JSON: ", s.message().as_string()));
    }
    rls::RateLimitResponse response;
    const grpc::Status status = service.decide(request, &response, Api::kJson);
    if (!status.ok()) {
      return detail::envoy_json_error(res, static_cast<absl::StatusCode>(status.error_code()),
                                      status.error_message());
    }
    std::string body;
    if (auto s = google::protobuf::util::MessageToJsonString(response, &body); !s.ok()) {
      return detail::envoy_json_error(res, absl::StatusCode::kInternal, s.message().as_string());
    }
    for (const auto& h : response.response_headers_to_add()) res.set_header(h.key(), h.value());
    res.status = response.overall_code() == rls::RateLimitResponse::OVER_LIMIT ? 429 : 200;
    res.set_content(body + "\n", "application/json");
  });
}

}  // namespace quota::server
