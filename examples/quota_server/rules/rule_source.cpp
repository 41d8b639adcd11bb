// examples/quota_server/rules/rule_source.cpp — the definitions of rule_source.hpp: a rule
// file's text built into the rules quota-server decides with.
#include "rules/rule_source.hpp"

#include <utility>

namespace quota::server {

absl::StatusOr<LoadedRules> build_server_rules(RulesFormat format, std::uint64_t in_force,
                                               std::string_view text, const std::string& path,
                                               gateway::Metrics& metrics) {
  LoadedRules out;
  if (resolve_format(format, text) == RulesFormat::kEnvoy) {
    auto envoy = parse_envoy_rules(text, path, in_force + 1);
    if (!envoy.ok()) return envoy.status();
    out.envoy = *std::move(envoy);
    return out;
  }
  auto rules = quota::rules::load_next_rules(in_force, text, path, &metrics);
  if (!rules.ok()) return rules.status();
  out.rules = *std::move(rules);
  return out;
}

}  // namespace quota::server
