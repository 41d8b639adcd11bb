// quota/gateway/rules/rules.hpp — the validated rule set a gateway decides with.
//
// A RuleSet is an immutable snapshot of a RuleSetSpec (rule_spec.hpp): the route classes
// (a whitelist, each with its costs, fail mode and cap), the rules (each one budget: a
// policy on a scope, per tenant or plan, for one route class or shared by several) and a
// version. RuleSet::create checks everything up front and names the offending entry
// ("rules[2]: ..."), so a RuleSet that exists is valid. plan() turns a request into the
// budgets it must pass — each with its store key (store_key.hpp), its cost and whether it
// is in shadow (the Rule and Check values: rule.hpp) — without allocating. RuleRegistry
// (rule_registry.hpp) holds the set in force.
//
// Thread safety: a RuleSet is immutable (share it freely).
//
//   auto rules = quota::gateway::RuleSet::create(spec);   // StatusOr<shared_ptr<const RuleSet>>
//   auto checks = (*rules)->plan({.tenant = "acme", .plan = "free"}, "create");
//   // checks: [{rule "free-units", key "{acme}#units", cost 5, shadow false}]
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/inlined_vector.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "quota/detail/keyed_states.hpp"
#include "quota/gateway/key_state.hpp"
#include "quota/gateway/metrics.hpp"
#include "quota/gateway/rules/rule.hpp"
#include "quota/gateway/rules/rule_spec.hpp"
#include "quota/gateway/store_key.hpp"
#include "quota/units.hpp"

