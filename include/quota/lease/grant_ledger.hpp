// quota/lease/grant_ledger.hpp — the authority's record of lease grants: who holds what.
//
// Every grant a gateway LeasedBackend (gateway/leases/leased_backend.hpp) or a regional
// pool (region/) takes is recorded at the authority beside the budget it was taken from:
// the key, the grant id (which names the holder's incarnation), the rule-set version it
// was taken under, the units, and when it expires.
// An operator lists the grants still outstanding (`outstanding`: whole grants not yet
// expired, spent or not). Their units are at least what the holders still hold, so their
// sum bounds the envelope A(T) <= r·T + B + Σ units held, more loosely: a holder that
// renewed within one expiry is listed with every grant of it. GrantLedger, below, is
// the in-process record (for a StoreBackend shared by the gateways of one host, tests and
// simulations); quota::redis::RedisGrantLedger (redis/grant_ledger.hpp) keeps it in Redis
// next to the key. A ledger is also what makes an in-process grant idempotent: a grant id
// already recorded is replayed (`replay`), nothing taken twice. Over Redis the decision
// itself is idempotent by grant id (the gateway attempt record, in the key's slot).
//
// Revocation (a rule with `lease.revoke: at_once`, gateway/leases/lease_revocation.hpp):
// `revoke({rule, below})` records at the authority that the grants of that rule
// (Rule::id) asked for under rule-set versions below `below` are revoked — idempotent,
// the highest `below` of a rule stands — and tells every subscriber at once (`subscribe`:
// in process, a call on the revoking thread; over Redis, PUBLISH). `outstanding` lists
// revoked grants with `revoked` set; `revoked_below(rule)` is what a holder asks before
// each grant: the authority grants nothing under an older version of a revoked rule.
//
// Times: `granted_at` and `expires_at` are on the authority's clock when the backend
// reports one (LevelsResult::time), else on the holder's; records are pruned `keep`
// after they expire.
//
// Thread safety: GrantLedger may be called from any thread.
//
//   quota::GrantLedger ledger;
//   quota::gateway::LeasedBackend leased(inner, ledger, {.incarnation = 7});
//   for (const auto& g : ledger.outstanding(clock.now())) std::cout << g.key << " " << g.units;
#pragma once

#include <algorithm>
#include <chrono>
#include <concepts>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "quota/detail/keyed_states.hpp"
#include "quota/detail/mutex.hpp"
#include "quota/units.hpp"

namespace quota {

// One grant as the authority records it.
struct GrantRecord {
  std::string key{};       // the budget's store key
  std::string grant_id{};  // "<incarnation hex>-<n>"
  std::uint64_t incarnation = 0;
  std::uint64_t version = 0;  // rule-set version the grant was taken under
  std::int64_t units = 0;     // whole units granted
  Nanos granted_at{0};
  Nanos expires_at{0};
  std::string rule{};               // Rule::id of the rule the grant was asked for under
  std::uint64_t asked_version = 0;  // the holder's rule-set version when it asked
  bool revoked = false;             // outstanding(): covered by a revocation
};

// The grants of rule `rule` (Rule::id) asked for under rule-set versions below `below`.
struct Revocation {
  std::string rule{};
  std::uint64_t below = 0;

  bool covers(std::string_view grant_rule, std::uint64_t asked_version) const {
    return grant_rule == rule && asked_version < below;
  }
};

// Called for each revocation a ledger hears of (GrantLedger: on the revoking thread;
// redis::RedisGrantLedger: on its subscription's). It runs under the ledger's lock of its
// listeners: it must not subscribe, unsubscribe or ask the ledger whether it is subscribed.
using RevocationListener = std::function<void(const Revocation&)>;

// Where grants are recorded: `record` after a grant is taken (an error is counted by the
// holder and does not undo the grant: the units were taken); `replay` the record of a
// grant id, if the ledger has it.
template <class L>
concept GrantRecorder = requires(L& l, const GrantRecord& g, std::string_view id) {
  { l.record(g) } -> std::same_as<absl::Status>;
  { l.replay(id) } -> std::same_as<std::optional<GrantRecord>>;
};

// An authority that revokes grants (the optional capability LeasedBackend and
// revoke_on_publish look for): `revoke` records and notifies; `revoked_below` answers 0
// for a rule never revoked; `subscribe` returns an id for `unsubscribe`, after which the
// listener is never called again (unsubscribe waits for a call in progress).
template <class L>
concept RevocationAuthority = requires(L& l, const Revocation& r, std::string_view rule,
                                       RevocationListener fn, std::uint64_t id) {
  { l.revoke(r) } -> std::same_as<absl::Status>;
  { l.revoked_below(rule) } -> std::same_as<absl::StatusOr<std::uint64_t>>;
  { l.subscribe(std::move(fn)) } -> std::same_as<std::uint64_t>;
  { l.unsubscribe(id) } -> std::same_as<void>;
};

// The in-process ledger: a map by grant id, pruned `keep` after expiry.
class GrantLedger {
 public:
  explicit GrantLedger(Nanos keep = std::chrono::minutes(1)) : keep_(keep) {}

