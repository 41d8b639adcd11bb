// quota/verify/envelope.hpp — exact envelope verification of admission logs.
//
// Given the events a limiter admitted, `(time_ns, cost)` in non-decreasing time order
// (events.hpp), these functions answer exactly, with integer arithmetic only, whether the
// log stays inside a policy's envelope, by how much it leaves it, and where:
// verify_token_bucket (over any interval of length T, admitted <= r·T + B + extra) and
// verify_window (at most `limit` in any window of length W). Nothing is rounded in the
// verdict; a violation of any size is never reported as 0. TokenBucketVerifier and
// WindowVerifier take the events one at a time (`add`) and can report at any point; the
// offline functions are loops over them, and EnvelopeMonitor (monitor.hpp) and the
// verify_log tool are built on them.
//
// Thread safety: the functions are pure; a verifier object needs external
// synchronization (EnvelopeMonitor provides it).
//
//   using namespace std::chrono_literals;
//   std::vector<quota::verify::AdmittedEvent> log = {{0, 20}, {10'000'000, 1}};
//   auto r = quota::verify::verify_token_bucket(log, {.units = 100, .per = 1s}, 20);
//   // r->holds() is true: 21 units in 10 ms <= 100/s · 10 ms + 20 = 21
//   auto w = quota::verify::verify_window(log, 20, 1s);   // w->holds() false: 21 > 20
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <limits>
#include <span>
#include <string>

#include "absl/numeric/int128.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_format.h"
#include "quota/units.hpp"
#include "quota/verify/events.hpp"

namespace quota::verify {

// The verdict on a log against the token-bucket envelope A(T) <= r·T + burst + extra.
//
// Exactness. The token-bucket peak is a rational number of units with denominator
// rate.per (in ns). It is carried exactly as an integer numerator over rate.per
// ("scaled units", absl::int128) through the recurrence
//     X_j = c_j·per + max(0, X_{j−1} − units·(t_j − t_{j−1})),
// so X_j / per is the largest A[i..j] − r·(t_j − t_i) over i <= j. Nothing is rounded.
// The report gives the excess both exactly (`excess_scaled` / per) and in micro-units
// rounded UP (`excess_micro()`), so a violation of any size, even 1/per of a micro-unit,
// is never reported as 0; `slack_micro()` = −excess_micro() is therefore rounded down.
// Saturation: the running numerator is clamped at kScaledCap (2^120); a log that reaches
// it violates every envelope a quota policy can express (burst·per < 2^107) by far, and
// the report says `saturated`.
//
// All "scaled" quantities are units multiplied by rate.per in ns (exact integers).
struct TokenBucketReport {
  Rate rate;
  std::int64_t burst = 0;
  std::int64_t extra = 0;
  std::size_t events = 0;
  // The largest A[i..j] − r·(t_j − t_i), scaled; 0 for an empty log.
  absl::int128 peak_scaled = 0;
  // peak − (burst + extra), scaled. <= 0 iff the envelope holds.
  absl::int128 excess_scaled = 0;
  bool saturated = false;  // the peak reached kScaledCap (a gross violation)
  Witness witness;         // where the peak was reached

  bool holds() const { return excess_scaled <= 0; }

  // The excess over r·T + B + extra in micro-units, rounded UP (a violation is never
  // hidden by rounding), clamped to int64. <= 0 iff the envelope holds.
  MicroUnits excess_micro() const {
    return detail::scaled_to_micro_ceil(excess_scaled, rate.per.count());
  }
  // How far below the envelope the log stays, in micro-units, rounded DOWN:
  // −excess_micro(). Negative when it is violated.
  MicroUnits slack_micro() const { return -excess_micro(); }
  // The peak A[i..j] − r·(t_j − t_i) in micro-units, rounded up.
  MicroUnits peak_micro() const {
    return detail::scaled_to_micro_ceil(peak_scaled, rate.per.count());
  }
  // The smallest whole-unit burst B' (with extra = 0) under which this log conforms to
  // (rate, B'): ceil(peak). Useful to state "this limiter behaved like burst B'".
  std::int64_t required_burst() const {
    return detail::clamp_to_int64(detail::ceil_div_signed(peak_scaled, rate.per.count()));
  }
};

// Streaming token-bucket verifier: O(1) state.
class TokenBucketVerifier {
 public:
  // Preconditions are checked by `check_params` (verify_token_bucket calls it); an
  // unchecked verifier with invalid parameters is undefined.
  TokenBucketVerifier(Rate rate, std::int64_t burst, std::int64_t extra = 0)
      : rate_(rate), burst_(burst), extra_(extra), per_(rate.per.count()), units_(rate.units) {}

