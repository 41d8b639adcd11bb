// examples/quota_server/rules/rule_source.hpp — the rule file quota-server decides with.
//
// read_rule_text() reads the file; build_server_rules() parses and validates its text
// into LoadedRules: in quota's format (quota/rules/rule_file.hpp; schema in
// docs/gateway/rules.md "Rule files"), a RuleSet whose rules count their decisions in `metrics`
// (served on /metrics); in envoyproxy/ratelimit's (envoy_rules.hpp), an EnvoyRules. The
// format is --rules-format's, or with `auto` the file's shape (a top-level `domain` or
// `descriptors`: envoyproxy/ratelimit's), decided at start. Either is built as the successor
// of the version in force (0 at start: the file's `version:`, else 1; on a reload the
// file's `version:` must be greater, else it gets the version in force + 1). The whole
// file or nothing: an error names the file, line, column and field. At start an error
// stops the server; on a hot reload (rule_watcher.hpp) the rules in force stay.
//
// Thread safety: pure apart from `metrics` (thread-safe).
//
//   quota::gateway::Metrics metrics;
//   auto text = quota::server::read_rule_text("rules.yaml");
//   auto rules = quota::server::build_server_rules(RulesFormat::kQuota, 0, *text,
//                                                  "rules.yaml", metrics);
//   if (!rules.ok()) { /* "rules.yaml:7:14: rules[1]...." */ }
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "backend/checker.hpp"
#include "config/options.hpp"
#include "quota/gateway/metrics.hpp"
#include "quota/gateway/rules/rules.hpp"
#include "quota/rules/rule_file.hpp"
#include "rules/envoy_rules.hpp"

namespace quota::server {

// The content of the rule file at `path` (an error names it and the system's reason).
inline absl::StatusOr<std::string> read_rule_text(const std::string& path) {
  return quota::rules::detail::read_file(path);
}

// kQuota or kEnvoy: `format`, or for kAuto the shape of `text`.
inline RulesFormat resolve_format(RulesFormat format, std::string_view text) {
  if (format != RulesFormat::kAuto) return format;
  return looks_like_envoy_rules(text) ? RulesFormat::kEnvoy : RulesFormat::kQuota;
}

// The rules of `text` (the file at `path`) following version `in_force`, counting into
// `metrics` (which must outlive them). Not published.
absl::StatusOr<LoadedRules> build_server_rules(RulesFormat format, std::uint64_t in_force,
                                               std::string_view text, const std::string& path,
                                               gateway::Metrics& metrics);

}  // namespace quota::server
