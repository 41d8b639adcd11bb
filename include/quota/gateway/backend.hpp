// quota/gateway/backend.hpp — where a gateway's budgets live, and what it asks of them.
//
// The Gateway (gateway.hpp) decides every budget level of a request through a backend:
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
//       The settle operations of key_state.hpp on one key.
//
// Two backends:
//   - StoreBackend<Store>, below: any in-process store of KeyStates with `update`
//     (LocalStore<KeyPolicy>, ShardedStore<KeyPolicy>). Each level is one atomic update;
//     across levels, all-or-nothing is by exact give-back: a level deducted before a
//     later one denied gets the same cost back, quoting the state's own time of the
//     deduction (so a window kind takes it back from the window it was counted in, the
//     log from the event it logged, even if other requests came between). Between the
//     deduction and the give-back a concurrent request may see that level lower by the
//     cost and be denied — never admitted beyond any level's envelope.
//   - quota::redis::GatewayStore (redis/gateway_store.hpp): the levels of one tenant in
//     ONE Lua script (atomic all-or-nothing, no give-back needed); the global level in
//     its own slot, given back by a second script when it denies.
//
// Thread safety: that of the store.
#pragma once

#include <algorithm>
#include <concepts>
#include <cstdint>
#include <span>
#include <string_view>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "quota/decision.hpp"
#include "quota/gateway/key_state.hpp"
#include "quota/gateway/rules.hpp"
#include "quota/store/store.hpp"
#include "quota/units.hpp"

namespace quota::gateway {

// One budget a request must pass: its policy, its store key, whether it is in shadow, and
// what the request costs against it (whole units).
struct LevelCheck {
  const RulePolicy* policy = nullptr;
  std::string_view key{};
  bool shadow = false;
  std::int64_t cost = 1;
};

// Inline storage for kInlineChecks decisions (rules.hpp): a decision allocates nothing here.
struct LevelsResult {
  CheckVector<Decision> parts{};  // one per level decided, in order
  Nanos time{0};                  // the backend's time of the decision
};

template <class B>
concept GatewayBackend = requires(B& b, std::span<const LevelCheck> levels,
                                  const RulePolicy& policy, std::string_view key,
                                  std::uint64_t version, std::int64_t units, Nanos t) {
  { b.decide(levels, version, t) } -> std::same_as<absl::StatusOr<LevelsResult>>;
  { b.refund(policy, version, key, units, t, t) } -> std::same_as<absl::StatusOr<MicroUnits>>;
  { b.charge(policy, version, key, units, t) } -> std::same_as<absl::StatusOr<MicroUnits>>;
};

// An in-process store of KeyStates (LocalStore<KeyPolicy>, ShardedStore<KeyPolicy>).
template <class S>
concept InProcessKeyStore = has_update<S> && std::same_as<typename S::policy_type, KeyPolicy>;

// The in-process backend over such a store (see the header comment).
template <InProcessKeyStore Store>
class StoreBackend {
 public:
  explicit StoreBackend(Store& store) : store_(store) {}

  absl::StatusOr<LevelsResult> decide(std::span<const LevelCheck> levels, std::uint64_t version,
                                      Nanos now) {
    LevelsResult out{.parts = {}, .time = now};
    CheckVector<Taken> taken;  // levels deducted so far
    for (std::size_t i = 0; i < levels.size(); ++i) {
      const KeyPolicy kp{.policy = levels[i].policy, .version = version};
      // The state's own time after the decision is when the cost was counted: the window
      // or the log event a give-back must take it from.
      auto d = store_.update(kp, levels[i].key, now, [&](KeyState& s) {
        const Decision decided = kp.apply(s, now, levels[i].cost);
        return std::pair<Decision, Nanos>{decided, Nanos{detail::latest_time(s)}};
      });
      if (!d.ok()) {
        give_back(levels, taken, version, now);
        return d.status();
      }
      out.parts.push_back(d->first);
      if (d->first.allowed) {
        taken.push_back({.level = i, .spent_at = d->second});
      } else if (!levels[i].shadow) {
        give_back(levels, taken, version, now);
        return out;
      }
    }
    return out;
  }

  absl::StatusOr<MicroUnits> refund(const RulePolicy& policy, std::uint64_t version,
                                    std::string_view key, std::int64_t units, Nanos spent_at,
                                    Nanos now) {
    const KeyPolicy kp{.policy = &policy, .version = version};
    return store_.update(kp, key, now,
                         [&](KeyState& s) { return gateway::refund(s, units, spent_at, now); });
  }

  absl::StatusOr<MicroUnits> charge(const RulePolicy& policy, std::uint64_t version,
                                    std::string_view key, std::int64_t units, Nanos now) {
    const KeyPolicy kp{.policy = &policy, .version = version};
    return store_.update(kp, key, now, [&](KeyState& s) { return gateway::charge(s, units, now); });
  }

 private:
  struct Taken {
    std::size_t level;
    Nanos spent_at;  // the state's time when the cost was counted
  };

  // Gives each level in `taken` its cost back: exactly what was deducted (capped).
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

  Store& store_;
};

// What a Gateway can be built on: a backend, or an in-process store of KeyStates.
template <class S>
concept GatewayStorage = GatewayBackend<S> || InProcessKeyStore<S>;

namespace detail {

// The backend a Gateway<Store> uses: the store itself when it is a backend (Redis), else
// a StoreBackend over it.
template <class Store>
struct backend_for {
  using type = StoreBackend<Store>;
};
template <GatewayBackend Store>
struct backend_for<Store> {
  using type = Store&;
};

}  // namespace detail

}  // namespace quota::gateway
