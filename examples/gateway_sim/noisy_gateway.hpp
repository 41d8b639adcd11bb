// noisy_gateway.hpp — the fair-share strategies of the noisy-neighbour scenario (noisy.hpp)
// through the Gateway: the global budget is a global rule with the `fair_share` option
// (quota/gateway/fair_share/fair_share_spec.hpp), so each request is asked of the gateway's
// allocator for its tenant first and then of the global bucket, exactly as a gateway
// author's rule file would have it. The allocator's budget is the global budget's tokens
// per lease period (`budget`), its period the lease period, its reserve, share and pause
// thresholds those of NoisyConfig::fair (pause at 100 % for fair-share, the default 90 %
// for fair-share-p90). Every tenant also has a tenant rule that never limits (the
// gateway requires one). Single-threaded and seeded, like the rest of the scenario.
//
//   auto run = gateway_sim::noisy::run_noisy_gateway(config, requests, fair_config, "fair-share");
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "quota/fair/fair_share_config.hpp"
#include "quota/gateway/gateway.hpp"
#include "quota/store/local_store.hpp"

namespace gateway_sim::noisy {

// The rule set: route "llm" costs the request's tokens; plan "free" has a tenant budget
// that never limits; everyone shares `global` with fair shares of `fair`.
inline quota::gateway::RuleSetSpec noisy_rules(quota::TokenBucket global,
                                               const quota::fair::FairShareConfig& fair,
                                               quota::Nanos period) {
  quota::gateway::RuleSetSpec s{.version = 1, .routes = {{.name = "llm", .cost = 1}}, .rules = {}};
  s.rules.push_back({.level = quota::gateway::Level::kTenant,
                     .plan = "free",
                     .route = "llm",
                     .name = "tenant",
                     .policy = quota::TokenBucket{.rate = {1'000'000'000, std::chrono::seconds(1)},
                                                  .burst = 1'000'000'000}});
  s.rules.push_back({.level = quota::gateway::Level::kGlobal,
                     .route = "llm",
                     .name = "global",
                     .policy = global,
                     .fair_share = {.enabled = true,
                                    .reserve_permille = fair.reserve_permille,
                                    .shares_above_permille = fair.share_permille,
                                    .pause_above_permille = fair.pause_permille,
                                    .period = period,
                                    .budget = fair.budget}});
  return s;
}

// Replays the stream through a Gateway with the fair_share rule (see the header comment).
template <class Run, class Request, class RefusalT>
Run run_noisy_gateway(const std::vector<Request>& reqs, quota::TokenBucket global,
                      const quota::fair::FairShareConfig& fair, quota::Nanos period,
                      const std::string& name) {
  Run out{name, {}, ""};
  auto rules = quota::gateway::RuleSet::create(noisy_rules(global, fair, period));
  if (!rules.ok()) {
    out.error = std::string(rules.status().message());
    return out;
  }
  quota::gateway::RuleRegistry registry(*rules);
  quota::LocalStore<quota::gateway::KeyPolicy> store;
  quota::gateway::Gateway gw(store, registry);
  for (const Request& r : reqs) {
    const std::string tenant = r.tenant == 0 ? "noisy" : "small-" + std::to_string(r.tenant);
    auto d =
        gw.decide({.who = {.tenant = tenant, .plan = "free"}, .route = "llm", .cost = r.tokens},
                  quota::Nanos{r.time_ns});
    if (!d.ok()) {
      out.error = std::string(d.status().message());
      return out;
    }
    switch (d->decision.reason) {
      case quota::Reason::kAllowed:
        out.refusal.push_back(RefusalT::kNone);
        break;
      case quota::Reason::kOverShare:
        out.refusal.push_back(RefusalT::kOverShare);
        break;
      case quota::Reason::kPaused:
        out.refusal.push_back(RefusalT::kPaused);
        break;
      case quota::Reason::kRequestTooLarge:
        out.refusal.push_back(RefusalT::kOverBudget);
        break;
      default:
        out.refusal.push_back(RefusalT::kGlobal);
        break;
    }
  }
  const auto stats = gw.fair_shares();
  if (stats.size() == 1) {
    out.allocations = stats[0].allocations;
    out.allocations_over = stats[0].allocation_errors +
                           (stats[0].max_share_sum > stats[0].config.share_capacity() ? 1 : 0);
    out.max_share_sum = stats[0].max_share_sum;
  }
  return out;
}

}  // namespace gateway_sim::noisy
