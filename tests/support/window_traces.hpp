// tests/support/window_traces.hpp — random traces for the window policies, compared
// decision by decision with the brute-force models of exact_windows.hpp.
//
// A trace draws a policy (limit 1..20, windows from 1 ns to a year), a start time
// anywhere from far negative to far positive, and steps that stress the boundaries:
// same instant, 1–3 ns, exactly W, W − 1, W + 1, a random fraction of W, a jump of many
// windows, and (one step in ten) time going backwards. Costs are mostly in [1, limit]
// with some 0, negative and limit + 1.
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "absl/numeric/int128.h"
#include "quota/units.hpp"
#include "support/exact_windows.hpp"
#include "support/printers.hpp"

namespace quota::testing {

template <class P>
P random_window_policy(std::mt19937_64& rng) {
  static const std::int64_t windows[] = {
      1, 2, 3, 7, 10, 1'000, 999'983, 1'000'000'000, 60'000'000'000, 31'536'000'000'000'000};
  P p;
  p.limit = std::uniform_int_distribution<std::int64_t>(1, 20)(rng);
  p.window = Nanos{windows[rng() % std::size(windows)]};
  return p;
}

inline std::int64_t clamp_time(absl::int128 t) {
  constexpr absl::int128 lo = std::numeric_limits<std::int64_t>::min();
  constexpr absl::int128 hi = std::numeric_limits<std::int64_t>::max();
  return static_cast<std::int64_t>(t < lo ? lo : (t > hi ? hi : t));
}

inline std::int64_t next_time(std::mt19937_64& rng, std::int64_t now, std::int64_t w) {
  const auto frac = [&](std::int64_t m) {
    return static_cast<std::int64_t>(rng() %
                                     static_cast<std::uint64_t>(std::max<std::int64_t>(m, 1)));
  };
  absl::int128 t = now;
  switch (rng() % 10) {
    case 0:
      break;
    case 1:
      t += 1 + frac(3);
      break;
    case 2:
      t += w;
      break;
    case 3:
      t += w - 1;
      break;
    case 4:
      t += w + 1;
      break;
    case 5:
    case 6:
      t += frac(w);
      break;
    case 7:
      t += absl::int128(w) * (2 + frac(1000)) + frac(w);
      break;
    case 8:
      t += frac(3 * w);
      break;
    default:
      t -= 1 + frac(2 * w);  // backwards
      break;
  }
  return clamp_time(t);
}

inline std::int64_t random_cost(std::mt19937_64& rng, std::int64_t limit) {
  switch (rng() % 20) {
    case 0:
      return 0;
    case 1:
      return limit + 1;
    case 2:
      return -static_cast<std::int64_t>(rng() % 5) - 1;
    default:
      // Mostly small costs so that windows fill with several events.
      return rng() % 3 == 0 ? std::uniform_int_distribution<std::int64_t>(1, limit)(rng)
                            : std::uniform_int_distribution<std::int64_t>(
                                  1, std::max<std::int64_t>(1, limit / 4))(rng);
  }
}

inline std::int64_t random_start(std::mt19937_64& rng) {
  switch (rng() % 5) {
    case 0:
      return 0;
    case 1:
      return -static_cast<std::int64_t>(rng() % 1'000'000'000'000'000'000ULL);
    case 2:
      return std::numeric_limits<std::int64_t>::min() + static_cast<std::int64_t>(rng() % 1000);
    default:
      return static_cast<std::int64_t>(rng() % 1'000'000'000'000'000'000ULL) -
             500'000'000'000'000'000;
  }
}

// Runs `traces` random traces of `steps` requests on policy type P, each compared with
// the exact model decision by decision. Every trace has its own printed seed.
template <class P>
void compare_random_traces(std::uint64_t base_seed, int traces, int steps) {
  for (int i = 0; i < traces; ++i) {
    const std::uint64_t seed = base_seed + static_cast<std::uint64_t>(i);
    std::mt19937_64 rng(seed);
    const P p = random_window_policy<P>(rng);
    REQUIRE(p.validate().ok());
    ExactWindowModel model(p);
    std::int64_t now = random_start(rng);
    auto state = p.init(Nanos{now});
    for (int j = 0; j < steps; ++j) {
      if (j > 0) now = next_time(rng, now, p.window.count());
      const std::int64_t cost = random_cost(rng, p.limit);
      const Decision got = p.apply(state, Nanos{now}, cost);
      const Decision want = model.apply(now, cost);
      if (got != want) {
        INFO("trace seed " << seed << " (base " << base_seed << ", trace " << i << "), step " << j
                           << ": limit=" << p.limit << " window=" << p.window.count()
                           << "ns now=" << now << " cost=" << cost);
        REQUIRE(got == want);
      }
    }
  }
}

}  // namespace quota::testing
