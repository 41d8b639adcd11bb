// quota/gateway/leases/lease_grant.hpp — the options of LeasedBackend, and how one grant is taken.
//
// LeasedBackend (leased_backend.hpp) documents the rules; this header holds its options,
// what it lists of one key (`Holding`), and how a grant is taken: the ledger's record of
// the grant id (an in-process replay), else the authority's revocation check for the rule
// (lease_revocation.hpp: a holder under an older version of a revoked rule is refused)
// and one decision of `units` on the key by the inner backend — with the grant id as its
// attempt when the inner backend records attempts at the authority. Over Redis that is two
// script calls (the check, the decision); LeasedBackend's record of the grant is a third.
//
// Thread safety: take_grant is as thread-safe as the inner backend and the ledger.
//
//   quota::gateway::LeasedBackendOptions options{.incarnation = 7, .metrics = &metrics};
//   quota::gateway::LeasedBackend leased(inner, ledger, options);
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "quota/decision.hpp"
#include "quota/gateway/backend.hpp"
#include "quota/gateway/leases/lease_metrics.hpp"
#include "quota/gateway/rules/rules.hpp"
#include "quota/lease/grant_ledger.hpp"
#include "quota/lease/holder.hpp"
#include "quota/lease/renewal_thread.hpp"

namespace quota::gateway {

struct LeasedBackendOptions {
  // The holder's incarnation; 0: a fresh random one (one per process start).
  std::uint64_t incarnation = 0;
  Nanos backoff_min = std::chrono::milliseconds(1);
  Nanos backoff_max = std::chrono::seconds(1);
  // Most keys held at once; a key beyond it is decided by the inner backend.
  std::size_t max_keys = 100'000;
  LeaseMetrics* metrics = nullptr;  // optional; must outlive the backend
  // Non-blocking (renewal_thread.hpp): grant requests are posted to this thread, never
  // made by a deciding thread; optional, must be stopped before the backend is destroyed.
  quota::detail::Renewals* renewals = nullptr;
};

// What this process holds of one key (LeasedBackend::holdings).
struct Holding {
  std::string key{};
  std::int64_t units = 0;  // held now, all grants
  Nanos expires_at{0};     // of the oldest grant held
  std::uint64_t version = 0;
};

namespace detail {

// The options with the defaults filled in: a random odd incarnation when none is given,
// backoff_min >= 1 ns, backoff_max >= backoff_min.
inline LeasedBackendOptions filled(LeasedBackendOptions o) {
  if (o.incarnation == 0) o.incarnation = random_incarnation();
  o.backoff_min = std::max(o.backoff_min, Nanos{1});
  o.backoff_max = std::max(o.backoff_max, o.backoff_min);
  return o;
}

struct Granted {
  Decision decision;
  Nanos time{0};          // the authority's time of the grant
  bool replayed = false;  // a grant already recorded: nothing taken now
  // The authority refused: the rule is revoked below this version (> the request's).
  std::uint64_t revoked_below = 0;
};

// One decision of `units` on the key of `l`, for the grant `id`: an attempt by the id
// when `inner` records attempts at the authority (a lost reply is then replayed, not
// taken twice; the attempt kept for `ttl`), else a plain decision. Every grant a holder
// takes from a backend is this call (take_grant; the regional pool's refill).
struct GrantDecision {
  Decision decision;
  Nanos time{0};  // the authority's time of the decision
};
inline absl::StatusOr<GrantDecision> decide_grant(Backend& inner, const LevelCheck& l,
                                                  std::int64_t units, std::string_view id,
                                                  std::uint64_t version, Nanos now, Nanos ttl) {
  const LevelCheck grant{.policy = l.policy,
                         .key = l.key,
                         .shadow = false,
                         .cost = units,
                         .rule = nullptr,
                         .layout = l.layout};
  absl::StatusOr<LevelsResult> r;
  if (inner.shares_attempts()) {
    const std::string fingerprint = absl::StrCat(units, "|", quota::detail::to_absl(l.key));
    auto a = inner.decide_attempt(
        std::span(&grant, 1), version, now,
        {.id = id, .fingerprint = fingerprint, .deadline = std::nullopt, .ttl = ttl});
    if (!a.ok()) return a.status();
    r = std::move(a->levels);
  } else {
    r = inner.decide(std::span(&grant, 1), version, now);
  }
  if (!r.ok()) return r.status();
  if (r->parts.size() != 1) return absl::InternalError("grant: no decision");
  return GrantDecision{.decision = r->parts[0], .time = r->time};
}

// The version below which the authority revokes the grants of `rule`; 0 when the ledger
// keeps no revocations.
template <class Ledger>
absl::StatusOr<std::uint64_t> revoked_below(Ledger& ledger, std::string_view rule) {
  if constexpr (RevocationAuthority<Ledger>) {
    return ledger.revoked_below(rule);
  } else {
    return std::uint64_t{0};
  }
}

// The grant decision: the ledger's record of the id (in-process replay), else the
// authority's revocation check, else one decision of `units` on the key by the inner
// backend — with the id as its attempt when the inner backend records attempts at the
// authority (Redis). `requests` counts the decisions sent to the inner backend.
template <GatewayBackend Inner, GrantRecorder Ledger>
absl::StatusOr<Granted> take_grant(Inner& inner, Ledger& ledger, const LevelCheck& l,
                                   std::string_view id, std::int64_t units, std::uint64_t version,
                                   Nanos now, std::atomic<std::int64_t>& requests) {
  if (auto seen = ledger.replay(id)) {
    return Granted{.decision = {.allowed = true, .remaining = 0, .version = seen->version},
                   .time = seen->granted_at,
                   .replayed = true};
  }
  auto below = revoked_below(ledger, l.rule->id);
  if (!below.ok()) return below.status();
  if (version < *below) return Granted{.decision = {}, .revoked_below = *below};
  requests.fetch_add(1, std::memory_order_relaxed);
  auto r = decide_grant(inner, l, units, id, version, now, 2 * l.rule->lease.expiry);
  if (!r.ok()) return r.status();
  return Granted{.decision = r->decision, .time = r->time, .replayed = false};
}

}  // namespace detail
}  // namespace quota::gateway
