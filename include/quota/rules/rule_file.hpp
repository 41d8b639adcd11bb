// quota/rules/rule_file.hpp — rule files: load a YAML rule file into a RuleSet, reload it
// into a RuleRegistry.
//
// load_rules() parses a rule file (rule_parser.hpp: syntax and schema) and validates it
// with gateway::RuleSet::create; an error of either reads `<file>:<line>:<column>: <field
// path>: <message>`. RuleSet::create names the entry ("rules[2]: burst must be ..."); the
// error is placed at that entry, or at the field the message begins with when the entry
// has it (`rules.yaml:9:29: rules[2].token_bucket.burst: burst must be ...`).
// reload_rule_file() replaces the set in force only with a whole, valid new set, or not
// at all. The schema is in docs/gateway/rules.md ("Rule files"); examples/rules/ has one file
// per contract. Needs yaml-cpp: link quota::rules.
//
// Thread safety: load_* are pure apart from `metrics` (Metrics is thread-safe);
// reload_rule_file may race other publishers: RuleRegistry::publish refuses all but one
// of two sets with the same version.
//
//   auto rules = quota::rules::load_rule_file("/etc/gateway/rules.yaml");
//   if (!rules.ok()) return rules.status();  // "/etc/gateway/rules.yaml:7:14: rules[1]...."
//   quota::gateway::RuleRegistry registry(*rules);
//   // on SIGHUP: on error the old rules stay in force and the status says why
//   absl::StatusOr<std::uint64_t> v = quota::rules::reload_rule_file(registry, path);
#pragma once

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "quota/gateway/metrics.hpp"
#include "quota/gateway/rules/rule_registry.hpp"
#include "quota/gateway/rules/rule_spec.hpp"
#include "quota/gateway/rules/rules.hpp"
#include "quota/rules/rule_parser.hpp"
#include "quota/rules/yaml_fields.hpp"

namespace quota::rules {

// Parses `yaml` and builds the RuleSet it describes (version 1 when the file gives none).
// InvalidArgument, located as described above, when either step fails.
inline absl::StatusOr<std::shared_ptr<const gateway::RuleSet>> load_rules(
    std::string_view yaml, std::string_view file_name, gateway::Metrics* metrics = nullptr);

// load_rules() on the file at `path`; a file that cannot be read is an error naming it
// and the system's reason (NotFound for a missing file).
inline absl::StatusOr<std::shared_ptr<const gateway::RuleSet>> load_rule_file(
    const std::string& path, gateway::Metrics* metrics = nullptr);

// Reads, parses and validates the whole file at `path`, then publishes it in `registry`
// (RuleRegistry::publish, atomic). Its `version:` must be greater than the version in
// force (FailedPrecondition otherwise); without one the new set gets the version in
// force + 1. Returns the version published. On any error nothing is published: the rules
// in force stay, and the status says why.
inline absl::StatusOr<std::uint64_t> reload_rule_file(gateway::RuleRegistry& registry,
                                                      const std::string& path,
                                                      gateway::Metrics* metrics = nullptr);

// What reload_rule_file() publishes, built from text already read (`yaml`, named
// `file_name` in errors) as the successor of version `in_force`, and not published: for a
// caller that reads the file itself or publishes under its own lock. Errors as
// reload_rule_file's.
inline absl::StatusOr<std::shared_ptr<const gateway::RuleSet>> load_next_rules(
    std::uint64_t in_force, std::string_view yaml, std::string_view file_name,
    gateway::Metrics* metrics = nullptr);

// Implementation details follow.

namespace detail {

inline bool path_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' || c == '.';
}

// The field of `entry` an error message (without its "rules[i]: ") is about, relative to
// the entry ("token_bucket.burst"), or "" for the entry itself. The message must begin
// with the field's name: "burst must be ..." ("burst" of the policy, when the message is
// the policy's own validate() message), "emergency: rate.units ..." (nested fields).
inline std::string field_of(const EntrySource& entry, std::string_view message,
                            bool policy_message) {
  // RuleSet::create's names for fields it checks by another name.
  for (const auto& [said, field] :
       {std::pair<std::string_view, std::string_view>{"rule name ", "name"},
        {"route name ", "name"},
        {"unknown route class ", "route"}}) {
    if (absl::StartsWith(sv(message), sv(said))) return entry.find(field) ? std::string(field) : "";
  }
  std::string found = policy_message ? entry.policy : "";
  std::string_view rest = message;
  while (true) {
    std::size_t n = 0;
    while (n < rest.size() && path_char(rest[n])) ++n;
    if (n == 0) break;
    std::string candidate = found.empty() ? std::string(rest.substr(0, n))
                                          : absl::StrCat(found, ".", sv(rest.substr(0, n)));
    // "rate.units" names a part of the field "rate": the longest recorded prefix.
    while (candidate.size() > found.size() && entry.find(candidate) == nullptr) {
      const std::size_t dot = candidate.rfind('.');
      candidate.resize(dot == std::string::npos ? 0 : dot);
    }
    if (candidate.size() <= found.size()) break;
    found = std::move(candidate);
    rest.remove_prefix(n);
    if (!absl::StartsWith(sv(rest), ": ")) break;
    rest.remove_prefix(2);
  }
  return entry.find(found) ? found : "";
}

// RuleSet::create's error for `parsed`, placed in the file (see the header comment).
inline absl::Status locate(const absl::Status& error, const ParsedRules& parsed,
                           std::string_view file) {
  const std::string_view message = sv(error.message());
  for (const bool is_rule : {true, false}) {
    const std::string_view list = is_rule ? "rules[" : "routes[";
    if (!absl::StartsWith(sv(message), sv(list))) continue;
    const std::size_t close = message.find("]: ");
    std::size_t i = 0;
    const std::vector<EntrySource>& entries = is_rule ? parsed.source.rules : parsed.source.routes;
    if (close == std::string_view::npos ||
        !absl::SimpleAtoi(sv(message.substr(list.size(), close - list.size())), &i) ||
        i >= entries.size()) {
      break;
    }
    const std::string_view rest = message.substr(close + 3);
    const bool policy_message =
        is_rule && sv(gateway::detail::validate(parsed.spec.rules[i].policy).message()) == rest;
    const std::string field = field_of(entries[i], rest, policy_message);
    const std::string path = field.empty()
                                 ? std::string(message.substr(0, close + 1))
                                 : absl::StrCat(sv(message.substr(0, close + 1)), ".", field);
    const Position* at = field.empty() ? nullptr : entries[i].find(field);
    // "costs: no rule ..." placed at routes[0].costs reads "routes[0].costs: no rule ...".
    std::string_view shown = rest;
    for (std::size_t begin = 0; begin < field.size();) {
      std::size_t end = field.find('.', begin);
      if (end == std::string::npos) end = field.size();
      const std::string prefix = field.substr(begin, end - begin) + ": ";
      if (shown.starts_with(prefix)) shown.remove_prefix(prefix.size());
      begin = end + 1;
    }
    return located(file, at != nullptr ? *at : entries[i].at, path, shown, error.code());
  }
  return located(file, parsed.source.root, "rule file", message, error.code());
}

inline absl::StatusOr<std::shared_ptr<const gateway::RuleSet>> create(const ParsedRules& parsed,
                                                                      std::string_view file,
                                                                      gateway::Metrics* metrics) {
  auto set = gateway::RuleSet::create(parsed.spec, metrics);
  if (!set.ok()) return locate(set.status(), parsed, file);
  return set;
}

inline absl::StatusOr<std::string> read_file(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  const auto fail = [&](int err) {
    return absl::Status(
        absl::ErrnoToStatusCode(err),
        absl::StrFormat("cannot read rule file \"%s\": %s", path, std::strerror(err)));
  };
  if (f == nullptr) return fail(errno);
  std::string text;
  char buf[4096];
  std::size_t n = 0;
  while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) text.append(buf, n);
  const int err = std::ferror(f) ? errno : 0;
  std::fclose(f);
  if (err != 0) return fail(err);
  return text;
}

}  // namespace detail