  absl::Status record(const GrantRecord& g) {
    quota::detail::MutexLock lock(mu_);
    prune(g.granted_at);
    grants_.insert_or_assign(g.grant_id, g);
    return absl::OkStatus();
  }

  std::optional<GrantRecord> replay(std::string_view grant_id) {
    quota::detail::MutexLock lock(mu_);
    auto it = grants_.find(quota::detail::to_absl(grant_id));
    if (it == grants_.end()) return std::nullopt;
    return it->second;
  }

  // The grants not expired at `now`, by key then grant id: who holds what. (A holder may
  // have spent some of them: the ledger knows what was granted, the holder what is left.)
  // A grant covered by a revocation is listed with `revoked`.
  std::vector<GrantRecord> outstanding(Nanos now) const {
    std::vector<GrantRecord> out;
    {
      quota::detail::MutexLock lock(mu_);
      for (const auto& [id, g] : grants_) {
        if (now >= g.expires_at) continue;
        out.push_back(g);
        auto r = revoked_.find(g.rule);
        out.back().revoked = r != revoked_.end() && g.asked_version < r->second;
      }
    }
    std::sort(out.begin(), out.end(), [](const GrantRecord& a, const GrantRecord& b) {
      return a.key != b.key ? a.key < b.key : a.grant_id < b.grant_id;
    });
    return out;
  }

  // Records the revocation (the highest `below` of a rule stands) and calls every
  // listener with it, on this thread, before returning.
  absl::Status revoke(const Revocation& r) {
    {
      quota::detail::MutexLock lock(mu_);
      std::uint64_t& below = revoked_[r.rule];
      below = std::max(below, r.below);
    }
    quota::detail::MutexLock lock(listeners_mu_);
    for (const auto& [id, fn] : listeners_) fn(r);
    return absl::OkStatus();
  }

  absl::StatusOr<std::uint64_t> revoked_below(std::string_view rule) {
    quota::detail::MutexLock lock(mu_);
    auto it = revoked_.find(quota::detail::to_absl(rule));
    return it == revoked_.end() ? 0 : it->second;
  }

  std::uint64_t subscribe(RevocationListener fn) {
    quota::detail::MutexLock lock(listeners_mu_);
    listeners_.emplace(++last_listener_, std::move(fn));
    return last_listener_;
  }
  void unsubscribe(std::uint64_t id) {
    quota::detail::MutexLock lock(listeners_mu_);
    listeners_.erase(id);
  }

  // Records kept (outstanding or expired less than `keep` ago).
  std::size_t size() const {
    quota::detail::MutexLock lock(mu_);
    return grants_.size();
  }

 private:
  // At most once per keep/4 of the records' time: a record costs O(1) amortized.
  void prune(Nanos now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (now < next_prune_) return;
    next_prune_ = now + keep_ / 4;
    absl::erase_if(grants_, [&](const auto& entry) {
      return entry.second.expires_at.count() <= now.count() - keep_.count();
    });
  }

  Nanos keep_;
  mutable quota::detail::Mutex mu_;
  Nanos next_prune_ ABSL_GUARDED_BY(mu_) = Nanos::min();
  absl::flat_hash_map<std::string, GrantRecord> grants_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, std::uint64_t> revoked_ ABSL_GUARDED_BY(mu_);  // rule → below
  // Held while listeners run, so that unsubscribe waits for a call in progress.
  quota::detail::Mutex listeners_mu_;
  std::uint64_t last_listener_ ABSL_GUARDED_BY(listeners_mu_) = 0;
  absl::flat_hash_map<std::uint64_t, RevocationListener> listeners_ ABSL_GUARDED_BY(listeners_mu_);
};

static_assert(GrantRecorder<GrantLedger>);
static_assert(RevocationAuthority<GrantLedger>);

}  // namespace quota
