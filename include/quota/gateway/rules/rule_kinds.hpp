// quota/gateway/rules/rule_kinds.hpp — what the gateway's KeyState asks of each policy kind.
//
// `RuleKind<P>` holds, for one policy kind P of a rule (TokenBucket, FixedWindow,
// SlidingLog, SlidingWindowEstimate), the operations key_state.hpp combines into rule
// changes, refunds and debt. Each is written with the policy's own functions (refill,
// advance, apply, remaining, take_back of policy/*.hpp), never a copy of their arithmetic:
//   - observe(p, st, t): brings `st` to time t; returns the remaining budget in micro-units
//     (TokenBucket: tokens, negative while in debt; window kinds: limit − units counted);
//   - with_remaining(p, t, remaining): a state at t holding `remaining` micro-units, never
//     more than the capacity. Window kinds round down to whole units and hold the spent
//     units as admitted at t (for the log: one event at t, leaving at t + W);
//   - refund(p, st, give, spent_at): gives back up to `give` micro-units deducted at
//     `spent_at`, capped so that no budget is created (below); returns what it gave;
//   - pay_debt(p, st, debt): pays `debt` from the budget present (window kinds count it
//     as admitted now, a partial unit as a whole one);
//   - capacity(p): burst or limit, whole units.
// Pure functions of values; the store makes each update atomic per key.
//
//   quota::SlidingLog log{.limit = 100, .window = 60s};
//   auto st = RuleKind<quota::SlidingLog>::with_remaining(log, t, quota::to_micro(40));
//   // st holds one event of 60 units at t
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>

#include "quota/policy/fixed_window.hpp"
#include "quota/policy/sliding_log.hpp"
#include "quota/policy/sliding_window_estimate.hpp"
#include "quota/policy/token_bucket.hpp"
#include "quota/units.hpp"

namespace quota::gateway::detail {

template <class P>
struct RuleKind;

// The lowest token count (most debt) a bucket of capacity `cap` micro-units may hold:
// -cap, or less debt when cap - tokens would leave int64 (a burst near kMaxUnits).
inline MicroUnits token_floor(MicroUnits cap) {
  return -std::min(cap, std::numeric_limits<MicroUnits>::max() - cap);
}

template <>
struct RuleKind<TokenBucket> {
  using State = TokenBucket::State;

  static std::int64_t capacity(const TokenBucket& p) { return p.burst; }
  static bool same_params(const TokenBucket& a, const TokenBucket& b) {
    return a.rate == b.rate && a.burst == b.burst;
  }

  static MicroUnits observe(const TokenBucket& p, State& st, std::int64_t t) {
    p.refill(st, t);
    return st.tokens;
  }

  // Negative remaining is debt (see charge() in key_state.hpp): kept, floored at -burst.
  // The refill remainder is not carried over: rounding down, never up.
  static State with_remaining(const TokenBucket& p, std::int64_t t, MicroUnits remaining) {
    const MicroUnits cap = to_micro(p.burst);
    return State{.tokens = std::clamp(remaining, token_floor(cap), cap), .carry = 0, .last = t};
  }

  // Exact in micro-units, capped at the burst; when `spent_at` was does not matter.
  static MicroUnits refund(const TokenBucket& p, State& st, MicroUnits give, std::int64_t) {
    const MicroUnits cap = to_micro(p.burst);
    const MicroUnits given = std::min(give, cap - st.tokens);
    st.tokens += given;
    if (st.tokens == cap) st.carry = 0;  // full means no carried fraction
    return given;
  }

  // Only tokens present pay: a bucket already in debt of its own (negative tokens, from
  // charge()) pays nothing more now.
  static void pay_debt(const TokenBucket&, State& st, MicroUnits& debt) {
    const MicroUnits pay = std::min(std::max<MicroUnits>(st.tokens, 0), debt);
    st.tokens -= pay;
    debt -= pay;
  }
};

// The three window kinds count whole units: the remaining budget, a new state and paid
// debt go through the policy's own advance() and apply(), so a unit counted here is
// counted exactly as an admitted request's.
template <class P>
struct WindowKind {
  static std::int64_t capacity(const P& p) { return p.limit; }
  static bool same_params(const P& a, const P& b) {
    return a.limit == b.limit && a.window == b.window;
  }

