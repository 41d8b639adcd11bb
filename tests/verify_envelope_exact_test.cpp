// Tests of quota/verify/envelope.hpp on exact cases: closed intervals and exact fractions
// (a violation of 1/3000 of a micro-unit is reported), half-open windows, saturation, and
// invalid logs and parameters rejected, naming the event.
#include <chrono>
#include <cstdint>
#include <limits>
#include <vector>

#include <catch2/catch.hpp>

#include "quota/verify/envelope.hpp"

using namespace std::chrono_literals;
using quota::Nanos;
using quota::Rate;
using quota::verify::AdmittedEvent;

TEST_CASE("token-bucket verifier: closed intervals and exact fractions", "[verify]") {
  const Rate one_per_3s{.units = 1, .per = 3s};
  SECTION("the example of the header") {
    const std::vector<AdmittedEvent> log = {{0, 20}, {10'000'000, 1}};
    const auto r = quota::verify::verify_token_bucket(log, {.units = 100, .per = 1s}, 20);
    REQUIRE(r.ok());
    CHECK(r->holds());
    CHECK(r->slack_micro() == 0);  // 21 units in 10 ms = 100/s · 10 ms + 20 exactly
    const auto w = quota::verify::verify_window(log, 20, 1s);
    REQUIRE(w.ok());
    CHECK_FALSE(w->holds());
    CHECK(w->peak == 21);
  }
  SECTION("a violation of 1/3000 micro-unit is reported, rounded up to 1 micro-unit") {
    // Two units 1 ns less than one refill apart: 2 > 1 + (3s - 1ns)/3s.
    const std::vector<AdmittedEvent> log = {{0, 1}, {3'000'000'000 - 1, 1}};
    const auto r = quota::verify::verify_token_bucket(log, one_per_3s, 1);
    REQUIRE(r.ok());
    CHECK_FALSE(r->holds());
    CHECK(r->excess_scaled == 1);  // 1/3e9 units
    CHECK(r->excess_micro() == 1);
    CHECK(r->slack_micro() == -1);
    CHECK(r->required_burst() == 2);
    CHECK(r->witness.first == 0);
    CHECK(r->witness.last == 1);
    CHECK(r->witness.admitted == 2);
  }
  SECTION("exactly one refill apart holds with zero slack") {
    const std::vector<AdmittedEvent> log = {{0, 1}, {3'000'000'000, 1}};
    const auto r = quota::verify::verify_token_bucket(log, one_per_3s, 1);
    REQUIRE(r.ok());
    CHECK(r->holds());
    CHECK(r->excess_scaled == 0);
    CHECK(r->slack_micro() == 0);
    CHECK(r->required_burst() == 1);
  }
  SECTION("events at one instant all count together") {
    const std::vector<AdmittedEvent> log = {{5, 1}, {10, 1}, {10, 1}, {10, 1}};
    const auto r = quota::verify::verify_token_bucket(log, {.units = 1, .per = 1s}, 3);
    REQUIRE(r.ok());
    CHECK_FALSE(r->holds());
    CHECK(r->witness.first == 0);
    CHECK(r->witness.last == 3);
    CHECK(r->witness.admitted == 4);
  }
  SECTION("the extra allowance and the slack") {
    // 100/s, burst 20: 30 units at one instant exceed by 10.
    const std::vector<AdmittedEvent> log = {{7, 30}};
    const Rate r100{.units = 100, .per = 1s};
    auto r = quota::verify::verify_token_bucket(log, r100, 20, 0);
    REQUIRE(r.ok());
    CHECK(r->excess_micro() == 10'000'000);
    r = quota::verify::verify_token_bucket(log, r100, 20, 10);
    REQUIRE(r.ok());
    CHECK(r->holds());
    CHECK(r->slack_micro() == 0);
    r = quota::verify::verify_token_bucket(log, r100, 20, 12);
    REQUIRE(r.ok());
    CHECK(r->slack_micro() == 2'000'000);
    CHECK(quota::verify::to_string(*r).find("holds") == 0);
  }
  SECTION("an empty log holds with the whole burst as slack") {
    const auto r = quota::verify::verify_token_bucket({}, {.units = 5, .per = 1s}, 4, 1);
    REQUIRE(r.ok());
    CHECK(r->holds());
    CHECK(r->witness.empty);
    CHECK(r->slack_micro() == 5'000'000);
  }
  SECTION("a huge log saturates instead of overflowing, and stays a violation") {
    const Rate slow{.units = 0, .per = Nanos::max()};
    quota::verify::TokenBucketVerifier v(slow, 1);
    for (int i = 0; i < 20'000; ++i) REQUIRE(v.add({0, quota::kMaxUnits}).ok());
    const auto r = v.report();
    CHECK(r.saturated);
    CHECK_FALSE(r.holds());
    CHECK(r.peak_scaled == quota::verify::kScaledCap);
    CHECK(r.excess_micro() == std::numeric_limits<std::int64_t>::max());
  }
}

TEST_CASE("window verifier: half-open windows", "[verify]") {
  // An event at e counts for now in [e, e + W): events exactly W apart never meet.
  const std::vector<AdmittedEvent> apart = {{0, 10}, {1000, 10}};
  auto r = quota::verify::verify_window(apart, 10, Nanos{1000});
  REQUIRE(r.ok());
  CHECK(r->holds());
  CHECK(r->peak == 10);
  const std::vector<AdmittedEvent> close = {{0, 10}, {999, 10}};
  r = quota::verify::verify_window(close, 10, Nanos{1000});
  REQUIRE(r.ok());
  CHECK_FALSE(r->holds());
  CHECK(r->excess == 10);
  CHECK(r->witness.first == 0);
  CHECK(r->witness.last == 1);
  CHECK(quota::verify::to_string(*r).find("VIOLATED") == 0);
  // Times across the whole int64 range do not overflow.
  const std::vector<AdmittedEvent> wide = {{std::numeric_limits<std::int64_t>::min(), 1},
                                           {std::numeric_limits<std::int64_t>::max(), 1}};
  r = quota::verify::verify_window(wide, 1, Nanos::max());
  REQUIRE(r.ok());
  CHECK(r->peak == 1);
}

TEST_CASE("verifiers reject invalid logs and parameters, naming the event", "[verify]") {
  const Rate rate{.units = 1, .per = 1s};
  const std::vector<AdmittedEvent> backwards = {{10, 1}, {20, 1}, {19, 1}};
  auto tb = quota::verify::verify_token_bucket(backwards, rate, 5);
  REQUIRE_FALSE(tb.ok());
  CHECK(tb.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(tb.status().message().find("event 2") != absl::string_view::npos);
  auto w = quota::verify::verify_window(backwards, 5, 1s);
  REQUIRE_FALSE(w.ok());
  CHECK(w.status().message().find("event 2") != absl::string_view::npos);

  const std::vector<AdmittedEvent> negative = {{0, -1}};
  CHECK_FALSE(quota::verify::verify_token_bucket(negative, rate, 5).ok());
  CHECK_FALSE(quota::verify::verify_window(negative, 5, 1s).ok());
  const std::vector<AdmittedEvent> huge = {{0, quota::kMaxUnits + 1}};
  CHECK_FALSE(quota::verify::verify_token_bucket(huge, rate, 5).ok());

  const std::vector<AdmittedEvent> ok = {{0, 1}};
  auto bad = quota::verify::verify_token_bucket(ok, rate, -1);
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.status().message().find("burst") != absl::string_view::npos);
  bad = quota::verify::verify_token_bucket(ok, rate, 1, -2);
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.status().message().find("extra") != absl::string_view::npos);
  bad = quota::verify::verify_token_bucket(ok, {.units = 1, .per = Nanos{0}}, 1);
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.status().message().find("rate.per") != absl::string_view::npos);
  auto badw = quota::verify::verify_window(ok, 1, Nanos{0});
  REQUIRE_FALSE(badw.ok());
  CHECK(badw.status().message().find("window") != absl::string_view::npos);
  badw = quota::verify::verify_window(ok, -1, 1s);
  REQUIRE_FALSE(badw.ok());
  CHECK(badw.status().message().find("limit") != absl::string_view::npos);

  // A streaming verifier keeps its state after a rejected event.
  quota::verify::TokenBucketVerifier v(rate, 5);
  REQUIRE(v.add({10, 1}).ok());
  REQUIRE_FALSE(v.add({9, 1}).ok());
  REQUIRE(v.add({10, 1}).ok());
  CHECK(v.report().events == 2);
  CHECK(v.report().witness.admitted == 2);
}
