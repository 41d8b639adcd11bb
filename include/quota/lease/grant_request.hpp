// quota/lease/grant_request.hpp — one key's grant request, as every lease holder keeps it.
//
// A holder asks its authority for a grant and may not hear back: the request may have
// been taken or not. `GrantRequest` is what a holder keeps of the request per key: the id
// of a request whose answer was lost (asked again with the same id, so that the authority
// replays a grant it took instead of taking a second one), when not to ask before (after
// a failure: the backoff; after a denial: its retry time), and the failure it backs off
// from. Every holder keeps one per key in its GrantsHeld (holdings.hpp): a LeasedLimiter
// and a LeasedBackend (gateway/leases/lease_state.hpp's KeyLease) alike.
//
// Thread safety: none of its own; the holder's per-key lock guards it.
//
//   GrantRequest& r = holding.request;
//   if (r.pending_id.empty()) r.pending_id = grant_id(incarnation, ++sequence);
//   auto got = authority.grant(key, units, r.pending_id);
//   if (!got.ok()) r.failed(got.status(), now, [&](int n) { return backoff.after(n); });
//   else r.answered();
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>

#include "absl/numeric/int128.h"
#include "absl/status/status.h"
#include "quota/policy/policy.hpp"
#include "quota/units.hpp"

namespace quota {

struct GrantRequest {
  // The request in flight, or one whose answer was lost (kUnavailable): asked again
  // with this id.
  std::string pending_id;
  std::int64_t pending_units = 0;
  std::uint64_t pending_version = 0;  // the rule-set version it was asked under
  // Do not ask before this time (a failure's backoff, a denial's retry time), and the
  // wait that set it; Nanos::max() (saturated) is never reached.
  Nanos retry_at = Nanos::min();
  Nanos retry_wait{0};
  absl::Status last_failure;  // the failure backed off from; OK after an answer
  int failures = 0;           // failed requests in a row

  // Whether the authority may be asked at `now`.
  bool may_ask(Nanos now) const { return now >= retry_at && retry_at != Nanos::max(); }

  // Do not ask for `wait` from `now` (a negative wait counts as none).
  void hold_off(Nanos now, Nanos wait) {
    wait = std::max(wait, Nanos{0});
    retry_at = detail::saturating_add(now, wait);
    retry_wait = std::min(wait, kNever - Nanos{1});
  }

  // What a denial while waiting answers as its retry_after: what is left of the wait,
  // finite and positive, never more than the wait that was set (so a retry_at saturated
  // at the end of the int64 range, or a clock set back, cannot make it longer or turn it
  // into kNever; a denial never says "retry now").
  Nanos wait_left(Nanos now) const {
    const absl::int128 left = absl::int128(retry_at.count()) - now.count();
    const absl::int128 wait = std::max<absl::int128>(retry_wait.count(), 1);
    return Nanos{static_cast<std::int64_t>(left <= 0 ? wait : std::min(left, wait))};
  }

  // After a request that failed with `s`. kUnavailable is an unknown outcome: the id is
  // kept (a retry replays a grant taken) and the holder backs off for
  // `backoff(failures)` (failures counted up to 62). Any other error is definite:
  // nothing was taken, the id is dropped, and there is no backoff.
  template <class Backoff>
  void failed(const absl::Status& s, Nanos now, Backoff&& backoff) {
    if (s.code() != absl::StatusCode::kUnavailable) {
      pending_id.clear();
      return;
    }
    failures = std::min(failures + 1, 62);
    last_failure = s;
    hold_off(now, backoff(failures));
  }

  // After the authority answered (a grant or a denial): nothing pending, no failure.
  void answered() {
    pending_id.clear();
    failures = 0;
    last_failure = absl::OkStatus();
  }
};

}  // namespace quota
