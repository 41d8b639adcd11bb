// quota/limiter.hpp — a policy, a store and a clock put together.
//
// `Limiter<Policy, Store, Clock>` is what most callers hold: `acquire(key, cost)` reads
// the clock once, validates the key and asks the store to apply the policy atomically.
// It is built with `create`, which rejects invalid policy parameters with a message
// naming the field and the bound, so a Limiter that exists is valid.
//
// Keys: 1 to kMaxLimiterKeyBytes bytes; a key outside that gets InvalidArgument and touches no
// state. Build keys from authenticated identity (tenant id and a whitelisted route
// class), never from raw URLs or client-supplied headers: the gateway layer does this.
//
// Thread safety: that of the store (ShardedStore and RedisStore: any thread;
// LocalStore: one thread).
//
//   using namespace std::chrono_literals;
//   auto limiter = quota::Limiter<quota::TokenBucket, quota::ShardedStore>::create(
//       {.rate = {.units = 100, .per = 1s}, .burst = 20});
//   absl::StatusOr<quota::Decision> d = limiter->acquire("tenant-7:read", 1);
//   if (d.ok() && !d->allowed) { /* 429, Retry-After from d->retry_after */ }
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string_view>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_format.h"
#include "quota/clock.hpp"
#include "quota/decision.hpp"
#include "quota/policy/policy.hpp"
#include "quota/store/sharded_store.hpp"
#include "quota/store/store.hpp"

namespace quota {

// The longest key, in bytes, that limiters accept.
inline constexpr std::size_t kMaxLimiterKeyBytes = 256;

// OK for a key of 1..kMaxLimiterKeyBytes bytes, InvalidArgument otherwise.
inline absl::Status validate_key(std::string_view key) {
  if (key.empty()) return absl::InvalidArgumentError("key is empty");
  if (key.size() > kMaxLimiterKeyBytes) {
    return absl::InvalidArgumentError(
        absl::StrFormat("key is %d bytes; the bound is %d bytes", key.size(), kMaxLimiterKeyBytes));
  }
  return absl::OkStatus();
}

template <Policy P, template <Policy> class Store = ShardedStore, Clock C = SteadyClock>
requires StateStore<Store<P>>
class Limiter {
 public:
  using policy_type = P;
  using store_type = Store<P>;
  using clock_type = C;

  // Validates `policy` and builds the store with `options`.
  template <class Options = StoreOptions>
  static absl::StatusOr<Limiter> create(P policy, Options options = {}, C clock = {}) {
    if (auto s = policy.validate(); !s.ok()) return s;
    return Limiter(std::move(policy), std::make_unique<store_type>(std::move(options)),
                   std::move(clock));
  }

  // Spends `cost` units of `key`'s budget if it has them. A denial is a Decision; an
  // error status means nothing was decided and nothing deducted (invalid key, store
  // full or unreachable).
  absl::StatusOr<Decision> acquire(std::string_view key, std::int64_t cost = 1) {
    if (auto s = validate_key(key); !s.ok()) return s;
    return store_->apply(policy_, key, clock_.now(), cost);
  }

  const P& policy() const { return policy_; }
  store_type& store() { return *store_; }
  const C& clock() const { return clock_; }

 private:
  Limiter(P policy, std::unique_ptr<store_type> store, C clock)
      : policy_(std::move(policy)), store_(std::move(store)), clock_(std::move(clock)) {}

  P policy_;
  std::unique_ptr<store_type> store_;
  C clock_;
};

}  // namespace quota
