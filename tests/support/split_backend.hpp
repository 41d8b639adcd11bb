// tests/support/split_backend.hpp — a gateway backend that decides the user and
// tenant levels in this process and the global level at a shared authority.
//
// `SplitBackend<Local, Global>` satisfies the gateway's backend concept
// (quota/gateway/backend.hpp). A level whose key is in the global scope ("{~global}...")
// goes to `global` (e.g. a quota::redis::GatewayStore shared by every gateway process);
// every other level to `local` (e.g. a StoreBackend over this process's own store). It
// is the shape of a deployment where tenants are routed to one gateway process each
// (sticky by tenant), so that process alone enforces their limits, and only the budget
// every tenant shares is at the authority: with the global level leased
// (leased_backend.hpp) a decision then makes no round trip at all besides grants.
//
// Guarantees:
//   - All or nothing across levels, as one backend: the levels are decided in order, one
//     call per run of levels of the same side; when a later run denies (not in shadow) or
//     fails, what the earlier runs deducted is refunded through their side (a failed
//     refund keeps the deduction: an under-admission, never an over-admission).
//   - Grants (LeasedBackend's decisions of `units` on the global key) take the global
//     side's idempotent path: `decide_attempt` is forwarded when every level is global,
//     so a retried grant is replayed at the authority, not taken twice. An attempt that
//     spans both sides is refused (InvalidArgument): attempts are then this gateway's.
//   - refund and charge go to the side of their key.
//
// Thread safety: as the two backends.
//
//   quota::LocalStore<quota::gateway::KeyPolicy> tenants;
//   quota::gateway::StoreBackend local(tenants);
//   quota::testing::SplitBackend split(local, redis_gateway_store);
//   quota::gateway::LeasedBackend leased(split, ledger);
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "quota/gateway/backend.hpp"

namespace quota::testing {

namespace detail {
// The global side's attempt type, when it records attempts at the authority (Redis).
template <class Global>
struct SplitAttempt {};
template <class Global>
requires requires { typename Global::Attempt; }
struct SplitAttempt<Global> {
  using Attempt = typename Global::Attempt;
};
}  // namespace detail

template <gateway::GatewayBackend Local, gateway::GatewayBackend Global>
class SplitBackend : public detail::SplitAttempt<Global> {
 public:
  // Both must outlive the backend.
  SplitBackend(Local& local, Global& global) : local_(local), global_(global) {}

  static bool is_global(std::string_view key) { return key.starts_with("{~global}"); }

  absl::StatusOr<gateway::LevelsResult> decide(std::span<const gateway::LevelCheck> levels,
                                               std::uint64_t version, Nanos now) {
    gateway::LevelsResult out{.parts = {}, .time = now};
    for (std::size_t i = 0; i < levels.size();) {
      const bool global = is_global(levels[i].key);
      std::size_t end = i + 1;
      while (end < levels.size() && is_global(levels[end].key) == global) ++end;
      auto r = global ? global_.decide(levels.subspan(i, end - i), version, now)
                      : local_.decide(levels.subspan(i, end - i), version, now);
      if (!r.ok()) {
        give_back(levels.first(i), out, version, now);
        return r.status();
      }
      const bool stopped =
          r->parts.size() < end - i || (!r->parts.back().allowed && !levels[end - 1].shadow);
      if (stopped) {
        give_back(levels.first(i), out, version, now);  // the run gave back its own
        for (const Decision& d : r->parts) out.parts.push_back(d);
        return out;
      }
      for (const Decision& d : r->parts) out.parts.push_back(d);
      if (global) out.time = r->time;
      i = end;
    }
    return out;
  }

  template <class G = Global>
  requires requires { typename G::Attempt; }
  auto decide_attempt(std::span<const gateway::LevelCheck> levels, std::uint64_t version, Nanos now,
                      const typename G::Attempt& attempt)
      -> decltype(std::declval<G&>().decide_attempt(levels, version, now, attempt)) {
    for (const gateway::LevelCheck& l : levels) {
      if (!is_global(l.key)) {
        return absl::InvalidArgumentError("split backend: an attempt must be global levels only");
      }
    }
    return global_.decide_attempt(levels, version, now, attempt);
  }

  absl::StatusOr<MicroUnits> refund(const gateway::RulePolicy& policy, std::uint64_t version,
                                    std::string_view key, std::int64_t units, Nanos spent_at,
                                    Nanos now) {
    return is_global(key) ? global_.refund(policy, version, key, units, spent_at, now)
                          : local_.refund(policy, version, key, units, spent_at, now);
  }

  absl::StatusOr<MicroUnits> charge(const gateway::RulePolicy& policy, std::uint64_t version,
                                    std::string_view key, std::int64_t units, Nanos now) {
    return is_global(key) ? global_.charge(policy, version, key, units, now)
                          : local_.charge(policy, version, key, units, now);
  }

 private:
  // Refunds the levels of `done` that `out` says were admitted (shadow levels deduct
  // too when allowed).
  void give_back(std::span<const gateway::LevelCheck> done, const gateway::LevelsResult& out,
                 std::uint64_t version, Nanos now) {
    for (std::size_t k = 0; k < done.size() && k < out.parts.size(); ++k) {
      if (!out.parts[k].allowed) continue;
      (void)refund(*done[k].policy, version, done[k].key, done[k].cost, out.time, now);
    }
  }

  Local& local_;
  Global& global_;
};

}  // namespace quota::testing
