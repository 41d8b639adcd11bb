// quota/gateway/rules.hpp — who gets which budget: route classes, rules, versioned sets.
//
// A RuleSet is an immutable, validated snapshot of route classes (a whitelist, each with
// its cost and fail mode), rules ((level, tenant or plan, route class) → policy) and a
// version. RuleSet::create checks everything up front and names the offending entry, so
// a RuleSet that exists is valid. RuleRegistry holds the set in force and swaps in a new
// one without ever showing a decision a half-built set. The store keys and the ids they
// are built from are in store_key.hpp.
//
// Thread safety: a RuleSet is immutable (share it freely); RuleRegistry may be called
// from any thread.
//
//   auto rules = quota::gateway::RuleSet::create({
//       .version = 1,
//       .routes = {{.name = "read", .cost = 1}, {.name = "create", .cost = 5}},
//       .rules = {{.level = quota::gateway::Level::kTenant, .plan = "free", .route = "read",
//                  .name = "free", .policy = quota::TokenBucket{.rate = {10, 1s}, .burst = 20}}}});
//   quota::gateway::RuleRegistry registry(*rules);
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/inlined_vector.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "quota/detail/keyed_states.hpp"
#include "quota/detail/mutex.hpp"
#include "quota/gateway/key_state.hpp"
#include "quota/gateway/metrics.hpp"
#include "quota/gateway/rule_spec.hpp"
#include "quota/gateway/store_key.hpp"
#include "quota/units.hpp"

namespace quota::gateway {

// A validated rule inside a RuleSet.
struct Rule {
  std::string name{};
  Level level = Level::kTenant;
  RulePolicy policy{};
  bool shadow = false;
  std::shared_ptr<RuleCounters> counters{};  // null when the set was built without Metrics
};

// One budget a request must pass.
struct Check {
  const Rule* rule = nullptr;
  StoreKey key{};
};

class RuleSet {
 public:
  // Checks everything up front (ids, names, bounds, duplicate rules, unknown routes, a
  // route cost that can never fit its rule's capacity) and names the offending entry.
  static absl::StatusOr<std::shared_ptr<const RuleSet>> create(RuleSetSpec spec,
                                                               Metrics* metrics = nullptr) {
    auto set = std::shared_ptr<RuleSet>(new RuleSet());
    set->version_ = spec.version;
    if (spec.routes.empty()) return absl::InvalidArgumentError("rule set: no route classes");
    for (std::size_t i = 0; i < spec.routes.size(); ++i) {
      RouteClass& r = spec.routes[i];
      const std::string where = absl::StrFormat("routes[%d]", i);
      if (auto s = check_name(r.name, "route name"); !s.ok()) return annotate(s, where);
      if (auto s = validate_amount(r.cost, "cost"); !s.ok()) return annotate(s, where);
      if (r.fail_mode == FailMode::kOpen) {
        if (auto s = r.emergency.validate(); !s.ok()) return annotate(s, where);
        if (r.cost > r.emergency.burst) {
          return absl::InvalidArgumentError(absl::StrFormat(
              "%s: cost %d exceeds emergency.burst %d: the route could never fail open", where,
              r.cost, r.emergency.burst));
        }
      }
      if (!set->routes_.emplace(r.name, r).second) {
        return absl::InvalidArgumentError(
            absl::StrFormat("%s: route class \"%s\" listed twice", where, r.name));
      }
    }
    for (std::size_t i = 0; i < spec.rules.size(); ++i) {
      RuleSpec& r = spec.rules[i];
      const std::string where = absl::StrFormat("rules[%d]", i);
      if (auto s = check_name(r.name, "rule name"); !s.ok()) return annotate(s, where);
      auto route = set->routes_.find(r.route);
      if (route == set->routes_.end()) {
        return absl::InvalidArgumentError(
            absl::StrFormat("%s: unknown route class \"%s\"", where, r.route));
      }
      if (auto s = detail::validate(r.policy); !s.ok()) return annotate(s, where);
      if (route->second.cost > detail::capacity(r.policy)) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "%s: route \"%s\" costs %d units but the policy holds only %d: it could never pass",
            where, r.route, route->second.cost, detail::capacity(r.policy)));
      }
      std::string scope;
      if (r.level == Level::kGlobal) {
        if (!r.tenant.empty() || !r.plan.empty()) {
          return absl::InvalidArgumentError(
              absl::StrFormat("%s: a global rule names no tenant or plan", where));
        }
      } else if (r.tenant.empty() == r.plan.empty()) {
        return absl::InvalidArgumentError(
            absl::StrFormat("%s: set exactly one of tenant and plan", where));
      } else if (!r.tenant.empty()) {
        if (auto s = check_id(r.tenant, "tenant"); !s.ok()) return annotate(s, where);
        scope = "t:" + r.tenant;
      } else {
        if (auto s = check_name(r.plan, "plan"); !s.ok()) return annotate(s, where);
        scope = "p:" + r.plan;
      }
      Rule rule{.name = r.name,
                .level = r.level,
                .policy = r.policy,
                .shadow = r.shadow,
                .counters = nullptr};
      if (metrics != nullptr) {
        auto c = metrics->counters(
            {.rule = r.name, .route = r.route, .level = std::string(to_string(r.level))});
        if (!c.ok()) return c.status();
        rule.counters = *c;
      }
      if (!set->rules_.emplace(rule_key(r.level, scope, r.route), std::move(rule)).second) {
        return absl::InvalidArgumentError(
            absl::StrFormat("%s: a %s rule for %s on route \"%s\" is already defined", where,
                            to_string(r.level), scope.empty() ? "everyone" : scope, r.route));
      }
    }
    return std::shared_ptr<const RuleSet>(std::move(set));
  }

  std::uint64_t version() const { return version_; }

  // The route class, or InvalidArgument for a class not on the whitelist.
  absl::StatusOr<const RouteClass*> route(std::string_view name) const {
    auto it = routes_.find(quota::detail::to_absl(name));
    if (it == routes_.end()) {
      if (auto s = check_name(name, "route class"); !s.ok()) return s;
      return absl::InvalidArgumentError(
          absl::StrFormat("unknown route class \"%s\" (not on the rule set's whitelist)",
                          quota::detail::to_absl(name)));
    }
    return &it->second;
  }

  // The rule of `level` for this identity and route: the tenant's own, else its plan's;
  // null when there is none. Allocates nothing.
  const Rule* find(Level level, const Identity& who, std::string_view route) const {
    if (level == Level::kGlobal) return lookup(level, "", "", route);
    if (const Rule* own = lookup(level, "t:", who.tenant, route)) return own;
    return lookup(level, "p:", who.plan, route);
  }

  // The budgets a request must pass, from the narrowest (user) to the widest (global).
  // InvalidArgument for a malformed identity or an unknown route; NotFound when no
  // tenant-level rule applies (a tenant must have a budget: no rule is not "unlimited").
  absl::StatusOr<CheckVector<Check>> plan(const Identity& who, std::string_view route) const {
    if (auto s = check_id(who.tenant, "tenant"); !s.ok()) return s;
    if (auto s = check_name(who.plan, "plan"); !s.ok()) return s;
    if (!who.user.empty()) {
      if (auto s = check_id(who.user, "user"); !s.ok()) return s;
    }
    auto rc = this->route(route);
    if (!rc.ok()) return rc.status();
    CheckVector<Check> checks;
    if (!who.user.empty()) {
      if (const Rule* u = find(Level::kUser, who, route)) {
        checks.push_back({u, StoreKey{"{", who.tenant, "}", route, "/", who.user}});
      }
    }
    const Rule* t = find(Level::kTenant, who, route);
    if (t == nullptr) {
      return absl::NotFoundError(
          absl::StrFormat("no tenant rule for tenant \"%s\" (plan \"%s\") on route \"%s\"",
                          quota::detail::to_absl(who.tenant), quota::detail::to_absl(who.plan),
                          quota::detail::to_absl(route)));
    }
    checks.push_back({t, StoreKey{"{", who.tenant, "}", route}});
    if (const Rule* g = find(Level::kGlobal, who, route)) {
      checks.push_back({g, StoreKey{"{~global}", route}});
    }
    return checks;
  }

 private:
  RuleSet() = default;

  static absl::Status annotate(const absl::Status& s, const std::string& where) {
    return absl::Status(s.code(), absl::StrCat(where, ": ", s.message()));
  }

  // The rules' map key: "<level digit><scope> <route>" (scope "", "t:<tenant>" or
  // "p:<plan>"). Unambiguous: no id or name contains a space.
  static constexpr std::size_t kMaxRuleKeyBytes = 1 + 2 + kMaxIdBytes + 1 + kMaxNameBytes;
  static std::string rule_key(Level level, std::string_view scope, std::string_view route) {
    return absl::StrCat(static_cast<int>(level), quota::detail::to_absl(scope), " ",
                        quota::detail::to_absl(route));
  }

  // Looks up the rule of (level, kind + id, route), the key built in place: no
  // allocation on the decision path. An id or route too long for any rule has none.
  const Rule* lookup(Level level, std::string_view kind, std::string_view id,
                     std::string_view route) const {
    if (kind.size() + id.size() > 2 + kMaxIdBytes || route.size() > kMaxNameBytes) return nullptr;
    std::array<char, kMaxRuleKeyBytes> buf;
    std::size_t n = 0;
    buf[n++] = static_cast<char>('0' + static_cast<int>(level));
    for (std::string_view part : {kind, id, std::string_view(" "), route}) {
      std::copy(part.begin(), part.end(), buf.begin() + n);
      n += part.size();
    }
    auto it = rules_.find(absl::string_view(buf.data(), n));
    return it == rules_.end() ? nullptr : &it->second;
  }

  std::uint64_t version_ = 0;
  absl::flat_hash_map<std::string, RouteClass> routes_;
  absl::flat_hash_map<std::string, Rule> rules_;
};

