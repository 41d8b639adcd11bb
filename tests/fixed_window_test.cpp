// Tests for quota/policy/fixed_window.hpp: validation, the exact semantics at the
// window boundaries (also for negative times), the documented 2N burst across a
// boundary, backwards time, and 1,000+ random traces against the brute-force model.
#include <chrono>
#include <cstdint>
#include <limits>

#include <catch2/catch.hpp>

#include "quota/policy/fixed_window.hpp"
#include "support/exact_windows.hpp"
#include "support/printers.hpp"
#include "support/seed.hpp"
#include "support/window_traces.hpp"

using namespace std::chrono_literals;
using quota::Decision;
using quota::FixedWindow;
using quota::kNever;
using quota::Nanos;
using quota::Reason;

namespace {
constexpr std::int64_t kYearNs = 365LL * 24 * 3600 * 1'000'000'000LL;
}

TEST_CASE("FixedWindow validate names the field and the bound") {
  CHECK(FixedWindow{.limit = 10, .window = 1s}.validate().ok());
  CHECK(FixedWindow{.limit = quota::kMaxUnits, .window = quota::kMaxWindow}.validate().ok());
  const auto limit0 = FixedWindow{.limit = 0, .window = 1s}.validate();
  CHECK(limit0.code() == absl::StatusCode::kInvalidArgument);
  CHECK_THAT(std::string(limit0.message()), Catch::Contains("limit"));
  CHECK_FALSE(FixedWindow{.limit = quota::kMaxUnits + 1, .window = 1s}.validate().ok());
  for (Nanos w : {Nanos{0}, Nanos{-1}, quota::kMaxWindow + Nanos{1}}) {
    const auto s = FixedWindow{.limit = 1, .window = w}.validate();
    CHECK_FALSE(s.ok());
    CHECK_THAT(std::string(s.message()), Catch::Contains("window"));
  }
}

TEST_CASE("FixedWindow admits the limit per aligned window and retries at the next start") {
  const FixedWindow fw{.limit = 3, .window = Nanos{100}};
  auto s = fw.init(Nanos{250});
  CHECK(fw.apply(s, Nanos{250}, 2) == Decision{true, 1, Nanos{0}, Nanos{50}, 0, Reason::kAllowed});
  CHECK(fw.apply(s, Nanos{260}, 1) == Decision{true, 0, Nanos{0}, Nanos{40}, 0, Reason::kAllowed});
  // Denied: the next window starts at 300.
  CHECK(fw.apply(s, Nanos{270}, 1) ==
        Decision{false, 0, Nanos{30}, Nanos{30}, 0, Reason::kOverLimit});
  // Tight: 1 ns before the boundary still denied; at the boundary admitted.
  CHECK_FALSE(fw.apply(s, Nanos{299}, 1).allowed);
  CHECK(fw.apply(s, Nanos{300}, 3) == Decision{true, 0, Nanos{0}, Nanos{100}, 0, Reason::kAllowed});
}

TEST_CASE("FixedWindow floors negative times to the window that contains them") {
  const FixedWindow fw{.limit = 1, .window = Nanos{10}};
  auto s = fw.init(Nanos{-10});
  REQUIRE(fw.apply(s, Nanos{-10}, 1).allowed);  // window [-10, 0)
  const Decision d = fw.apply(s, Nanos{-1}, 1);
  CHECK_FALSE(d.allowed);
  CHECK(d.retry_after == Nanos{1});  // next window starts at 0
  CHECK(fw.apply(s, Nanos{0}, 1).allowed);
  // -15 lies in [-20, -10): truncating division would put it in [-10, 0).
  auto t = fw.init(Nanos{-15});
  REQUIRE(fw.apply(t, Nanos{-15}, 1).allowed);
  CHECK(fw.apply(t, Nanos{-11}, 1).retry_after == Nanos{1});
  CHECK(fw.apply(t, Nanos{-10}, 1).allowed);
}

