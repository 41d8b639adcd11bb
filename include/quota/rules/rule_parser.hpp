// quota/rules/rule_parser.hpp — a rule file's YAML text into a gateway::RuleSetSpec.
//
// parse_rules() checks a rule file's syntax and schema and builds the RuleSetSpec it
// describes (gateway/rules/rule_spec.hpp); it does not check what RuleSet::create checks (ids,
// bounds, duplicates, unknown routes): load_rules() in rule_file.hpp does both. Every error
// reads `<file>:<line>:<column>: <field path>: <message>` with a 1-based position and a
// path such as `rules[2].token_bucket.burst`; unknown fields, wrong types, a second policy,
// a missing required field and YAML syntax errors are all errors, never skipped. Integers
// are whole numbers that fit in int64 (`1_000_000` is allowed); rates are
// `<units>/<period>` (`100/s`, `1000000/1min`, `20/100ms`), durations
// `<integer><ns|us|ms|s|min|h|d>` (scalars.hpp). This header holds the schema; the field
// walking, its errors and the scalar readers are in yaml_fields.hpp. The schema, field for
// field the RuleSetSpec (a * marks a required field; docs/gateway/rules.md "Rule files" has the
// details):
//
//   version, shadow_all
//   routes*: [{name*, cost, max_cost, prompt_factor, fail_mode: closed|open,
//              emergency: {rate*, burst*, max_duration*} (required with open, else refused),
//              costs: {<limit>: <units> | estimate | {units, estimate}}}]
//   rules*:  [{name*, level*: user|tenant|global, tenant | plan, route, limit,
//              exactly one of token_bucket: {rate*, burst*}, fixed_window: {limit*, window*},
//              sliding_log: {...}, sliding_window_estimate: {...};
//              shadow, enforce_percent: 0..100, max_cost,
//              lease: {mode*: off|on|auto, units, expiry, low_water, auto_rate,
//                     revoke: at_expiry|at_once},
//              fair_share: {reserve, shares_above, pause_above, period, budget,
//                           weight_default, weights}}]
//
// Needs yaml-cpp: link quota::rules. Thread safety: pure functions.
//
//   auto spec = quota::rules::parse_rules(text, "rules.yaml");
//   if (!spec.ok()) std::cerr << spec.status().message() << "\n";  // rules.yaml:7:14: ...
//   // spec->routes, spec->rules, spec->version (1 when the file gives none)
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <yaml-cpp/yaml.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "quota/gateway/key_state.hpp"
#include "quota/gateway/rules/rule_spec.hpp"
#include "quota/policy/fixed_window.hpp"
#include "quota/policy/sliding_log.hpp"
#include "quota/policy/sliding_window_estimate.hpp"
#include "quota/policy/token_bucket.hpp"
#include "quota/rules/fair_share_field.hpp"
#include "quota/rules/scalars.hpp"
#include "quota/rules/yaml_fields.hpp"
#include "quota/units.hpp"

namespace quota::rules {

namespace detail {

// Where a routes[i] or rules[i] entry and its fields are in the file, so that an error
// RuleSet::create reports later ("rules[2]: burst must be ...") gets a position too.
struct EntrySource {
  Position at{};
  std::vector<std::pair<std::string, Position>> fields{};  // "token_bucket.burst" -> its value
  std::string policy{};                                    // rules: "token_bucket", ...

  const Position* find(std::string_view path) const {
    for (const auto& [p, at_field] : fields) {
      if (p == path) return &at_field;
    }
    return nullptr;
  }
};

struct SourceMap {
  Position root{};
  Position version{};  // the version's value, else the root
  std::vector<EntrySource> routes{};
  std::vector<EntrySource> rules{};
};

struct ParsedRules {
  gateway::RuleSetSpec spec{};
  bool has_version = false;  // false: spec.version is RuleSetSpec's default, 1
  SourceMap source{};
};

}  // namespace detail

// Parses a rule file (`file_name` is used only in messages). Errors are InvalidArgument,
// located as described in the header comment. A file without `version:` gets version 1.
inline absl::StatusOr<gateway::RuleSetSpec> parse_rules(std::string_view yaml,
                                                        std::string_view file_name);

// Implementation details follow.

namespace detail {

// Walks the YAML tree of a rule file (FieldReader, yaml_fields.hpp, reads its fields).
// Errors are thrown as a Failure and caught by parse_with_source(), the only entry point:
// yaml-cpp reports syntax errors by exception, so one catch turns both into the returned
// Status, and no walker function needs to forward one.
class Parser : private FieldReader {
 public:
  explicit Parser(std::string_view file) : FieldReader(file) {}

