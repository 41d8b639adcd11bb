// examples/quota_server/api/http/http_errors.hpp — how quota-server's HTTP APIs answer an error:
// one status per absl::StatusCode and one JSON body, {"error": "<code>", "message": ...},
// for /v1/check, /v1/auth and /json alike (http_api.hpp, envoy_json.hpp).
//
//   InvalidArgument 400, NotFound 404, Aborted and FailedPrecondition 409, Unavailable,
//   ResourceExhausted and DeadlineExceeded 503 (with Retry-After: 1: the store may answer
//   soon), anything else 500. The code is the status code's name in lower case with
//   underscores ("invalid_argument").
//
// Thread safety: pure functions.
//
//   quota::server::detail::set_error(res, absl::InvalidArgumentError("tenant is missing"));
#pragma once

#include <httplib.h>

#include <cctype>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "api/http/json.hpp"

namespace quota::server::detail {

inline int http_status_of(const absl::Status& s) {
  switch (s.code()) {
    case absl::StatusCode::kInvalidArgument:
      return 400;
    case absl::StatusCode::kNotFound:
      return 404;
    case absl::StatusCode::kAborted:
    case absl::StatusCode::kFailedPrecondition:
      return 409;
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kResourceExhausted:
    case absl::StatusCode::kDeadlineExceeded:
      return 503;
    default:
      return 500;
  }
}

inline std::string error_body(const absl::Status& s) {
  std::string code = absl::StatusCodeToString(s.code());
  for (char& c : code) c = c == ' ' ? '_' : static_cast<char>(std::tolower(c));
  return absl::StrCat("{\"error\":", json_quote(code),
                      ",\"message\":", json_quote(std::string(s.message())), "}\n");
}

// `s` as the JSON error body, the status left as set.
inline void set_error_body(httplib::Response& res, const absl::Status& s) {
  res.set_content(error_body(s), "application/json");
}

inline void set_error(httplib::Response& res, const absl::Status& s) {
  res.status = http_status_of(s);
  if (res.status == 503) res.set_header("Retry-After", "1");  // the store may answer soon
  res.set_content(error_body(s), "application/json");
}

}  // namespace quota::server::detail