// The current rule set, swapped atomically. Thread-safe. `current()` copies a shared_ptr
// under a mutex held only for the copy; `publish()` swaps in a set built beforehand, so
// readers never wait for a reload to be built, and a reader keeps the set it took until
// it drops it: no decision ever sees a half-built set. Versions must increase.
class RuleRegistry {
 public:
  explicit RuleRegistry(std::shared_ptr<const RuleSet> initial) : current_(std::move(initial)) {}

  // The set in force now. Hold the returned pointer for the whole request.
  std::shared_ptr<const RuleSet> current() const {
    quota::detail::MutexLock lock(mu_);
    return current_;
  }

  // Makes `next` current. FailedPrecondition unless its version is greater than the
  // current one (versions identify states' parameters: they must not be reused).
  absl::Status publish(std::shared_ptr<const RuleSet> next) {
    if (next == nullptr) return absl::InvalidArgumentError("publish: null rule set");
    std::shared_ptr<const RuleSet> old;  // released outside the lock
    quota::detail::MutexLock lock(mu_);
    if (current_ != nullptr && next->version() <= current_->version()) {
      return absl::FailedPreconditionError(
          absl::StrFormat("publish: version %d is not greater than the current %d", next->version(),
                          current_->version()));
    }
    old = std::exchange(current_, std::move(next));
    return absl::OkStatus();
  }

 private:
  mutable quota::detail::Mutex mu_;
  std::shared_ptr<const RuleSet> current_ ABSL_GUARDED_BY(mu_);
};

}  // namespace quota::gateway
