// The fair-share allocators' Prometheus lines (quota/gateway/fair_share/fair_metrics.hpp) read back
// from a Gateway's text exposition: one series per fair-share budget labelled by rule and
// budget key (no tenant), the level of use, active and constrained tenants, denials by
// reason (over_share, paused, request_too_large), allocations, and fallback periods when
// the asks exchange fails. Over Redis the fallback is also read in
// redis_gateway_fair_shared_test.cpp.
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_split.h"
#include "quota/gateway/fair_share/fair_metrics.hpp"
#include "quota/gateway/gateway.hpp"
#include "quota/store/local_store.hpp"
#include "support/gateway_rules.hpp"

using namespace std::chrono_literals;
using quota::Nanos;
using quota::TokenBucket;
using quota::gateway::FairShareSpec;
using quota::gateway::Level;
using quota::gateway::RuleSetSpec;

namespace {

// Route "call"; everyone shares rule "provider" (a bucket that never runs out here) with
// fair shares of 1,000 units per 1 s period (defaults: reserve 10 %, 70 %, 90 %).
RuleSetSpec metered_spec() {
  return quota::testing::fair_share_spec(
      "provider", FairShareSpec{.enabled = true, .period = 1s, .budget = 1'000});
}

// An exchange that never answers: every period falls back to the fixed part.
struct DownExchange final : quota::gateway::FairAsksExchange {
  absl::StatusOr<quota::gateway::FairAsksView> exchange(
      std::string_view, Nanos, std::int64_t, std::span<const std::pair<std::string, std::int64_t>>,
      std::int64_t) override {
    return absl::UnavailableError("exchange down");
  }
};

struct MeteredGateway {
  explicit MeteredGateway(quota::gateway::GatewayOptions o = {})
      : registry(quota::testing::build(metered_spec())), gw(store, registry, o) {}
  bool admits(const std::string& tenant, std::int64_t units, Nanos t) {
    auto r =
        gw.decide({.who = {.tenant = tenant, .plan = "free"}, .route = "call", .cost = units}, t);
    REQUIRE(r.ok());
    return r->decision.allowed;
  }
  // The sample lines of the exposition (no # HELP / # TYPE).
  std::vector<std::string> samples() const {
    std::vector<std::string> out;
    for (absl::string_view line :
         absl::StrSplit(quota::gateway::render_prometheus(gw.fair_shares()), '\n')) {
      if (!line.empty() && line[0] != '#') out.emplace_back(line);
    }
    return out;
  }
  quota::gateway::RuleRegistry registry;
  quota::LocalStore<quota::gateway::KeyPolicy> store;
  quota::gateway::Gateway gw;
};

constexpr const char* kLabels = "{rule=\"provider\",budget=\"{~global}call\"";

std::string line(const std::string& family, const std::string& value,
                 const std::string& extra = "") {
  return family + kLabels + extra + "} " + value;
}

}  // namespace

TEST_CASE("the fair-share allocator's state is in the Prometheus text, one series per budget") {
  MeteredGateway g;
  CHECK(quota::gateway::render_prometheus(g.gw.fair_shares()).find("quota_fair_share_") !=
        std::string::npos);  // HELP and TYPE lines even before any budget was asked
  CHECK(g.samples().empty());
  // Period 0: a alone takes 800; b asks 200 more: paused (1,000 > 900); a asks 1,001:
  // more than the budget.
  for (int i = 0; i < 8; ++i) CHECK(g.admits("a", 100, Nanos{0}));
  CHECK_FALSE(g.admits("b", 200, 1ms));
  CHECK_FALSE(g.admits("a", 1'001, 2ms));
  std::vector<std::string> s = g.samples();
  const std::vector<std::string> period0 = {
      line("quota_fair_share_budget_units", "1000"),
      line("quota_fair_share_units_in_use", "800"),
      line("quota_fair_share_use_ratio", "0.800000"),
      line("quota_fair_share_active_tenants", "2"),
      line("quota_fair_share_constrained_tenants", "0"),
      line("quota_fair_share_share_sum_units", "0"),
      line("quota_fair_share_capacity_units", "900"),
      line("quota_fair_share_reserve_units", "100"),
      line("quota_fair_share_denials_total", "0", ",reason=\"over_share\""),
      line("quota_fair_share_denials_total", "1", ",reason=\"paused\""),
      line("quota_fair_share_denials_total", "1", ",reason=\"request_too_large\""),
      line("quota_fair_share_allocations_total", "1"),
      line("quota_fair_share_fallback_periods_total", "0"),
      line("quota_fair_share_late_reports_total", "0"),
  };
  CHECK(s == period0);

  // Period 1: a's 800 have left; estimates 400 and 100, Σ 500 ≤ 700: free. Both ask
  // more, then period 2: estimates 200 + 450 and 50 + 450, both above their shares.
  for (int i = 0; i < 9; ++i) (void)g.admits("a", 100, 1s + Nanos{i});
  for (int i = 0; i < 9; ++i) (void)g.admits("b", 100, 1s + 10ms + Nanos{i});
  for (int i = 0; i < 6; ++i) (void)g.admits("a", 100, 2s + Nanos{i});
  const bool b_first = g.admits("b", 100, 2s + 10ms);
  CHECK(b_first);
  for (int i = 0; i < 6; ++i) (void)g.admits("b", 100, 2s + 11ms + Nanos{i});
  s = g.samples();
  const auto stats = g.gw.fair_shares();
  REQUIRE(stats.size() == 1);
  REQUIRE(stats[0].last.has_value());
  CHECK(stats[0].last->constrained == 2);
  CHECK(stats[0].over_share >= 1);
  CHECK(std::find(s.begin(), s.end(), line("quota_fair_share_constrained_tenants", "2")) !=
        s.end());
  CHECK(std::find(s.begin(), s.end(),
                  line("quota_fair_share_denials_total", std::to_string(stats[0].over_share),
                       ",reason=\"over_share\"")) != s.end());
  CHECK(std::find(s.begin(), s.end(), line("quota_fair_share_share_sum_units", "900")) != s.end());
  CHECK(std::find(s.begin(), s.end(),
                  line("quota_fair_share_units_in_use", std::to_string(stats[0].units_in_use))) !=
        s.end());
  CHECK(stats[0].units_in_use <= 900);
  CHECK(std::find(s.begin(), s.end(), line("quota_fair_share_allocations_total", "3")) != s.end());
  // Bounded: one series per family (three for denials), whatever the tenants.
  CHECK(s.size() == period0.size());
}

TEST_CASE("periods on the fixed part (the asks exchange down) are counted as fallback periods") {
  MeteredGateway g(
      {.fair_share_holders = 4, .fair_share_exchange = std::make_shared<DownExchange>()});
  for (int p = 0; p < 3; ++p) {
    std::int64_t got = 0;
    for (int i = 0; i < 5; ++i) got += g.admits("solo", 100, p * 1s + i * 1ms) ? 100 : 0;
    CHECK(got == 200);  // ⌊1,000 / 4⌋ = 250: two requests of 100
  }
  const std::vector<std::string> s = g.samples();
  CHECK(std::find(s.begin(), s.end(), line("quota_fair_share_fallback_periods_total", "3")) !=
        s.end());
  CHECK(std::find(s.begin(), s.end(), line("quota_fair_share_allocations_total", "3")) != s.end());
}
