// quota/verify/events.hpp — the admission log the envelope verifiers read.
//
// An AdmittedEvent is one admitted request; a Witness names the events where a
// verifier's peak was reached. envelope.hpp verifies logs of them; monitor.hpp records
// them online. Also here: the checks every verifier applies to an event, and the
// one-line formatting of micro-units and witnesses used in reports.
//
// Thread safety: values and pure functions.
//
//   std::vector<quota::verify::AdmittedEvent> log = {{.time_ns = 0, .cost = 20},
//                                                    {.time_ns = 10'000'000, .cost = 1}};
//   std::string s = quota::verify::format_micro(1'500'000);   // "1.500000"
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>

#include "absl/numeric/int128.h"
#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "quota/units.hpp"

namespace quota::verify {

// One admitted request: when (ns on the limiter's clock) and how many whole units, in
// [0, kMaxUnits]. Times must be non-decreasing; a log with a time that goes backwards, a
// negative cost or a cost above kMaxUnits is rejected with InvalidArgument naming the
// event index. Events with equal times are one instant: they all fall in every interval
// or window that contains it.
struct AdmittedEvent {
  std::int64_t time_ns = 0;
  std::int64_t cost = 0;

  friend constexpr bool operator==(const AdmittedEvent&, const AdmittedEvent&) = default;
};

// The interval or window where the peak was reached: events first..last (indices into
// the log as given, counting from 0, inclusive), their times and the cost they admitted
// together. When the log is empty, `empty` is true and the other fields are zero.
struct Witness {
  bool empty = true;
  std::size_t first = 0;
  std::size_t last = 0;
  std::int64_t first_time_ns = 0;
  std::int64_t last_time_ns = 0;
  absl::int128 admitted = 0;  // whole units, events first..last
  // Caller-chosen labels of events first and last (e.g. line numbers in a file): the
  // `tag` passed to a verifier's add(), or the event index when none was.
  std::uint64_t first_tag = 0;
  std::uint64_t last_tag = 0;
};

// Clamp of the scaled token-bucket peak (see "Saturation" on TokenBucketReport,
// envelope.hpp).
inline constexpr absl::int128 kScaledCap = absl::int128(1) << 120;

namespace detail {

// ceil(a / b) for b > 0 and any sign of a.
inline absl::int128 ceil_div_signed(absl::int128 a, absl::int128 b) {
  const absl::int128 q = a / b;  // truncates toward zero
  return (a % b != 0 && a > 0) ? q + 1 : q;
}

inline std::int64_t clamp_to_int64(absl::int128 v) {
  constexpr absl::int128 kMax = std::numeric_limits<std::int64_t>::max();
  constexpr absl::int128 kMin = std::numeric_limits<std::int64_t>::min();
  return static_cast<std::int64_t>(v > kMax ? kMax : (v < kMin ? kMin : v));
}

// ceil(scaled · 10^6 / per) clamped to int64, for |scaled| <= 2^121 and per > 0: the
// product itself could leave 128 bits, so whole periods and the remainder go separately.
inline std::int64_t scaled_to_micro_ceil(absl::int128 scaled, std::int64_t per) {
  const absl::int128 q = scaled / per;    // truncates toward zero
  const absl::int128 rem = scaled % per;  // same sign as scaled, |rem| < per < 2^63
  constexpr absl::int128 kLimit = absl::int128(std::numeric_limits<std::int64_t>::max());
  if (q > kLimit / kMicrosPerUnit) return std::numeric_limits<std::int64_t>::max();
  if (q < -kLimit / kMicrosPerUnit) return std::numeric_limits<std::int64_t>::min();
  return clamp_to_int64(q * kMicrosPerUnit + ceil_div_signed(rem * kMicrosPerUnit, per));
}

inline absl::Status check_event(std::size_t index, const AdmittedEvent& e, bool has_prev,
                                std::int64_t prev_time) {
  if (e.cost < 0 || e.cost > kMaxUnits) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "event %d: cost must be in [0, %d] units (got %d)", index, kMaxUnits, e.cost));
  }
  if (has_prev && e.time_ns < prev_time) {
    return absl::InvalidArgumentError(
        absl::StrFormat("event %d: time %d ns is earlier than the previous event's %d ns; "
                        "times must be non-decreasing",
                        index, e.time_ns, prev_time));
  }
  return absl::OkStatus();
}

}  // namespace detail

// One-line human summaries, e.g. for test output and the gateway simulator:
//   "holds: peak 20.5 units <= 20 + 0 (slack 0.000000 units); witness events 0..1 ..."
inline std::string format_micro(MicroUnits m) {
  const bool neg = m < 0;
  const absl::uint128 a = neg ? absl::uint128(-(absl::int128(m))) : absl::uint128(m);
  return absl::StrFormat("%s%d.%06d", neg ? "-" : "", a / kMicrosPerUnit,
                         static_cast<std::uint64_t>(a % kMicrosPerUnit));
}

inline std::string to_string(const Witness& w) {
  if (w.empty) return "no events";
  return absl::StrFormat("events %d..%d, t=%d..%d ns (%d ns), admitted %d units", w.first, w.last,
                         w.first_time_ns, w.last_time_ns,
                         absl::int128(w.last_time_ns) - w.first_time_ns, w.admitted);
}

}  // namespace quota::verify
