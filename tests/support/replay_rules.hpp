// tests/support/replay_rules.hpp — what the testing kit's tests share, whichever framework
// runs them (Catch2: testing_replay_test.cpp; GoogleTest: gtest/testing_gtest_test.cpp):
// one tenant rule of 10 units/s and a chosen burst, and a trace replayed through it into
// an EnvelopeBook.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <vector>

#include "quota/store/local_store.hpp"
#include "quota/testing/replay.hpp"

namespace quota::testing {

// free-read: plan free's reads, 10 units/s, burst `burst`; null if the set is refused.
inline std::shared_ptr<const gateway::RuleSet> burst_rules(std::int64_t burst) {
  using namespace std::chrono_literals;
  gateway::RuleSetSpec s;
  s.version = 1;
  s.routes = {{.name = "read"}};
  s.rules.push_back({.level = gateway::Level::kTenant,
                     .plan = "free",
                     .route = "read",
                     .name = "free-read",
                     .policy = TokenBucket{.rate = {10, 1s}, .burst = burst}});
  auto set = gateway::RuleSet::create(s);
  return set.ok() ? *set : nullptr;
}

// `trace` decided under `rules` on a fresh in-process store, every decision recorded in
// `book`; the requests admitted, or -1 when a call failed.
inline int replay_into(std::shared_ptr<const gateway::RuleSet> rules, EnvelopeBook& book,
                       const std::vector<TraceRequest>& trace) {
  LocalStore<gateway::KeyPolicy> store;
  gateway::RuleRegistry registry(rules);
  gateway::Gateway g(store, registry);
  int admitted = 0;
  bool failed = false;
  replay(g, trace, [&](const TraceRequest& r, const absl::StatusOr<gateway::Result>& d) {
    failed = failed || !d.ok() || !book.record(r, d).ok();
    admitted += d.ok() && d->decision.allowed ? 1 : 0;
  });
  return failed ? -1 : admitted;
}

}  // namespace quota::testing
