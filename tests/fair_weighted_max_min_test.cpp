// Tests of quota/fair/weighted_max_min.hpp: exact equality with an independent model (every
// subset of satisfied tenants tried, the one consistent with the water level kept) on
// small random inputs; the integer max-min property; the bounds; the errors.
#include <cstddef>
#include <cstdint>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "absl/numeric/int128.h"
#include "quota/fair/weighted_max_min.hpp"
#include "support/seed.hpp"

using quota::fair::kMaxWeight;
using quota::fair::weighted_max_min;
using Units = std::vector<std::int64_t>;

namespace {

// The model: the real-valued level λ = R / W is the one for which the satisfied set S
// (demand_i ≤ w_i·λ) is exactly the subset tried. Found by trying every subset, then
// rounded by the stated rule (floor, then one unit each to the largest remainders,
// ties by index) with a selection by repeated maximum rather than a sort.
Units model(std::int64_t capacity, const Units& d, const Units& w) {
  const std::size_t n = d.size();
  absl::int128 total = 0;
  for (std::int64_t x : d) total += x;
  if (total <= capacity) return d;
  for (std::uint32_t mask = 0; mask < (1u << n); ++mask) {
    absl::int128 r = capacity;
    absl::int128 weight = 0;
    for (std::size_t i = 0; i < n; ++i) {
      if (mask & (1u << i)) {
        r -= d[i];
      } else {
        weight += w[i];
      }
    }
    if (r < 0 || weight == 0) continue;
    bool consistent = true;
    for (std::size_t i = 0; i < n; ++i) {
      const bool satisfied = absl::int128(d[i]) * weight <= r * w[i];
      if (satisfied != ((mask & (1u << i)) != 0)) consistent = false;
    }
    if (!consistent) continue;
    Units out(n, 0);
    std::vector<absl::int128> rem(n, -1);
    absl::int128 left = r;
    for (std::size_t i = 0; i < n; ++i) {
      if (mask & (1u << i)) {
        out[i] = d[i];
      } else {
        out[i] = static_cast<std::int64_t>(r * w[i] / weight);
        rem[i] = r * w[i] % weight;
        left -= out[i];
      }
    }
    for (; left > 0; --left) {
      std::size_t best = n;
      for (std::size_t i = 0; i < n; ++i) {
        if (rem[i] >= 0 && (best == n || rem[i] > rem[best])) best = i;
      }
      ++out[best];
      rem[best] = -1;
    }
    return out;
  }
  FAIL("no consistent satisfied set");
  return {};
}

// The properties every allocation must have, checked without the model.
void check_properties(std::int64_t capacity, const Units& d, const Units& w, const Units& s) {
  REQUIRE(s.size() == d.size());
  absl::int128 demand_sum = 0, share_sum = 0;
  for (std::size_t i = 0; i < d.size(); ++i) {
    REQUIRE(s[i] >= 0);
    REQUIRE(s[i] <= d[i]);
    demand_sum += d[i];
    share_sum += s[i];
  }
  // Never more than the capacity, and nothing wasted while a demand is unmet.
  REQUIRE(share_sum == std::min(absl::int128(capacity), demand_sum));
  // Integer max-min: an unsatisfied tenant i could not gain a unit by taking it from
  // anyone j: (s_j − 1) / w_j < (s_i + 1) / w_i.
  for (std::size_t i = 0; i < d.size(); ++i) {
    if (s[i] == d[i]) continue;
    for (std::size_t j = 0; j < d.size(); ++j) {
      INFO("i=" << i << " j=" << j);
      REQUIRE(absl::int128(s[j] - 1) * w[i] < absl::int128(s[i] + 1) * w[j]);
    }
  }
}

}  // namespace

TEST_CASE("weighted_max_min: the documented example", "[fair]") {
  const Units d{10, 500, 500}, w{1, 1, 2};
  auto s = weighted_max_min(300, d, w);
  REQUIRE(s.ok());
  CHECK(*s == Units{10, 97, 193});
  CHECK(*s == model(300, d, w));
}

