// quota/gateway/rules/estimate_formula.hpp — a route's estimate computed from what an LLM
// caller knows before the call: prompt tokens × a factor + the most output it allows.
//
// An LLM gateway knows a request's prompt tokens and its max output before it calls the
// provider, and the actual usage only after; the budget is deducted by an estimate and
// settled with the actual (Gateway::acquire_estimate, settle.hpp). A route's
// EstimateFormula states the estimate in the rule file, so callers send what they know
// and the rule computes the deduction:
//
//   estimate = ceil(prompt_tokens × numerator / denominator) + max_output
//
// exactly, in 128-bit integers (no floating point in decisions); the product is rounded
// up, so a factor that does not divide never under-estimates. A factor is an integer or an
// exact ratio (`3/2`), each part in [1, kMaxFactorPart]. Refused with InvalidArgument, the
// route and the field named, nothing decided: a request without prompt_tokens or
// max_output on a route with a formula, a negative count, an estimate of 0 units (it must
// cost at least 1) or over kMaxUnits.
//
// Thread safety: values and pure functions.
//
//   quota::gateway::EstimateFormula f{.numerator = 3, .denominator = 2};
//   auto e = quota::gateway::estimate_of("chat", f, /*prompt_tokens=*/1001, /*max_output=*/256);
//   // *e == 1502 + 256 = 1758 (1001 × 3/2 = 1501.5, rounded up)
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "absl/numeric/int128.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_format.h"
#include "quota/units.hpp"

namespace quota::gateway {

// The largest numerator or denominator of a factor.
inline constexpr std::int64_t kMaxFactorPart = 1'000'000;

struct EstimateFormula {
  std::int64_t numerator = 0;  // 0: the route has no formula
  std::int64_t denominator = 1;

  bool enabled() const { return numerator > 0; }

  // OK for a formula that is off, or whose parts are both in [1, kMaxFactorPart].
  absl::Status validate() const {
    if (numerator == 0 && denominator == 1) return absl::OkStatus();
    if (numerator < 1 || numerator > kMaxFactorPart || denominator < 1 ||
        denominator > kMaxFactorPart) {
      return absl::InvalidArgumentError(
          absl::StrFormat("prompt_factor %d/%d: each part must be in [1, %d]", numerator,
                          denominator, kMaxFactorPart));
    }
    return absl::OkStatus();
  }

  // "prompt_tokens * 3/2 + max_output" (the factor as written: `3` when the denominator is 1).
  std::string text() const {
    return denominator == 1
               ? absl::StrFormat("prompt_tokens * %d + max_output", numerator)
               : absl::StrFormat("prompt_tokens * %d/%d + max_output", numerator, denominator);
  }
};

// The estimate of a request on `route` (named in errors) by `formula`, from the request's
// prompt tokens and max output (see the top of this file).
inline absl::StatusOr<std::int64_t> estimate_of(std::string_view route,
                                                const EstimateFormula& formula,
                                                std::optional<std::int64_t> prompt_tokens,
                                                std::optional<std::int64_t> max_output) {
  const auto fail = [&](const std::string& what) {
    return absl::InvalidArgumentError(absl::StrFormat("route \"%s\" estimates %s: %s",
                                                      absl::string_view(route.data(), route.size()),
                                                      formula.text(), what));
  };
  if (!formula.enabled()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("route \"%s\" has no estimate formula (prompt_factor)",
                        absl::string_view(route.data(), route.size())));
  }
  if (!prompt_tokens) return fail("prompt_tokens is missing");
  if (!max_output) return fail("max_output is missing");
  if (*prompt_tokens < 0)
    return fail(absl::StrFormat("prompt_tokens %d is negative", *prompt_tokens));
  if (*max_output < 0) return fail(absl::StrFormat("max_output %d is negative", *max_output));
  const absl::int128 product = absl::int128(*prompt_tokens) * formula.numerator;
  const absl::int128 estimate =
      (product + formula.denominator - 1) / formula.denominator + *max_output;
  if (estimate < 1) return fail("the estimate is 0 units; a request costs at least 1");
  if (estimate > kMaxUnits) {
    return fail(absl::StrFormat("the estimate exceeds the largest cost, %d units", kMaxUnits));
  }
  return static_cast<std::int64_t>(estimate);
}

}  // namespace quota::gateway
