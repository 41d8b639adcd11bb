// quota/gateway/leases/lease_spec.hpp — the `lease` option of a rule: whether a gateway process
// decides the rule's budget locally from a grant it holds, and the grant's parameters.
//
// A rule with `lease` on (or automatic, above a measured rate) is decided by
// LeasedBackend (leased_backend.hpp): the process takes `units` from the authoritative
// budget in one ordinary atomic decision, spends them locally, renews when what it holds
// falls to `low_water`, and never gives them back. Each holder holds at most
// `units + low_water` at any instant, so with H holders of a key the budget's envelope
// becomes A(T) <= r·T + B + H·(units + low_water). Off by default.
//
// A rule change reaches the holders of the rule's keys within one lease expiry
// (`revoke` kAtExpiry, the default), or at once (kAtOnce): the gateway that installs the
// change records a revocation at the authority and the holders drop what they hold
// (lease_revocation.hpp).
//
// Validation (RuleSet::create, naming the field): 1 <= units <= the policy's capacity;
// 0 <= low_water < units; expiry > 0; auto_rate >= 1 with `auto` and 0 otherwise.
//
// Thread safety: a value.
//
//   quota::gateway::RuleSpec global{.level = quota::gateway::Level::kGlobal, ...,
//       .lease = {.mode = quota::gateway::LeaseMode::kOn, .units = 500, .expiry = 1s,
//                 .low_water = 100, .revoke = quota::gateway::LeaseRevoke::kAtOnce}};
#pragma once

#include <chrono>
#include <cstdint>
#include <string_view>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "quota/units.hpp"

namespace quota::gateway {

enum class LeaseMode : std::uint8_t {
  kOff = 0,   // every decision goes to the authority (the default)
  kOn = 1,    // always decided from a grant
  kAuto = 2,  // decided from a grant while this process decides the key at >= auto_rate
};

constexpr std::string_view to_string(LeaseMode m) {
  switch (m) {
    case LeaseMode::kOff:
      return "off";
    case LeaseMode::kOn:
      return "on";
    case LeaseMode::kAuto:
      return "auto";
  }
  return "unknown";
}

// How a change of the rule reaches grants already taken under it.
enum class LeaseRevoke : std::uint8_t {
  kAtExpiry = 0,  // each holder spends its grant until it expires, or until it decides
                  // the key under the new rules (the default)
  kAtOnce = 1,    // revoked at the authority on install; holders drop the grant at once
};

constexpr std::string_view to_string(LeaseRevoke r) {
  return r == LeaseRevoke::kAtOnce ? "at_once" : "at_expiry";
}

struct LeaseSpec {
  LeaseMode mode = LeaseMode::kOff;
  // Whole units per grant (q): taken from the budget in one atomic decision.
  std::int64_t units = 100;
  // A grant's life on the holder's clock, counted from before the grant was asked for:
  // never spent past it; what is left then is counted as unused and dropped.
  Nanos expiry = std::chrono::seconds(1);
  // Renew when the units held fall to this or below (before they run out).
  std::int64_t low_water = 0;
  // kAuto: lease while this process decides the key at >= auto_rate units per second
  // (measured over one-second windows of the caller's clock); back to the authority
  // when the rate falls below half of it.
  std::int64_t auto_rate = 0;
  // When a change of this rule reaches grants taken under it (see LeaseRevoke).
  LeaseRevoke revoke = LeaseRevoke::kAtExpiry;

  friend bool operator==(const LeaseSpec&, const LeaseSpec&) = default;

  bool enabled() const { return mode != LeaseMode::kOff; }
  // The most a holder holds of one key at any instant.
  std::int64_t max_held() const { return units + low_water; }

  // Checks the parameters against the budget's capacity (whole units); the message names
  // the field ("lease.units ...").
  absl::Status validate(std::int64_t capacity) const {
    if (mode == LeaseMode::kOff) return absl::OkStatus();
    if (units < 1 || units > capacity) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "lease.units is %d; it must be in [1, %d] (the policy's capacity)", units, capacity));
    }
    if (low_water < 0 || low_water >= units) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "lease.low_water is %d; it must be in [0, lease.units = %d)", low_water, units));
    }
    if (expiry <= Nanos{0}) {
      return absl::InvalidArgumentError("lease.expiry must be positive");
    }
    if (mode == LeaseMode::kAuto ? auto_rate < 1 : auto_rate != 0) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "lease.auto_rate is %d; it must be >= 1 with mode auto and 0 otherwise", auto_rate));
    }
    if (revoke != LeaseRevoke::kAtExpiry && revoke != LeaseRevoke::kAtOnce) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "lease.revoke is %d; it must be at_expiry (0) or at_once (1)", static_cast<int>(revoke)));
    }
    return absl::OkStatus();
  }
};

}  // namespace quota::gateway