  static absl::Status check_params(Rate rate, std::int64_t burst, std::int64_t extra) {
    if (auto s = validate_rate(rate, "rate"); !s.ok()) return s;
    if (burst < 0 || burst > kMaxUnits) {
      return absl::InvalidArgumentError(
          absl::StrFormat("burst must be in [0, %d] units (got %d)", kMaxUnits, burst));
    }
    if (extra < 0 || extra > kMaxUnits) {
      return absl::InvalidArgumentError(
          absl::StrFormat("extra must be in [0, %d] units (got %d)", kMaxUnits, extra));
    }
    return absl::OkStatus();
  }

  // Adds the next admitted event. InvalidArgument (and no change) if its time is before
  // the previous event's or its cost is outside [0, kMaxUnits]. `tag` labels the event in
  // the witness (default: its index).
  absl::Status add(const AdmittedEvent& e) { return add(e, count_); }
  absl::Status add(const AdmittedEvent& e, std::uint64_t tag) {
    if (auto s = detail::check_event(count_, e, count_ > 0, last_time_); !s.ok()) return s;
    const std::size_t index = count_++;
    // x − units·Δt, floored at 0: the best interval ending at the previous event, moved
    // forward to now; if nothing of it is left, the best interval starts here.
    absl::int128 carried = 0;
    if (index > 0) {
      const absl::int128 decay = absl::int128(units_) * (absl::int128(e.time_ns) - last_time_);
      carried = x_ - decay;
    }
    if (index == 0 || carried <= 0) {
      x_ = 0;
      run_first_ = index;
      run_first_time_ = e.time_ns;
      run_first_tag_ = tag;
      run_cost_ = 0;
    } else {
      x_ = carried;
    }
    x_ += absl::int128(e.cost) * per_;
    run_cost_ += e.cost;
    if (x_ >= kScaledCap) {
      x_ = kScaledCap;
      saturated_ = true;
    }
    last_time_ = e.time_ns;
    if (witness_.empty || x_ > peak_) {
      peak_ = x_;
      witness_ = Witness{.empty = false,
                         .first = run_first_,
                         .last = index,
                         .first_time_ns = run_first_time_,
                         .last_time_ns = e.time_ns,
                         .admitted = run_cost_,
                         .first_tag = run_first_tag_,
                         .last_tag = tag};
    }
    return absl::OkStatus();
  }

  TokenBucketReport report() const {
    TokenBucketReport r;
    r.rate = rate_;
    r.burst = burst_;
    r.extra = extra_;
    r.events = count_;
    r.peak_scaled = peak_;
    r.excess_scaled = peak_ - (absl::int128(burst_) + extra_) * per_;
    r.saturated = saturated_;
    r.witness = witness_;
    return r;
  }

  std::size_t events() const { return count_; }

 private:
  Rate rate_;
  std::int64_t burst_, extra_, per_, units_;
  std::size_t count_ = 0;
  std::int64_t last_time_ = 0;
  absl::int128 x_ = 0;  // scaled best A[i..j] − r·(t_j − t_i) ending at the last event
  std::size_t run_first_ = 0;
  std::int64_t run_first_time_ = 0;
  std::uint64_t run_first_tag_ = 0;
  absl::int128 run_cost_ = 0;  // units admitted from run_first_ to the last event
  absl::int128 peak_ = 0;
  bool saturated_ = false;
  Witness witness_;
};

// verify_token_bucket(events, rate, burst, extra)
//   the largest  A[i..j] − r·(t_j − t_i)  over all event index pairs i <= j, where
//   A[i..j] is the cost admitted by events i..j (the closed interval [t_i, t_j]);
//   the log conforms iff that peak <= burst + extra. This is exactly the guarantee of
//   quota::TokenBucket: over any interval of length T, admitted <= r·T + B. `extra`
//   is an allowance (leases, fail-open budgets: DESIGN §6) added to the burst.
//   Intervals are closed: the events at t_i count too. (A half-open (s, t] would
//   drop them and accept a bucket that admits one event too many.)
//   O(n) time, O(1) extra space.
//
// Verifies a whole log. InvalidArgument for invalid parameters (burst and extra in
// [0, kMaxUnits], a valid rate) or an invalid event (named by index).
inline absl::StatusOr<TokenBucketReport> verify_token_bucket(std::span<const AdmittedEvent> events,
                                                             Rate rate, std::int64_t burst,
                                                             std::int64_t extra = 0) {
  if (auto s = TokenBucketVerifier::check_params(rate, burst, extra); !s.ok()) return s;
  TokenBucketVerifier v(rate, burst, extra);
  for (const AdmittedEvent& e : events) {
    if (auto s = v.add(e); !s.ok()) return s;
  }
  return v.report();
}

// The verdict on a log against "at most `limit` units in any window of length W".
struct WindowReport {
  std::int64_t limit = 0;
  Nanos window{0};
  std::size_t events = 0;
  absl::int128 peak = 0;    // the largest cost admitted in one window, whole units
  absl::int128 excess = 0;  // peak − limit; <= 0 iff the envelope holds
  Witness witness;          // the events of that window

