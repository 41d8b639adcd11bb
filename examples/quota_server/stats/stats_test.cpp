// quota_server_stats_test — the heavy-hitters sketch's guarantee and the decision metrics,
// in process (no server, no Redis).
//
// HeavyHitters (K counters) over a skewed stream of weighted adds: every tenant with more
// than N/K of the units is listed, every listed count is at least the true units and at
// most N/K above them, and the counts sum to N. The stream is random with a fixed seed,
// printed. DecisionStats: the histogram's buckets are cumulative and count every call,
// near-limit counts an admission under 10 % of the capacity only, and Redis errors are
// counted by the kind the transport marks them with (never by their message).
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdint>
#include <map>
#include <random>
#include <string>

#include "absl/status/status.h"
#include "quota/redis/transport/breaker.hpp"
#include "quota/redis/transport/deadline.hpp"
#include "quota/redis/transport/error_kind.hpp"
#include "stats/decision_stats.hpp"
#include "stats/heavy_hitters.hpp"

using quota::server::DecisionStats;
using quota::server::HeavyHitters;
using quota::server::RedisErrorKind;

TEST_CASE("heavy hitters: heavy tenants listed, counts over by at most N/K") {
  constexpr std::uint32_t kSeed = 20261202;
  INFO("seed " << kSeed);
  for (std::size_t k : {1u, 5u, 20u}) {
    std::mt19937 rng(kSeed + static_cast<std::uint32_t>(k));
    HeavyHitters sketch(k);
    std::map<std::string, std::uint64_t> truth;
    std::uint64_t n = 0;
    // Three heavy tenants (each ~ 1/6 .. 1/4 of the units) among 2000 light ones.
    std::uniform_int_distribution<int> pick(0, 99), light(0, 1999), units(1, 5);
    for (int i = 0; i < 50'000; ++i) {
      const int p = pick(rng);
      const std::string t = p < 25   ? "heavy-a"
                            : p < 45 ? "heavy-b"
                            : p < 62 ? "heavy-c"
                                     : "light-" + std::to_string(light(rng));
      const auto u = static_cast<std::uint64_t>(units(rng));
      sketch.add(t, u);
      truth[t] += u;
      n += u;
    }
    INFO("k " << k << ", N " << n);
    REQUIRE(sketch.total() == n);
    const auto top = sketch.top();
    REQUIRE(top.size() <= k);
    std::uint64_t sum = 0;
    for (const auto& e : top) {
      sum += e.count;
      INFO("tenant " << e.key << " count " << e.count << " true " << truth[e.key]);
      CHECK(e.count >= truth[e.key]);
      CHECK(e.count - truth[e.key] <= n / k);
      CHECK(e.error <= n / k);
    }
    CHECK(sum == n);
    for (const auto& [tenant, units_of] : truth) {
      if (units_of * k <= n) continue;  // not above N/K
      bool listed = false;
      for (const auto& e : top) listed = listed || e.key == tenant;
      INFO("tenant " << tenant << " has " << units_of << " of " << n);
      CHECK(listed);
    }
    // Sorted: the largest count first.
    for (std::size_t i = 1; i < top.size(); ++i) CHECK(top[i - 1].count >= top[i].count);
  }
}

TEST_CASE("heavy hitters: fewer tenants than counters are counted exactly") {
  HeavyHitters sketch(20);
  for (int i = 0; i < 10; ++i)
    sketch.add("t" + std::to_string(i), static_cast<std::uint64_t>(i + 1));
  sketch.add("t9", 5);
  sketch.add("t0", 0);  // nothing
  const auto top = sketch.top();
  REQUIRE(top.size() == 10);
  CHECK(top[0].key == "t9");
  CHECK(top[0].count == 15);
  CHECK(top[0].error == 0);
  CHECK(top.back().key == "t0");
  CHECK(top.back().count == 1);
}

TEST_CASE("heavy hitters: a listed tenant's denied units, exact since it took its counter") {
  HeavyHitters sketch(2);
  sketch.add("a", 10, 4);
  sketch.add("b", 6, 0);
  sketch.add("a", 5, 5);
  sketch.add("b", 3, 9);  // never more denied than asked for
  auto top = sketch.top();
  REQUIRE(top.size() == 2);
  CHECK((top[0].key == "a" && top[0].count == 15 && top[0].denied == 9));
  CHECK((top[1].key == "b" && top[1].count == 9 && top[1].denied == 3));
  // c takes b's counter (the smallest): its count carries b's as error, its denied only
  // its own.
  sketch.add("c", 1, 1);
  top = sketch.top();
  REQUIRE(top.size() == 2);
  CHECK((top[1].key == "c" && top[1].count == 10 && top[1].error == 9 && top[1].denied == 1));
}

