// examples/quota_server/rules/envoy_rules.hpp — envoyproxy/ratelimit's YAML rule files, imported
// into quota's rule model and matched as envoyproxy/ratelimit matches them.
//
// The format (docs/service.md, "envoyproxy/ratelimit rule files"): `domain`, then
// `descriptors`, each with `key`, optional `value` (a trailing `*` makes it a prefix),
// optional `rate_limit` {unit, requests_per_unit, name, unlimited, replaces: [{name}]},
// `shadow_mode`, `detailed_metric` and nested `descriptors`. parse_envoy_rules() reads it
// strictly; every field is either implemented or refused, never read and ignored. Refused,
// each an InvalidArgument reading `<file>:<line>:<column>: <field path>: <message>`: an
// unknown key, an empty key, a key ending in `*` without a value, two descriptors of one
// level whose `key_value` is the same (envoyproxy/ratelimit's duplicate check), `unlimited`
// with `unit` or `requests_per_unit`, a rate_limit without unit or requests_per_unit,
// `replaces` outside rate_limit (envoyproxy/ratelimit ignores it there), a limit replacing
// its own name, `shadow_mode` or `detailed_metric` on a descriptor without a rate_limit.
//
// Semantics: matching is envoyproxy/ratelimit's — for each entry of a request descriptor
// in order, the child with the entry's key and exactly its value, else the first child (in
// file order) with that key and a `prefix*` value the entry's value starts with, else the
// child with the key alone (or `value: ""`); the limit is the one of the node reached at
// the descriptor's last entry. Each distinct list of entry values is its own budget (a
// wildcard's values too). Counting is quota's, not envoyproxy/ratelimit's windows: a limit
// of N per unit is an exact token bucket with burst N refilled at N per unit (second,
// minute, hour, day, week, month = 30 days, year = 365 days), and a denied request spends
// nothing; a top-level `quota_policy: fixed_window` makes every limit a fixed window of N
// per unit instead (aligned to the store's clock, not to the Unix epoch).
// `requests_per_unit: 0` is envoyproxy/ratelimit's block list: every request over the
// limit (EnvoyRateLimit::blocks(); no budget is kept for it).
//
// parse_envoy_rules(yaml, file, version) returns the rules of `yaml` with `version` (the
// format has no version of its own: the server gives 1 at start, +1 per reload).
//
// Thread safety: an EnvoyRules is immutable once built.
//
//   auto rules = quota::server::parse_envoy_rules(text, "ratelimit.yaml", /*version=*/1);
//   const quota::server::EnvoyRateLimit* l = (*rules)->match({{"tenant", "acme"}});
#pragma once

#include <algorithm>
#include <array>
#include <cctype>
#include <chrono>
#include <cstdint>
#include <limits>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <yaml-cpp/yaml.h>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "quota/decision.hpp"
#include "quota/gateway/key_state.hpp"
#include "quota/rules/yaml_fields.hpp"

namespace quota::server {

// One rate_limit of the file, as quota enforces it.
struct EnvoyRateLimit {
  std::string name{};  // the file's name, else the descriptor's path ("tenant_acme.path")
  bool named = false;  // `name` was given: only a named limit can be replaced
  bool unlimited = false;
  bool shadow = false;
  bool detailed_metric = false;  // its metric label names the request's values
  std::int64_t requests_per_unit = 0;
  int unit = 0;                  // Envoy's RateLimit.Unit number: SECOND 1 ... YEAR 6, WEEK 7
  Nanos per{0};                  // the unit's length
  gateway::RulePolicy policy{};  // the budget; unused when unlimited or blocks()
  std::vector<std::string> replaces{};  // names of the limits this one replaces

  // requests_per_unit: 0 — every request is over the limit, whatever it costs.
  bool blocks() const { return !unlimited && requests_per_unit == 0; }

  // What a blocking limit answers (blocks()): over the limit, and waiting never helps
  // (no Retry-After).
  static Decision blocked(std::uint64_t version) {
    return Decision{.allowed = false,
                    .remaining = 0,
                    .retry_after = kNever,
                    .reset_after = kNever,
                    .version = version,
                    .reason = Reason::kOverLimit};
  }

