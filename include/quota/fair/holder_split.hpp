// quota/fair/holder_split.hpp — one holder's part of fair shares computed over all holders.
//
// When several processes (holders) admit units of one budget, each tenant's fair share
// is computed once over the demand of every holder, and each holder enforces the part of
// it that matches where the tenant's demand is:
//   share_t = weighted_max_min(capacity, demands, weights)_t with demand_t = the tenant's
//             asks at all holders together (capped at `demand_cap`, the budget),
//   part_t  = ⌊share_t · local_t / total_t⌋ (0 when total_t = 0).
// Guarantees, given the same `view` totals and weights at every holder (and each holder's
// own `local`, with Σ over holders of local_t = total_t): Σ over holders of part_t ≤
// share_t (each part rounds down), so Σ over holders and tenants ≤ Σ shares ≤ capacity;
// a tenant asked for at one holder only gets its whole share there; the shares are the
// same in every holder (weighted_max_min is deterministic and the view is sorted by name
// before it is used). Exact integers, 128-bit intermediates.
//
// Thread safety: a pure function.
//
//   std::vector<quota::fair::HolderDemand> view{{.tenant = "a", .total = 900, .local = 300},
//                                               {.tenant = "b", .total = 100, .local = 0}};
//   auto split = quota::fair::split_shares(600, 1'000, view);
//   // split->shares == {500, 100}; split->parts == {166, 0}
//
// Used by FairShare::allocate_split (fair_share.hpp); docs/fair_share.md states it.
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "absl/numeric/int128.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "quota/fair/weighted_max_min.hpp"

namespace quota::fair {

// One tenant as every holder sees it (total, weight) and as this holder sees it (local).
struct HolderDemand {
  std::string tenant;
  std::int64_t weight = 1;
  std::int64_t total = 0;  // its asks at all holders (≥ 0)
  std::int64_t local = 0;  // its asks at this holder (0 ≤ local ≤ total)
  friend bool operator==(const HolderDemand&, const HolderDemand&) = default;
};

struct HolderSplit {
  std::vector<std::int64_t> shares;  // share_t over all holders, index by index
  std::vector<std::int64_t> parts;   // this holder's part of it
  std::int64_t share_sum = 0;
  std::int64_t part_sum = 0;
};

// The shares of `capacity` among the tenants of `view` (sorted by tenant, each once)
// and this holder's parts. InvalidArgument (naming the tenant) on an unsorted view, a
// negative total, a local outside [0, total], or weighted_max_min's errors.
inline absl::StatusOr<HolderSplit> split_shares(std::int64_t capacity, std::int64_t demand_cap,
                                                std::span<const HolderDemand> view) {
  std::vector<std::int64_t> demands, weights;
  demands.reserve(view.size());
  weights.reserve(view.size());
  for (std::size_t i = 0; i < view.size(); ++i) {
    const HolderDemand& d = view[i];
    if (i > 0 && !(view[i - 1].tenant < d.tenant)) {
      return absl::InvalidArgumentError(
          absl::StrCat("split_shares: the view is not sorted by tenant at \"", d.tenant, "\""));
    }
    if (d.total < 0 || d.local < 0 || d.local > d.total) {
      return absl::InvalidArgumentError(absl::StrCat("split_shares: tenant \"", d.tenant,
                                                     "\" has local ", d.local, " of total ",
                                                     d.total, "; need 0 <= local <= total"));
    }
    demands.push_back(std::min(d.total, std::max<std::int64_t>(0, demand_cap)));
    weights.push_back(d.weight);
  }
  auto shares = weighted_max_min(capacity, demands, weights);
  if (!shares.ok()) return shares.status();
  HolderSplit out{.shares = std::move(*shares), .parts = {}};
  out.parts.reserve(view.size());
  for (std::size_t i = 0; i < view.size(); ++i) {
    const std::int64_t part = view[i].total == 0
                                  ? 0
                                  : static_cast<std::int64_t>(absl::int128(out.shares[i]) *
                                                              view[i].local / view[i].total);
    out.parts.push_back(part);
    out.share_sum += out.shares[i];
    out.part_sum += part;
  }
  return out;
}

}  // namespace quota::fair
