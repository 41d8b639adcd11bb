// quota/redis/transport/reply.hpp — a hiredis reply and how its errors read.
//
// `Reply` owns one reply as hiredis returns it (any type, including an error reply).
// `reply_string` views its text, `is_error(r, "NOSCRIPT")` tests an error reply's code, and
// `error_status(r)` maps an error reply to the absl::Status a caller reports: NOAUTH and
// WRONGPASS kUnauthenticated (naming authentication), NOPERM kPermissionDenied, any other
// kUnavailable (QUOTA_CLOCK_AHEAD marked ErrorKind::kClockAhead: error_kind.hpp). An error reply is
// a reply, not a transport failure (connection.hpp).
//
// Thread safety: plain values and pure functions.
//
//   quota::redis::Reply r = ...;  // from Connection::command
//   if (quota::redis::is_error(*r, "NOSCRIPT")) { /* load the script */ }
//   else if (absl::Status s = quota::redis::error_status(*r); !s.ok()) return s;
#pragma once

#include <hiredis/hiredis.h>

#include <memory>
#include <string_view>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "quota/redis/transport/error_kind.hpp"

namespace quota::redis {

struct ReplyDeleter {
  void operator()(redisReply* r) const {
    if (r != nullptr) freeReplyObject(r);
  }
};
// A reply as hiredis returns it (any type, including REDIS_REPLY_ERROR).
using Reply = std::unique_ptr<redisReply, ReplyDeleter>;

namespace detail {
// Debian's abseil has its own absl::string_view; StrCat needs it, not std::string_view.
inline absl::string_view av(std::string_view s) { return absl::string_view(s.data(), s.size()); }
}  // namespace detail

inline std::string_view reply_string(const redisReply& r) {
  return std::string_view(r.str == nullptr ? "" : r.str, r.len);
}

// True for an error reply whose message starts with `code` ("NOSCRIPT", "BUSY", ...).
inline bool is_error(const redisReply& r, std::string_view code) {
  if (r.type != REDIS_REPLY_ERROR) return false;
  const std::string_view s = reply_string(r);
  return s.size() >= code.size() && s.substr(0, code.size()) == code &&
         (s.size() == code.size() || s[code.size()] == ' ');
}

// OK unless `r` is an error reply; then "redis error: <message>" with the code its kind
// calls for: NOAUTH and WRONGPASS kUnauthenticated (naming authentication), NOPERM (an
// ACL user without the right) kPermissionDenied, any other kUnavailable. Callers that
// treat some errors specially (NOSCRIPT) look at the reply before calling this.
inline absl::Status error_status(const redisReply& r) {
  if (r.type != REDIS_REPLY_ERROR) return absl::OkStatus();
  const std::string_view msg = reply_string(r);
  if (is_error(r, "NOAUTH") || is_error(r, "WRONGPASS")) {
    return absl::UnauthenticatedError(
        absl::StrCat("redis error: authentication: ", detail::av(msg)));
  }
  if (is_error(r, "NOPERM")) {
    return absl::PermissionDeniedError(absl::StrCat("redis error: ", detail::av(msg)));
  }
  absl::Status s = absl::UnavailableError(absl::StrCat("redis error: ", detail::av(msg)));
  if (is_error(r, "QUOTA_CLOCK_AHEAD")) return with_kind(std::move(s), ErrorKind::kClockAhead);
  return s;
}

}  // namespace quota::redis
