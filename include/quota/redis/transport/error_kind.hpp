// quota/redis/transport/error_kind.hpp — what kind of failure a Redis call's status is.
//
// Every failed call is an absl::Status (kUnavailable for the transport, the deadline, an
// open breaker, the in-flight guard; kUnauthenticated for a refused AUTH). The code says
// what the gateway does with it (quota/gateway/request.hpp is_unavailable: the route's
// fail mode); ErrorKind says why, for counters and logs (quota-server's
// quota_redis_errors_total{kind}). The transport marks the status where it is made,
// as a payload under kErrorKindUrl (absl::Status::SetPayload), so a reader never parses a
// message: the deadline (deadline.hpp Deadline::error), an open breaker
// (connection_pool.hpp), the in-flight guard (breaker.hpp), a script's refusal of a node
// whose TIME ran ahead (reply.hpp error_status). A status without the payload
// has the kind its code implies: kUnauthenticated, kDeadlineExceeded → kDeadline,
// kUnavailable → kUnavailable, anything else kOther.
//
// Guarantees: marking keeps the code and the message; error_kind() is total.
//
// Thread safety: pure functions on values.
//
//   absl::Status s = quota::redis::with_kind(absl::UnavailableError("..."),
//                                            quota::redis::ErrorKind::kBreakerOpen);
//   if (quota::redis::error_kind(s) == quota::redis::ErrorKind::kBreakerOpen) { ... }
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/cord.h"

namespace quota::redis {

enum class ErrorKind : std::uint8_t {
  kUnavailable = 0,      // the transport: connect, send, receive; an error reply
  kDeadline = 1,         // the call's deadline passed (deadline.hpp)
  kBreakerOpen = 2,      // the node's circuit breaker is open (breaker.hpp)
  kInFlight = 3,         // the in-flight guard's maximum is reached (breaker.hpp)
  kUnauthenticated = 4,  // AUTH refused (NOAUTH, WRONGPASS)
  kOther = 5,            // anything else
  kClockAhead = 6,       // the node's TIME ran ahead of the client's clock (node_watch.hpp)
};
inline constexpr std::size_t kErrorKinds = 7;

// Names for labels and logs, indexed by ErrorKind.
inline constexpr std::array<const char*, kErrorKinds> kErrorKindNames = {
    "unavailable",     "deadline", "breaker_open", "in_flight",
    "unauthenticated", "other",    "clock_ahead"};

// The payload's type URL.
inline constexpr std::string_view kErrorKindUrl = "type.quota.dev/quota.redis.ErrorKind";

// `s` marked as `kind` (an OK status stays OK, unmarked).
inline absl::Status with_kind(absl::Status s, ErrorKind kind) {
  if (s.ok()) return s;
  const char c = static_cast<char>('0' + static_cast<int>(kind));
  s.SetPayload(absl::string_view(kErrorKindUrl.data(), kErrorKindUrl.size()),
               absl::Cord(absl::string_view(&c, 1)));
  return s;
}

// The kind of a failed call (see the top of this file).
inline ErrorKind error_kind(const absl::Status& s) {
  const auto p = s.GetPayload(absl::string_view(kErrorKindUrl.data(), kErrorKindUrl.size()));
  if (p.has_value() && p->size() == 1) {
    const int k = static_cast<unsigned char>((*p)[0]) - '0';
    if (k >= 0 && k < static_cast<int>(kErrorKinds)) return static_cast<ErrorKind>(k);
  }
  switch (s.code()) {
    case absl::StatusCode::kUnauthenticated:
      return ErrorKind::kUnauthenticated;
    case absl::StatusCode::kDeadlineExceeded:
      return ErrorKind::kDeadline;
    case absl::StatusCode::kUnavailable:
      return ErrorKind::kUnavailable;
    default:
      return ErrorKind::kOther;
  }
}

// `s`'s code and kind with the message `message` (for a caller that adds context).
inline absl::Status with_message(const absl::Status& s, std::string_view message) {
  absl::Status out(s.code(), absl::string_view(message.data(), message.size()));
  if (s.GetPayload(absl::string_view(kErrorKindUrl.data(), kErrorKindUrl.size())).has_value()) {
    return with_kind(std::move(out), error_kind(s));
  }
  return out;
}

}  // namespace quota::redis