  static MicroUnits observe(const P& p, typename P::State& st, std::int64_t t) {
    p.advance(st, t);
    return to_micro(RuleKind<P>::remaining_units(p, st));
  }

  // Rounds down; negative remaining (debt) is moved to KeyState::debt by migrate().
  static typename P::State with_remaining(const P& p, std::int64_t t, MicroUnits remaining) {
    const std::int64_t units = std::clamp<std::int64_t>(remaining / kMicrosPerUnit, 0, p.limit);
    typename P::State st = p.init(Nanos{t});
    // limit − units <= limit on an empty state: admitted, counted at t.
    if (units < p.limit) (void)p.apply(st, Nanos{t}, p.limit - units);
    return st;
  }

  // On a state brought to its time `t` by observe(): counts min(debt, remaining) at t.
  static void pay_debt(const P& p, typename P::State& st, MicroUnits& debt) {
    const std::int64_t owed = (debt + kMicrosPerUnit - 1) / kMicrosPerUnit;
    const std::int64_t pay = std::min(RuleKind<P>::remaining_units(p, st), owed);
    if (pay > 0) (void)p.apply(st, Nanos{RuleKind<P>::time(st)}, pay);
    debt = std::max<MicroUnits>(0, debt - to_micro(pay));
  }
};

// A refund takes back units only while the window they were counted in is current: a
// later window already started from zero, so refunding into it would create budget.
template <>
struct RuleKind<FixedWindow> : WindowKind<FixedWindow> {
  using State = FixedWindow::State;
  static std::int64_t time(const State& st) { return st.last; }
  static std::int64_t remaining_units(const FixedWindow& p, const State& st) {
    return p.limit - st.count;
  }

  static MicroUnits refund(const FixedWindow& p, State& st, MicroUnits give,
                           std::int64_t spent_at) {
    const std::int64_t w = p.window.count();
    if (quota::detail::floor_div(spent_at, w) != quota::detail::floor_div(st.last, w)) return 0;
    const std::int64_t back = std::min(give / kMicrosPerUnit, st.count);
    st.count -= back;
    return to_micro(back);
  }
};

// "Remaining" at t is limit − the units counted in (t − W, t]. A refund un-logs the most
// recent events logged at or before `spent_at` that are still counted
// (SlidingLog::take_back): the refunded units then never count, and no event logged
// later (another request's, leaving later) is removed in their place.
template <>
struct RuleKind<SlidingLog> : WindowKind<SlidingLog> {
  using State = SlidingLog::State;
  static std::int64_t time(const State& st) { return st.last(); }
  static std::int64_t remaining_units(const SlidingLog& p, const State& st) {
    return p.limit - st.used();
  }

  static MicroUnits refund(const SlidingLog& p, State& st, MicroUnits give, std::int64_t spent_at) {
    return to_micro(p.take_back(st, give / kMicrosPerUnit, spent_at));
  }
};

// A refund takes units off the counter of the window they were spent in while it is still
// counted: the current one (cur) or the one before (prev, counted with its weight). The
// result is the state the estimator would hold had they never been admitted. It returns
// the units taken off the counter (of prev, a weighted part is budget at once).
template <>
struct RuleKind<SlidingWindowEstimate> : WindowKind<SlidingWindowEstimate> {
  using State = SlidingWindowEstimate::State;
  static std::int64_t time(const State& st) { return st.last; }
  static std::int64_t remaining_units(const SlidingWindowEstimate& p, const State& st) {
    return p.remaining(st);
  }

  static MicroUnits refund(const SlidingWindowEstimate& p, State& st, MicroUnits give,
                           std::int64_t spent_at) {
    const std::int64_t w = p.window.count();
    const std::int64_t k_spent = quota::detail::floor_div(spent_at, w);
    const std::int64_t k_last = quota::detail::floor_div(st.last, w);
    std::int64_t* counter = nullptr;
    if (k_spent == k_last) counter = &st.cur;
    if (k_spent < k_last && k_spent == k_last - 1) counter = &st.prev;
    if (counter == nullptr) return 0;
    const std::int64_t back = std::min(give / kMicrosPerUnit, *counter);
    *counter -= back;
    return to_micro(back);
  }
};

}  // namespace quota::gateway::detail
