// quota/fair/fair_share_config.hpp — the budget, thresholds and verdicts of FairShare.
//
// FairShareConfig states a budget shared by many tenants (units in use, e.g. an upstream
// provider's tokens per lease period) and its levels in permille of the budget: the
// reserve no share reaches into, the share threshold above which weighted max-min shares
// apply, and the pause threshold above which admissions are paused. validate() names the
// bad field and its bound. FairShareVerdict says why FairShare (fair_share.hpp) admitted
// or refused a request. Plain values: safe to copy and read from any thread.
//
//   auto c = quota::fair::FairShareConfig{.budget = 666'666}.checked();
//   // c->share_capacity() == 599'999, c->share_level() == 466'666, c->pause_level() == 599'999
#pragma once

#include <cstdint>
#include <limits>
#include <string_view>

#include "absl/numeric/int128.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

namespace quota::fair {

// The largest budget: half the int64 range, so a tenant's use plus a request (each at
// most the budget) always fits in an int64.
inline constexpr std::int64_t kMaxBudget = std::numeric_limits<std::int64_t>::max() / 2;

// The shared budget and its thresholds, in units and permille (‰) of the budget.
struct FairShareConfig {
  std::int64_t budget = 0;              // units shared by all tenants, ≥ 1
  std::int64_t reserve_permille = 100;  // never part of a share: budget − ⌈budget·r⌉
  std::int64_t share_permille = 700;    // load above it: weighted max-min shares apply
  std::int64_t pause_permille = 900;    // units in use above it: new admissions paused

  // OK, or InvalidArgument naming the field and its bound: 1 ≤ budget ≤ kMaxBudget; 0 ≤
  // reserve_permille < 1000; 1 ≤ share_permille ≤ pause_permille ≤ 1000; and
  // pause_permille ≥ 1000 − reserve_permille, so that the pause never cuts into the
  // shares (which sum to budget − reserve).
  absl::Status validate() const {
    if (budget < 1 || budget > kMaxBudget) {
      return absl::InvalidArgumentError(
          absl::StrCat("FairShareConfig.budget must be in [1, ", kMaxBudget, "], got ", budget));
    }
    if (reserve_permille < 0 || reserve_permille >= 1000) {
      return absl::InvalidArgumentError(absl::StrCat(
          "FairShareConfig.reserve_permille must be in [0, 999], got ", reserve_permille));
    }
    if (share_permille < 1 || share_permille > 1000) {
      return absl::InvalidArgumentError(absl::StrCat(
          "FairShareConfig.share_permille must be in [1, 1000], got ", share_permille));
    }
    if (pause_permille < share_permille || pause_permille > 1000) {
      return absl::InvalidArgumentError(
          absl::StrCat("FairShareConfig.pause_permille must be in [share_permille (",
                       share_permille, "), 1000], got ", pause_permille));
    }
    if (pause_permille < 1000 - reserve_permille) {
      return absl::InvalidArgumentError(
          absl::StrCat("FairShareConfig.pause_permille must be >= 1000 - reserve_permille (",
                       1000 - reserve_permille,
                       ") so that the pause never cuts into the shares, got ", pause_permille));
    }
    return absl::OkStatus();
  }
  // This config when valid, else validate()'s error.
  absl::StatusOr<FairShareConfig> checked() const {
    if (auto s = validate(); !s.ok()) return s;
    return *this;
  }

  // The units the shares divide: budget − ⌈budget · reserve_permille / 1000⌉ (the
  // reserve rounded up, so the shares never reach into it).
  std::int64_t share_capacity() const {
    const absl::int128 reserve = (absl::int128(budget) * reserve_permille + 999) / 1000;
    return budget - static_cast<std::int64_t>(reserve);
  }
  // ⌊budget · share_permille / 1000⌋: the load up to which tenants draw freely.
  std::int64_t share_level() const { return permille_of(share_permille); }
  // ⌊budget · pause_permille / 1000⌋: the units in use no admission carries use above.
  std::int64_t pause_level() const { return permille_of(pause_permille); }

 private:
  std::int64_t permille_of(std::int64_t permille) const {
    return static_cast<std::int64_t>(absl::int128(budget) * permille / 1000);
  }
};

// Why a request was admitted or refused. Stable names: to_string().
enum class FairShareVerdict : std::uint8_t {
  kFree = 0,         // admitted: the load stays at or below the share threshold, or the
                     // tenant is alone
  kWithinShare = 1,  // admitted: above the share threshold, within the tenant's share
  kOverShare = 2,    // refused: a constrained tenant would exceed its share or take what
                     // below-level tenants were allocated; another would pass the level
  kPaused = 3,       // refused: the units in use would pass the pause threshold
  kOverBudget = 4,   // refused: the request does not fit the budget (a tenant alone, or
                     // units > budget: it can never pass)
  kBorrowed = 5,     // admitted: a tenant below the water level, past its share (its
                     // demand rose, or it is new in the period), within the level
};

constexpr std::string_view to_string(FairShareVerdict v) {
  switch (v) {
    case FairShareVerdict::kFree:
      return "free";
    case FairShareVerdict::kWithinShare:
      return "within_share";
    case FairShareVerdict::kOverShare:
      return "over_share";
    case FairShareVerdict::kPaused:
      return "paused";
    case FairShareVerdict::kOverBudget:
      return "over_budget";
    case FairShareVerdict::kBorrowed:
      return "borrowed";
  }
  return "unknown";
}

}  // namespace quota::fair
