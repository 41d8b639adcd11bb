// quota/policy/policy.hpp — the Policy concept every rate policy models.
//
// A policy is a value (its parameters) plus a pure transition on a per-key state:
//
//   (state, now, cost) -> (state', Decision)
//
// It owns no storage, takes no locks and reads no clock: stores make the transition
// atomic per key, limiters supply the time. The same transition exists as a Lua twin
// for the Redis store.
//
// Contract for every policy P:
//   - `P::State` is the per-key state; `p.init(now)` is the state of a key seen for the
//     first time at `now` (for every policy here: an unspent budget).
//   - `p.validate()` rejects invalid parameters with InvalidArgument naming the field
//     and the bound. Limiters and stores call it once when they are built; `apply` on
//     an unvalidated policy is undefined.
//   - `p.apply(state, now, cost)` decides and, when allowed, deducts. A `now` earlier
//     than the time already in `state` counts as that stored time: backwards time
//     refills nothing, un-counts nothing, and is never written into the state.
//   - `p.idle_at(state)` is the earliest time from which `state` behaves exactly like
//     `p.init(t)`: a store may forget the key then (and only then) without handing out
//     budget. Nanos::max() means never.
//   - Optionally (every policy here has it), `p.exhausted(at)`: the state of a key whose
//     whole budget was spent at `at` — what `apply(init(at), at, budget)` leaves. Stores
//     create new keys in it with StoreOptions::assume_spent_at (restart safety).
//
//   template <quota::Policy P> quota::Decision spend(const P& p, typename P::State& s,
//                                                     quota::Nanos now) {
//     return p.apply(s, now, 1);
//   }
#pragma once

#include <concepts>
#include <cstdint>

#include "absl/status/status.h"
#include "quota/decision.hpp"
#include "quota/units.hpp"

namespace quota {

template <class P>
concept Policy = std::copy_constructible<P> &&
    requires(const P& policy, typename P::State& state, const typename P::State& cstate, Nanos now,
             std::int64_t cost) {
  typename P::State;
  { policy.validate() } -> std::same_as<absl::Status>;
  { policy.init(now) } -> std::same_as<typename P::State>;
  { policy.apply(state, now, cost) } -> std::same_as<Decision>;
  { policy.idle_at(cstate) } -> std::same_as<Nanos>;
};

// A policy whose keys can start exhausted (StoreOptions::assume_spent_at).
template <class P>
concept HasExhausted = Policy<P> && requires(const P& policy, Nanos at) {
  { policy.exhausted(at) } -> std::same_as<typename P::State>;
};

namespace detail {

// a + b for b >= 0, saturating at Nanos::max() (kNever).
constexpr Nanos saturating_add(Nanos a, Nanos b) {
  if (b == kNever || a.count() > Nanos::max().count() - b.count()) return kNever;
  return a + b;
}

// An admission (the cost was deducted).
constexpr Decision allowed_decision(std::int64_t remaining, Nanos reset_after) {
  return Decision{.allowed = true,
                  .remaining = remaining,
                  .retry_after = Nanos{0},
                  .reset_after = reset_after,
                  .version = 0,
                  .reason = Reason::kAllowed};
}

// A denial for lack of budget now: the same request passes after `retry_after`.
constexpr Decision over_limit_decision(std::int64_t remaining, Nanos retry_after,
                                       Nanos reset_after) {
  return Decision{.allowed = false,
                  .remaining = remaining,
                  .retry_after = retry_after,
                  .reset_after = reset_after,
                  .version = 0,
                  .reason = Reason::kOverLimit};
}

// A denial that no amount of waiting can turn into an admission.
constexpr Decision never_decision(Reason reason, std::int64_t remaining, Nanos reset_after) {
  return Decision{.allowed = false,
                  .remaining = remaining,
                  .retry_after = kNever,
                  .reset_after = reset_after,
                  .version = 0,
                  .reason = reason};
}

}  // namespace detail
}  // namespace quota