  bool holds() const { return excess <= 0; }
};

// Streaming window verifier: keeps the events of the last window (a deque).
class WindowVerifier {
 public:
  WindowVerifier(std::int64_t limit, Nanos window) : limit_(limit), window_(window) {}

  static absl::Status check_params(std::int64_t limit, Nanos window) {
    if (limit < 0 || limit > kMaxUnits) {
      return absl::InvalidArgumentError(
          absl::StrFormat("limit must be in [0, %d] units (got %d)", kMaxUnits, limit));
    }
    if (window.count() <= 0) {
      return absl::InvalidArgumentError(
          absl::StrFormat("window must be positive (got %d ns)", window.count()));
    }
    return absl::OkStatus();
  }

  // As TokenBucketVerifier::add.
  absl::Status add(const AdmittedEvent& e) { return add(e, count_); }
  absl::Status add(const AdmittedEvent& e, std::uint64_t tag) {
    if (auto s = detail::check_event(count_, e, count_ > 0, last_time_); !s.ok()) return s;
    const std::size_t index = count_++;
    last_time_ = e.time_ns;
    // An event at t_i no longer counts at now = t_j once t_j >= t_i + W. Differences in
    // 128 bits: times may span the whole int64 range.
    while (!live_.empty() &&
           absl::int128(e.time_ns) - live_.front().time_ns >= absl::int128(window_.count())) {
      sum_ -= live_.front().cost;
      live_.pop_front();
    }
    live_.push_back(Live{e.time_ns, e.cost, index, tag});
    sum_ += e.cost;
    if (witness_.empty || sum_ > peak_) {
      peak_ = sum_;
      witness_ = Witness{.empty = false,
                         .first = live_.front().index,
                         .last = index,
                         .first_time_ns = live_.front().time_ns,
                         .last_time_ns = e.time_ns,
                         .admitted = sum_,
                         .first_tag = live_.front().tag,
                         .last_tag = tag};
    }
    return absl::OkStatus();
  }

  WindowReport report() const {
    return WindowReport{.limit = limit_,
                        .window = window_,
                        .events = count_,
                        .peak = peak_,
                        .excess = peak_ - limit_,
                        .witness = witness_};
  }

  std::size_t events() const { return count_; }
  // Events currently held (those of the last window).
  std::size_t live_events() const { return live_.size(); }

 private:
  struct Live {
    std::int64_t time_ns;
    std::int64_t cost;
    std::size_t index;
    std::uint64_t tag;
  };
  std::int64_t limit_;
  Nanos window_;
  std::size_t count_ = 0;
  std::int64_t last_time_ = 0;
  std::deque<Live> live_;
  absl::int128 sum_ = 0;
  absl::int128 peak_ = 0;
  Witness witness_;
};

// verify_window(events, limit, window)
//   the largest cost admitted in any half-open window of length W, as the sliding
//   log counts it: an event at e counts at every now in [e, e + W); so the count at
//   now = t_j is the cost of the events with t_j − W < e <= t_j. The log conforms
//   iff that peak <= limit. O(n) time, O(events in one window) space.
//
// Verifies a whole log against (limit, window). InvalidArgument for limit outside
// [0, kMaxUnits], a non-positive window, or an invalid event (named by index).
inline absl::StatusOr<WindowReport> verify_window(std::span<const AdmittedEvent> events,
                                                  std::int64_t limit, Nanos window) {
  if (auto s = WindowVerifier::check_params(limit, window); !s.ok()) return s;
  WindowVerifier v(limit, window);
  for (const AdmittedEvent& e : events) {
    if (auto s = v.add(e); !s.ok()) return s;
  }
  return v.report();
}

inline std::string to_string(const TokenBucketReport& r) {
  return absl::StrFormat(
      "%s: peak A-rT %s units vs burst %d + extra %d (excess %s units, rounded up%s); %s",
      r.holds() ? "holds" : "VIOLATED", format_micro(r.peak_micro()), r.burst, r.extra,
      format_micro(r.excess_micro()), r.saturated ? ", saturated" : "", to_string(r.witness));
}

inline std::string to_string(const WindowReport& r) {
  return absl::StrFormat("%s: peak %d units in a %d ns window vs limit %d (excess %d); %s",
                         r.holds() ? "holds" : "VIOLATED", r.peak, r.window.count(), r.limit,
                         r.excess, to_string(r.witness));
}

}  // namespace quota::verify
