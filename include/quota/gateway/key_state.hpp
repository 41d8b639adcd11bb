// quota/gateway/key_state.hpp — the per-key state the gateway stores, and rule changes.
//
// The gateway keeps, for every key, the state of the policy that governs it *together
// with that policy's parameters and the rule-set version that last wrote it*
// (`KeyState`). That makes a rule change safe: a state written under other parameters is
// first brought to `now` with the OLD parameters, then converted (migrate()):
//
//   remaining' = min(remaining under the old policy at now, capacity of the new policy)
//
// so a change never hands out a fresh full bucket (DESIGN §6). `KeyPolicy` adapts this to
// the Policy concept, so the ordinary stores (LocalStore, ShardedStore) hold KeyStates.
// Policies: TokenBucket and FixedWindow (`RulePolicy`). A settle's deficit may be charged
// as debt, capped at the capacity (charge()).
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
#include <variant>

#include "absl/status/status.h"
#include "quota/decision.hpp"
#include "quota/policy/fixed_window.hpp"
#include "quota/policy/policy.hpp"
#include "quota/policy/token_bucket.hpp"
#include "quota/units.hpp"

namespace quota::gateway {

// The policy of a rule: one of the kinds the gateway can convert between. SlidingLog
// (state grows with events) and SlidingWindowEstimate are not gateway rule kinds.
using RulePolicy = std::variant<TokenBucket, FixedWindow>;

namespace detail {

inline bool same_params(const TokenBucket& a, const TokenBucket& b) {
  return a.rate == b.rate && a.burst == b.burst;
}
inline bool same_params(const FixedWindow& a, const FixedWindow& b) {
  return a.limit == b.limit && a.window == b.window;
}
template <class A, class B>
bool same_params(const A&, const B&) {
  return false;
}
inline bool same_params(const RulePolicy& a, const RulePolicy& b) {
  return std::visit([](const auto& x, const auto& y) { return same_params(x, y); }, a, b);
}

// Capacity in whole units: burst or limit.
inline std::int64_t capacity(const RulePolicy& p) {
  return std::visit(
      [](const auto& x) -> std::int64_t {
        if constexpr (std::is_same_v<std::decay_t<decltype(x)>, TokenBucket>) {
          return x.burst;
        } else {
          return x.limit;
        }
      },
      p);
}

inline absl::Status validate(const RulePolicy& p) {
  return std::visit([](const auto& x) { return x.validate(); }, p);
}

}  // namespace detail

// What the store keeps per key (about 80 bytes).
struct KeyState {
  std::uint64_t version = 0;  // rule-set version that last wrote this state
  std::int64_t idle_at = 0;   // ns: from then on the state equals a fresh one
  RulePolicy policy{};        // parameters that wrote `state`
  std::variant<TokenBucket::State, FixedWindow::State> state{};
  MicroUnits debt = 0;  // charged deficit still to pay, <= capacity
};

namespace detail {

inline std::int64_t latest_time(const KeyState& s) {
  return std::visit([](const auto& st) { return st.last; }, s.state);
}

// Brings the state to `now` under its own (old) parameters; returns the remaining budget
// in micro-units.
inline MicroUnits observe(KeyState& s, std::int64_t now) {
  if (auto* tb = std::get_if<TokenBucket>(&s.policy)) {
    auto& st = std::get<TokenBucket::State>(s.state);
    tb->refill(st, now);
    return st.tokens;
  }
  const auto& fw = std::get<FixedWindow>(s.policy);
  auto& st = std::get<FixedWindow::State>(s.state);
  fw.advance(st, now);
  return to_micro(fw.limit - st.count);
}

// The lowest token count (most debt) a bucket of capacity `cap` micro-units may hold:
// -cap, or less debt when cap - tokens would leave int64 (a burst near kMaxUnits).
inline MicroUnits token_floor(MicroUnits cap) {
  return -std::min(cap, std::numeric_limits<MicroUnits>::max() - cap);
}

// A state of `p` at time `t` holding `remaining` micro-units (clamped to capacity).
inline std::variant<TokenBucket::State, FixedWindow::State> with_remaining(const RulePolicy& p,
                                                                           std::int64_t t,
                                                                           MicroUnits remaining) {
  if (const auto* tb = std::get_if<TokenBucket>(&p)) {
    // Negative remaining is debt (see charge()): kept, floored at -burst.
    const MicroUnits cap = to_micro(tb->burst);
    return TokenBucket::State{
        .tokens = std::clamp(remaining, token_floor(cap), cap), .carry = 0, .last = t};
  }
  const auto& fw = std::get<FixedWindow>(p);
  // Rounds down; negative remaining (debt) is moved to KeyState::debt by migrate().
  const std::int64_t units = std::clamp<std::int64_t>(remaining / kMicrosPerUnit, 0, fw.limit);
  return FixedWindow::State{.count = fw.limit - units, .last = t};
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
  if (std::holds_alternative<TokenBucket>(s.policy)) {
    auto& st = std::get<TokenBucket::State>(s.state);
    // Only tokens present pay: a bucket already in debt of its own (negative tokens,
    // from charge()) pays nothing more now.
    const MicroUnits pay = std::min(std::max<MicroUnits>(st.tokens, 0), s.debt);
    st.tokens -= pay;
    s.debt -= pay;
    return;
  }
  const auto& fw = std::get<FixedWindow>(s.policy);
  auto& st = std::get<FixedWindow::State>(s.state);
  // Window policies count whole units: a partial unit of debt is paid as a whole one.
  const std::int64_t owed = (s.debt + kMicrosPerUnit - 1) / kMicrosPerUnit;
  const std::int64_t pay = std::min(fw.limit - st.count, owed);
  st.count += pay;
  s.debt = std::max<MicroUnits>(0, s.debt - to_micro(pay));
}

}  // namespace detail

// Converts `s` to `policy` at rule-set `version`: brought to max(now, stored time) under
// its own parameters (so stored time never moves back), then given
// remaining' = min(remaining, capacity of `policy`). Returns true when the parameters
// changed.
//   - TokenBucket → TokenBucket (downgrade or upgrade): refilled at the old rate up to the
//     change, then clamped to the new burst. An upgrade therefore keeps the tokens the
//     client had and refills towards the larger burst at the new rate; a downgrade cuts
//     the tokens to the new burst. The carried sub-micro-unit fraction (< 1 micro-unit)
//     is dropped: rounding down, never up.
//   - switching kind (TokenBucket ↔ FixedWindow): the same rule. Bucket → window: the
//     current window's count is set so that `limit − count = min(limit, floor(tokens))`;
//     the next window is full, as the window policy gives anyway. Window → bucket:
//     tokens = min(burst, limit − count) — what the window still allowed, never more.
//     Remaining is rounded DOWN to whole units when entering a window policy.
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
  if (remaining < 0 && std::holds_alternative<FixedWindow>(policy)) s.debt -= remaining;
  s.state = detail::with_remaining(policy, t, remaining);
  s.policy = policy;
  s.version = version;
  s.debt = std::min(s.debt, to_micro(detail::capacity(policy)));
  s.idle_at = detail::idle_time(s).count();
  return true;
}

