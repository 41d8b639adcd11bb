// quota/rules/fair_share_field.hpp — the `fair_share` field of a rule in a rule file.
//
// A rule's `fair_share: {reserve, shares_above, pause_above, period, budget,
// weight_default, weights}` (every field optional; `fair_share: {}` takes the defaults
// 10 %, 70 %, 90 %, 10 s, the policy's rate × period and weight 1 for every tenant)
// enables gateway::FairShareSpec (gateway/fair_share/fair_share_spec.hpp). Thresholds are
// percentages (`10%`, `72.5%`: scalars.hpp, parse_percent), `period` a duration, `budget`
// whole units, `weight_default` a whole number in [1, 2^32] and `weights` a mapping of
// tenant ids to such numbers (`weights: {acme: 3, globex: 2}`: a tenant's weight in the
// shares; tenants not named have weight_default). Syntax errors and weights out of range
// are located here (FieldReader); the option's other bounds (only on a global rule,
// thresholds ordered, ...) are RuleSet::create's, located by rule_file.hpp at the field
// they name. Needs yaml-cpp: link quota::rules.
//
// Thread safety: pure functions.
//
//   rules:
//     - {name: provider, level: global, limit: tokens, token_bucket: {rate: 4000000/1min,
//        burst: 1000000}, fair_share: {reserve: 10%, shares_above: 70%, pause_above: 90%,
//        period: 10s, weights: {acme: 3}}}
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <map>
#include <span>
#include <string>
#include <string_view>

#include "absl/strings/str_cat.h"

#include "quota/gateway/fair_share/fair_share_spec.hpp"
#include "quota/rules/scalars.hpp"
#include "quota/rules/yaml_fields.hpp"

namespace quota::rules::detail {

inline constexpr std::array<std::string_view, 7> kFairShareFields{
    "reserve", "shares_above", "pause_above", "period", "budget", "weight_default", "weights"};
inline constexpr std::string_view kFairShareExpected =
    "{reserve, shares_above, pause_above, period, budget, weight_default, weights}";

// `weights: {tenant: N, ...}`: each tenant once, each weight in [1, fair::kMaxWeight].
inline std::map<std::string, std::int64_t, std::less<>> fair_share_weights(const FieldReader& in,
                                                                           const Field& f) {
  if (!f.node.IsMap()) in.wrong_type(f, "a mapping of tenant ids to weights, such as {acme: 3}");
  std::map<std::string, std::int64_t, std::less<>> out;
  for (auto it = f.node.begin(); it != f.node.end(); ++it) {
    const Position key_at = position(it->first.Mark());
    const std::string tenant = it->first.IsScalar() ? it->first.Scalar() : describe(it->first);
    const Field w{tenant, key_at, it->second, absl::StrCat(f.path, ".", tenant),
                  it->second.IsNull() ? key_at : position(it->second.Mark())};
    if (!it->first.IsScalar()) in.fail(key_at, w.path, "a tenant id must be a string");
    if (out.contains(tenant)) in.fail(key_at, w.path, "tenant given twice");
    out.emplace(tenant, in.integer(w, 1, fair::kMaxWeight));
  }
  return out;
}

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
    if (f.key == "weight_default") out.weights.default_weight = in.integer(f, 1, fair::kMaxWeight);
    if (f.key == "weights") out.weights.by_tenant = fair_share_weights(in, f);
  }
  return out;
}

}  // namespace quota::rules::detail
