// quota/redis/gateway_policy_args.hpp — the packed policy arguments GatewayStore sends,
// each policy checked and packed once.
//
// A gateway script call carries each level's policy as one 35-byte argument
// (GatewayTwin::params, twin/gateway_codec.hpp): its range checked and its terms packed (a
// gcd, 128-bit products). Rule sets are immutable and hold few distinct policies, so
// `GatewayPolicyArgCache` does that once per policy VALUE (its kind and parameters, not
// its address: a rule set freed and another built at the same address must not hit) and
// later calls copy the 35 bytes.
//
// Guarantees: `append` appends exactly GatewayTwin::params(policy), or returns its error
// (errors are not kept: an out-of-range policy gets the error on every call). Entries are
// never erased; past kMaxCachedPolicies distinct policies (many reloads, each with new
// parameters) new ones are checked and packed per call instead. Thread safety: `append`
// may be called from any thread (one mutex around the map's look-up and insert).
//
//   quota::redis::GatewayPolicyArgCache cache;
//   std::vector<std::string> args;
//   if (auto s = cache.append(policy, args); !s.ok()) return s;  // args.back(): 35 bytes
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/node_hash_map.h"
#include "absl/status/status.h"
#include "quota/detail/mutex.hpp"
#include "quota/gateway/key_state.hpp"
#include "quota/redis/twin/gateway_codec.hpp"

namespace quota::redis {

class GatewayPolicyArgCache {
 public:
  // What identifies a policy's arguments: its kind and parameters (the value, not the
  // address — a rule set freed and another built at the same address must not hit).
  using PolicyKey = std::tuple<std::size_t, std::int64_t, std::int64_t, std::int64_t>;
  static PolicyKey policy_key(const gateway::RulePolicy& policy) {
    return std::visit(
        [&](const auto& w) -> PolicyKey {
          if constexpr (std::is_same_v<std::decay_t<decltype(w)>, TokenBucket>) {
            return {policy.index(), w.rate.units, w.rate.per.count(), w.burst};
          } else {
            return {policy.index(), w.limit, w.window.count(), 0};
          }
        },
        policy);
  }

  // Appends `policy`'s argument to `args`. Rule sets are immutable and hold few distinct
  // policies, so each one's range check and packing (a gcd, 128-bit products) is done
  // once and kept: later decisions copy the 35 bytes. Entries are never erased, so a
  // pointer taken under the lock stays valid; past kMaxCachedPolicies distinct policies
  // (many reloads, each with new parameters) new ones are checked and packed per call
  // instead. Errors are not kept: an out-of-range policy gets params()'s error on every
  // call.
  absl::Status append(const gateway::RulePolicy& policy, std::vector<std::string>& args) const {
    const PolicyKey key = policy_key(policy);
    const GatewayTwin::PolicyArgs* cached = nullptr;
    {
      quota::detail::MutexLock lock(params_mu_);
      auto it = params_cache_.find(key);
      if (it != params_cache_.end()) cached = &it->second;
    }
    if (cached == nullptr) {
      auto p = GatewayTwin::params(policy);
      if (!p.ok()) return p.status();
      quota::detail::MutexLock lock(params_mu_);
      if (params_cache_.size() >= kMaxCachedPolicies) {
        args.push_back(*std::move(p));
        return absl::OkStatus();
      }
      cached = &params_cache_.try_emplace(key, *std::move(p)).first->second;
    }
    args.push_back(*cached);
    return absl::OkStatus();
  }

  static constexpr std::size_t kMaxCachedPolicies = 4096;

 private:
  mutable quota::detail::Mutex params_mu_;
  mutable absl::node_hash_map<PolicyKey, GatewayTwin::PolicyArgs> params_cache_
      ABSL_GUARDED_BY(params_mu_);
};

}  // namespace quota::redis
