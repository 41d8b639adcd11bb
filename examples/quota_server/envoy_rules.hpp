// examples/quota_server/envoy_rules.hpp — envoyproxy/ratelimit's YAML rule files, imported
// into quota's rule model.
//
// The format (docs/service.md, "envoyproxy/ratelimit rule files"):
// `domain`, then `descriptors`, each with `key`, optional `value`, optional `rate_limit`
// {unit, requests_per_unit, name, unlimited}, `shadow_mode`, `replaces: [{name}]` and
// nested `descriptors`. parse_envoy_rules() reads it strictly: an unknown key, an empty
// key, a key/value given twice at one level, `unlimited` with `unit`, a rate_limit without
// unit or requests_per_unit — each an InvalidArgument reading
// `<file>:<line>:<column>: <field path>: <message>`.
//
// Semantics (quota's, not envoyproxy/ratelimit's windows): a limit of N per unit is an
// exact token bucket with burst N refilled at N per unit (second, minute, hour, day, week,
// month = 30 days, year = 365 days), and a denied request spends nothing. A top-level
// `quota_policy: fixed_window` makes every limit a fixed window of N per unit instead
// (aligned to the store's clock, not to the Unix epoch). Matching is the format's: for
// each entry of a request descriptor in order, the child with the entry's key and value,
// else the child with the key alone (any value); the limit is the one of the node reached
// at the descriptor's last entry. Each distinct list of entry values is its own budget.
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
#include "quota/gateway/key_state.hpp"
#include "quota/rules/yaml_fields.hpp"

namespace quota::server {

// One rate_limit of the file, as quota enforces it.
struct EnvoyRateLimit {
  std::string name{};  // the file's name, else the descriptor path ("tenant_acme.route")
  bool unlimited = false;
  bool shadow = false;
  std::int64_t requests_per_unit = 0;
  int unit = 0;  // Envoy's RateLimit.Unit number: SECOND 1 ... YEAR 6, WEEK 7
  gateway::RulePolicy policy{};
  std::vector<std::string> replaces{};  // names of the limits this one replaces
};

struct EnvoyNode {
  std::string key{};
  std::string value{};  // "" with !has_value: any value of `key`
  bool has_value = false;
  std::shared_ptr<const EnvoyRateLimit> limit{};
  std::vector<EnvoyNode> children{};
};

class EnvoyRules {
 public:
  std::uint64_t version = 0;
  std::string domain{};
  bool fixed_window = false;
  std::vector<EnvoyNode> descriptors{};

  // The limit for a request descriptor's entries (key, value), or null: none applies.
  const EnvoyRateLimit* match(std::span<const std::pair<std::string, std::string>> entries) const {
    const std::vector<EnvoyNode>* level = &descriptors;
    for (std::size_t i = 0; i < entries.size(); ++i) {
      const EnvoyNode* found = nullptr;
      for (const EnvoyNode& n : *level) {
        if (n.key == entries[i].first && n.has_value && n.value == entries[i].second) found = &n;
      }
      if (found == nullptr) {
        for (const EnvoyNode& n : *level) {
          if (n.key == entries[i].first && !n.has_value) found = &n;
        }
      }
      if (found == nullptr) return nullptr;
      if (i + 1 == entries.size()) return found->limit.get();
      level = &found->children;
    }
    return nullptr;
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

  std::vector<EnvoyNode> descriptors(const Field& list) {
    std::vector<EnvoyNode> out;
    for (const Field& item : sequence(list, "descriptors")) {
      if (!item.node.IsMap()) wrong_type(item, "a mapping with key");
      static constexpr std::array<std::string_view, 6> kAllowed{
          "key", "value", "rate_limit", "descriptors", "shadow_mode", "replaces"};
      const std::vector<Field> fs = fields(item.node, item.path, kAllowed);
      require(item.at, item.path, fs, "key");
      EnvoyNode node;
      bool shadow = false;
      std::vector<std::string> replaces;
      const Field* rate_limit = nullptr;
      for (const Field& f : fs) {
        if (f.key == "key") {
          node.key = text(f);
          if (node.key.empty()) fail(f.at, f.path, "the key is empty");
        } else if (f.key == "value") {
          node.value = text(f);
          node.has_value = true;
        } else if (f.key == "shadow_mode") {
          shadow = boolean(f);
        } else if (f.key == "replaces") {
          for (const Field& r : sequence(f, "{name: ...} mappings")) {
            if (!r.node.IsMap()) wrong_type(r, "a mapping with name");
            static constexpr std::array<std::string_view, 1> kName{"name"};
            const std::vector<Field> rf = fields(r.node, r.path, kName);
            require(r.at, r.path, rf, "name");
            const std::string name = text(rf[0]);
            if (name.empty()) fail(rf[0].at, rf[0].path, "the name is empty");
            replaces.push_back(name);
          }
        } else if (f.key == "descriptors") {
          node.children = descriptors(f);
        } else {
          rate_limit = &f;
        }
      }
      for (const EnvoyNode& seen : out) {
        if (seen.key == node.key && seen.has_value == node.has_value && seen.value == node.value) {
          fail(item.at, item.path,
               node.has_value ? absl::StrFormat("key \"%s\" with value \"%s\" given twice at "
                                                "this level",
                                                node.key, node.value)
                              : absl::StrFormat("key \"%s\" without a value given twice at this "
                                                "level",
                                                node.key));
        }
      }
      if (rate_limit != nullptr) {
        node.limit = limit(*rate_limit, shadow, std::move(replaces), path_name(node));
      } else if (shadow || !replaces.empty()) {
        fail(item.at, item.path, "shadow_mode and replaces need a rate_limit");
      }
      out.push_back(std::move(node));
    }
    return out;
  }

 private:
  std::string path_name(const EnvoyNode& n) const {
    return n.has_value ? absl::StrCat(n.key, "_", n.value) : n.key;
  }

  std::shared_ptr<const EnvoyRateLimit> limit(const Field& f, bool shadow,
                                              std::vector<std::string> replaces,
                                              std::string fallback) {
    if (!f.node.IsMap()) wrong_type(f, "a mapping with unit and requests_per_unit");
    static constexpr std::array<std::string_view, 4> kAllowed{"unit", "requests_per_unit", "name",
                                                              "unlimited"};
    auto out = std::make_shared<EnvoyRateLimit>();
    out->shadow = shadow;
    out->replaces = std::move(replaces);
    out->name = std::move(fallback);
    const Field* unit = nullptr;
    const Field* rpu = nullptr;
    const std::vector<Field> fs = fields(f.node, f.path, kAllowed);
    for (const Field& g : fs) {
      if (g.key == "name") {
        out->name = text(g);
        if (out->name.empty()) fail(g.at, g.path, "the name is empty");
      } else if (g.key == "unlimited") {
        out->unlimited = boolean(g);
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
        per_ = std::chrono::seconds(kSeconds[i]);
      } else {
        rpu = &g;
        out->requests_per_unit = integer(g, 1, std::numeric_limits<std::uint32_t>::max());
      }
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
    if (fixed_window_) {
      out->policy = FixedWindow{.limit = n, .window = per_};
    } else {
      out->policy = TokenBucket{.rate = Rate{.units = n, .per = per_}, .burst = n};
    }
    if (auto s = gateway::detail::validate(out->policy); !s.ok()) {
      fail(f.at, f.path, rules::detail::sv(s.message()));
    }
    return out;
  }

  bool fixed_window_;
  Nanos per_{0};
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
