// fuzz/check/lease_check.hpp — one fuzz input run through a lease holder
// (quota::LeasedLimiter) over an in-process authority (quota::StoreAuthority), both on
// one manual clock, with every decision checked against the holder's contract
// (quota/lease/leased_limiter.hpp) and the admitted events against its envelope.
//
// Input layout (input.hpp decoders): the central token bucket (as policy_check.hpp
// decodes it), the lease options (q_min <= q_max, grant_ttl, backoff, whether the holder
// knows the central policy), then up to kMaxOps requests, each a clock time (forward,
// equal, backwards, jumps across the whole int64 range), a key of two and a cost.
// Checks, for every request:
//   - the call succeeds (the in-process authority has no failures to report);
//   - an allowed decision has retry_after 0; a denial for lack of budget has a positive
//     retry_after;
//   - a holder told to wait does not ask the authority again before the wait is over: a
//     request of at most q_max units on that key earlier than t + retry_after makes no
//     round trip (the authority counts them); told "never" for a cost, a request of that
//     cost or more not before grant_ttl has passed since the authority's answer;
// and at the end, per key, the admitted events, stamped with the latest time the key
// reached the authority, stay inside the lease envelope with one holder:
// admitted(T) <= r·T + B + q_max.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/numeric/int128.h"
#include "absl/strings/str_format.h"
#include "check/input.hpp"
#include "check/policy_check.hpp"
#include "quota/clock.hpp"
#include "quota/lease/authority.hpp"
#include "quota/lease/leased_limiter.hpp"
#include "quota/verify/envelope.hpp"

namespace quota::fuzz {

inline void check_lease_input(const std::uint8_t* data, std::size_t size) {
  using Authority = StoreAuthority<ShardedStore, ManualClock>;
  using Holder = LeasedLimiter<Authority, ManualClock>;
  Input in(data, size);
  const TokenBucket central = detail_policy::decode_token_bucket(in);
  LeaseOptions o;
  o.q_min = in.in_range(1, kMaxUnits);
  o.q_max = in.in_range(o.q_min, kMaxUnits);
  o.grant_ttl = Nanos{in.in_range(1, kMax)};
  o.backoff_min = Nanos{in.in_range(1, kMax)};
  o.backoff_max = Nanos{in.in_range(o.backoff_min.count(), kMax)};
  o.incarnation = 1 + in.byte();
  if (in.byte() % 2 == 1) o.central = central;
  const std::string where_opts =
      absl::StrFormat("%s q=[%d, %d] ttl=%d central=%d", detail_policy::describe(central), o.q_min,
                      o.q_max, o.grant_ttl.count(), o.central.has_value());

  ManualClock clock(Nanos{in.in_range(kMin, kMax)});
  Authority authority(central, clock);
  auto holder = Holder::create(authority, o, clock);
  check(holder.ok(), where_opts + ": create failed: " + std::string(holder.status().message()));

  static constexpr std::array<const char*, 2> kKeys = {"{t}a", "{t}b"};
  struct PerKey {
    std::vector<verify::AdmittedEvent> admitted;
    absl::int128 quiet_until = absl::int128(kMin);  // no round trip before this time
    // After "never" for a cost: no round trip for that cost or more before this time
    absl::int128 never_until = absl::int128(kMin);
    std::int64_t never_cost = 0;
    // The latest time a request on this key reached the authority: what its bucket there
    // has seen (time that goes back refills nothing), so the key's events are stamped with
    // it (every unit spent came from a grant taken at or before it).
    std::int64_t latest = kMin;
  };
  std::array<PerKey, 2> keys;
  absl::int128 hint = 0;
  for (int op = 0; op < kMaxOps && !in.empty(); ++op) {
    const std::int64_t now = in.time(clock.now().count(), hint, central.rate.per.count());
    const std::size_t k = in.byte() % 2;
    const std::int64_t cost = in.cost(std::min(o.q_max, central.burst));
    clock.set(Nanos{now});
    const std::string where =
        absl::StrFormat("%s op %d key %d now=%d cost=%d", where_opts, op, k, now, cost);
    const std::int64_t trips = authority.round_trips();
    const auto d = (*holder)->acquire(kKeys[k], cost);
    if (authority.round_trips() != trips) keys[k].latest = std::max(keys[k].latest, now);
    check(d.ok(), where + ": acquire failed: " + std::string(d.status().message()));
    if (cost >= 1 && cost <= o.q_max && absl::int128(now) < keys[k].quiet_until) {
      check(authority.round_trips() == trips,
            where + ": asked the authority again before the wait it answered was over");
    }
    if (cost >= keys[k].never_cost && cost <= o.q_max && absl::int128(now) < keys[k].never_until) {
      check(authority.round_trips() == trips,
            where + ": asked the authority again within grant_ttl of a \"never\" for this cost");
    }
    if (d->allowed && authority.round_trips() != trips) {
      // A new grant supersedes the waits answered before it (the clock may go back).
      keys[k].quiet_until = keys[k].never_until = absl::int128(kMin);
    }
    if (d->allowed) {
      check(d->retry_after == Nanos{0}, where + ": allowed with a wait " + str(*d));
      keys[k].admitted.push_back({keys[k].latest, cost});
    } else if (d->reason == Reason::kOverLimit) {
      check(d->retry_after > Nanos{0}, where + ": denied with a wait <= 0 " + str(*d));
      // A finite wait: no round trip before it is over. "Never" (a budget that cannot
      // refill) holds for this cost and more: the holder answers it locally and asks again
      // at most once per grant_ttl (to see a rule change), counted from the answer it got;
      // a smaller request may still pass, so it may ask.
      if (cost <= o.q_max && d->retry_after != kNever) {
        keys[k].quiet_until = absl::int128(now) + d->retry_after.count();
      } else if (cost <= o.q_max && authority.round_trips() != trips) {
        keys[k].never_until = absl::int128(now) + o.grant_ttl.count();
        keys[k].never_cost = cost;
      }
      hint = d->retry_after.count();
    }
  }
  for (std::size_t k = 0; k < keys.size(); ++k) {
    if (keys[k].admitted.empty()) continue;
    verify::TokenBucketVerifier v(central.rate, central.burst, o.q_max);
    for (const auto& e : keys[k].admitted) check(v.add(e).ok(), "verifier rejected an event");
    const auto r = v.report();
    check(r.holds(), absl::StrFormat("%s key %d: lease envelope r·T + B + q_max exceeded by %d "
                                     "micro-units",
                                     where_opts, k, r.excess_micro()));
  }
}

}  // namespace quota::fuzz