TEST_CASE("weighted_max_min: equals the subset model on small random inputs", "[fair]") {
  std::mt19937_64 rng(quota::testing::test_seed(2201));
  for (int iter = 0; iter < 20'000; ++iter) {
    const std::size_t n = rng() % 8;
    const std::int64_t scale = (iter % 3 == 0) ? 4 : 1000;
    Units d(n), w(n);
    for (std::size_t i = 0; i < n; ++i) {
      d[i] = static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(scale + 1));
      w[i] = 1 + static_cast<std::int64_t>(rng() % (iter % 2 == 0 ? 3 : 50));
    }
    const auto capacity = static_cast<std::int64_t>(
        rng() % static_cast<std::uint64_t>(scale * static_cast<std::int64_t>(n) + 2));
    INFO("iteration " << iter << " capacity " << capacity);
    auto s = weighted_max_min(capacity, d, w);
    REQUIRE(s.ok());
    REQUIRE(*s == model(capacity, d, w));
    check_properties(capacity, d, w, *s);
  }
}

TEST_CASE("weighted_max_min: ties go to the lower index", "[fair]") {
  // 10 units among three equal tenants: 3 each and one left, for tenant 0.
  auto s = weighted_max_min(10, Units{100, 100, 100}, Units{1, 1, 1});
  REQUIRE(s.ok());
  CHECK(*s == Units{4, 3, 3});
  // Equal remainders with unequal weights: 5 units at weights 2, 2, 1 → 2, 2, 1 exactly.
  s = weighted_max_min(5, Units{9, 9, 9}, Units{2, 2, 1});
  REQUIRE(s.ok());
  CHECK(*s == Units{2, 2, 1});
}

TEST_CASE("weighted_max_min: edges", "[fair]") {
  CHECK(weighted_max_min(0, Units{5, 6}, Units{1, 1}).value() == Units{0, 0});
  CHECK(weighted_max_min(7, Units{}, Units{}).value().empty());
  CHECK(weighted_max_min(100, Units{5, 6}, Units{1, 9}).value() == Units{5, 6});
  CHECK(weighted_max_min(100, Units{0, 0}, Units{1, 1}).value() == Units{0, 0});
  // A lone tenant may take all of the capacity.
  CHECK(weighted_max_min(100, Units{1'000}, Units{3}).value() == Units{100});
}

TEST_CASE("weighted_max_min: extreme values stay exact", "[fair]") {
  constexpr std::int64_t kMax = std::numeric_limits<std::int64_t>::max();
  const Units d{kMax, kMax, kMax, 1}, w{kMaxWeight, 1, kMaxWeight - 1, kMaxWeight};
  auto s = weighted_max_min(kMax, d, w);
  REQUIRE(s.ok());
  check_properties(kMax, d, w, *s);
  CHECK(*s == model(kMax, d, w));
}

TEST_CASE("weighted_max_min: many tenants", "[fair]") {
  std::mt19937_64 rng(quota::testing::test_seed(2202));
  const std::size_t n = 100'000;
  Units d(n), w(n);
  for (std::size_t i = 0; i < n; ++i) {
    d[i] = static_cast<std::int64_t>(rng() % 10'000);
    w[i] = 1 + static_cast<std::int64_t>(rng() % 8);
  }
  auto s = weighted_max_min(4'000'000, d, w);
  REQUIRE(s.ok());
  absl::int128 sum = 0;
  for (std::size_t i = 0; i < n; ++i) {
    REQUIRE((*s)[i] <= d[i]);
    sum += (*s)[i];
  }
  const absl::int128 demand = std::accumulate(d.begin(), d.end(), absl::int128(0));
  CHECK(sum == std::min(absl::int128(4'000'000), demand));
}

TEST_CASE("weighted_max_min: invalid input names the field", "[fair]") {
  auto message = [](const absl::StatusOr<Units>& s) {
    REQUIRE(s.status().code() == absl::StatusCode::kInvalidArgument);
    return std::string(s.status().message());
  };
  CHECK_THAT(message(weighted_max_min(5, Units{1}, Units{1, 1})),
             Catch::Contains("1 demands but 2 weights"));
  CHECK_THAT(message(weighted_max_min(-1, Units{1}, Units{1})), Catch::Contains("capacity"));
  CHECK_THAT(message(weighted_max_min(5, Units{1, -2}, Units{1, 1})),
             Catch::Contains("demands[1]"));
  CHECK_THAT(message(weighted_max_min(5, Units{1, 2}, Units{0, 1})), Catch::Contains("weights[0]"));
  CHECK_THAT(message(weighted_max_min(5, Units{1}, Units{kMaxWeight + 1})),
             Catch::Contains("weights[0]"));
}