  // The answer to the store's decision `d` of this limit: in shadow mode a denial is
  // answered OK (decided, nothing deducted), reason kShadow.
  Decision answer(Decision d) const {
    if (shadow && !d.allowed) {
      d.allowed = true;
      d.retry_after = Nanos{0};
      d.reason = Reason::kShadow;
    }
    return d;
  }
};

struct EnvoyNode {
  std::string key{};
  std::string value{};  // "" with !has_value: any value of `key`
  bool has_value = false;
  bool wildcard = false;  // value ends with '*': any value starting with prefix()
  std::shared_ptr<const EnvoyRateLimit> limit{};
  std::vector<EnvoyNode> children{};

  std::string_view prefix() const {
    return std::string_view(value).substr(0, value.size() - (wildcard ? 1 : 0));
  }
};

class EnvoyRules {
 public:
  using Entries = std::span<const std::pair<std::string, std::string>>;

  std::uint64_t version = 0;
  std::string domain{};
  bool fixed_window = false;
  std::vector<EnvoyNode> descriptors{};

  // The limit for a request descriptor's entries (key, value), or null: none applies.
  // At each level: the exact key and value, else the first wildcard (file order) whose
  // prefix the value starts with, else the key alone; the limit is the last entry's.
  const EnvoyRateLimit* match(Entries entries) const {
    const std::vector<EnvoyNode>* level = &descriptors;
    for (std::size_t i = 0; i < entries.size(); ++i) {
      const auto& [key, value] = entries[i];
      const EnvoyNode* found = nullptr;
      for (const EnvoyNode& n : *level) {
        if (n.key == key && n.has_value && n.value == value) found = &n;
      }
      for (const EnvoyNode& n : *level) {
        if (found != nullptr) break;
        if (n.key == key && n.wildcard && value.starts_with(n.prefix())) found = &n;
      }
      for (const EnvoyNode& n : *level) {
        if (found == nullptr && n.key == key && !n.has_value) found = &n;
      }
      if (found == nullptr) return nullptr;
      if (i + 1 == entries.size()) return found->limit.get();
      level = &found->children;
    }
    return nullptr;
  }

  // The budget of a descriptor's entries under this domain: each distinct list of entry
  // values is its own ("rls:<len>:<domain>|<len>:<key><len>:<value>..."; the lengths keep
  // any two lists apart).
  std::string budget_key(Entries entries) const {
    std::string key = absl::StrCat("rls:", domain.size(), ":", domain);
    for (const auto& [k, v] : entries)
      absl::StrAppend(&key, "|", k.size(), ":", k, v.size(), ":", v);
    return key;
  }

  // The label `limit` (matched for `entries`) is counted under on /metrics: its name, or
  // with detailed_metric the request's own path, `key_value` per entry joined by '.'
  // (envoyproxy/ratelimit's detailed key without the domain).
  static std::string metric_name(const EnvoyRateLimit& limit, Entries entries) {
    if (!limit.detailed_metric) return limit.name;
    std::string out;
    for (const auto& [k, v] : entries) {
      absl::StrAppend(&out, out.empty() ? "" : ".", k, v.empty() ? "" : "_", v);
    }
    return out;
  }
};

// True when `yaml` looks like an envoyproxy/ratelimit file: a top-level `domain` or
// `descriptors` key (quota's rule files have `routes` and `rules`).
inline bool looks_like_envoy_rules(std::string_view yaml) {
  try {
    const YAML::Node root = YAML::Load(std::string(yaml));
    return root.IsMap() && (root["domain"] || root["descriptors"]);
  } catch (const YAML::Exception&) {
    return false;
  }
}

namespace detail {

using quota::rules::detail::Field;
using quota::rules::detail::FieldReader;
using quota::rules::detail::position;

class EnvoyParser : private FieldReader {
 public:
  EnvoyParser(std::string_view file, bool fixed_window)
      : FieldReader(file), fixed_window_(fixed_window) {}

