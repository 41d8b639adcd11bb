// quota/gateway/leases/lease_revocation.hpp — a rule change that reaches leased keys at once.
//
// A leased rule with `lease.revoke: at_once` (lease_spec.hpp) does not wait for its grants
// to expire when it changes. The gateway that installs the change revokes them at the
// authority: `revoke_on_publish(registry, authority)` makes every publish of `registry`
// first record, for each such rule, "grants of rule R asked for under versions below V
// are revoked" (V: the new set's version), and only then install the set. Then:
//   - the authority refuses grants under older versions of R (LeasedBackend asks
//     `revoked_below` before each grant): a holder still on the old rules decides R's keys
//     at the authority, per request, under the newest rule the key was converted to;
//   - every holder subscribed to the authority (in process: the GrantLedger's listeners;
//     over Redis: pub/sub, redis/grant_ledger.hpp) drops the units it holds of covered
//     grants before its next decision (LeaseCounters::units_revoked).
// Bound: a holder whose subscription is up stops spending a revoked grant once the
// notification is delivered; one whose subscription is down spends it until it expires —
// the rule change then reaches it within one expiry, as without `at_once`.
//
// Which rules: a rule (by Rule::id: level, scope, route, limit) leased in the set in force
// whose policy or lease changed in the next set, or which the next set removes, when
// either version asks for `at_once`. Revocations are idempotent (the highest version of a
// rule stands), so every gateway that installs the same set may record them. A failure to
// record one fails the publish (nothing installed; the caller retries).
//
// Thread safety: revocations_between is pure; the installed step runs on the publishing
// thread and calls the authority (thread-safe per RevocationAuthority).
//
//   quota::GrantLedger ledger;                  // or redis::RedisGrantLedger
//   quota::gateway::RuleRegistry registry(v1);
//   quota::gateway::revoke_on_publish(registry, ledger);
//   registry.publish(v2);  // revokes v1's at_once grants that v2 changes, then installs v2
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "quota/gateway/key_state.hpp"
#include "quota/gateway/rules/rule_registry.hpp"
#include "quota/gateway/rules/rules.hpp"
#include "quota/lease/grant_ledger.hpp"

namespace quota::gateway {

// The revocations that installing `to` over `from` records, by rule id.
inline std::vector<Revocation> revocations_between(const RuleSet& from, const RuleSet& to) {
  std::vector<Revocation> out;
  from.for_each_rule([&](const Rule& old) {
    if (!old.lease.enabled()) return;
    const Rule* next = to.rule(old.id);
    const bool at_once = old.lease.revoke == LeaseRevoke::kAtOnce ||
                         (next != nullptr && next->lease.revoke == LeaseRevoke::kAtOnce);
    const bool changed = next == nullptr || !detail::same_params(old.policy, next->policy) ||
                         !(old.lease == next->lease);
    if (at_once && changed) out.push_back({.rule = old.id, .below = to.version()});
  });
  return out;
}

// Every publish of `registry` first records the revocations of revocations_between at
// `authority` (which must outlive the registry's use of it).
template <RevocationAuthority Authority>
void revoke_on_publish(RuleRegistry& registry, Authority& authority) {
  registry.before_publish([&authority](const RuleSet& from, const RuleSet& to) {
    for (const Revocation& r : revocations_between(from, to)) {
      if (auto s = authority.revoke(r); !s.ok()) {
        return absl::Status(
            s.code(), absl::StrCat("revoking the grants of rule \"", r.rule, "\" below version ",
                                   r.below, ": ", s.message()));
      }
    }
    return absl::OkStatus();
  });
}

}  // namespace quota::gateway