inline absl::StatusOr<std::shared_ptr<const gateway::RuleSet>> load_rules(
    std::string_view yaml, std::string_view file_name, gateway::Metrics* metrics) {
  auto parsed = detail::parse_with_source(yaml, file_name);
  if (!parsed.ok()) return parsed.status();
  return detail::create(*parsed, file_name, metrics);
}

inline absl::StatusOr<std::shared_ptr<const gateway::RuleSet>> load_rule_file(
    const std::string& path, gateway::Metrics* metrics) {
  auto text = detail::read_file(path);
  if (!text.ok()) return text.status();
  return load_rules(*text, path, metrics);
}

inline absl::StatusOr<std::uint64_t> reload_rule_file(gateway::RuleRegistry& registry,
                                                      const std::string& path,
                                                      gateway::Metrics* metrics) {
  auto text = detail::read_file(path);
  if (!text.ok()) return text.status();
  const std::shared_ptr<const gateway::RuleSet> current = registry.current();
  auto set = load_next_rules(current == nullptr ? 0 : current->version(), *text, path, metrics);
  if (!set.ok()) return set.status();
  // Fails only when another publisher got in between with this version or a later one.
  if (auto s = registry.publish(*set); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat(path, ": ", s.message()));
  }
  return (*set)->version();
}

inline absl::StatusOr<std::shared_ptr<const gateway::RuleSet>> load_next_rules(
    std::uint64_t in_force, std::string_view yaml, std::string_view path,
    gateway::Metrics* metrics) {
  auto parsed = detail::parse_with_source(yaml, path);
  if (!parsed.ok()) return parsed.status();
  if (parsed->has_version && parsed->spec.version <= in_force) {
    return detail::located(
        path, parsed->source.version, "version",
        absl::StrFormat("version %d is not greater than the version in force, %d (omit version: "
                        "to use %d)",
                        parsed->spec.version, in_force, in_force + 1),
        absl::StatusCode::kFailedPrecondition);
  }
  if (!parsed->has_version) {
    if (in_force == std::numeric_limits<std::uint64_t>::max()) {
      return absl::FailedPreconditionError(
          absl::StrFormat("%s: the version in force is the largest there is", detail::sv(path)));
    }
    parsed->spec.version = in_force + 1;
  }
  return detail::create(*parsed, path, metrics);
}

}  // namespace quota::rules