namespace quota::gateway {

class RuleSet {
 public:
  // Checks everything up front (ids, names, bounds, duplicate rules, unknown routes and
  // limits, a cost that can never fit its rule's capacity) and names the offending entry:
  // "rules[2]: ..." or "routes[0]: ...".
  static absl::StatusOr<std::shared_ptr<const RuleSet>> create(RuleSetSpec spec,
                                                               Metrics* metrics = nullptr) {
    auto set = std::shared_ptr<RuleSet>(new RuleSet());
    set->version_ = spec.version;
    set->shadow_all_ = spec.shadow_all;
    if (spec.routes.empty()) return absl::InvalidArgumentError("rule set: no route classes");
    for (std::size_t i = 0; i < spec.routes.size(); ++i) {
      if (auto s = set->add_route(spec.routes[i]); !s.ok()) {
        return annotate(s, absl::StrFormat("routes[%d]", i));
      }
    }
    absl::flat_hash_map<std::string, std::size_t> limit_rules;  // limit name → a rule using it
    for (std::size_t i = 0; i < spec.rules.size(); ++i) {
      if (auto s = set->add_rule(spec.rules[i], metrics); !s.ok()) {
        return annotate(s, absl::StrFormat("rules[%d]", i));
      }
      if (!spec.rules[i].limit.empty()) limit_rules.emplace(spec.rules[i].limit, i);
    }
    // Every cost entry names a limit some rule defines; every shared limit is paid by some
    // route (else it would never be decided).
    for (std::size_t i = 0; i < spec.routes.size(); ++i) {
      for (const RouteCost& c : spec.routes[i].costs) {
        if (!limit_rules.contains(c.limit)) {
          return absl::InvalidArgumentError(
              absl::StrFormat("routes[%d]: costs: no rule defines limit \"%s\"", i, c.limit));
        }
      }
    }
    for (std::size_t i = 0; i < spec.rules.size(); ++i) {
      const RuleSpec& r = spec.rules[i];
      if (!r.route.empty()) continue;
      const bool paid = std::any_of(spec.routes.begin(), spec.routes.end(), [&](const auto& rc) {
        return find_cost(rc, r.limit) != nullptr;
      });
      if (!paid) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "rules[%d]: no route class lists limit \"%s\" in its costs: it would never be "
            "decided",
            i, r.limit));
      }
    }
    return std::shared_ptr<const RuleSet>(std::move(set));
  }

  std::uint64_t version() const { return version_; }
  // Calls fn(const Rule&) once per rule, in no stated order (e.g. for a store to refuse,
  // at load, a policy it cannot decide); and the rule of an id (Rule::id), or null.
  template <class Fn>
  void for_each_rule(Fn&& fn) const {
    for (const auto& [id, rule] : rules_) fn(rule);
  }
  const Rule* rule(std::string_view id) const {
    auto it = rules_.find(quota::detail::to_absl(id));
    return it == rules_.end() ? nullptr : &it->second;
  }
  // RuleSetSpec::shadow_all: every rule of this set is in shadow.
  bool shadow_all() const { return shadow_all_; }

  // The route class, or InvalidArgument for a class not on the whitelist.
  absl::StatusOr<const RouteClass*> route(std::string_view name) const {
    auto it = routes_.find(quota::detail::to_absl(name));
    if (it == routes_.end()) {
      if (auto s = check_name(name, "route class"); !s.ok()) return s;
      return absl::InvalidArgumentError(
          absl::StrFormat("unknown route class \"%s\" (not on the rule set's whitelist)",
                          quota::detail::to_absl(name)));
    }
    return &it->second.route;
  }

  // The rule of (level, the tenant's own or else its plan's, route part, limit); null when
  // there is none. `route` is "" for a limit shared by route classes. Allocates nothing.
  const Rule* find(Level level, const Identity& who, std::string_view route,
                   std::string_view limit = {}) const {
    if (level == Level::kGlobal) return lookup(level, "", "", route, limit);
    if (tenant_rules_[static_cast<std::size_t>(level)]) {
      if (const Rule* own = lookup(level, "t:", who.tenant, route, limit)) return own;
    }
    return lookup(level, "p:", who.plan, route, limit);
  }

  // The budgets a request must pass, from the narrowest (user) to the widest (global),
  // each with its cost and whether it is in shadow. InvalidArgument for a malformed
  // identity or an unknown route; NotFound when no tenant-level rule applies (a tenant
  // must have a budget: no rule is not "unlimited").
  absl::StatusOr<CheckVector<Check>> plan(const Identity& who, std::string_view route,
                                          const PlanOptions& options = {}) const {
    if (auto s = check_id(who.tenant, "tenant"); !s.ok()) return s;
    if (auto s = check_name(who.plan, "plan"); !s.ok()) return s;
    if (!who.user.empty()) {
      if (auto s = check_id(who.user, "user"); !s.ok()) return s;
    }
    auto it = routes_.find(quota::detail::to_absl(route));
    if (it == routes_.end()) return this->route(route).status();
    const bool all_shadow = options.shadow_all || shadow_all_;
    int bucket = -1;  // the tenant's rollout bucket, hashed only for a partial rollout
    CheckVector<Check> checks;
    bool tenant_level = false;
    for (const Slot& slot : it->second.slots) {
      if (slot.level == Level::kUser && who.user.empty()) continue;
      const std::string_view part = slot.own_route ? route : std::string_view();
      const Rule* rule = find(slot.level, who, part, slot.limit);
      if (rule == nullptr) continue;
      tenant_level = tenant_level || slot.level == Level::kTenant;
      Check c{.rule = rule,
              .key = StoreKey::level(slot.level == Level::kGlobal ? "~global" : who.tenant, part,
                                     slot.limit, slot.level == Level::kUser ? who.user : ""),
              .cost = slot.estimate && options.estimate ? *options.estimate : slot.units,
              .estimate = slot.estimate,
              .shadow = all_shadow || rule->shadow || !enforced(*rule, who.tenant, bucket)};
      checks.push_back(std::move(c));
    }
    if (!tenant_level) {
      return absl::NotFoundError(
          absl::StrFormat("no tenant rule for tenant \"%s\" (plan \"%s\") on route \"%s\"",
                          quota::detail::to_absl(who.tenant), quota::detail::to_absl(who.plan),
                          quota::detail::to_absl(route)));
    }
    return checks;
  }

 private:
  RuleSet() = default;

  // One budget identity a route class pays, whichever tenant or plan defines it: its
  // level, whether it is the route's own (route part = the route) or shared (""), the
  // limit's name, and the cost.
  struct Slot {
    Level level = Level::kTenant;
    bool own_route = true;
    std::string limit{};
    std::int64_t units = 1;
    bool estimate = true;
  };
  struct RouteEntry {
    RouteClass route;
    std::vector<Slot> slots;  // by level (user, tenant, global), then in the rules' order
  };

  static absl::Status annotate(const absl::Status& s, const std::string& where) {
    return absl::Status(s.code(), absl::StrCat(where, ": ", s.message()));
  }

  // Whether `rule` enforces on `tenant` (enforce_percent); `bucket` caches the tenant's
  // rollout bucket across the rules of one plan (-1: not computed yet).
  static bool enforced(const Rule& rule, std::string_view tenant, int& bucket) {
    if (rule.enforce_percent >= 100) return true;
    if (bucket < 0) bucket = rollout_bucket(tenant);
    return bucket < rule.enforce_percent;
  }

  static const RouteCost* find_cost(const RouteClass& r, std::string_view limit) {
    for (const RouteCost& c : r.costs) {
      if (c.limit == limit) return &c;
    }
    return nullptr;
  }

  absl::Status add_route(const RouteClass& r) {
    if (auto s = check_name(r.name, "route name"); !s.ok()) return s;
    if (auto s = validate_amount(r.cost, "cost"); !s.ok()) return s;
    if (r.max_cost < 0) return absl::InvalidArgumentError("max_cost must be >= 0 (0: no cap)");
    if (auto s = r.estimate_formula.validate(); !s.ok()) return s;
    if (r.fail_mode == FailMode::kOpen) {
      if (auto s = r.emergency.validate(); !s.ok()) return s;
      if (r.cost > r.emergency.burst) {
        return absl::InvalidArgumentError(
            absl::StrFormat("cost %d exceeds emergency.burst %d: the route could never fail open",
                            r.cost, r.emergency.burst));
      }
    }
    for (std::size_t j = 0; j < r.costs.size(); ++j) {
      const RouteCost& c = r.costs[j];
      if (auto s = check_name(c.limit, "costs: limit"); !s.ok()) return s;
      if (auto s = validate_amount(c.units, "costs: units"); !s.ok()) return s;
      if (find_cost(r, c.limit) != &c) {
        return absl::InvalidArgumentError(
            absl::StrFormat("costs: limit \"%s\" listed twice", c.limit));
      }
    }
    if (!routes_.emplace(r.name, RouteEntry{.route = r, .slots = {}}).second) {
      return absl::InvalidArgumentError(absl::StrFormat("route class \"%s\" listed twice", r.name));
    }
    return absl::OkStatus();
  }

  absl::Status add_rule(const RuleSpec& r, Metrics* metrics) {
    if (auto s = check_name(r.name, "rule name"); !s.ok()) return s;
    if (!r.limit.empty()) {
      if (auto s = check_name(r.limit, "limit"); !s.ok()) return s;
    } else if (r.route.empty()) {
      return absl::InvalidArgumentError(
          "a rule names its route class, or a limit shared by the route classes whose costs "
          "list it");
    }
    if (!r.route.empty() && !routes_.contains(r.route)) {
      return absl::InvalidArgumentError(absl::StrFormat("unknown route class \"%s\"", r.route));
    }
    if (auto s = detail::validate(r.policy); !s.ok()) return s;
    if (r.enforce_percent < 0 || r.enforce_percent > 100) {
      return absl::InvalidArgumentError(
          absl::StrFormat("enforce_percent is %d; it must be 0..100", r.enforce_percent));
    }
    if (r.max_cost < 0) return absl::InvalidArgumentError("max_cost must be >= 0 (0: no cap)");
    if (auto s = r.lease.validate(detail::capacity(r.policy)); !s.ok()) return s;
    if (auto s = r.fair_share.validate(r.level == Level::kGlobal, r.policy); !s.ok()) return s;
    std::string scope;
    if (r.level == Level::kGlobal) {
      if (!r.tenant.empty() || !r.plan.empty()) {
        return absl::InvalidArgumentError("a global rule names no tenant or plan");
      }
    } else if (r.tenant.empty() == r.plan.empty()) {
      return absl::InvalidArgumentError("set exactly one of tenant and plan");
    } else if (!r.tenant.empty()) {
      if (auto s = check_id(r.tenant, "tenant"); !s.ok()) return s;
      scope = "t:" + r.tenant;
      tenant_rules_[static_cast<std::size_t>(r.level)] = true;
    } else {
      if (auto s = check_name(r.plan, "plan"); !s.ok()) return s;
      scope = "p:" + r.plan;
    }
    // The routes that pay this rule, and what each pays: every cost must fit the capacity.
    const std::int64_t capacity = detail::capacity(r.policy);
    for (auto& [name, entry] : routes_) {
      const RouteCost* c = r.limit.empty() ? nullptr : find_cost(entry.route, r.limit);
      if (r.route.empty() ? c == nullptr : r.route != name) continue;
      const Slot slot{.level = r.level,
                      .own_route = !r.route.empty(),
                      .limit = r.limit,
                      .units = c != nullptr ? c->units : entry.route.cost,
                      .estimate = c == nullptr || c->estimate};
      if (slot.units > capacity) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "route \"%s\" costs %d units but the policy holds only %d: it could never pass", name,
            slot.units, capacity));
      }
      add_slot(entry, slot);
    }
    std::string id = rule_key(r.level, scope, r.route, r.limit);
    Rule rule{.id = id,
              .name = r.name,
              .level = r.level,
              .policy = r.policy,
              .shadow = r.shadow,
              .limit = r.limit,
              .enforce_percent = r.enforce_percent,
              .max_cost = r.max_cost,
              .lease = r.lease,
              .fair_share = r.fair_share,
              .counters = nullptr};
    if (metrics != nullptr) {
      const std::string route = r.route.empty() ? "#" + r.limit : r.route;
      auto c = metrics->counters(
          {.rule = r.name, .route = route, .level = std::string(to_string(r.level))});
      if (!c.ok()) return c.status();
      rule.counters = *c;
    }
    if (!rules_.emplace(std::move(id), std::move(rule)).second) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "a %s rule for %s on %s is already defined", to_string(r.level),
          scope.empty() ? "everyone" : scope,
          r.route.empty()
              ? absl::StrCat("limit \"", r.limit, "\"")
              : absl::StrCat("route \"", r.route, "\"",
                             r.limit.empty() ? "" : absl::StrCat(", limit \"", r.limit, "\""))));
    }
    return absl::OkStatus();
  }

  // Adds `slot` to the route's list once per identity, keeping the levels in order.
  static void add_slot(RouteEntry& entry, const Slot& slot) {
    for (const Slot& s : entry.slots) {
      if (s.level == slot.level && s.own_route == slot.own_route && s.limit == slot.limit) return;
    }
    auto at = std::find_if(entry.slots.begin(), entry.slots.end(),
                           [&](const Slot& s) { return s.level > slot.level; });
    entry.slots.insert(at, slot);
  }

  // The rules' map key: "<level digit><scope> <route>#<limit>" (scope "", "t:<tenant>" or
  // "p:<plan>"). Unambiguous: no id or name contains a space or '#'.
  static constexpr std::size_t kMaxRuleKeyBytes =
      1 + 2 + kMaxIdBytes + 1 + kMaxNameBytes + 1 + kMaxNameBytes;
  static std::string rule_key(Level level, std::string_view scope, std::string_view route,
                              std::string_view limit) {
    return absl::StrCat(static_cast<int>(level), quota::detail::to_absl(scope), " ",
                        quota::detail::to_absl(route), "#", quota::detail::to_absl(limit));
  }

  // Looks up the rule of (level, kind + id, route, limit), the key built in place: no
  // allocation on the decision path. An id or name too long for any rule has none.
  const Rule* lookup(Level level, std::string_view kind, std::string_view id,
                     std::string_view route, std::string_view limit) const {
    if (kind.size() + id.size() > 2 + kMaxIdBytes || route.size() > kMaxNameBytes ||
        limit.size() > kMaxNameBytes) {
      return nullptr;
    }
    std::array<char, kMaxRuleKeyBytes> buf;
    std::size_t n = 0;
    buf[n++] = static_cast<char>('0' + static_cast<int>(level));
    for (std::string_view part :
         {kind, id, std::string_view(" "), route, std::string_view("#"), limit}) {
      std::copy(part.begin(), part.end(), buf.begin() + n);
      n += part.size();
    }
    auto it = rules_.find(absl::string_view(buf.data(), n));
    return it == rules_.end() ? nullptr : &it->second;
  }

  std::uint64_t version_ = 0;
  bool shadow_all_ = false;
  // Per level: some rule names a tenant (else find() looks up the plan's rule alone).
  std::array<bool, 3> tenant_rules_{};
  absl::flat_hash_map<std::string, RouteEntry> routes_;
  absl::flat_hash_map<std::string, Rule> rules_;
};

}  // namespace quota::gateway
