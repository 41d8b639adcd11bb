// examples/quota_server/rules/failover_safety_rules.hpp — rule sets that --redis-failover-safety
// cannot decide, refused when they are loaded.
//
// Under failover safety the Redis store reads every bucket older than a failover as spent
// (docs/redis.md "Failover safety"); a sliding log has no such state (a log read as spent
// would need an event at the failover time in its list), so the store refuses a
// sliding_log level at every decision. check_failover_safety_rules() refuses such a rule
// set before it is in force instead: at start the server exits 2 with this message; on a
// hot reload of the file (rule_watcher.hpp) or a version published in Redis
// (rule_subscriber.hpp) the new set is refused like any invalid one and the rules in
// force stay. The message names the rule, its place in the text when the text is in
// quota's format (`file:line:column: rules[i].sliding_log`), and the option.
// envoyproxy/ratelimit files make token buckets or fixed windows only: always accepted.
//
// Thread safety: pure.
//
//   auto s = quota::server::check_failover_safety_rules(*rules, text, "rules.yaml");
//   // "rules.yaml:9:5: rules[1].sliding_log: rule \"audit-log\" is a sliding_log, which
//   //  --redis-failover-safety does not take; ..."
#pragma once

#include <string>
#include <string_view>
#include <variant>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "backend/checker.hpp"
#include "quota/gateway/rules/rules.hpp"
#include "quota/redis/gateway_store_setup.hpp"
#include "quota/rules/rule_parser.hpp"

namespace quota::server {

// OK unless `rules` (loaded from `text`, the rule file or published rules named `origin`)
// has a sliding_log rule; then InvalidArgument naming the one with the smallest name (the
// same rule on every run), at its place in `text` when the text can place it.
inline absl::Status check_failover_safety_rules(const LoadedRules& rules, std::string_view text,
                                                std::string_view origin) {
  if (rules.rules == nullptr) return absl::OkStatus();
  const gateway::Rule* refused = redis::refused_under_failover_safety(*rules.rules);
  if (refused == nullptr) return absl::OkStatus();
  const std::string what =
      absl::StrCat("rule \"", refused->name,
                   "\" is a sliding_log, which --redis-failover-safety does not take (after a "
                   "failover its log cannot be read as spent); use a token_bucket, "
                   "fixed_window or sliding_window_estimate, or turn failover safety off "
                   "(on by default) with --redis-failover-safety=false");
  auto parsed = quota::rules::detail::parse_with_source(text, origin);
  if (parsed.ok()) {
    for (std::size_t i = 0; i < parsed->spec.rules.size(); ++i) {
      const gateway::RuleSpec& r = parsed->spec.rules[i];
      if (r.name != refused->name || !std::holds_alternative<SlidingLog>(r.policy)) continue;
      const quota::rules::detail::EntrySource& entry = parsed->source.rules[i];
      const quota::rules::detail::Position* at = entry.find("sliding_log");
      return quota::rules::detail::located(origin, at != nullptr ? *at : entry.at,
                                           absl::StrCat("rules[", i, "].sliding_log"), what);
    }
  }
  return absl::InvalidArgumentError(absl::StrCat(std::string(origin), ": ", what));
}

}  // namespace quota::server