TEST_CASE("FixedWindow boundaries: e + W − 1, e + W, a jump of many windows, 10 years idle") {
  const FixedWindow fw{.limit = 2, .window = 1s};
  const std::int64_t e = 7 * 1'000'000'000LL;  // a window start
  auto s = fw.init(Nanos{e});
  REQUIRE(fw.apply(s, Nanos{e}, 2).allowed);
  CHECK(fw.apply(s, Nanos{e + 1'000'000'000 - 1}, 1) ==
        Decision{false, 0, Nanos{1}, Nanos{1}, 0, Reason::kOverLimit});
  CHECK(fw.apply(s, Nanos{e + 1'000'000'000}, 2).allowed);
  // A jump of a million windows lands mid-window: fresh count, reset at its end.
  const std::int64_t far = e + 1'000'000LL * 1'000'000'000 + 123;
  CHECK(fw.apply(s, Nanos{far}, 1) ==
        Decision{true, 1, Nanos{0}, Nanos{1'000'000'000 - 123}, 0, Reason::kAllowed});
  // Ten years idle.
  const std::int64_t later = far + 10 * kYearNs;
  CHECK(fw.apply(s, Nanos{later}, 2).allowed);
  CHECK(fw.idle_at(s) == Nanos{(later / 1'000'000'000 + 1) * 1'000'000'000});
}

TEST_CASE("FixedWindow lets 2N through within 2 ns across a window boundary (documented)") {
  // The price of a fixed window: N at the end of one window, N at the start of the next.
  const FixedWindow fw{.limit = 5, .window = 1s};
  quota::testing::ExactWindowModel model(fw);
  auto s = fw.init(Nanos{0});
  std::int64_t admitted = 0;
  for (std::int64_t t : {999'999'999LL, 1'000'000'000LL}) {
    for (int i = 0; i < 5; ++i) {
      const Decision d = fw.apply(s, Nanos{t}, 1);
      CHECK(d == model.apply(t, 1));
      admitted += d.allowed ? 1 : 0;
    }
  }
  CHECK(admitted == 2 * fw.limit);
  // All 2N fall within one sliding window of length W (here: (0, 1 s]).
  CHECK(model.in_sliding_window(1'000'000'000) == 2 * fw.limit);
}

TEST_CASE("FixedWindow cost outside [1, limit] never counts") {
  const FixedWindow fw{.limit = 4, .window = 1s};
  auto s = fw.init(Nanos{0});
  REQUIRE(fw.apply(s, Nanos{0}, 1).allowed);
  CHECK(fw.apply(s, Nanos{1}, 0) ==
        Decision{false, 3, kNever, Nanos{999'999'999}, 0, Reason::kInvalidCost});
  CHECK(fw.apply(s, Nanos{1}, -3).reason == Reason::kInvalidCost);
  CHECK(fw.apply(s, Nanos{1}, 5) ==
        Decision{false, 3, kNever, Nanos{999'999'999}, 0, Reason::kCostExceedsBurst});
  CHECK(fw.apply(s, Nanos{2}, 3).allowed);  // nothing was counted by the invalid ones
}

TEST_CASE("FixedWindow backwards time neither resets nor re-counts") {
  const FixedWindow fw{.limit = 2, .window = Nanos{100}};
  auto s = fw.init(Nanos{150});
  REQUIRE(fw.apply(s, Nanos{150}, 2).allowed);
  // An earlier window would be fresh; backwards time must not reach it.
  const Decision back = fw.apply(s, Nanos{50}, 1);
  CHECK_FALSE(back.allowed);
  CHECK(back.retry_after == Nanos{50});  // counted from the latest time seen, 150
  CHECK(s.last == 150);                  // not stored
  // Moving on, then back into the spent window, does not count it again.
  auto t = fw.init(Nanos{150});
  REQUIRE(fw.apply(t, Nanos{150}, 2).allowed);
  REQUIRE(fw.apply(t, Nanos{210}, 1).allowed);
  CHECK(fw.apply(t, Nanos{160}, 1) == Decision{true, 0, Nanos{0}, Nanos{90}, 0, Reason::kAllowed});
}

TEST_CASE("FixedWindow at the ends of the int64 timeline") {
  const FixedWindow fw{.limit = 1, .window = 1s};
  const std::int64_t max = std::numeric_limits<std::int64_t>::max();
  const std::int64_t min = std::numeric_limits<std::int64_t>::min();
  auto s = fw.init(Nanos{max});
  REQUIRE(fw.apply(s, Nanos{max}, 1).allowed);
  const Decision d = fw.apply(s, Nanos{max}, 1);
  CHECK_FALSE(d.allowed);
  CHECK(d.retry_after.count() > 0);
  CHECK(d.retry_after <= 1s);
  CHECK(fw.idle_at(s) == kNever);  // the next window starts past the end of time
  auto m = fw.init(Nanos{min});
  REQUIRE(fw.apply(m, Nanos{min}, 1).allowed);
  CHECK_FALSE(fw.apply(m, Nanos{min + 1}, 1).allowed);
}

TEST_CASE("FixedWindow agrees with the exact model on 1,000 random traces") {
  const std::uint64_t seed = quota::testing::test_seed(0xF1DE'0001);
  INFO("seed " << seed);
  quota::testing::compare_random_traces<FixedWindow>(seed * 1'000'003, 1'200, 150);
}

TEST_CASE("FixedWindow state from a larger limit (a rule change) reports remaining 0") {
  const FixedWindow big{.limit = 8, .window = Nanos{100}};
  const FixedWindow small{.limit = 4, .window = Nanos{100}};
  auto s = big.init(Nanos{0});
  REQUIRE(big.apply(s, Nanos{0}, 8).allowed);
  CHECK(small.apply(s, Nanos{10}, 1) ==
        Decision{false, 0, Nanos{90}, Nanos{90}, 0, Reason::kOverLimit});
  CHECK(small.apply(s, Nanos{100}, 4).allowed);
}
