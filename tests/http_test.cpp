// Tests for quota/http.hpp: status, Retry-After and the RateLimit fields, string for string.
#include "quota/http.hpp"

#include <catch2/catch.hpp>
#include <chrono>
#include <ostream>
#include <string>
#include <variant>
#include <vector>

#include "quota/policy/token_bucket.hpp"

using namespace std::chrono_literals;
using quota::Decision;
using quota::Nanos;
using quota::Reason;
using quota::http::Header;

namespace quota::http {
// Catch2 prints headers with this on a failed comparison.
inline std::ostream& operator<<(std::ostream& os, const Header& h) {
  return os << h.name << ": " << h.value;
}
}  // namespace quota::http

namespace {

struct WindowLike {  // shaped like the window policies: limit per window
  std::int64_t limit = 1;
  Nanos window{1s};
  absl::Status validate() const { return absl::OkStatus(); }
};

quota::http::PolicyInfo tb_info(const quota::TokenBucket& tb, std::string_view name = "default") {
  auto info = quota::http::describe(name, tb);
  REQUIRE(info.ok());
  return *info;
}

}  // namespace

TEST_CASE("RateLimit-Policy of a token bucket: q = burst, w = burst/rate rounded up") {
  CHECK(quota::http::policy_field(tb_info({.rate = {.units = 100, .per = 60s}, .burst = 100})) ==
        "\"default\";q=100;w=60");
  // 20 units at 100/s refill in 200 ms: w rounds up to 1 s.
  CHECK(quota::http::policy_field(tb_info({.rate = {.units = 100, .per = 1s}, .burst = 20})) ==
        "\"default\";q=20;w=1");
  // 10 units at 3/s: 3.33 s -> 4.
  CHECK(quota::http::policy_field(tb_info({.rate = {.units = 3, .per = 1s}, .burst = 10})) ==
        "\"default\";q=10;w=4");
  // rate 0 never refills: no window.
  CHECK(quota::http::policy_field(tb_info({.rate = {.units = 0, .per = 1s}, .burst = 7})) ==
        "\"default\";q=7");
}

TEST_CASE("RateLimit-Policy of a window policy: q = limit, w = window in seconds") {
  auto info = quota::http::describe("per-minute", WindowLike{.limit = 1000, .window = 1min});
  REQUIRE(info.ok());
  CHECK(quota::http::policy_field(*info) == "\"per-minute\";q=1000;w=60");
  auto sub = quota::http::describe("fast", WindowLike{.limit = 5, .window = 1500ms});
  REQUIRE(sub.ok());
  CHECK(quota::http::policy_field(*sub) == "\"fast\";q=5;w=2");
}