  ParsedRules parse(std::string_view yaml) {
    std::vector<YAML::Node> docs;
    try {
      docs = YAML::LoadAll(std::string(yaml));
    } catch (const YAML::Exception& e) {
      throw Failure{located(file(), position(e.mark), "YAML syntax", e.msg)};
    }
    if (docs.size() > 1) {
      fail(position(docs[1].Mark()), "rule file", "expected one YAML document, found several");
    }
    ParsedRules out;
    if (docs.empty() || !docs[0].IsMap()) {
      fail(docs.empty() ? Position{} : position(docs[0].Mark()), "rule file",
           absl::StrCat("expected a mapping with routes and rules, got ",
                        docs.empty() ? "an empty file" : describe(docs[0])));
    }
    out.source.root = out.source.version = position(docs[0].Mark());
    bool have_routes = false, have_rules = false;
    static constexpr std::array<std::string_view, 4> kTop{"version", "shadow_all", "routes",
                                                          "rules"};
    for (const Field& f : fields(docs[0], "", kTop)) {
      if (f.key == "version") {
        out.spec.version = static_cast<std::uint64_t>(integer(f, 1));
        out.has_version = true;
        out.source.version = f.at;
      } else if (f.key == "shadow_all") {
        out.spec.shadow_all = boolean(f);
      } else if (f.key == "routes") {
        have_routes = true;
        for (const Field& item : sequence(f, "route classes")) {
          out.spec.routes.push_back(route(item, out.source.routes.emplace_back()));
        }
        if (out.spec.routes.empty()) fail(f.at, f.path, "at least one route class is required");
      } else {
        have_rules = true;
        for (const Field& item : sequence(f, "rules")) {
          out.spec.rules.push_back(rule(item, out.source.rules.emplace_back()));
        }
      }
    }
    if (!have_routes) fail(out.source.root, "routes", "required field missing");
    if (!have_rules) fail(out.source.root, "rules", "required field missing");
    return out;
  }

 private:
  // A nested mapping: its fields, each recorded in `entry` relative to `entry_path`.
  std::vector<Field> submap(const Field& f, std::span<const std::string_view> allowed,
                            std::string_view expected, EntrySource& entry,
                            std::string_view entry_path) const {
    if (!f.node.IsMap()) wrong_type(f, expected);
    std::vector<Field> out = fields(f.node, f.path, allowed);
    for (const Field& sub : out) record(entry, entry_path, sub);
    return out;
  }

  static void record(EntrySource& entry, std::string_view entry_path, const Field& f) {
    entry.fields.emplace_back(f.path.substr(entry_path.size() + 1), f.at);
  }

  gateway::RouteClass route(const Field& item, EntrySource& entry) const {
    static constexpr std::array<std::string_view, 7> kRouteFields{
        "name", "cost", "max_cost", "fail_mode", "emergency", "costs", "prompt_factor"};
    if (!item.node.IsMap()) wrong_type(item, "a route class (a mapping with a name)");
    entry.at = item.at;
    gateway::RouteClass r;
    const std::vector<Field> got = fields(item.node, item.path, kRouteFields);
    const Field* emergency = nullptr;
    for (const Field& f : got) {
      record(entry, item.path, f);
      if (f.key == "name") {
        r.name = text(f);
      } else if (f.key == "cost") {
        r.cost = integer(f);
      } else if (f.key == "max_cost") {
        r.max_cost = integer(f, 0);
      } else if (f.key == "prompt_factor") {
        const auto [numerator, denominator] = ratio(f, gateway::kMaxFactorPart);
        r.estimate_formula = {.numerator = numerator, .denominator = denominator};
      } else if (f.key == "fail_mode") {
        static constexpr std::array<std::string_view, 2> kModes{"closed", "open"};
        r.fail_mode =
            one_of(f, kModes) == "open" ? gateway::FailMode::kOpen : gateway::FailMode::kClosed;
      } else if (f.key == "emergency") {
        emergency = &f;
        static constexpr std::array<std::string_view, 3> kBucket{"rate", "burst", "max_duration"};
        const std::vector<Field> sub =
            submap(f, kBucket, "{rate, burst, max_duration}", entry, item.path);
        require(f.at, f.path, sub, "rate", "burst", "max_duration");
        for (const Field& s : sub) {
          if (s.key == "rate") r.emergency.rate = rate(s, true);
          if (s.key == "burst") r.emergency.burst = integer(s);
          if (s.key == "max_duration") r.emergency.max_duration = duration(s);
        }
      } else {
        r.costs = costs(f, entry, item.path);
      }
    }
    require(item.at, item.path, got, "name");
    if (emergency != nullptr && r.fail_mode != gateway::FailMode::kOpen) {
      fail(emergency->key_at, emergency->path, "applies only to a route with fail_mode: open");
    }
    if (emergency == nullptr && r.fail_mode == gateway::FailMode::kOpen) {
      fail(item.at, absl::StrCat(item.path, ".emergency"),
           "required with fail_mode: open: {rate, burst, max_duration}");
    }
    return r;
  }

