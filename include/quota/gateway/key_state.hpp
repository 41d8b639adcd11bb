// quota/gateway/key_state.hpp — the per-key state the gateway stores, and rule changes.
//
// The gateway keeps, for every key, the state of the policy that governs it *together
// with that policy's parameters and the rule-set version that last wrote it*
// (`KeyState`). That makes a rule change safe: a state written under other parameters is
// first brought to `now` with the OLD parameters, then converted (migrate()):
//
//   remaining' = min(remaining under the old policy at now, capacity of the new policy)
//
// so a change never hands out a fresh full bucket (DESIGN §6), between any two of the
// four kinds (`RulePolicy`). refund() gives back units a request did not use, charge()
// a settle's deficit (as debt, capped at the capacity). `KeyPolicy` adapts this to the
// Policy concept, so the ordinary stores (LocalStore, ShardedStore) hold KeyStates. What
// each kind contributes (remaining, a converted state, a refund) is in rule_kinds.hpp.
//
// Thread safety: values and pure functions; the store makes each update atomic per key.
//
//   quota::gateway::RulePolicy free = quota::TokenBucket{.rate = {10, 1s}, .burst = 20};
//   quota::ShardedStore<quota::gateway::KeyPolicy> store;
//   auto d = store.apply(quota::gateway::KeyPolicy{.policy = &free, .version = 1},
//                        "{acme}read", clock.now(), 1);
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <variant>

#include "absl/status/status.h"
#include "quota/decision.hpp"
#include "quota/gateway/rules/rule_kinds.hpp"
#include "quota/policy/fixed_window.hpp"
#include "quota/policy/policy.hpp"
#include "quota/policy/sliding_log.hpp"
#include "quota/policy/sliding_window_estimate.hpp"
#include "quota/policy/token_bucket.hpp"
#include "quota/units.hpp"

