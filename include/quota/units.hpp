// quota/units.hpp — units, rates and exact integer arithmetic helpers.
//
// Every budget in quota is kept in *micro-units* (1 unit = 1,000,000 micro-units) in
// 64-bit integers, and every product that could leave 64 bits is formed in
// `absl::int128`. No floating point is used in any decision. A rate is a rational
// number of whole units per period (`Rate{.units = 1000, .per = 60s}`), never a
// rounded "units per second", so 1000/min refills exactly 1000 units every minute.
//
// Thread safety: everything here is a value type or a pure function.
//
//   using namespace std::chrono_literals;
//   quota::Rate r{.units = 1, .per = 3s};        // one unit every three seconds
//   quota::MicroUnits b = quota::to_micro(20);  // 20 units = 20,000,000 micro-units
#pragma once

#include <chrono>
#include <cstdint>
#include <limits>
#include <string>

#include "absl/numeric/int128.h"
#include "absl/status/status.h"
#include "absl/strings/str_format.h"

namespace quota {

// A duration in nanoseconds on the limiter's clock. All times in quota are this type.
using Nanos = std::chrono::nanoseconds;

// Micro-units: 1 unit = 1,000,000 micro-units.
using MicroUnits = std::int64_t;

inline constexpr std::int64_t kMicrosPerUnit = 1'000'000;

// The largest cost or burst, in whole units, whose micro-unit value fits in int64:
// floor((2^63 - 1) / 10^6) = 9,223,372,036,854 units.
inline constexpr std::int64_t kMaxUnits = std::numeric_limits<std::int64_t>::max() / kMicrosPerUnit;

// "Never": the retry_after / reset_after of a request that cannot pass by waiting
// (a rate of zero, or a cost larger than the burst). Reserved: the bounds every policy's
// validate() checks (the time to fill a token bucket, kMaxWindow) keep every finite wait
// at most 2^63 − 2 ns, so kNever is never a finite wait.
inline constexpr Nanos kNever = Nanos::max();

// Converts whole units to micro-units. Precondition: 0 <= units <= kMaxUnits (policies
// check this when they are built).
constexpr MicroUnits to_micro(std::int64_t units) { return units * kMicrosPerUnit; }

// A rate of `units` whole units per `per` (a positive duration). `units` may be 0:
// a budget that never refills.
struct Rate {
  std::int64_t units = 0;
  Nanos per{std::chrono::seconds(1)};

  friend constexpr bool operator==(const Rate&, const Rate&) = default;
};

// Checks a rate and names the offending field (`field` is the caller's name for it,
// e.g. "rate").
inline absl::Status validate_rate(const Rate& rate, const char* field) {
  if (rate.per.count() <= 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s.per must be positive (got %d ns)", field, rate.per.count()));
  }
  if (rate.units < 0 || rate.units > kMaxUnits) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s.units must be in [0, %d] so that it fits in int64 micro-units (got %d)",
                        field, kMaxUnits, rate.units));
  }
  return absl::OkStatus();
}

// Checks a whole-unit amount (a burst or a limit) in [1, kMaxUnits].
inline absl::Status validate_amount(std::int64_t units, const char* field) {
  if (units < 1 || units > kMaxUnits) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s must be in [1, %d] units so that it fits in int64 micro-units (got %d)",
                        field, kMaxUnits, units));
  }
  return absl::OkStatus();
}

namespace detail {

// ceil(a / b) for a >= 0, b > 0.
inline absl::int128 ceil_div(absl::int128 a, absl::int128 b) { return (a + b - 1) / b; }

inline constexpr absl::int128 kInt64Max = std::numeric_limits<std::int64_t>::max();

}  // namespace detail

// Formats a rate for messages: "1000/60s".
inline std::string to_string(const Rate& rate) {
  return absl::StrFormat("%d/%dns", rate.units, rate.per.count());
}

}  // namespace quota
