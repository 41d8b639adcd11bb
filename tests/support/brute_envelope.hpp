// tests/support/brute_envelope.hpp — quadratic reference answers for the envelope
// verifier (quota/verify/envelope.hpp).
//
// They enumerate every interval (or every window position) directly, with exact
// integers, and share no code with the O(n) verifier: agreement is evidence.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "absl/numeric/int128.h"
#include "quota/units.hpp"
#include "quota/verify/envelope.hpp"

namespace quota::testing {

// max over i <= j of (sum of costs of events i..j)·per − units·(t_j − t_i): the peak of
// A − r·T scaled by rate.per. 0 for an empty log (by the verifier's convention).
inline absl::int128 brute_token_bucket_peak_scaled(std::span<const verify::AdmittedEvent> events,
                                                   Rate rate) {
  absl::int128 best = 0;
  bool any = false;
  for (std::size_t i = 0; i < events.size(); ++i) {
    absl::int128 sum = 0;
    for (std::size_t j = i; j < events.size(); ++j) {
      sum += events[j].cost;
      const absl::int128 v = sum * rate.per.count() -
                             absl::int128(rate.units) * (events[j].time_ns - events[i].time_ns);
      if (!any || v > best) best = v;
      any = true;
    }
  }
  return best;
}

// max over every instant `now` of the cost of the events e with e <= now < e + W. The
// count is a step function that only rises at event times, so those instants suffice.
inline absl::int128 brute_window_peak(std::span<const verify::AdmittedEvent> events, Nanos window) {
  absl::int128 best = 0;
  for (const auto& at : events) {
    absl::int128 sum = 0;
    for (const auto& e : events) {
      if (e.time_ns <= at.time_ns &&
          absl::int128(at.time_ns) < absl::int128(e.time_ns) + window.count())
        sum += e.cost;
    }
    if (sum > best) best = sum;
  }
  return best;
}

}  // namespace quota::testing
