// quota/region/scope_router.hpp — one gateway backend over two authorities: the global
// scope at a central one, every other scope at a regional one.
//
// `ScopeRouter<Regional, Central>` is a gateway backend (backend.hpp). A
// level whose store key is in the global scope ("{~global}...", store_key.hpp) is decided
// by `Central`; every other level (user and tenant budgets, "{tenant}...") by `Regional`.
// It is the inner backend of a RegionalBackend (regional_backend.hpp), where the central
// levels are leased, so `Central` is asked only for grants; on its own it sends every
// global decision across regions.
//
// Guarantees:
//   - Each authority decides its levels as it does alone (the levels of one scope in one
//     atomic step there). All or nothing across the two: a run of levels decided at one
//     authority before a later run denies (or fails) gets its cost back through that
//     authority's refund, quoting the time it reported — the same give-back StoreBackend
//     and GatewayStore do between scopes. A failure of either answers the request with
//     that status (kUnavailable: the route's fail mode), never an admission.
//   - `refund` and `charge` go to the authority of the key's scope.
//   - Attempts: when `Central` shares attempts (redis::GatewayStore: shares_attempts()),
//     `decide_attempt` forwards a decision whose levels are all central to it, so a
//     LeasedBackend over the router takes its grants idempotently by grant id at the
//     central authority. Attempts over levels of both authorities are refused
//     (kInvalidArgument): no authority could replay them alone.
//
// Thread safety: that of the two backends; the router keeps no state.
//
//   quota::gateway::StoreBackend regional(regional_store);   // or a redis::GatewayStore
//   quota::gateway::StoreBackend central(central_store);
//   quota::region::ScopeRouter router(regional, central);
//   auto r = router.decide(levels, version, now);   // {acme}read here, {~global}read there
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "quota/decision.hpp"
#include "quota/gateway/backend.hpp"
#include "quota/gateway/store_key.hpp"
#include "quota/units.hpp"

namespace quota::region {

// True for a level of the global scope: decided (and leased) at the central authority.
inline bool is_central(const gateway::LevelCheck& l) { return gateway::scope_of(l) == "{~global}"; }
// The same for a key alone (refund and charge name only the key).
inline bool is_central(std::string_view key) { return gateway::scope_of(key) == "{~global}"; }

template <gateway::GatewayBackend Regional, gateway::GatewayBackend Central>
class ScopeRouter final : public gateway::Backend {
 public:
  // Both backends must outlive the router.
  ScopeRouter(Regional& regional, Central& central) : regional_(regional), central_(central) {}

  absl::StatusOr<gateway::LevelsResult> decide(std::span<const gateway::LevelCheck> levels,
                                               std::uint64_t version, Nanos now) override {
    // A run: consecutive levels of one authority, decided by it all or nothing.
    const auto run_end = [&](std::size_t begin) {
      const bool central = is_central(levels[begin]);
      std::size_t end = begin + 1;
      while (end < levels.size() && is_central(levels[end]) == central) ++end;
      return end;
    };
    const auto decide_run =
        [&](std::size_t begin, std::size_t end, gateway::CheckVector<Decision>& parts,
            gateway::CheckVector<Run>& taken) -> absl::StatusOr<gateway::RunStep> {
      const auto run = levels.subspan(begin, end - begin);
      auto r = is_central(run.front()) ? central_.decide(run, version, now)
                                       : regional_.decide(run, version, now);
      if (!r.ok()) return r.status();
      for (std::size_t k = 0; k < r->parts.size(); ++k) {
        parts.push_back(r->parts[k]);
        if (r->parts[k].allowed) taken.push_back({.level = begin + k, .spent_at = r->time});
      }
      return gateway::RunStep{.redo = false, .time = r->time};
    };
    return gateway::decide_all_or_nothing<Run>(
        levels, now, run_end, decide_run,
        [&](std::span<const Run> taken) { give_back(levels, taken, version, now); });
  }

  absl::StatusOr<MicroUnits> refund(const gateway::RulePolicy& policy, std::uint64_t version,
                                    gateway::LevelKey key, std::int64_t units, Nanos spent_at,
                                    Nanos now) override {
    if (is_central(key.key)) return central_.refund(policy, version, key, units, spent_at, now);
    return regional_.refund(policy, version, key, units, spent_at, now);
  }

  absl::StatusOr<MicroUnits> charge(const gateway::RulePolicy& policy, std::uint64_t version,
                                    gateway::LevelKey key, std::int64_t units, Nanos now) override {
    if (is_central(key.key)) return central_.charge(policy, version, key, units, now);
    return regional_.charge(policy, version, key, units, now);
  }

  // The central authority's attempts (see the header comment), when it keeps them.
  bool shares_attempts() const override { return central_.shares_attempts(); }
  absl::StatusOr<gateway::AttemptResult> decide_attempt(
      std::span<const gateway::LevelCheck> levels, std::uint64_t version, Nanos now,
      const gateway::AttemptRequest& attempt) override {
    for (const gateway::LevelCheck& l : levels) {
      if (!is_central(l)) {
        return absl::InvalidArgumentError(
            "ScopeRouter: an attempt over regional levels; only central ones are recorded");
      }
    }
    return central_.decide_attempt(levels, version, now, attempt);
  }

 private:
  struct Run {
    std::size_t level;
    Nanos spent_at;
  };

  // All or nothing: each level in `taken` gets its cost back at its own authority. An
  // error here cannot over-admit: the level keeps the deduction.
  void give_back(std::span<const gateway::LevelCheck> levels, std::span<const Run> taken,
                 std::uint64_t version, Nanos now) {
    for (const Run& t : taken) {
      const gateway::LevelCheck& l = levels[t.level];
      (void)refund(*l.policy, version, l.key, l.cost, t.spent_at, now);
    }
  }

  Regional& regional_;
  Central& central_;
};

}  // namespace quota::region
