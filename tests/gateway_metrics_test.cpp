// Tests for quota/gateway/metrics.hpp: per-rule counters, low cardinality, the callback
// interface and the Prometheus text rendering.
#include "quota/gateway/metrics.hpp"

#include <catch2/catch.hpp>
#include <chrono>
#include <mutex>
#include <string>
#include <vector>

#include "quota/gateway/gateway.hpp"
#include "quota/store/local_store.hpp"
#include "support/gateway_rules.hpp"

using namespace std::chrono_literals;
using quota::Nanos;
using quota::gateway::Gateway;
using quota::gateway::KeyPolicy;
using quota::gateway::Metrics;
using quota::gateway::Outcome;
using quota::gateway::RuleLabels;
using quota::gateway::RuleRegistry;
using quota::testing::build;

namespace {

struct Recorder : quota::gateway::MetricsSink {
  struct Event {
    RuleLabels labels;
    Outcome outcome;
    std::int64_t cost;
  };
  void on_outcome(const RuleLabels& labels, Outcome outcome, std::int64_t cost) override {
    std::lock_guard<std::mutex> lock(mu);
    events.push_back({labels, outcome, cost});
  }
  std::mutex mu;
  std::vector<Event> events;
};

}  // namespace

TEST_CASE("Prometheus text: one counter family, a stable order, exact lines") {
  Metrics metrics;
  RuleRegistry registry(build(quota::testing::basic_spec(1, 1, 5), &metrics));
  quota::LocalStore<KeyPolicy> store;
  Gateway gw(store, registry);
  const quota::gateway::Request read{.who = {.tenant = "acme", .plan = "free"}, .route = "read"};
  for (int i = 0; i < 7; ++i) REQUIRE(gw.decide(read, Nanos{0}).ok());
  const std::string expected =
      "# HELP quota_decisions_total Rate-limit decisions by rule, route class, budget level and "
      "outcome.\n"
      "# TYPE quota_decisions_total counter\n"
      "quota_decisions_total{rule=\"free\",route=\"create\",level=\"tenant\",outcome=\"allowed\"} "
      "0\n"
      "quota_decisions_total{rule=\"free\",route=\"create\",level=\"tenant\",outcome=\"denied\"} "
      "0\n"
      "quota_decisions_total{rule=\"free\",route=\"create\",level=\"tenant\",outcome="
      "\"unavailable\"} 0\n"
      "quota_decisions_total{rule=\"free\",route=\"create\",level=\"tenant\",outcome=\"fail_open_"
      "allowed\"} 0\n"
      "quota_decisions_total{rule=\"free\",route=\"create\",level=\"tenant\",outcome=\"shadow_"
      "would_deny\"} 0\n"
      "quota_decisions_total{rule=\"free\",route=\"read\",level=\"tenant\",outcome=\"allowed\"} "
      "5\n"
      "quota_decisions_total{rule=\"free\",route=\"read\",level=\"tenant\",outcome=\"denied\"} "
      "2\n"
      "quota_decisions_total{rule=\"free\",route=\"read\",level=\"tenant\",outcome="
      "\"unavailable\"} 0\n"
      "quota_decisions_total{rule=\"free\",route=\"read\",level=\"tenant\",outcome=\"fail_open_"
      "allowed\"} 0\n"
      "quota_decisions_total{rule=\"free\",route=\"read\",level=\"tenant\",outcome=\"shadow_"
      "would_deny\"} 0\n";
  CHECK(quota::gateway::render_prometheus(metrics) == expected);
}

TEST_CASE("cardinality: many tenants, one series per (rule, route, level)") {
  Metrics metrics;
  RuleRegistry registry(build(quota::testing::basic_spec(1), &metrics));
  quota::LocalStore<KeyPolicy> store;
  Gateway gw(store, registry);
  for (int i = 0; i < 500; ++i) {
    const std::string tenant = "tenant-" + std::to_string(i);
    const std::string attempt = "attempt-" + std::to_string(i);
    REQUIRE(
        gw.decide(
              {.who = {.tenant = tenant, .plan = "free"}, .route = "read", .attempt_id = attempt},
              Nanos{0})
            .ok());
  }
  CHECK(metrics.snapshot().size() == 2);  // free/read and free/create, tenant level
  const std::string text = quota::gateway::render_prometheus(metrics);
  CHECK(text.find("tenant-") == std::string::npos);
  CHECK(text.find("attempt-") == std::string::npos);
  // A reload that keeps the rule keeps counting into the same series.
  REQUIRE(registry.publish(build(quota::testing::basic_spec(2), &metrics)).ok());
  REQUIRE(gw.decide({.who = {.tenant = "x", .plan = "free"}, .route = "read"}, Nanos{0}).ok());
  CHECK(metrics.snapshot().size() == 2);
  for (const auto& c : metrics.snapshot()) {
    if (c->labels().route == "read") CHECK(c->count(Outcome::kAllowed) == 501);
  }
}

TEST_CASE("the sink sees every counted outcome with labels and cost") {
  Recorder recorder;
  Metrics metrics(&recorder);
  RuleRegistry registry(build(quota::testing::basic_spec(1, 1, 5), &metrics));
  quota::LocalStore<KeyPolicy> store;
  Gateway gw(store, registry);
  const quota::gateway::Request create{.who = {.tenant = "acme", .plan = "free"},
                                       .route = "create"};
  REQUIRE(gw.decide(create, Nanos{0})->decision.allowed);
  REQUIRE_FALSE(gw.decide(create, Nanos{0})->decision.allowed);
  REQUIRE(recorder.events.size() == 2);
  CHECK(recorder.events[0].labels ==
        RuleLabels{.rule = "free", .route = "create", .level = "tenant"});
  CHECK(recorder.events[0].outcome == Outcome::kAllowed);
  CHECK(recorder.events[0].cost == 5);
  CHECK(recorder.events[1].outcome == Outcome::kDenied);
}

TEST_CASE("label values are escaped and the series count is capped") {
  CHECK(quota::gateway::detail::prom_escape("a\"b\\c\nd") == "a\\\"b\\\\c\\nd");
  Metrics metrics;
  for (std::size_t i = 0; i < Metrics::kMaxSeries; ++i) {
    REQUIRE(metrics.counters({.rule = std::to_string(i), .route = "r", .level = "tenant"}).ok());
  }
  CHECK(metrics.counters({.rule = "one-more", .route = "r", .level = "tenant"}).status().code() ==
        absl::StatusCode::kResourceExhausted);
  // An existing series is still found.
  CHECK(metrics.counters({.rule = "7", .route = "r", .level = "tenant"}).ok());
}
