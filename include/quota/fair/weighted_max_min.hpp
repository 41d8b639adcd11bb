// quota/fair/weighted_max_min.hpp — exact integer weighted max-min fair allocation.
//
// `weighted_max_min(capacity, demands, weights)` divides `capacity` units among tenants
// by water-filling: every tenant gets min(demand, its weighted share of what is left), and
// what a satisfied tenant leaves is offered again to the unsatisfied ones. The shares are
// integers, computed exactly (128-bit intermediates, no floating point):
//   - Σ shares = min(capacity, Σ demands): never more than the capacity, and no unit is
//     left over while any demand is unmet;
//   - share_i ≤ demand_i;
//   - each share differs from the real-valued weighted max-min share by less than one
//     unit: the real share rounded down, plus one unit for the tenants with the largest
//     remainders (ties: lower index first) until the capacity is used up.
// Deterministic (the same input gives the same shares), O(n log n), no shared state:
// safe to call from any thread.
//
//   std::vector<std::int64_t> demands{10, 500, 500}, weights{1, 1, 2};
//   auto shares = quota::fair::weighted_max_min(300, demands, weights);
//   // *shares == {10, 97, 193}: 10 is satisfied, 290 split 1 : 2 (96.67 → 97, 193.33 → 193)
//
// Used by FairShare (fair_share.hpp); docs/fair_share.md states the arithmetic.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <numeric>
#include <span>
#include <vector>

#include "absl/numeric/int128.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

namespace quota::fair {

// The largest weight a tenant may carry. With weights ≤ 2^32 and at most 2^30 tenants,
// every product below (a demand or capacity, < 2^63, times a sum of weights, < 2^62)
// stays below 2^125: int128 never overflows.
inline constexpr std::int64_t kMaxWeight = std::int64_t{1} << 32;
inline constexpr std::size_t kMaxTenants = std::size_t{1} << 30;

// The weighted max-min fair shares of `capacity` for tenants with `demands` (units, ≥ 0)
// and `weights` (1 ≤ weight ≤ kMaxWeight), index by index. InvalidArgument, naming the
// field and the index, when the spans differ in size, the capacity or a demand is
// negative, a weight is out of range, or there are more than kMaxTenants tenants.
//
// The real-valued allocation it rounds: the level λ at which Σ min(demand_i, w_i·λ) =
// capacity (when Σ demands > capacity). Tenants with demand_i ≤ w_i·λ get their demand;
// the others share R = capacity − Σ(satisfied demands) in proportion to their weights,
// w_i·R / W (W = the sum of their weights), rounded as stated in the banner.
inline absl::StatusOr<std::vector<std::int64_t>> weighted_max_min(
    std::int64_t capacity, std::span<const std::int64_t> demands,
    std::span<const std::int64_t> weights) {
  if (demands.size() != weights.size()) {
    return absl::InvalidArgumentError(absl::StrCat("weighted_max_min: ", demands.size(),
                                                   " demands but ", weights.size(), " weights"));
  }
  if (demands.size() > kMaxTenants) {
    return absl::InvalidArgumentError(absl::StrCat("weighted_max_min: ", demands.size(),
                                                   " tenants; at most ", kMaxTenants, " allowed"));
  }
  if (capacity < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("weighted_max_min: capacity must be >= 0, got ", capacity));
  }
  const std::size_t n = demands.size();
  for (std::size_t i = 0; i < n; ++i) {
    if (demands[i] < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("weighted_max_min: demands[", i, "] must be >= 0, got ", demands[i]));
    }
    if (weights[i] < 1 || weights[i] > kMaxWeight) {
      return absl::InvalidArgumentError(absl::StrCat(
          "weighted_max_min: weights[", i, "] must be in [1, ", kMaxWeight, "], got ", weights[i]));
    }
  }

  std::vector<std::int64_t> shares(n, 0);
  // Tenants in order of demand per unit of weight (d_i / w_i, compared by cross products),
  // ties by index: water-filling satisfies them in this order.
  std::vector<std::size_t> order(n);
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    const absl::int128 lhs = absl::int128(demands[a]) * weights[b];
    const absl::int128 rhs = absl::int128(demands[b]) * weights[a];
    return lhs != rhs ? lhs < rhs : a < b;
  });

  absl::int128 left = capacity;  // R: the capacity not yet given to a satisfied tenant
  absl::int128 weight_left = 0;  // W: the weight of the tenants not yet satisfied
  for (std::int64_t w : weights) weight_left += w;
  std::size_t k = 0;
  // Tenant i is satisfied when its demand fits under the level the unsatisfied tenants
  // would reach together: d_i ≤ w_i·R / W, i.e. d_i·W ≤ R·w_i. Satisfying it lowers R
  // by d_i and W by w_i, which never lowers the level R / W, so the next tenant (whose
  // d / w is no smaller) is tested against the final level or a lower one: the first
  // that fails, and every one after it, stays unsatisfied.
  for (; k < n; ++k) {
    const std::size_t i = order[k];
    if (absl::int128(demands[i]) * weight_left > left * weights[i]) break;
    shares[i] = demands[i];
    left -= demands[i];
    weight_left -= weights[i];
  }
  if (k == n) return shares;  // every demand met (Σ demands ≤ capacity)

  // The unsatisfied share R in proportion to their weights: w_i·R / W rounded down, then
  // the R − Σ(rounded down) units left (fewer than the tenants with a non-zero
  // remainder, since the remainders, each < 1, add up to them) one each to the largest
  // remainders w_i·R mod W, ties by index. A tenant receiving one stays within its
  // demand: its real share w_i·R / W is below d_i (it is unsatisfied), so its ceiling is
  // at most d_i.
  std::vector<std::size_t> rest(order.begin() + static_cast<std::ptrdiff_t>(k), order.end());
  std::vector<absl::int128> remainder(n, 0);
  absl::int128 given = 0;
  for (std::size_t i : rest) {
    const absl::int128 product = left * weights[i];
    shares[i] = static_cast<std::int64_t>(product / weight_left);
    remainder[i] = product % weight_left;
    given += shares[i];
  }
  std::sort(rest.begin(), rest.end(), [&](std::size_t a, std::size_t b) {
    return remainder[a] != remainder[b] ? remainder[a] > remainder[b] : a < b;
  });
  const auto extra = static_cast<std::size_t>(left - given);
  for (std::size_t j = 0; j < extra; ++j) ++shares[rest[j]];
  return shares;
}

}  // namespace quota::fair