namespace quota::gateway {

// The policy of a rule: one of the kinds the gateway converts between.
using RulePolicy = std::variant<TokenBucket, FixedWindow, SlidingLog, SlidingWindowEstimate>;

// What the store keeps per key: 120 bytes (x86-64, libstdc++), plus a sliding log's ring
// (16 bytes per slot, at most `limit` slots; freed when the key is evicted or converted).
struct KeyState {
  std::uint64_t version = 0;  // rule-set version that last wrote this state
  std::int64_t idle_at = 0;   // ns: from then on the state equals a fresh one
  RulePolicy policy{};        // parameters that wrote `state`
  std::variant<TokenBucket::State, FixedWindow::State, SlidingLog::State,
               SlidingWindowEstimate::State>
      state{};
  MicroUnits debt = 0;  // charged deficit still to pay, <= capacity
};

namespace detail {

template <class A, class B>
bool same_params(const A& a, const B& b) {
  if constexpr (std::is_same_v<A, B>) {
    return RuleKind<A>::same_params(a, b);
  } else {
    return false;
  }
}
inline bool same_params(const RulePolicy& a, const RulePolicy& b) {
  return std::visit([](const auto& x, const auto& y) { return same_params(x, y); }, a, b);
}

// Capacity in whole units: burst or limit.
inline std::int64_t capacity(const RulePolicy& p) {
  return std::visit([](const auto& x) { return RuleKind<std::decay_t<decltype(x)>>::capacity(x); },
                    p);
}

inline absl::Status validate(const RulePolicy& p) {
  return std::visit([](const auto& x) { return x.validate(); }, p);
}

// Calls fn(policy, state) with the policy `s` holds and its state.
template <class Fn>
decltype(auto) with_kind(KeyState& s, Fn&& fn) {
  return std::visit(
      [&](const auto& p) -> decltype(auto) {
        using P = std::decay_t<decltype(p)>;
        return fn(p, std::get<typename P::State>(s.state));
      },
      s.policy);
}

inline std::int64_t latest_time(const KeyState& s) {
  return std::visit(
      [](const auto& st) {
        using S = std::decay_t<decltype(st)>;
        if constexpr (std::is_same_v<S, SlidingLog::State>) {
          return st.last();
        } else {
          return st.last;
        }
      },
      s.state);
}

// Brings the state to `now` under its own (old) parameters; returns the remaining budget
// in micro-units.
inline MicroUnits observe(KeyState& s, std::int64_t now) {
  return with_kind(s, [&](const auto& p, auto& st) {
    return RuleKind<std::decay_t<decltype(p)>>::observe(p, st, now);
  });
}

// A state of `p` at time `t` holding `remaining` micro-units (clamped to capacity).
inline decltype(KeyState::state) with_remaining(const RulePolicy& p, std::int64_t t,
                                                MicroUnits remaining) {
  return std::visit(
      [&](const auto& x) -> decltype(KeyState::state) {
        return RuleKind<std::decay_t<decltype(x)>>::with_remaining(x, t, remaining);
      },
      p);
}

inline Nanos idle_time(const KeyState& s) {
  if (s.debt > 0) return kNever;  // debt is not a fresh state; paid at the next decision
  return std::visit(
      [&](const auto& p) -> Nanos {
        using P = std::decay_t<decltype(p)>;
        return p.idle_at(std::get<typename P::State>(s.state));
      },
      s.policy);
}

// Pays debt from the budget present now (the state must already be brought to now).
inline void pay_debt(KeyState& s) {
  if (s.debt <= 0) return;
  with_kind(s, [&](const auto& p, auto& st) {
    RuleKind<std::decay_t<decltype(p)>>::pay_debt(p, st, s.debt);
  });
}

}  // namespace detail

// Converts `s` to `policy` at rule-set `version`: brought to max(now, stored time) under
// its own parameters (so stored time never moves back), then given
// remaining' = min(remaining, capacity of `policy`), for every pair of kinds. Returns true
// when the parameters changed.
//   - into a TokenBucket: tokens = remaining (micro-units; negative, i.e. debt, kept down
//     to -burst); the carried sub-micro-unit fraction is dropped: rounding down, never up.
//     An upgrade keeps the tokens the client had and refills towards the larger burst at
//     the new rate; a downgrade cuts them to the new burst.
//   - into a window kind: remaining rounded DOWN to whole units; the units it lacks are
//     counted as admitted at the change (FixedWindow: the current window's count; the
//     estimator: the current window's counter; the log: one event at the change, leaving
//     it a whole window later — never earlier than the events it stands for). Debt
//     (negative remaining) moves to KeyState::debt.
//   - the same parameters under a new version: only the version is updated.
// A state written under a NEWER version is left as it is
// (its parameters and version stay): a caller still holding an older rule set — another
// gateway process mid-rollout, or a request that took its snapshot just before a
// reload — must not roll the key back, so the newest rule wins and state never
// flip-flops between two rule sets.
inline bool migrate(KeyState& s, const RulePolicy& policy, std::uint64_t version, Nanos now) {
  if (s.version > version) return false;
  // Versions identify parameters within one registry; comparing the parameters as well
  // keeps unversioned users (the emergency buckets, version 0) safe.
  if (detail::same_params(s.policy, policy)) {
    s.version = version;
    return false;
  }
  const std::int64_t t = std::max(now.count(), detail::latest_time(s));
  const MicroUnits remaining = detail::observe(s, t);
  if (remaining < 0 && !std::holds_alternative<TokenBucket>(policy)) s.debt -= remaining;
  s.state = detail::with_remaining(policy, t, remaining);
  s.policy = policy;
  s.version = version;
  s.debt = std::min(s.debt, to_micro(detail::capacity(policy)));
  s.idle_at = detail::idle_time(s).count();
  return true;
}

// Gives back `units` that were deducted at `spent_at` (a hierarchy's compensation or a
// settle's surplus); outstanding debt is paid first. Never creates budget: a token bucket
// is capped at its burst; a window kind takes back only units still counted from that
// deduction's window or events (rule_kinds.hpp: FixedWindow its current window, the
// estimator its current or previous window, the log the newest events at or before
// `spent_at`). Returns the micro-units given back, debt paid included.
inline MicroUnits refund(KeyState& s, std::int64_t units, Nanos spent_at, Nanos now) {
  MicroUnits give = to_micro(units);
  const std::int64_t t = std::max(now.count(), detail::latest_time(s));
  detail::observe(s, t);
  const MicroUnits to_debt = std::min(s.debt, give);
  s.debt -= to_debt;
  give -= to_debt;
  const MicroUnits given = detail::with_kind(s, [&](const auto& p, auto& st) {
    return detail::RuleKind<std::decay_t<decltype(p)>>::refund(p, st, give, spent_at.count());
  });
  s.idle_at = detail::idle_time(s).count();
  return given + to_debt;
}

// Charges `units` now (a settle's deficit). Returns the micro-units that could not be
// paid from the budget present, i.e. became debt.
//   - TokenBucket: debt is negative tokens, so the bucket's own refill pays it, exactly
//     (TokenBucket's refill and retry_after arithmetic hold for tokens in [-burst, burst];
//     tokens are floored at -burst, and at -(2^63-1-burst·10^6) for a huge burst).
//     retry_after then includes the debt.
//   - the window kinds: what the budget still allows is counted at once (as admitted
//     now); the rest is kept in KeyState::debt and counted at later decisions, before
//     their own cost.
// Either way debt is capped at the capacity: an emptied key is blocked for at most one
// full refill (B/r) or window (two for the estimator, whose counted units weigh on the
// next window).
inline MicroUnits charge(KeyState& s, std::int64_t units, Nanos now) {
  const std::int64_t t = std::max(now.count(), detail::latest_time(s));
  detail::observe(s, t);
  const MicroUnits cap = to_micro(detail::capacity(s.policy));
  if (std::holds_alternative<TokenBucket>(s.policy)) {
    auto& st = std::get<TokenBucket::State>(s.state);
    const MicroUnits floor = detail::token_floor(cap);
    const MicroUnits before = std::max<MicroUnits>(0, -st.tokens);
    MicroUnits after;
    if (__builtin_sub_overflow(st.tokens, to_micro(units), &after) || after < floor) {
      after = floor;
    }
    st.tokens = after;
    st.carry = after >= cap ? 0 : st.carry;
    s.idle_at = detail::idle_time(s).count();
    return std::max<MicroUnits>(0, -after) - before;
  }
  const MicroUnits before = s.debt;
  MicroUnits owed;
  if (__builtin_add_overflow(s.debt, to_micro(units), &owed)) {
    owed = std::numeric_limits<MicroUnits>::max();
  }
  s.debt = owed;
  detail::pay_debt(s);
  s.debt = std::min(cap, s.debt);
  s.idle_at = detail::idle_time(s).count();
  return s.debt - std::min(before, s.debt);
}

// The Policy the stores see: the current rule's policy and version. Construct one per
// call (it holds a pointer to the caller's policy; cheap to copy): the stores then hold
// KeyStates, `store.update(KeyPolicy{...}, key, now, fn)`. Its `idle_at` reads the time
// stored in the state (computed with the parameters that wrote it), so eviction is safe
// whichever rule the evicting call carries. A key forgotten while idle (full) is
// recreated fresh under the current rule — exactly what a tenant never seen before gets;
// this is the one case where an upgrade's larger burst is available at once, and only to
// a key that had been entirely unspent.
struct KeyPolicy {
  using State = KeyState;

