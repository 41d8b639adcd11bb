// quota/http.hpp — what an HTTP server answers for a decision.
//
// Turns a Decision (or a store error) into a status code, the `Retry-After` field, the
// IETF `RateLimit-Policy` and `RateLimit` structured fields (draft-ietf-httpapi-
// ratelimit-headers, revisions 08–11: a List of Items whose bare item is the policy name
// as an sf-string), and a stable machine-readable reason for the response body or logs.
// A denial is 429, a cost that can never fit 400, a request over its per-request cap 413,
// an unreachable authority 503 (never 429), any other store error 500: the table is on
// answer(). A host that keeps each policy's fields (the C interface) takes status_line()
// and writes the live values with ratelimit_params(), allocating nothing. Pure functions,
// no floating point, no allocation beyond the strings returned.
//
// Thread safety: pure functions; thread-safe.
//
//   auto policy = quota::http::describe("default", tb);          // StatusOr<PolicyInfo>
//   quota::http::Answer a = quota::http::answer(decision, *policy);
//   // a.status = 429, a.headers = {{"Retry-After", "2"},
//   //   {"RateLimit-Policy", "\"default\";q=20;w=1"}, {"RateLimit", "\"default\";r=0;t=1"}}
#pragma once

#include <algorithm>
#include <charconv>
#include <chrono>
#include <concepts>
#include <cstdint>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "absl/numeric/int128.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "quota/decision.hpp"
#include "quota/policy/token_bucket.hpp"
#include "quota/units.hpp"

namespace quota::http {

inline constexpr std::size_t kMaxPolicyNameBytes = 64;

// What `RateLimit-Policy` says about one policy. Build it with describe().
struct PolicyInfo {
  std::string name{};               // sf-string content, unescaped
  std::int64_t quota = 0;           // q: whole units
  std::int64_t window_seconds = 0;  // w: whole seconds; 0 = omitted
};

struct Header {
  std::string name{};
  std::string value{};

  friend bool operator==(const Header&, const Header&) = default;
};

struct Answer {
  int status = 200;
  std::string_view reason{};      // stable, machine-readable: see answer()
  std::vector<Header> headers{};  // in the order Retry-After, RateLimit-Policy, RateLimit
  // The Retry-After value in seconds, or -1 when the field is omitted.
  std::int64_t retry_after_seconds = -1;
};

struct Options {
  // Retry-After on a 503; 0 omits it. Rounded up to whole seconds.
  Nanos unavailable_retry_after{0};
};

namespace detail {

// ceil(d / 1 s) for d >= 0, in whole seconds (kNever stays huge but finite).
inline std::int64_t ceil_seconds(Nanos d) {
  if (d.count() <= 0) return 0;
  constexpr std::int64_t kNs = 1'000'000'000;
  return d.count() / kNs + (d.count() % kNs != 0);
}

inline absl::Status check_name(std::string_view name) {
  if (name.empty() || name.size() > kMaxPolicyNameBytes) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "policy name is %d bytes; it must be 1..%d bytes", name.size(), kMaxPolicyNameBytes));
  }
  for (char ch : name) {
    const auto u = static_cast<unsigned char>(ch);
    if (u < 0x20 || u > 0x7e) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "policy name contains byte 0x%02x; only printable ASCII (0x20-0x7e) is allowed", u));
    }
  }
  return absl::OkStatus();
}

// The sf-string serialization: DQUOTE, the content with `"` and `\` escaped, DQUOTE.
inline std::string sf_string(std::string_view s) {
  std::string out = "\"";
  for (char ch : s) {
    if (ch == '"' || ch == '\\') out.push_back('\\');
    out.push_back(ch);
  }
  out.push_back('"');
  return out;
}

}  // namespace detail

// The RateLimit fields. `RateLimit-Policy` describes the policy: `"<name>";q=<quota>`
// plus `;w=<window seconds>` when the policy has a window:
//   - TokenBucket{rate, burst}: q = burst, w = the time to refill a whole burst from
//     empty, burst·rate.per/rate.units, rounded UP to whole seconds (at least 1); no w
//     when rate.units = 0 (the budget never refills);
//   - window policies (FixedWindow, SlidingLog, SlidingWindowEstimate: anything with
//     `limit` and `window`): q = limit, w = window rounded up to whole seconds.
// `RateLimit` is the live counter: `"<name>";r=<remaining>;t=<reset seconds>` with
// r = decision.remaining (whole units, clamped at 0) and t = decision.reset_after rounded
// UP to whole seconds; t is omitted when reset_after is kNever. On a 503 (no decision was
// made) `RateLimit` is omitted and only `RateLimit-Policy` is sent.
//
// The field value of `RateLimit-Policy` for one policy: `"name";q=100;w=60`.
inline std::string policy_field(const PolicyInfo& p) {
  std::string out = absl::StrCat(detail::sf_string(p.name), ";q=", p.quota);
  if (p.window_seconds > 0) absl::StrAppend(&out, ";w=", p.window_seconds);
  return out;
}

