// Tests for quota/clock.hpp.
#include <chrono>

#include <catch2/catch.hpp>

#include "quota/clock.hpp"

using namespace std::chrono_literals;

TEST_CASE("ManualClock is set, advanced and moved back by hand; copies share it", "[clock]") {
  quota::ManualClock clock;
  CHECK(clock.now() == quota::Nanos{0});
  quota::ManualClock copy = clock;
  clock.advance(1500ms);
  CHECK(copy.now() == 1500ms);
  copy.advance(-2s);
  CHECK(clock.now() == -500ms);
  clock.set(10s);
  CHECK(copy.now() == 10s);
}

TEST_CASE("SteadyClock does not go backwards", "[clock]") {
  quota::SteadyClock clock;
  quota::Nanos prev = clock.now();
  for (int i = 0; i < 10'000; ++i) {
    const quota::Nanos now = clock.now();
    REQUIRE(now >= prev);
    prev = now;
  }
}