  // The descriptors of `list`, whose parent's path in the file is `parent` ("" at the top).
  std::vector<EnvoyNode> descriptors(const Field& list, const std::string& parent = "") {
    std::vector<EnvoyNode> out;
    std::vector<std::string> joined;  // envoyproxy/ratelimit's map keys: key or key_value
    for (const Field& item : sequence(list, "descriptors")) {
      if (!item.node.IsMap()) wrong_type(item, "a mapping with key");
      refuse_misplaced_replaces(item);
      static constexpr std::array<std::string_view, 6> kAllowed{
          "key", "value", "rate_limit", "descriptors", "shadow_mode", "detailed_metric"};
      const std::vector<Field> fs = fields(item.node, item.path, kAllowed);
      require(item.at, item.path, fs, "key");
      EnvoyNode node;
      bool shadow = false;
      bool detailed = false;
      const Field* rate_limit = nullptr;
      const Field* children = nullptr;
      const Field* flag = nullptr;  // shadow_mode or detailed_metric set: needs a rate_limit
      for (const Field& f : fs) {
        if (f.key == "key") {
          node.key = text(f);
          if (node.key.empty()) fail(f.at, f.path, "the key is empty");
        } else if (f.key == "value") {
          // An empty value is no value, as in envoyproxy/ratelimit (its map key is `key`).
          node.value = text(f);
          node.has_value = !node.value.empty();
          node.wildcard = node.value.ends_with('*');
        } else if (f.key == "shadow_mode") {
          shadow = boolean(f);
          if (shadow) flag = &f;
        } else if (f.key == "detailed_metric") {
          detailed = boolean(f);
          if (detailed && flag == nullptr) flag = &f;
        } else if (f.key == "descriptors") {
          children = &f;
        } else {
          rate_limit = &f;
        }
      }
      // envoyproxy/ratelimit would match such a key as a prefix of "key_value" (any key
      // that starts with it); a wildcard belongs in `value`.
      if (!node.has_value && node.key.ends_with('*')) {
        fail(fs[0].at, fs[0].path,
             "a key ending in '*' without a value is not a wildcard quota matches; give the "
             "wildcard as the value (value: \"prefix*\")");
      }
      const std::string key = node.has_value ? absl::StrCat(node.key, "_", node.value) : node.key;
      if (std::find(joined.begin(), joined.end(), key) != joined.end()) {
        fail(item.at, item.path,
             absl::StrFormat("duplicate descriptor \"%s\" at this level (key, or key_value: "
                             "envoyproxy/ratelimit's composite key)",
                             key));
      }
      joined.push_back(key);
      const std::string path = parent.empty() ? key : absl::StrCat(parent, ".", key);
      if (children != nullptr) node.children = descriptors(*children, path);
      if (rate_limit != nullptr) {
        node.limit = limit(*rate_limit, shadow, detailed, path);
      } else if (flag != nullptr) {
        fail(flag->key_at, flag->path,
             "needs a rate_limit on this descriptor (envoyproxy/ratelimit ignores it without "
             "one)");
      }
      out.push_back(std::move(node));
    }
    return out;
  }

 private:
  // `replaces` is a field of rate_limit; envoyproxy/ratelimit accepts it beside `key` and
  // ignores it there, so a file that has it there is refused rather than read otherwise.
  void refuse_misplaced_replaces(const Field& item) const {
    for (auto it = item.node.begin(); it != item.node.end(); ++it) {
      if (it->first.IsScalar() && it->first.Scalar() == "replaces") {
        fail(position(it->first.Mark()), absl::StrCat(item.path, ".replaces"),
             "replaces belongs inside rate_limit (rate_limit: {replaces: [{name: ...}]}); "
             "envoyproxy/ratelimit ignores it here");
      }
    }
  }

  std::vector<std::string> replaces(const Field& f) {
    std::vector<std::string> out;
    for (const Field& r : sequence(f, "{name: ...} mappings")) {
      if (!r.node.IsMap()) wrong_type(r, "a mapping with name");
      static constexpr std::array<std::string_view, 1> kName{"name"};
      const std::vector<Field> rf = fields(r.node, r.path, kName);
      require(r.at, r.path, rf, "name");
      const std::string name = text(rf[0]);
      if (name.empty()) fail(rf[0].at, rf[0].path, "the name is empty");
      out.push_back(name);
    }
    return out;
  }

