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
// A tenant new at this holder (it asked here in the last period, but has no local asks in
// the view, which is two periods old) has no part from the split. newcomer_parts() gives
// it a provisional part: min(asked, its weighted fraction of the fixed part F = P −
// ⌈P·reserve⌉, ⌊F·w / W⌋, W = Σ weights of the tenants here), taken first from this
// holder's pool ⌊(capacity − Σ shares) / holders⌋, then from this holder's parts of the
// view's tenants (each cut by ⌈cut·part / Σ parts⌉), scaled down when both do not
// suffice. So Σ at this holder ≤ Σ parts + pool, and Σ over holders ≤ Σ shares +
// holders·pool ≤ capacity, given the same view and holder count everywhere.
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

// A tenant new at this holder: asked here in the last period, no local asks in the view.
struct Newcomer {
  std::string tenant;
  std::int64_t weight = 1;
  std::int64_t asked = 0;  // ≥ 0
  friend bool operator==(const Newcomer&, const Newcomer&) = default;
};

struct NewcomerParts {
  std::vector<std::int64_t> parts;       // each newcomer's provisional part, index by index
  std::vector<std::int64_t> view_parts;  // this holder's parts of the view's tenants after the cut
  std::int64_t from_pool = 0;            // units the newcomers took from the pool
  std::int64_t from_view = 0;            // units cut from the view's parts here
};

// Tenants new at this holder and what their provisional parts divide (FairShare::allocate_split).
struct NewcomerPool {
  std::int64_t holders = 1;         // holders of the budget
  std::int64_t fixed_capacity = 0;  // F = P − ⌈P·reserve⌉, P = ⌊budget / holders⌋
  std::span<const Newcomer> tenants{};
};

// The provisional parts of `newcomers` at this holder (see the banner), given this
// holder's `split` of `view` (split_shares(capacity, ..., view)), the number of holders
// (≥ 1) and the fixed part's capacity F (≥ 0). InvalidArgument (naming the field) on a
// weight out of [1, kMaxWeight], a negative ask, holders < 1 or a split that does not
// match the view.
inline absl::StatusOr<NewcomerParts> newcomer_parts(const HolderSplit& split,
                                                    std::span<const HolderDemand> view,
                                                    std::int64_t capacity, std::int64_t holders,
                                                    std::int64_t fixed_capacity,
                                                    std::span<const Newcomer> newcomers) {
  if (holders < 1 || fixed_capacity < 0 || split.parts.size() != view.size() ||
      split.share_sum > capacity) {
    return absl::InvalidArgumentError(
        absl::StrCat("newcomer_parts: holders ", holders, ", fixed capacity ", fixed_capacity, ", ",
                     split.parts.size(), " parts for ", view.size(), " tenants, shares ",
                     split.share_sum, " of ", capacity));
  }
  NewcomerParts out{.parts = std::vector<std::int64_t>(newcomers.size(), 0),
                    .view_parts = split.parts};
  absl::int128 weights = 0;  // W: at most 2^30 tenants of weight ≤ 2^32
  for (std::size_t i = 0; i < view.size(); ++i) weights += view[i].local > 0 ? view[i].weight : 0;
  for (const Newcomer& n : newcomers) {
    if (n.weight < 1 || n.weight > kMaxWeight || n.asked < 0) {
      return absl::InvalidArgumentError(absl::StrCat("newcomer_parts: newcomer \"", n.tenant,
                                                     "\" has weight ", n.weight, " and asked ",
                                                     n.asked));
    }
    weights += n.weight;
  }
  if (newcomers.empty()) return out;
  absl::int128 want = 0;  // Σ ⌊F·w / W⌋ ≤ F
  for (std::size_t i = 0; i < newcomers.size(); ++i) {
    const absl::int128 fraction = absl::int128(fixed_capacity) * newcomers[i].weight / weights;
    out.parts[i] = static_cast<std::int64_t>(std::min<absl::int128>(newcomers[i].asked, fraction));
    want += out.parts[i];
  }
  const std::int64_t pool = (capacity - split.share_sum) / holders;
  const absl::int128 given = std::min<absl::int128>(want, absl::int128(pool) + split.part_sum);
  std::int64_t taken = 0;
  for (std::int64_t& part : out.parts) {
    if (given < want) part = static_cast<std::int64_t>(absl::int128(part) * given / want);
    taken += part;
  }
  out.from_pool = std::min(taken, pool);
  const std::int64_t cut = taken - out.from_pool;  // ≤ Σ parts: given ≤ pool + Σ parts
  for (std::int64_t& part : out.view_parts) {
    if (cut == 0) break;
    const absl::int128 share_of_cut =
        (absl::int128(cut) * part + split.part_sum - 1) / split.part_sum;
    const auto c = static_cast<std::int64_t>(std::min<absl::int128>(part, share_of_cut));
    part -= c;
    out.from_view += c;
  }
  return out;
}

}  // namespace quota::fair
