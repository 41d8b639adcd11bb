// quota/fair/tenant_weights.hpp — each tenant's weight in a fair-share budget.
//
// TenantWeights says how many shares each tenant of one budget carries in the weighted
// max-min allocation (weighted_max_min.hpp): the weight given for it by name, else
// `default_weight`. A tenant of weight 3 gets three times the share of a tenant of
// weight 1 while both are constrained. Every weight is a whole number in [1,
// kMaxWeight] (2^32): the bound that keeps weighted_max_min's and FairShare's products
// exact in 128 bits. validate() names the bad field with `field` as its prefix
// ("fair_share.weights.acme is 0; ..."). With holders over Redis every holder reads the
// weights from the same rules, so every holder computes the same shares
// (holder_split.hpp).
//
// Thread safety: a value; of() is a const lookup, O(log n) in the tenants named.
//
//   quota::fair::TenantWeights w{.default_weight = 1, .by_tenant = {{"acme", 3}}};
//   // w.of("acme") == 3, w.of("globex") == 1
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "quota/detail/keyed_states.hpp"
#include "quota/fair/weighted_max_min.hpp"

namespace quota::fair {

struct TenantWeights {
  std::int64_t default_weight = 1;  // every tenant not named in by_tenant
  std::map<std::string, std::int64_t, std::less<>> by_tenant{};

  friend bool operator==(const TenantWeights&, const TenantWeights&) = default;

  // The tenant's weight.
  std::int64_t of(std::string_view tenant) const {
    auto it = by_tenant.find(tenant);
    return it == by_tenant.end() ? default_weight : it->second;
  }

  // OK, or InvalidArgument naming `<field>.weight_default` or `<field>.weights.<tenant>`
  // and the bound [1, kMaxWeight].
  absl::Status validate(std::string_view field) const {
    const auto bad = [&](std::string_view name, std::int64_t w) {
      return absl::InvalidArgumentError(
          absl::StrCat(quota::detail::to_absl(field), ".", quota::detail::to_absl(name), " is ", w,
                       "; a weight must be a whole number in [1, ", kMaxWeight, "]"));
    };
    if (default_weight < 1 || default_weight > kMaxWeight)
      return bad("weight_default", default_weight);
    for (const auto& [tenant, w] : by_tenant) {
      if (w < 1 || w > kMaxWeight) return bad(absl::StrCat("weights.", tenant), w);
    }
    return absl::OkStatus();
  }
};

}  // namespace quota::fair
