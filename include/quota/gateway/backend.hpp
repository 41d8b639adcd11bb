// quota/gateway/backend.hpp — where a gateway's budgets live, and what it asks of them.
//
// The Gateway (gateway.hpp) decides every budget level of a request through a Backend, an
// interface chosen at run time (so one Gateway serves in process, on Redis, leased, ...):
//
//   decide(levels, version, now) → LevelsResult
//       Decides the levels in order (user → tenant → global), each with its rule's policy
//       and its own cost under rule-set `version` (states written under other parameters are
//       converted first: key_state.hpp). It stops at the first level that denies and is not in
//       shadow mode. All or nothing: when it stops on a denial, no level keeps a
//       deduction. A shadow level that would deny deducts nothing and does not stop.
//       `parts` holds one decision per level decided (so the last one is the denier when
//       it stopped early); `time` is the time the backend decided at — what a later
//       refund must quote as `spent_at`.
//   refund(policy, version, key, units, spent_at, now) → micro-units given back
//   charge(policy, version, key, units, now)           → micro-units left as debt
//       The settle operations of key_state.hpp on one key (a LevelKey: the key with the
//       layout it was decided with, or a key given by hand).
//   decide_attempt(levels, version, now, attempt) → AttemptResult
//       decide() with the attempt recorded in the same call, for a backend whose
//       shares_attempts() is true (Redis: a retry is replayed at any process).
//
// Two backends over stores:
//   - StoreBackend<Store>, below: any in-process store of KeyStates with `update_all`
//     (LocalStore<KeyPolicy>, ShardedStore<KeyPolicy>). The levels of one scope — a
//     tenant's user and tenant budgets, every named limit of them — are ONE atomic
//     update_all: a level deducted before a later one of the scope denied gets the same
//     cost back under the same locks, so no call sees it. Across scopes (the global
//     one), all or nothing is by the same exact give-back after the call: between them a
//     concurrent request may see a budget lower by the cost and be denied — never
//     admitted beyond any budget's envelope. A give-back quotes the state's own time of
//     the deduction, so a window kind takes the cost back from the window it was counted
//     in and the log from the event it logged, even if other requests came between.
//   - quota::redis::GatewayStore (redis/gateway_store.hpp): the levels of one tenant in
//     ONE Lua script (atomic all-or-nothing, no give-back needed); the global level in
//     its own slot, given back by a second script when it denies.
// And a decorator of either: LeasedBackend<Inner> (leased_backend.hpp) decides the levels
// whose rule is leased from grants this process holds, the others through Inner.
// Every backend (these, and the region ones in region/) decides its levels in runs with
// decide_runs() below: the one loop for all or nothing across runs.
//
// Thread safety: that of the store.
#pragma once

#include <algorithm>
#include <concepts>
#include <cstdint>
#include <optional>
#include <span>
#include <string_view>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "quota/decision.hpp"
#include "quota/detail/keyed_states.hpp"
#include "quota/gateway/key_state.hpp"
#include "quota/gateway/rules/rules.hpp"
#include "quota/gateway/store_key.hpp"
#include "quota/store/store.hpp"
#include "quota/units.hpp"