// The parameters of `RateLimit` after the name, `;r=42;t=30` (t omitted for kNever),
// written into `out` without allocating; their length. A host that keeps each policy's
// quoted name writes the field with it (the C interface does).
inline constexpr std::size_t kRateLimitParamsBytes = 48;  // two int64 and the keys
inline std::size_t ratelimit_params(const Decision& d, char (&out)[kRateLimitParamsBytes]) {
  char* at = out;
  char* const end = out + kRateLimitParamsBytes;
  auto put = [&](std::string_view key, std::int64_t v) {
    for (char ch : key) *at++ = ch;
    at = std::to_chars(at, end, v).ptr;
  };
  put(";r=", d.remaining < 0 ? 0 : d.remaining);
  if (d.reset_after != kNever) put(";t=", detail::ceil_seconds(d.reset_after));
  return static_cast<std::size_t>(at - out);
}

// The field value of `RateLimit`: `"name";r=42;t=30` (t omitted for kNever).
inline std::string ratelimit_field(const PolicyInfo& p, const Decision& d) {
  char params[kRateLimitParamsBytes];
  const std::size_t n = ratelimit_params(d, params);
  return absl::StrCat(detail::sf_string(p.name), absl::string_view(params, n));
}

// Policy names must be 1..64 printable ASCII bytes (0x20–0x7e); `"` and `\` are escaped
// as sf-string requires. describe() rejects anything else with InvalidArgument.
//
// A TokenBucket as RateLimit-Policy sees it (see policy_field).
inline absl::StatusOr<PolicyInfo> describe(std::string_view name, const TokenBucket& tb) {
  if (auto s = detail::check_name(name); !s.ok()) return s;
  if (auto s = tb.validate(); !s.ok()) return s;
  PolicyInfo info{.name = std::string(name), .quota = tb.burst, .window_seconds = 0};
  if (tb.rate.units > 0) {
    // burst/rate in ns, rounded up; validate() keeps it below 2^63 ns.
    const absl::int128 fill_ns = quota::detail::ceil_div(
        absl::int128(tb.burst) * tb.rate.per.count(), absl::int128(tb.rate.units));
    info.window_seconds = detail::ceil_seconds(Nanos{static_cast<std::int64_t>(fill_ns)});
    if (info.window_seconds < 1) info.window_seconds = 1;
  }
  return info;
}

// Any window policy (`limit` units per `window`).
template <class P>
requires requires(const P& p) {
  { p.limit } -> std::convertible_to<std::int64_t>;
  { p.window } -> std::convertible_to<Nanos>;
  { p.validate() } -> std::same_as<absl::Status>;
}
absl::StatusOr<PolicyInfo> describe(std::string_view name, const P& p) {
  if (auto s = detail::check_name(name); !s.ok()) return s;
  if (auto s = p.validate(); !s.ok()) return s;
  std::int64_t w = detail::ceil_seconds(p.window);
  return PolicyInfo{.name = std::string(name), .quota = p.limit, .window_seconds = w < 1 ? 1 : w};
}

// A policy held in a std::variant (e.g. quota::gateway::RulePolicy): the alternative's
// description.
template <class... Ps>
absl::StatusOr<PolicyInfo> describe(std::string_view name, const std::variant<Ps...>& p) {
  return std::visit([&](const auto& x) { return describe(name, x); }, p);
}

