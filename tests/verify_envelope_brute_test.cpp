// Tests of quota/verify/envelope.hpp against quadratic brute force
// (support/brute_envelope.hpp) on random logs: the token-bucket and window verifiers'
// peaks, excesses and witnesses.
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <random>
#include <vector>

#include <catch2/catch.hpp>

#include "absl/numeric/int128.h"
#include "quota/verify/envelope.hpp"
#include "support/brute_envelope.hpp"
#include "support/seed.hpp"

using namespace std::chrono_literals;
using quota::Nanos;
using quota::Rate;
using quota::verify::AdmittedEvent;

namespace {

std::vector<AdmittedEvent> random_log(std::mt19937_64& rng, std::int64_t per) {
  std::vector<AdmittedEvent> log;
  const int n = static_cast<int>(rng() % 13);
  std::int64_t t = static_cast<std::int64_t>(rng() % 2000) - 1000;
  for (int i = 0; i < n; ++i) {
    switch (rng() % 4) {
      case 0:
        break;  // same instant
      case 1:
        t += static_cast<std::int64_t>(rng() % 4);
        break;
      case 2:
        t += static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(per / 2 + 2));
        break;
      default:
        t += static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(3 * per + 2));
    }
    log.push_back({t, static_cast<std::int64_t>(rng() % 11)});
  }
  return log;
}

// The independent check of a token-bucket witness: the interval it names really has
// the reported peak.
absl::int128 witness_value(const std::vector<AdmittedEvent>& log, const quota::verify::Witness& w,
                           Rate rate) {
  absl::int128 sum = 0;
  for (std::size_t k = w.first; k <= w.last; ++k) sum += log[k].cost;
  REQUIRE(sum == w.admitted);
  REQUIRE(w.first_time_ns == log[w.first].time_ns);
  REQUIRE(w.last_time_ns == log[w.last].time_ns);
  return sum * rate.per.count() - absl::int128(rate.units) * (w.last_time_ns - w.first_time_ns);
}

}  // namespace

TEST_CASE("token-bucket verifier equals brute force over all intervals on random logs",
          "[verify][property]") {
  const auto seed = quota::testing::test_seed(4001);
  std::mt19937_64 rng(seed);
  INFO("seed " << seed);
  static const std::int64_t periods[] = {1, 3, 7, 1'000, 1'000'000'000, 60'000'000'000};
  int violated = 0, held = 0;
  for (int trial = 0; trial < 12'000; ++trial) {
    const Rate rate{.units = static_cast<std::int64_t>(rng() % 30),
                    .per = Nanos{periods[rng() % std::size(periods)]}};
    const std::int64_t burst = static_cast<std::int64_t>(rng() % 25);
    const std::int64_t extra = static_cast<std::int64_t>(rng() % 4);
    const auto log = random_log(rng, rate.per.count());
    INFO("trial " << trial << " rate " << rate.units << "/" << rate.per.count() << "ns burst "
                  << burst << " extra " << extra << " events " << log.size());
    const auto r = quota::verify::verify_token_bucket(log, rate, burst, extra);
    REQUIRE(r.ok());
    const absl::int128 per = rate.per.count();
    const absl::int128 want = quota::testing::brute_token_bucket_peak_scaled(log, rate);
    REQUIRE(r->peak_scaled == want);
    REQUIRE(r->excess_scaled == want - (absl::int128(burst) + extra) * per);
    REQUIRE(r->holds() == (want <= (absl::int128(burst) + extra) * per));
    REQUIRE(r->events == log.size());
    // excess_micro is the least integer m with m·per >= excess·10^6 (rounded up).
    const absl::int128 m = r->excess_micro();
    REQUIRE(m * per >= r->excess_scaled * quota::kMicrosPerUnit);
    REQUIRE((m - 1) * per < r->excess_scaled * quota::kMicrosPerUnit);
    REQUIRE(r->slack_micro() == -r->excess_micro());
    // The smallest burst that makes the log conform.
    const absl::int128 b = r->required_burst();
    REQUIRE(want <= b * per);
    if (!log.empty()) REQUIRE(want > (b - 1) * per);
    if (log.empty()) {
      REQUIRE(r->witness.empty);
    } else {
      REQUIRE_FALSE(r->witness.empty);
      REQUIRE(witness_value(log, r->witness, rate) == want);
      // Without explicit tags the witness is labelled with event indices.
      REQUIRE(r->witness.first_tag == r->witness.first);
      REQUIRE(r->witness.last_tag == r->witness.last);
    }
    (r->holds() ? held : violated)++;
  }
  // The generator covers both verdicts in bulk.
  REQUIRE(violated > 1000);
  REQUIRE(held > 1000);
}

TEST_CASE("window verifier equals brute force over all window positions on random logs",
          "[verify][property]") {
  const auto seed = quota::testing::test_seed(4002);
  std::mt19937_64 rng(seed);
  INFO("seed " << seed);
  int violated = 0, held = 0;
  for (int trial = 0; trial < 12'000; ++trial) {
    const Nanos window{static_cast<std::int64_t>(rng() % 40) + 1};
    const std::int64_t limit = static_cast<std::int64_t>(rng() % 30);
    const auto log = random_log(rng, window.count());
    INFO("trial " << trial << " limit " << limit << " window " << window.count() << "ns events "
                  << log.size());
    const auto r = quota::verify::verify_window(log, limit, window);
    REQUIRE(r.ok());
    const absl::int128 want = quota::testing::brute_window_peak(log, window);
    REQUIRE(r->peak == want);
    REQUIRE(r->excess == want - limit);
    REQUIRE(r->holds() == (want <= limit));
    if (!log.empty()) {
      const auto& w = r->witness;
      REQUIRE_FALSE(w.empty);
      absl::int128 sum = 0;
      for (std::size_t k = w.first; k <= w.last; ++k) sum += log[k].cost;
      REQUIRE(sum == want);
      REQUIRE(w.admitted == want);
      // All the witness's events count together at now = t_last.
      REQUIRE(w.last_time_ns - w.first_time_ns < window.count());
    }
    (r->holds() ? held : violated)++;
  }
  REQUIRE(violated > 1000);
  REQUIRE(held > 1000);
}