TEST_CASE("decision stats: histogram, near-limit, Redis error kinds") {
  DecisionStats d;
  d.observe_latency(std::chrono::microseconds(5));    // le 1e-05
  d.observe_latency(std::chrono::microseconds(300));  // le 0.0005
  d.observe_latency(std::chrono::seconds(1));         // +Inf only
  const std::string text = d.render();
  CHECK(text.find("# TYPE quota_decision_duration_seconds histogram") != std::string::npos);
  CHECK(text.find("quota_decision_duration_seconds_bucket{le=\"1e-05\"} 1\n") != std::string::npos);
  CHECK(text.find("quota_decision_duration_seconds_bucket{le=\"0.00025\"} 1\n") !=
        std::string::npos);
  CHECK(text.find("quota_decision_duration_seconds_bucket{le=\"0.0005\"} 2\n") !=
        std::string::npos);
  CHECK(text.find("quota_decision_duration_seconds_bucket{le=\"0.1\"} 2\n") != std::string::npos);
  CHECK(text.find("quota_decision_duration_seconds_bucket{le=\"+Inf\"} 3\n") != std::string::npos);
  CHECK(text.find("quota_decision_duration_seconds_count 3\n") != std::string::npos);

  // capacity 100: remaining 9 is near (90 < 100), 10 is not; a denial never counts.
  d.observe_decision("r", 10, 100, true);
  CHECK(d.near_limit("r") == 0);
  d.observe_decision("r", 9, 100, true);
  d.observe_decision("r", 0, 100, true);
  d.observe_decision("r", 0, 100, false);
  CHECK(d.near_limit("r") == 2);
  // capacity 5: only remaining 0 is under 0.5.
  d.observe_decision("s", 1, 5, true);
  d.observe_decision("s", 0, 5, true);
  CHECK(d.near_limit("s") == 1);
  CHECK(d.render().find("quota_near_limit_total{rule=\"r\"} 2\n") != std::string::npos);

  // The kinds as the transport makes them: the deadline's error, the in-flight guard's
  // refusal, a marked status; a status's message is never read.
  using K = RedisErrorKind;
  quota::redis::InFlightGuard guard(1);
  auto held = guard.enter();
  REQUIRE(held.ok());
  const std::pair<absl::Status, K> cases[] = {
      {absl::UnauthenticatedError("redis 127.0.0.1:1: authentication failed"), K::kUnauthenticated},
      {quota::redis::with_kind(absl::UnavailableError("the pool's breaker"), K::kBreakerOpen),
       K::kBreakerOpen},
      {guard.enter().status(), K::kInFlight},
      {quota::redis::Deadline::after(std::chrono::microseconds(1))
           .error("read", "127.0.0.1:1", "reading"),
       K::kDeadline},
      {absl::UnavailableError("redis connect to 127.0.0.1:1: Connection refused"), K::kUnavailable},
      // Words of another kind in the message do not make it that kind.
      {absl::UnavailableError("redis 127.0.0.1:1: circuit breaker open (a quoted message)"),
       K::kUnavailable},
      {absl::FailedPreconditionError("maxmemory-policy allkeys-lru evicts keys"), K::kOther}};
  for (const auto& [status, kind] : cases) {
    INFO(status.ToString());
    CHECK(quota::redis::error_kind(status) == kind);
    const auto before = d.redis_errors(kind);
    d.count_redis_error(status);
    CHECK(d.redis_errors(kind) == before + 1);
  }
  // Context added to a message keeps the kind.
  CHECK(quota::redis::error_kind(quota::redis::with_message(
            quota::redis::with_kind(absl::UnavailableError("x"), K::kDeadline), "sentinel: x")) ==
        K::kDeadline);
  CHECK(d.render().find("quota_redis_errors_total{kind=\"breaker_open\"} 1\n") !=
        std::string::npos);

  d.observe_tenant("a\"b", 3, /*allowed=*/true);
  d.observe_tenant("a\"b", 2, /*allowed=*/false);
  CHECK(d.render().find("quota_top_tenant_units{rank=\"1\",tenant=\"a\\\"b\"} 5\n") !=
        std::string::npos);
  CHECK(d.render().find("quota_top_tenant_denied_units{rank=\"1\",tenant=\"a\\\"b\"} 2\n") !=
        std::string::npos);
  // No capacity said yet: no used-ratio series for the tenant.
  CHECK(d.render().find("quota_top_tenant_budget_used_ratio{") == std::string::npos);
  // 3 of 4 units left: a quarter in use; a negative remaining (a debt) counts as none left.
  d.observe_tenant("a\"b", 1, true, /*remaining=*/3, /*capacity=*/4);
  CHECK(d.render().find(
            "quota_top_tenant_budget_used_ratio{rank=\"1\",tenant=\"a\\\"b\"} 0.250000\n") !=
        std::string::npos);
  d.observe_tenant("a\"b", 1, false, /*remaining=*/-7, /*capacity=*/3);
  CHECK(d.render().find(
            "quota_top_tenant_budget_used_ratio{rank=\"1\",tenant=\"a\\\"b\"} 1.000000\n") !=
        std::string::npos);
  d.observe_tenant("a\"b", 1, true, /*remaining=*/1, /*capacity=*/3);
  CHECK(d.render().find(
            "quota_top_tenant_budget_used_ratio{rank=\"1\",tenant=\"a\\\"b\"} 0.666666\n") !=
        std::string::npos);
}