  const RulePolicy* policy = nullptr;
  std::uint64_t version = 0;

  absl::Status validate() const {
    if (policy == nullptr) return absl::InvalidArgumentError("KeyPolicy.policy is null");
    return detail::validate(*policy);
  }

  State init(Nanos now) const {
    State s{
        .version = version,
        .idle_at = now.count(),
        .policy = *policy,
        .state = detail::with_remaining(*policy, now.count(), to_micro(detail::capacity(*policy))),
        .debt = 0};
    return s;
  }

  // The rule's whole budget spent at `at` (StoreOptions::assume_spent_at).
  State exhausted(Nanos at) const {
    State s = init(at);
    s.state = detail::with_remaining(*policy, at.count(), 0);
    s.idle_at = detail::idle_time(s).count();
    return s;
  }

  // Migrates to this policy if needed, pays debt, then applies the policy's own
  // transition. Decision::version is the rule-set version whose parameters decided: this
  // one, or the newer one that last wrote the state (see migrate()).
  Decision apply(State& s, Nanos now, std::int64_t cost) const {
    migrate(s, *policy, version, now);
    if (s.debt > 0) {
      detail::observe(s, std::max(now.count(), detail::latest_time(s)));
      detail::pay_debt(s);
    }
    Decision d = std::visit(
        [&](const auto& p) {
          using P = std::decay_t<decltype(p)>;
          return p.apply(std::get<typename P::State>(s.state), now, cost);
        },
        s.policy);
    d.version = s.version;
    s.idle_at = detail::idle_time(s).count();
    return d;
  }

  Nanos idle_at(const State& s) const { return Nanos{s.idle_at}; }
};

static_assert(Policy<KeyPolicy>);

}  // namespace quota::gateway