namespace quota::gateway {

// One budget a request must pass: its policy, its store key, whether it is in shadow, and
// what the request costs against it (whole units); `rule` (the Gateway sets it) is the
// rule the level belongs to, for backends that need more than its policy (its lease:
// leased_backend.hpp). `layout` (the Gateway sets it, from StoreKey::level) says where
// the key's scope and record are, so no backend parses the key; a level built by hand
// without one is read from its key (scope_of, redis::layout_of).
struct LevelCheck {
  const RulePolicy* policy = nullptr;
  std::string_view key{};
  bool shadow = false;
  std::int64_t cost = 1;
  const Rule* rule = nullptr;
  std::optional<KeyLayout> layout{};
};

// The scope of a level: "{acme}", "{~global}", or a key without braces (store_key.hpp).
inline std::string_view scope_of(const LevelCheck& l) {
  return l.layout.has_value() ? l.layout->scope(l.key) : scope_of(l.key);
}

// Inline storage for kInlineChecks decisions (rules.hpp): a decision allocates nothing here.
struct LevelsResult {
  CheckVector<Decision> parts{};  // one per level decided, in order
  Nanos time{0};                  // the backend's time of the decision
};

// What decide_attempt is given (the Gateway fills it): the request's attempt, whose record
// a backend that shares attempts keeps beside the budget of the first level (the user's
// or the tenant's: one slot, the tenant's).
struct AttemptRequest {
  std::string_view id;            // 1..128 bytes (check_attempt_id, quota/attempts.hpp)
  std::string_view fingerprint;   // the request's keys and costs
  std::optional<Nanos> deadline;  // the caller's, kept with the record
  Nanos ttl{0};                   // how long the record is kept
};

// What decide_attempt answers: the levels decided now, or the recorded decision.
struct AttemptResult {
  LevelsResult levels;
  bool replayed = false;          // the recorded decision, nothing deducted by this call
  std::optional<Nanos> deadline;  // the attempt's, as recorded by the call that decided it
};

// The interface every backend implements (see the header comment); the Gateway holds one,
// chosen at run time. decide_attempt is called only when shares_attempts() is true: the
// backend keeps attempt records itself, shared by every process deciding on it (Redis),
// recorded in the call that decides. Otherwise the Gateway keeps them (AttemptCache).
class Backend {
 public:
  virtual ~Backend() = default;
  virtual absl::StatusOr<LevelsResult> decide(std::span<const LevelCheck> levels,
                                              std::uint64_t version, Nanos now) = 0;
  virtual absl::StatusOr<MicroUnits> refund(const RulePolicy& policy, std::uint64_t version,
                                            LevelKey key, std::int64_t units, Nanos spent_at,
                                            Nanos now) = 0;
  virtual absl::StatusOr<MicroUnits> charge(const RulePolicy& policy, std::uint64_t version,
                                            LevelKey key, std::int64_t units, Nanos now) = 0;
  virtual bool shares_attempts() const { return false; }
  virtual absl::StatusOr<AttemptResult> decide_attempt(std::span<const LevelCheck> /*levels*/,
                                                       std::uint64_t /*version*/, Nanos /*now*/,
                                                       const AttemptRequest& /*attempt*/) {
    return absl::UnimplementedError("this backend keeps no attempt records");
  }
};

// A backend type (for the decorators that wrap one: LeasedBackend, the region backends).
template <class B>
concept GatewayBackend = std::derived_from<B, Backend>;

// All or nothing over runs of levels, the one loop every backend decides with. A backend
// decides its levels in runs (a scope's levels in one atomic store step, one Redis slot
// per script call, one leased level from its grants, ...), each run all or nothing by
// itself; across runs, what earlier runs deducted is given back when a later run stops
// at an enforcing denial or fails.
//
// `decide_run(begin, end, parts, taken)` decides levels [begin, end) (end = run_end(begin)):
// it appends to `parts` one decision per level decided (fewer than the run's levels when
// it stopped early) and to `taken` what a give-back needs for each level it deducted, and
// returns a RunStep. decide_runs() stops at the first run that decided fewer levels than
// it holds or whose last decision is an enforcing denial, and returns true then; what
// that run added to `taken` is dropped (the run gave back its own). On an error it drops
// the failing run's `taken` too and returns the error. The caller gives back `taken`.
struct RunStep {
  bool redo = false;            // nothing decided: decide the run that starts here again
  std::optional<Nanos> time{};  // the run's time of decision, for LevelsResult::time
};

template <class Taken, class RunEnd, class DecideRun>
absl::StatusOr<bool> decide_runs(std::span<const LevelCheck> levels, std::size_t begin,
                                 LevelsResult& out, CheckVector<Taken>& taken, RunEnd&& run_end,
                                 DecideRun&& decide_run) {
  for (std::size_t b = begin; b < levels.size();) {
    const std::size_t e = run_end(b);
    const std::size_t taken_before = taken.size();
    const std::size_t parts_before = out.parts.size();
    absl::StatusOr<RunStep> step = decide_run(b, e, out.parts, taken);
    if (!step.ok() || step->redo) {
      taken.resize(taken_before);
      if (!step.ok()) return step.status();
      continue;
    }
    if (step->time.has_value()) out.time = *step->time;
    const bool stopped = out.parts.size() - parts_before < e - b ||
                         (!out.parts.back().allowed && !levels[e - 1].shadow);
    if (stopped) {
      taken.resize(taken_before);
      return true;
    }
    b = e;
  }
  return false;
}

// decide_runs() over all of `levels`, LevelsResult::time `now` unless a run says, and
// `give_back(std::span<const Taken>)` called when it stops or fails.
template <class Taken, class RunEnd, class DecideRun, class GiveBack>
absl::StatusOr<LevelsResult> decide_all_or_nothing(std::span<const LevelCheck> levels, Nanos now,
                                                   RunEnd&& run_end, DecideRun&& decide_run,
                                                   GiveBack&& give_back) {
  LevelsResult out{.parts = {}, .time = now};
  CheckVector<Taken> taken;
  auto stopped = decide_runs(levels, 0, out, taken, run_end, decide_run);
  if (!stopped.ok() || *stopped) give_back(std::span<const Taken>(taken));
  if (!stopped.ok()) return stopped.status();
  return out;
}

// An in-process store of KeyStates (LocalStore<KeyPolicy>, ShardedStore<KeyPolicy>).
template <class S>
concept InProcessKeyStore = has_update<S> && std::same_as<typename S::policy_type, KeyPolicy> &&
    requires(S& store, std::span<const KeyPolicy> policies, std::span<const std::string_view> keys,
             Nanos now) {
  store.update_all(policies, keys, now, [](quota::detail::OpenedStates<KeyPolicy>&) { return 0; });
};

// The in-process backend over such a store (see the header comment).
template <InProcessKeyStore Store>
class StoreBackend final : public Backend {
 public:
  explicit StoreBackend(Store& store) : store_(store) {}

