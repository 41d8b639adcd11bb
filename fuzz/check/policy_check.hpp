// fuzz/check/policy_check.hpp — one fuzz input run through one policy, every decision
// checked against an independent exact model and the policy's contract, the admitted
// events against the envelope.
//
// Input layout (input.hpp decoders): the first byte chooses the policy (token bucket,
// fixed window, sliding log, sliding window estimate); then its parameters, drawn over a
// range slightly wider than validate() accepts — validate() must agree with an
// independent statement of its bounds, and rejected values are then brought into range;
// then up to kMaxOps (time, cost) requests. For every request:
//   - the decision equals the exact model's (tests/support/exact_token_bucket.hpp,
//     exact_windows.hpp: 128-bit arithmetic, different representations);
//   - retry_after is 0 when allowed, kNever only for a request no wait can admit
//     (invalid cost, cost above the budget, a token bucket at rate 0), and otherwise
//     exact: the same request passes at t + retry_after and not 1 ns earlier (checked
//     on copies of the state, when that time is in int64);
//   - reset_after is kNever only for a token bucket at rate 0;
//   - at idle_at (when finite) the state decides exactly as a fresh one.
// At the end the admitted events, at the time each was decided at (the latest time the
// key had seen), stay inside the envelope (quota/verify/envelope.hpp): r·T + B for the
// token bucket, N per window for the sliding log, 2·N for the fixed window and
// 2·N − 1 for the estimate (their documented worst cases).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "absl/numeric/int128.h"
#include "absl/strings/str_format.h"
#include "check/input.hpp"
#include "quota/policy/fixed_window.hpp"
#include "quota/policy/sliding_log.hpp"
#include "quota/policy/sliding_window_estimate.hpp"
#include "quota/policy/token_bucket.hpp"
#include "quota/verify/envelope.hpp"
#include "support/exact_token_bucket.hpp"
#include "support/exact_windows.hpp"