  // costs: {units: 1, tokens: estimate, requests: {units: 1, estimate: false}}
  std::vector<gateway::RouteCost> costs(const Field& f, EntrySource& entry,
                                        std::string_view entry_path) const {
    if (!f.node.IsMap()) wrong_type(f, "a mapping of limit names to costs");
    std::vector<gateway::RouteCost> out;
    for (auto it = f.node.begin(); it != f.node.end(); ++it) {
      const Position key_at = position(it->first.Mark());
      const std::string limit = it->first.IsScalar() ? it->first.Scalar() : describe(it->first);
      const Field c{limit, key_at, it->second, absl::StrCat(f.path, ".", limit),
                    it->second.IsNull() ? key_at : position(it->second.Mark())};
      if (!it->first.IsScalar()) fail(key_at, c.path, "a limit name must be a string");
      for (const gateway::RouteCost& seen : out) {
        if (seen.limit == limit) fail(key_at, c.path, "limit given twice");
      }
      record(entry, entry_path, c);
      gateway::RouteCost cost{.limit = limit};
      if (c.node.IsMap()) {
        static constexpr std::array<std::string_view, 2> kCost{"units", "estimate"};
        for (const Field& s : submap(c, kCost, "", entry, entry_path)) {
          if (s.key == "units") cost.units = integer(s);
          if (s.key == "estimate") cost.estimate = boolean(s);
        }
      } else if (c.node.IsScalar() && c.node.Tag() != "!" && c.node.Scalar() == "estimate") {
        cost.estimate = true;
      } else if (c.node.IsScalar() && c.node.Tag() != "!") {
        cost.units = integer(c);
      } else {
        wrong_type(c, "whole units, estimate or {units: N, estimate: true}");
      }
      out.push_back(cost);
    }
    return out;
  }

  static constexpr std::array<std::string_view, 4> kPolicies{
      "token_bucket", "fixed_window", "sliding_log", "sliding_window_estimate"};

  gateway::RuleSpec rule(const Field& item, EntrySource& entry) const {
    static constexpr std::array<std::string_view, 15> kRuleFields{
        "name",   "level",           "tenant",       "plan",        "route",
        "limit",  "token_bucket",    "fixed_window", "sliding_log", "sliding_window_estimate",
        "shadow", "enforce_percent", "max_cost",     "lease",       "fair_share"};
    if (!item.node.IsMap())
      wrong_type(item, "a rule (a mapping with a name, a level and a policy)");
    entry.at = item.at;
    gateway::RuleSpec r;
    const std::vector<Field> got = fields(item.node, item.path, kRuleFields);
    const Field* policy = nullptr;
    for (const Field& f : got) {
      record(entry, item.path, f);
      if (f.key == "name") {
        r.name = text(f);
      } else if (f.key == "level") {
        static constexpr std::array<std::string_view, 3> kLevels{"user", "tenant", "global"};
        const std::string_view l = one_of(f, kLevels);
        r.level = l == "user"     ? gateway::Level::kUser
                  : l == "tenant" ? gateway::Level::kTenant
                                  : gateway::Level::kGlobal;
      } else if (f.key == "tenant") {
        r.tenant = text(f);
      } else if (f.key == "plan") {
        r.plan = text(f);
      } else if (f.key == "route") {
        r.route = text(f);
      } else if (f.key == "limit") {
        r.limit = text(f);
      } else if (f.key == "shadow") {
        r.shadow = boolean(f);
      } else if (f.key == "enforce_percent") {
        r.enforce_percent = static_cast<int>(integer(f, 0, 100));
      } else if (f.key == "max_cost") {
        r.max_cost = integer(f, 0);
      } else if (f.key == "lease") {
        r.lease = lease(f, entry, item.path);
      } else if (f.key == "fair_share") {
        r.fair_share =
            fair_share(*this, submap(f, kFairShareFields, kFairShareExpected, entry, item.path));
      } else {
        if (policy != nullptr) {
          fail(f.key_at, f.path,
               absl::StrFormat(
                   "a rule has exactly one policy, and this one already has %s (line %d)",
                   policy->key, policy->key_at.line));
        }
        policy = &f;
      }
    }
    require(item.at, item.path, got, "name", "level");
    if (policy == nullptr) {
      fail(item.at, item.path,
           absl::StrCat("a policy is required: one of ", join(kPolicies, ", ")));
    }
    entry.policy = policy->key;
    parse_policy(*policy, r.policy, entry, item.path);
    return r;
  }