  absl::StatusOr<LevelsResult> decide(std::span<const LevelCheck> levels, std::uint64_t version,
                                      Nanos now) override {
    // A run: the levels of one scope (a tenant's, or the global one).
    const auto run_end = [&](std::size_t begin) {
      std::size_t end = begin + 1;
      while (end < levels.size() && scope_of(levels[end]) == scope_of(levels[begin])) ++end;
      return end;
    };
    const auto decide_run = [&](std::size_t begin, std::size_t end, CheckVector<Decision>& parts,
                                CheckVector<Taken>& taken) -> absl::StatusOr<RunStep> {
      auto scope = decide_scope(levels.subspan(begin, end - begin), version, now);
      if (!scope.ok()) return scope.status();
      for (std::size_t i = 0; i < scope->parts.size(); ++i) {
        parts.push_back(scope->parts[i]);
        if (scope->parts[i].allowed)
          taken.push_back({.level = begin + i, .spent_at = scope->spent_at[i]});
      }
      return RunStep{};
    };
    return decide_all_or_nothing<Taken>(
        levels, now, run_end, decide_run,
        [&](std::span<const Taken> taken) { give_back(levels, taken, version, now); });
  }

  absl::StatusOr<MicroUnits> refund(const RulePolicy& policy, std::uint64_t version, LevelKey key,
                                    std::int64_t units, Nanos spent_at, Nanos now) override {
    const KeyPolicy kp{.policy = &policy, .version = version};
    return store_.update(kp, key.key, now,
                         [&](KeyState& s) { return gateway::refund(s, units, spent_at, now); });
  }

  absl::StatusOr<MicroUnits> charge(const RulePolicy& policy, std::uint64_t version, LevelKey key,
                                    std::int64_t units, Nanos now) override {
    const KeyPolicy kp{.policy = &policy, .version = version};
    return store_.update(kp, key.key, now,
                         [&](KeyState& s) { return gateway::charge(s, units, now); });
  }

 private:
  struct Taken {
    std::size_t level;
    Nanos spent_at;  // the state's time when the cost was counted
  };

  // Gives each level in `taken` its cost back: exactly what was deducted (capped), quoting
  // the state's own time of the deduction, so a window kind takes it back from the window
  // it was counted in and the log from the event it logged, even if other requests came
  // between.
  void give_back(std::span<const LevelCheck> levels, std::span<const Taken> taken,
                 std::uint64_t version, Nanos now) {
    for (const Taken& t : taken) {
      const LevelCheck& level = levels[t.level];
      const KeyPolicy kp{.policy = level.policy, .version = version};
      // The key was just written and is not idle, so it exists; an error here cannot
      // over-admit (the level simply keeps the deduction).
      (void)store_.update(kp, level.key, now, [&](KeyState& s) {
        return gateway::refund(s, level.cost, t.spent_at, now);
      });
    }
  }

  // The levels of one scope in one atomic step (Store::update_all): decided in order; at
  // the first enforcing denial the levels allowed before it get their cost back, under the
  // same locks, so no other call ever sees their deduction.
  struct ScopeResult {
    CheckVector<Decision> parts;
    CheckVector<Nanos> spent_at;  // per part: the state's time after it was decided
  };
  absl::StatusOr<ScopeResult> decide_scope(std::span<const LevelCheck> levels,
                                           std::uint64_t version, Nanos now) {
    CheckVector<KeyPolicy> policies;
    CheckVector<std::string_view> keys;
    for (const LevelCheck& l : levels) {
      policies.push_back({.policy = l.policy, .version = version});
      keys.push_back(l.key);
    }
    auto r = store_.update_all(
        policies, keys, now,
        [&](quota::detail::OpenedStates<KeyPolicy>& states) -> absl::StatusOr<ScopeResult> {
          ScopeResult r;
          CheckVector<KeyState*> decided;
          // On a denial or an error: the levels allowed so far get their cost back.
          const auto undo = [&] {
            for (std::size_t j = 0; j < decided.size(); ++j) {
              if (r.parts[j].allowed)
                gateway::refund(*decided[j], levels[j].cost, r.spent_at[j], now);
            }
          };
          for (std::size_t i = 0; i < levels.size(); ++i) {
            auto state = states[i];
            if (!state.ok()) {
              undo();
              return state.status();
            }
            decided.push_back(*state);
            r.parts.push_back(policies[i].apply(**state, now, levels[i].cost));
            r.spent_at.push_back(Nanos{detail::latest_time(**state)});
            if (r.parts.back().allowed || levels[i].shadow) continue;
            decided.pop_back();  // the denier deducted nothing
            undo();
            break;
          }
          return r;
        });
    if (!r.ok()) return r.status();
    return *std::move(r);
  }

  Store& store_;
};

}  // namespace quota::gateway