// Gives back `units` that were deducted at `spent_at` (a hierarchy's compensation or a
// settle's surplus), capped at the capacity; outstanding debt is paid first. A window
// policy only takes back units spent in the current window: a later window already
// started from zero. Returns the micro-units actually returned to the budget.
inline MicroUnits refund(KeyState& s, std::int64_t units, Nanos spent_at, Nanos now) {
  MicroUnits give = to_micro(units);
  const std::int64_t t = std::max(now.count(), detail::latest_time(s));
  detail::observe(s, t);
  const MicroUnits to_debt = std::min(s.debt, give);
  s.debt -= to_debt;
  give -= to_debt;
  MicroUnits given = 0;
  if (const auto* tb = std::get_if<TokenBucket>(&s.policy)) {
    auto& st = std::get<TokenBucket::State>(s.state);
    const MicroUnits cap = to_micro(tb->burst);
    given = std::min(give, cap - st.tokens);
    st.tokens += given;
    if (st.tokens == cap) st.carry = 0;  // full means no carried fraction
  } else {
    const auto& fw = std::get<FixedWindow>(s.policy);
    auto& st = std::get<FixedWindow::State>(s.state);
    const std::int64_t w = fw.window.count();
    if (quota::detail::floor_div(spent_at.count(), w) == quota::detail::floor_div(st.last, w)) {
      const std::int64_t back = std::min(give / kMicrosPerUnit, st.count);
      st.count -= back;
      given = to_micro(back);
    }
  }
  s.idle_at = detail::idle_time(s).count();
  return given + to_debt;
}

// Charges `units` now (a settle's deficit). Returns the micro-units that could not be
// paid from the budget present, i.e. became debt.
//   - TokenBucket: debt is negative tokens, so the bucket's own refill pays it, exactly
//     (TokenBucket's refill and retry_after arithmetic hold for tokens in [-burst, burst];
//     tokens are floored at -burst, and at -(2^63-1-burst·10^6) for a huge burst).
//     retry_after then includes the debt.
//   - FixedWindow: what the window still allows is counted at once; the rest is kept in
//     KeyState::debt and counted at later decisions, before their own cost.
// Either way debt is capped at the capacity: an emptied key is blocked for at most one
// full refill (B/r) or window.
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