TEST_CASE("policy names are sf-strings: quotes and backslashes escaped, others rejected") {
  CHECK(quota::http::policy_field(tb_info({.rate = {1, 1s}, .burst = 1}, "a\"b\\c")) ==
        "\"a\\\"b\\\\c\";q=1;w=1");
  quota::TokenBucket tb{.rate = {1, 1s}, .burst = 1};
  CHECK(quota::http::describe("", tb).status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(quota::http::describe("tab\there", tb).status().code() ==
        absl::StatusCode::kInvalidArgument);
  CHECK(quota::http::describe(std::string(65, 'x'), tb).status().code() ==
        absl::StatusCode::kInvalidArgument);
  CHECK(quota::http::describe(std::string(64, 'x'), tb).ok());
  // An invalid policy is not described.
  CHECK(
      quota::http::describe("x", quota::TokenBucket{.rate = {1, 1s}, .burst = 0}).status().code() ==
      absl::StatusCode::kInvalidArgument);
}

TEST_CASE("allowed: 200, RateLimit with remaining and reset rounded up, no Retry-After") {
  const auto info = tb_info({.rate = {.units = 100, .per = 60s}, .burst = 100});
  const Decision d{.allowed = true,
                   .remaining = 42,
                   .retry_after = Nanos{0},
                   .reset_after = 34'800'000'001ns,
                   .version = 3,
                   .reason = Reason::kAllowed};
  const auto a = quota::http::answer(d, info);
  CHECK(a.status == 200);
  CHECK(a.reason == "allowed");
  CHECK(a.retry_after_seconds == -1);
  CHECK(a.headers == std::vector<Header>{{"RateLimit-Policy", "\"default\";q=100;w=60"},
                                         {"RateLimit", "\"default\";r=42;t=35"}});
}

TEST_CASE("over limit: 429 with Retry-After rounded up, never 0") {
  const auto info = tb_info({.rate = {.units = 100, .per = 1s}, .burst = 20});
  Decision d{.allowed = false,
             .remaining = 0,
             .retry_after = 10ms,  // under a second: still "1", never "0"
             .reset_after = 200ms,
             .version = 0,
             .reason = Reason::kOverLimit};
  auto a = quota::http::answer(d, info);
  CHECK(a.status == 429);
  CHECK(a.reason == "over_limit");
  CHECK(a.retry_after_seconds == 1);
  CHECK(a.headers == std::vector<Header>{{"Retry-After", "1"},
                                         {"RateLimit-Policy", "\"default\";q=20;w=1"},
                                         {"RateLimit", "\"default\";r=0;t=1"}});
  d.retry_after = 2s;  // exactly 2 s stays 2
  CHECK(quota::http::answer(d, info).headers[0] == Header{"Retry-After", "2"});
  d.retry_after = 2s + 1ns;  // a nanosecond more is 3
  CHECK(quota::http::answer(d, info).headers[0] == Header{"Retry-After", "3"});
  d.retry_after = 1ns;
  CHECK(quota::http::answer(d, info).headers[0] == Header{"Retry-After", "1"});
}

TEST_CASE("over limit with kNever (a one-off budget): 429 without Retry-After or t") {
  const auto info = tb_info({.rate = {.units = 0, .per = 1s}, .burst = 5});
  const Decision d{.allowed = false,
                   .remaining = 0,
                   .retry_after = quota::kNever,
                   .reset_after = quota::kNever,
                   .version = 0,
                   .reason = Reason::kOverLimit};
  const auto a = quota::http::answer(d, info);
  CHECK(a.status == 429);
  CHECK(a.retry_after_seconds == -1);
  CHECK(a.headers == std::vector<Header>{{"RateLimit-Policy", "\"default\";q=5"},
                                         {"RateLimit", "\"default\";r=0"}});
}

TEST_CASE("cost exceeds burst: 400 with its reason, never a Retry-After") {
  quota::TokenBucket tb{.rate = {.units = 1, .per = 1s}, .burst = 3};
  auto s = tb.init(Nanos{0});
  const Decision d = tb.apply(s, Nanos{0}, 5);  // create = 5 > burst 3
  REQUIRE(d.reason == Reason::kCostExceedsBurst);
  const auto a = quota::http::answer(d, tb_info(tb));
  CHECK(a.status == 400);
  CHECK(a.reason == "cost_exceeds_burst");
  CHECK(a.retry_after_seconds == -1);
  CHECK(a.headers == std::vector<Header>{{"RateLimit-Policy", "\"default\";q=3;w=3"},
                                         {"RateLimit", "\"default\";r=3;t=0"}});
  const Decision bad = tb.apply(s, Nanos{0}, 0);
  const auto b = quota::http::answer(bad, tb_info(tb));
  CHECK(b.status == 400);
  CHECK(b.reason == "invalid_cost");
}

TEST_CASE("unavailable: 503, never 429; no RateLimit counter") {
  const auto info = tb_info({.rate = {.units = 10, .per = 1s}, .burst = 10});
  const Decision d{.allowed = false, .reason = Reason::kUnavailable};
  auto a = quota::http::answer(d, info);
  CHECK(a.status == 503);
  CHECK(a.reason == "unavailable");
  CHECK(a.headers == std::vector<Header>{{"RateLimit-Policy", "\"default\";q=10;w=1"}});
  a = quota::http::answer(d, info, {.unavailable_retry_after = 1500ms});
  CHECK(a.headers ==
        std::vector<Header>{{"Retry-After", "2"}, {"RateLimit-Policy", "\"default\";q=10;w=1"}});

  // A store error maps the same way.
  const absl::StatusOr<Decision> down = absl::UnavailableError("redis: connection refused");
  CHECK(quota::http::answer(down, info).status == 503);
  const absl::StatusOr<Decision> full = absl::ResourceExhaustedError("store full");
  CHECK(quota::http::answer(full, info).status == 503);
  const absl::StatusOr<Decision> corrupt = absl::DataLossError("not a bucket");
  const auto c = quota::http::answer(corrupt, info);
  CHECK(c.status == 500);
  CHECK(c.reason == "internal");
}

TEST_CASE("shadow and fail-open admissions are 200 with their own reasons") {
  const auto info = tb_info({.rate = {.units = 10, .per = 1s}, .burst = 10});
  Decision d{.allowed = true, .remaining = 0, .reset_after = 1s, .reason = Reason::kShadow};
  auto a = quota::http::answer(d, info);
  CHECK(a.status == 200);
  CHECK(a.reason == "shadow");
  d.reason = Reason::kFailOpen;
  a = quota::http::answer(d, info);
  CHECK(a.status == 200);
  CHECK(a.reason == "fail_open");
  CHECK(a.headers.back() == Header{"RateLimit", "\"default\";r=0;t=1"});
}

TEST_CASE("the Retry-After of a real denial is the policy's retry_after rounded up") {
  // 1 unit every 3 s, burst 1: after spending it the retry is 3 s exactly.
  quota::TokenBucket tb{.rate = {.units = 1, .per = 3s}, .burst = 1};
  auto s = tb.init(Nanos{0});
  REQUIRE(tb.apply(s, Nanos{0}, 1).allowed);
  const Decision d = tb.apply(s, 500ms, 1);
  REQUIRE_FALSE(d.allowed);
  const auto a = quota::http::answer(d, tb_info(tb));
  CHECK(a.headers == std::vector<Header>{{"Retry-After", "3"},
                                         {"RateLimit-Policy", "\"default\";q=1;w=3"},
                                         {"RateLimit", "\"default\";r=0;t=3"}});
}

TEST_CASE("a policy held in a variant is described by its alternative") {
  std::variant<quota::TokenBucket, WindowLike> p = WindowLike{.limit = 50, .window = 10s};
  auto w = quota::http::describe("v", p);
  REQUIRE(w.ok());
  CHECK(quota::http::policy_field(*w) == "\"v\";q=50;w=10");
  p = quota::TokenBucket{.rate = {.units = 1, .per = 2s}, .burst = 4};
  CHECK(quota::http::policy_field(*quota::http::describe("v", p)) == "\"v\";q=4;w=8");
}