// The status line of the answer for `d` (the table on answer()), without its fields: the
// status, the reason, the Retry-After seconds (-1: omitted), and whether a `RateLimit`
// field goes with it (not on a 503: no decision was made). answer() is this and the
// fields; a host that writes the fields itself takes this.
struct StatusLine {
  int status = 200;
  std::string_view reason{};
  std::int64_t retry_after_seconds = -1;
  bool ratelimit = true;
};
inline StatusLine status_line(const Decision& d, const Options& options = {}) {
  StatusLine a;
  a.reason = to_string(d.reason);
  switch (d.reason) {
    case Reason::kOverLimit:
    case Reason::kOverShare:
    case Reason::kPaused:
      a.status = 429;
      // Never 0 on a denial: a retry_after under 1 s still says "1".
      if (d.retry_after != kNever) {
        a.retry_after_seconds = std::max<std::int64_t>(1, detail::ceil_seconds(d.retry_after));
      }
      break;
    case Reason::kCostExceedsBurst:
    case Reason::kInvalidCost:
      a.status = 400;
      break;
    case Reason::kRequestTooLarge:
      a.status = 413;  // Content Too Large: this request, unchanged, never passes
      break;
    case Reason::kAttemptExpired:
      a.status = 504;  // the caller's deadline passed: no answer is given in time
      break;
    case Reason::kUnavailable:
      a.status = 503;
      if (options.unavailable_retry_after.count() > 0) {
        a.retry_after_seconds = detail::ceil_seconds(options.unavailable_retry_after);
      }
      break;
    default:
      // kAllowed, kShadow, kFailOpen and any admitted decision.
      a.status = d.allowed ? 200 : 429;
      break;
  }
  a.ratelimit = a.status != 503;
  return a;
}

// The answer for a decision made under `policy`.
//
// The mapping (tested string for string in tests/http_test.cpp):
//
//   decision                         status  Retry-After                 reason
//   allowed (kAllowed)               200     —                           "allowed"
//   allowed in shadow mode (kShadow) 200     —                           "shadow"
//   allowed by the local emergency   200     —                           "fail_open"
//     bucket (kFailOpen)
//   kOverLimit, finite retry_after   429     ceil(retry_after / 1 s),    "over_limit"
//                                            at least 1 (never 0)
//   kOverLimit, retry_after = kNever 429     omitted: waiting never      "over_limit"
//     (a one-off budget, rate 0)             helps, so no time is promised
//   kCostExceedsBurst                400     omitted                     "cost_exceeds_burst"
//   kInvalidCost                     400     omitted                     "invalid_cost"
//   kRequestTooLarge (over a         413     omitted                     "request_too_large"
//     per-request cap, max_cost)
//   kOverShare (past its fair share  429     ceil(retry_after / 1 s),    "over_share"
//     of a global budget)                    at least 1
//   kPaused (a global budget with    429     ceil(retry_after / 1 s),    "paused"
//     fair_share above its pause)            at least 1
//   kAttemptExpired (the request's  504     omitted                     "attempt_expired"
//     deadline passed)
//   kUnavailable (fail-closed route) 503     Options::               "unavailable"
//     or a store error Unavailable,          unavailable_retry_after
//     ResourceExhausted, DeadlineExceeded    (omitted when 0)
//   any other store error            500     —                           "internal"
//
// Why 400 for a cost that can never fit: the request asks for more than the bucket can
// ever hold, so repeating it can never succeed. A 429 invites the client to back off and
// retry forever (and with no Retry-After many clients retry at once); a 400-class status
// says "do not repeat this request unchanged". The reason string tells the two 400s apart
// from other client errors. Why 503 and not 429 when the authority is unreachable: the
// tenant did not exceed anything (DESIGN §1).
inline Answer answer(const Decision& d, const PolicyInfo& policy, const Options& options = {}) {
  const StatusLine s = status_line(d, options);
  Answer a{.status = s.status,
           .reason = s.reason,
           .headers = {},
           .retry_after_seconds = s.retry_after_seconds};
  if (s.retry_after_seconds >= 0) {
    a.headers.push_back({"Retry-After", absl::StrCat(s.retry_after_seconds)});
  }
  a.headers.push_back({"RateLimit-Policy", policy_field(policy)});
  if (s.ratelimit) a.headers.push_back({"RateLimit", ratelimit_field(policy, d)});
  return a;
}

// The answer for a store call that may have failed (see the table on answer()).
inline Answer answer(const absl::StatusOr<Decision>& d, const PolicyInfo& policy,
                     const Options& options = {}) {
  if (d.ok()) return answer(*d, policy, options);
  switch (d.status().code()) {
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kResourceExhausted:
    case absl::StatusCode::kDeadlineExceeded:
      return answer(Decision{.allowed = false, .reason = Reason::kUnavailable}, policy, options);
    default: {
      Answer a;
      a.status = 500;
      a.reason = "internal";
      a.headers.push_back({"RateLimit-Policy", policy_field(policy)});
      return a;
    }
  }
}

}  // namespace quota::http
