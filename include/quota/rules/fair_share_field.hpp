// quota/rules/fair_share_field.hpp — the `fair_share` field of a rule in a rule file.
//
// A rule's `fair_share: {reserve, shares_above, pause_above, period, budget}` (every
// field optional; `fair_share: {}` takes the defaults 10 %, 70 %, 90 %, 10 s and the
// policy's rate × period) enables gateway::FairShareSpec (gateway/fair_share_spec.hpp).
// Thresholds are percentages (`10%`, `72.5%`: scalars.hpp, parse_percent), `period` a
// duration, `budget` whole units. Syntax errors are located here (FieldReader); the
// option's bounds (only on a global rule, thresholds ordered, ...) are RuleSet::create's,
// located by rule_file.hpp at the field they name. Needs yaml-cpp: link quota::rules.
//
// Thread safety: pure functions.
//
//   rules:
//     - {name: provider, level: global, limit: tokens, token_bucket: {rate: 4000000/1min,
//        burst: 1000000}, fair_share: {reserve: 10%, shares_above: 70%, pause_above: 90%,
//        period: 10s}}
#pragma once

#include <array>
#include <span>
#include <string_view>

#include "quota/gateway/fair_share_spec.hpp"
#include "quota/rules/scalars.hpp"
#include "quota/rules/yaml_fields.hpp"

namespace quota::rules::detail {

inline constexpr std::array<std::string_view, 5> kFairShareFields{
    "reserve", "shares_above", "pause_above", "period", "budget"};
inline constexpr std::string_view kFairShareExpected =
    "{reserve, shares_above, pause_above, period, budget}";

// The option from the fields of its mapping (already listed by `in`: no unknown field).
inline gateway::FairShareSpec fair_share(const FieldReader& in, std::span<const Field> fields) {
  gateway::FairShareSpec out{.enabled = true};
  for (const Field& f : fields) {
    const auto percent = [&] {
      return in.check(f, parse_percent(in.plain(f, "a percentage such as 10%")));
    };
    if (f.key == "reserve") out.reserve_permille = percent();
    if (f.key == "shares_above") out.shares_above_permille = percent();
    if (f.key == "pause_above") out.pause_above_permille = percent();
    if (f.key == "period") out.period = in.duration(f);
    if (f.key == "budget") out.budget = in.integer(f, 1);
  }
  return out;
}

}  // namespace quota::rules::detail