  // lease: {mode: off|on|auto, units, expiry, low_water, auto_rate, revoke} (lease_spec.hpp)
  gateway::LeaseSpec lease(const Field& f, EntrySource& entry, std::string_view entry_path) const {
    static constexpr std::array<std::string_view, 6> kLease{"mode",      "units",     "expiry",
                                                            "low_water", "auto_rate", "revoke"};
    const std::vector<Field> sub =
        submap(f, kLease, "{mode, units, expiry, low_water, auto_rate, revoke}", entry, entry_path);
    require(f.at, f.path, sub, "mode");
    gateway::LeaseSpec out;
    for (const Field& s : sub) {
      if (s.key == "mode") {
        static constexpr std::array<std::string_view, 3> kModes{"off", "on", "auto"};
        const std::string_view m = one_of(s, kModes);
        out.mode = m == "on"     ? gateway::LeaseMode::kOn
                   : m == "auto" ? gateway::LeaseMode::kAuto
                                 : gateway::LeaseMode::kOff;
      }
      if (s.key == "units") out.units = integer(s);
      if (s.key == "expiry") out.expiry = duration(s);
      if (s.key == "low_water") out.low_water = integer(s);
      if (s.key == "auto_rate") out.auto_rate = integer(s);
      if (s.key == "revoke") {
        static constexpr std::array<std::string_view, 2> kRevoke{"at_expiry", "at_once"};
        out.revoke = one_of(s, kRevoke) == "at_once" ? gateway::LeaseRevoke::kAtOnce
                                                     : gateway::LeaseRevoke::kAtExpiry;
      }
    }
    return out;
  }

  void parse_policy(const Field& f, gateway::RulePolicy& out, EntrySource& entry,
                    std::string_view entry_path) const {
    if (f.key == "token_bucket") {
      static constexpr std::array<std::string_view, 2> kBucket{"rate", "burst"};
      const std::vector<Field> sub = submap(f, kBucket, "{rate, burst}", entry, entry_path);
      require(f.at, f.path, sub, "rate", "burst");
      TokenBucket tb;
      for (const Field& s : sub) {
        if (s.key == "rate") tb.rate = rate(s, false);
        if (s.key == "burst") tb.burst = integer(s);
      }
      out = tb;
      return;
    }
    static constexpr std::array<std::string_view, 2> kWindow{"limit", "window"};
    const std::vector<Field> sub = submap(f, kWindow, "{limit, window}", entry, entry_path);
    require(f.at, f.path, sub, "limit", "window");
    std::int64_t limit = 0;
    Nanos window{0};
    for (const Field& s : sub) {
      if (s.key == "limit") limit = integer(s);
      if (s.key == "window") window = duration(s);
    }
    if (f.key == "fixed_window") {
      out = FixedWindow{.limit = limit, .window = window};
    } else if (f.key == "sliding_log") {
      out = SlidingLog{.limit = limit, .window = window};
    } else {
      out = SlidingWindowEstimate{.limit = limit, .window = window};
    }
  }
};

inline absl::StatusOr<ParsedRules> parse_with_source(std::string_view yaml,
                                                     std::string_view file_name) {
  try {
    return Parser(file_name).parse(yaml);
  } catch (const Failure& f) {
    return f.status;
  }
}

}  // namespace detail

inline absl::StatusOr<gateway::RuleSetSpec> parse_rules(std::string_view yaml,
                                                        std::string_view file_name) {
  auto parsed = detail::parse_with_source(yaml, file_name);
  if (!parsed.ok()) return parsed.status();
  return std::move(parsed->spec);
}

}  // namespace quota::rules