  std::shared_ptr<const EnvoyRateLimit> limit(const Field& f, bool shadow, bool detailed,
                                              std::string fallback) {
    if (!f.node.IsMap()) wrong_type(f, "a mapping with unit and requests_per_unit");
    static constexpr std::array<std::string_view, 5> kAllowed{"unit", "requests_per_unit", "name",
                                                              "unlimited", "replaces"};
    auto out = std::make_shared<EnvoyRateLimit>();
    out->shadow = shadow;
    out->detailed_metric = detailed;
    out->name = std::move(fallback);
    const Field* unit = nullptr;
    const Field* rpu = nullptr;
    const Field* replaced = nullptr;
    const std::vector<Field> fs = fields(f.node, f.path, kAllowed);
    for (const Field& g : fs) {
      if (g.key == "name") {
        out->name = text(g);
        out->named = true;
        if (out->name.empty()) fail(g.at, g.path, "the name is empty");
      } else if (g.key == "unlimited") {
        out->unlimited = boolean(g);
      } else if (g.key == "replaces") {
        replaced = &g;
        out->replaces = replaces(g);
      } else if (g.key == "unit") {
        unit = &g;
        static constexpr std::array<std::string_view, 7> kUnits{"second", "minute", "hour", "day",
                                                                "week",   "month",  "year"};
        std::string lower = text(g);
        for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
        const auto it = std::find(kUnits.begin(), kUnits.end(), lower);
        if (it == kUnits.end()) wrong_type(g, "second | minute | hour | day | week | month | year");
        static constexpr std::array<int, 7> kEnvoyUnit{1, 2, 3, 4, 7, 5, 6};
        static constexpr std::array<std::int64_t, 7> kSeconds{
            1, 60, 3600, 86400, 7 * 86400, 30 * 86400, 365 * 86400};
        const auto i = static_cast<std::size_t>(it - kUnits.begin());
        out->unit = kEnvoyUnit[i];
        out->per = std::chrono::seconds(kSeconds[i]);
      } else {
        rpu = &g;
        out->requests_per_unit = integer(g, 0, std::numeric_limits<std::uint32_t>::max());
      }
    }
    if (replaced != nullptr && out->named &&
        std::find(out->replaces.begin(), out->replaces.end(), out->name) != out->replaces.end()) {
      fail(replaced->at, replaced->path,
           absl::StrFormat("a limit cannot replace its own name \"%s\"", out->name));
    }
    if (out->unlimited) {
      if (unit != nullptr) fail(unit->key_at, unit->path, "unlimited: true cannot have a unit");
      if (rpu != nullptr)
        fail(rpu->key_at, rpu->path, "unlimited: true cannot have requests_per_unit");
      return out;
    }
    if (unit == nullptr) fail(f.at, absl::StrCat(f.path, ".unit"), "required field missing");
    if (rpu == nullptr) {
      fail(f.at, absl::StrCat(f.path, ".requests_per_unit"), "required field missing");
    }
    const std::int64_t n = out->requests_per_unit;
    if (n == 0) return out;  // a block list: no budget to keep
    if (fixed_window_) {
      out->policy = FixedWindow{.limit = n, .window = out->per};
    } else {
      out->policy = TokenBucket{.rate = Rate{.units = n, .per = out->per}, .burst = n};
    }
    if (auto s = gateway::detail::validate(out->policy); !s.ok()) {
      fail(f.at, f.path, rules::detail::sv(s.message()));
    }
    return out;
  }

  bool fixed_window_;
};

inline absl::StatusOr<std::shared_ptr<const EnvoyRules>> parse_envoy_rules(std::string_view yaml,
                                                                           std::string_view file,
                                                                           std::uint64_t version) {
  using quota::rules::detail::Failure;
  using quota::rules::detail::located;
  try {
    YAML::Node root;
    try {
      root = YAML::Load(std::string(yaml));
    } catch (const YAML::Exception& e) {
      return located(file, position(e.mark), "YAML syntax", e.msg);
    }
    if (!root.IsMap()) {
      return located(file, position(root.Mark()), "rule file",
                     "expected a mapping with domain and descriptors");
    }
    FieldReader in(file);
    static constexpr std::array<std::string_view, 3> kTop{"domain", "descriptors", "quota_policy"};
    const std::vector<Field> top = in.fields(root, "", kTop);
    in.require(position(root.Mark()), "rule file", top, "domain");
    auto out = std::make_shared<EnvoyRules>();
    out->version = version;
    for (const Field& f : top) {
      if (f.key == "quota_policy") {
        static constexpr std::array<std::string_view, 2> kPolicies{"token_bucket", "fixed_window"};
        out->fixed_window = in.one_of(f, kPolicies) == "fixed_window";
      } else if (f.key == "domain") {
        out->domain = in.text(f);
        if (out->domain.empty()) in.fail(f.at, f.path, "the domain is empty");
      }
    }
    EnvoyParser parser(file, out->fixed_window);
    for (const Field& f : top) {
      if (f.key == "descriptors") out->descriptors = parser.descriptors(f);
    }
    return std::shared_ptr<const EnvoyRules>(std::move(out));
  } catch (const Failure& f) {
    return f.status;
  }
}

}  // namespace detail

using detail::parse_envoy_rules;

}  // namespace quota::server