namespace quota::fuzz {

inline constexpr int kMaxOps = 48;

namespace detail_policy {

inline TokenBucket decode_token_bucket(Input& in) {
  TokenBucket p;
  p.rate.units = in.in_range(-1, kMaxUnits + 1);
  p.rate.per = Nanos{in.in_range(-1, kMax)};
  p.burst = in.in_range(-1, kMaxUnits + 1);
  // The bounds, stated independently: the time to fill, ceil(burst·per / units), at most
  // 2^63 − 2 ns, so that kNever is never a finite wait.
  const bool fields = p.rate.units >= 0 && p.rate.units <= kMaxUnits && p.rate.per.count() > 0 &&
                      p.burst >= 1 && p.burst <= kMaxUnits;
  const bool fill_ok =
      !fields || p.rate.units == 0 ||
      absl::int128(p.burst) * p.rate.per.count() <= absl::int128(kMax - 1) * p.rate.units;
  check(p.validate().ok() == (fields && fill_ok),
        absl::StrFormat("TokenBucket validate() = %d for units=%d per=%d burst=%d",
                        p.validate().ok(), p.rate.units, p.rate.per.count(), p.burst));
  p.rate.units = std::clamp<std::int64_t>(p.rate.units, 0, kMaxUnits);
  p.rate.per = Nanos{std::max<std::int64_t>(1, p.rate.per.count())};
  p.burst = std::clamp<std::int64_t>(p.burst, 1, kMaxUnits);
  if (p.rate.units > 0) {
    const absl::int128 most = absl::int128(kMax - 1) * p.rate.units / p.rate.per.count();
    if (most < 1) {
      p.rate.per = Nanos{kMax - 1};  // units = 1, per = 2^63 − 1: one below the bound
      p.burst = 1;
    } else if (most < p.burst) {
      p.burst = static_cast<std::int64_t>(most);
    }
  }
  check(p.validate().ok(), "TokenBucket brought into range is still rejected");
  return p;
}

template <class P>
P decode_window(Input& in) {
  P p;
  p.limit = in.in_range(-1, kMaxUnits + 1);
  p.window = Nanos{in.in_range(-1, (std::int64_t{1} << 62) + 1)};
  const bool ok = p.limit >= 1 && p.limit <= kMaxUnits && p.window.count() >= 1 &&
                  p.window.count() <= (std::int64_t{1} << 62) - 1;
  check(p.validate().ok() == ok, absl::StrFormat("window validate() = %d for limit=%d window=%d",
                                                 p.validate().ok(), p.limit, p.window.count()));
  p.limit = std::clamp<std::int64_t>(p.limit, 1, kMaxUnits);
  p.window = std::clamp(p.window, Nanos{1}, kMaxWindow);
  return p;
}

inline std::int64_t budget(const TokenBucket& p) { return p.burst; }
template <class P>
std::int64_t budget(const P& p) {
  return p.limit;
}
inline std::int64_t period(const TokenBucket& p) { return p.rate.per.count(); }
template <class P>
std::int64_t period(const P& p) {
  return p.window.count();
}
inline bool never_refills(const TokenBucket& p) { return p.rate.units == 0; }
template <class P>
bool never_refills(const P&) {
  return false;
}

inline std::string describe(const TokenBucket& p) {
  return absl::StrFormat("TokenBucket{units=%d per=%d burst=%d}", p.rate.units, p.rate.per.count(),
                         p.burst);
}
template <class P>
std::string describe(const P& p) {
  return absl::StrFormat("window policy{limit=%d window=%d}", p.limit, p.window.count());
}

template <class P, class Model>
void run(const P& p, Model& model, Input& in) {
  typename P::State s{};
  bool started = false;
  std::int64_t eff = 0;  // the latest time the key has seen: the time of each decision
  absl::int128 hint = 0;
  std::vector<verify::AdmittedEvent> admitted;
  const std::int64_t b = budget(p);
  for (int op = 0; op < kMaxOps && !in.empty(); ++op) {
    const std::int64_t now = in.time(started ? eff : 0, hint, period(p));
    const std::int64_t cost = in.cost(b);
    if (!started) {
      s = p.init(Nanos{now});
      eff = now;
      started = true;
    }
    eff = std::max(eff, now);
    const std::string where =
        absl::StrFormat("%s op %d now=%d (at %d) cost=%d", describe(p), op, now, eff, cost);
    const Decision want = model.apply(now, cost);
    const Decision got = p.apply(s, Nanos{now}, cost);
    check(got == want, where + ": got " + str(got) + ", model " + str(want));

    check(got.remaining >= 0, where + ": negative remaining " + str(got));
    check(got.reset_after >= Nanos{0} && (got.reset_after != kNever || never_refills(p)),
          where + ": reset_after " + str(got));
    if (got.allowed) {
      check(got.retry_after == Nanos{0}, where + ": allowed with a wait " + str(got));
      admitted.push_back({eff, cost});
    } else if (cost < 1 || cost > b) {
      check(got.retry_after == kNever &&
                got.reason == (cost < 1 ? Reason::kInvalidCost : Reason::kCostExceedsBurst),
            where + ": invalid or oversized cost " + str(got));
    } else if (never_refills(p)) {
      check(got.retry_after == kNever, where + ": rate 0 with a finite wait " + str(got));
    } else {
      check(got.reason == Reason::kOverLimit && got.retry_after > Nanos{0} &&
                got.retry_after != kNever,
            where + ": denial without a finite wait " + str(got));
      hint = got.retry_after.count();
      const absl::int128 pass = absl::int128(eff) + got.retry_after.count();
      if (pass <= absl::int128(kMax)) {
        auto later = s;
        check(p.apply(later, Nanos{static_cast<std::int64_t>(pass)}, cost).allowed,
              where + ": denied again at now + retry_after " + str(got));
        auto before = s;
        check(!p.apply(before, Nanos{static_cast<std::int64_t>(pass) - 1}, cost).allowed,
              where + ": admitted 1 ns before now + retry_after " + str(got));
      }
    }
    // At idle_at the state is as good as a fresh one.
    const Nanos idle = p.idle_at(s);
    if (idle != kNever) {
      check(idle >= Nanos{eff}, where + ": idle_at before the time of the decision");
      auto copy = s;
      auto fresh = p.init(idle);
      const Decision a = p.apply(copy, idle, b);
      const Decision f = p.apply(fresh, idle, b);
      check(a == f, where + ": at idle_at " + str(a) + ", a fresh key " + str(f));
    }
  }
  if (admitted.empty()) return;
  if constexpr (std::is_same_v<P, TokenBucket>) {
    verify::TokenBucketVerifier v(p.rate, p.burst);
    for (const auto& e : admitted) check(v.add(e).ok(), "verifier rejected an event");
    const auto r = v.report();
    check(r.holds(), absl::StrFormat("%s: token-bucket envelope exceeded by %d micro-units",
                                     describe(p), r.excess_micro()));
  } else {
    std::int64_t limit = p.limit;
    if constexpr (std::is_same_v<P, FixedWindow>) limit = 2 * p.limit;
    if constexpr (std::is_same_v<P, SlidingWindowEstimate>) limit = 2 * p.limit - 1;
    verify::WindowVerifier v(limit, p.window);
    for (const auto& e : admitted) check(v.add(e).ok(), "verifier rejected an event");
    const auto r = v.report();
    check(r.holds(), absl::StrFormat("%s: window envelope %d exceeded: peak %d", describe(p), limit,
                                     static_cast<std::int64_t>(r.peak)));
  }
}

}  // namespace detail_policy

// Runs one input; returns normally when every check holds, traps otherwise.
inline void check_policy_input(const std::uint8_t* data, std::size_t size) {
  using namespace detail_policy;
  Input in(data, size);
  switch (in.byte() % 4) {
    case 0: {
      const TokenBucket p = decode_token_bucket(in);
      testing::ExactTokenBucket model(p);
      run(p, model, in);
      break;
    }
    case 1: {
      const auto p = decode_window<FixedWindow>(in);
      testing::ExactWindowModel model(p);
      run(p, model, in);
      break;
    }
    case 2: {
      const auto p = decode_window<SlidingLog>(in);
      testing::ExactWindowModel model(p);
      run(p, model, in);
      break;
    }
    default: {
      const auto p = decode_window<SlidingWindowEstimate>(in);
      testing::ExactWindowModel model(p);
      run(p, model, in);
      break;
    }
  }
}

}  // namespace quota::fuzz
