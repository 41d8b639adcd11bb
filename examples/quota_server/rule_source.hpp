// examples/quota_server/rule_source.hpp — the rule file quota-server decides with.
//
// load_server_rules() reads, parses and validates the YAML rule file
// (quota/rules/rule_file.hpp; schema in docs/gateway.md "Rule files") into a RuleSet whose
// rules count their decisions in `metrics` (served on /metrics). The whole file or
// nothing: an error names the file, line, column and field, and the server does not
// start. quota-server does not reload a running rule set (docs/service.md, "Not done").
//
// Thread safety: pure apart from `metrics` (thread-safe).
//
//   quota::gateway::Metrics metrics;
//   auto rules = quota::server::load_server_rules("rules.yaml", metrics);
//   if (!rules.ok()) { /* "rules.yaml:7:14: rules[1]...." */ }
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "quota/gateway/metrics.hpp"
#include "quota/gateway/rules.hpp"
#include "quota/rules/rule_file.hpp"

namespace quota::server {

// The RuleSet of the file at `path`, counting into `metrics` (which must outlive it).
inline absl::StatusOr<std::shared_ptr<const gateway::RuleSet>> load_server_rules(
    const std::string& path, gateway::Metrics& metrics) {
  return quota::rules::load_rule_file(path, &metrics);
}

}  // namespace quota::server
