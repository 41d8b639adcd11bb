// quota/redis/lease_authority.hpp — Redis as the authority that hands out lease grants.
//
// Adapts RedisStore<TokenBucket> to quota::LeaseAuthority (quota/lease/authority.hpp):
// a grant of q units is one ordinary `apply_attempt` of q units in the central bucket, in one
// EVALSHA, with the grant id as the attempt id — so a grant request whose reply was lost
// and is retried with the same id is replayed from the tenant's slot, never charged
// twice. Time is the server's. Thread-safe (as RedisStore).
//
//   auto store = std::make_shared<quota::RedisStore<quota::TokenBucket>>(
//       quota::RedisStoreOptions{.pool = pool});
//   quota::redis::LeaseAuthority authority(store, tb);
//   auto leased = quota::LeasedLimiter<quota::redis::LeaseAuthority>::create(
//       authority, {.q_max = 1000, .central = tb});
//   auto d = (*leased)->acquire("{acme}read", 1);
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string_view>
#include <utility>

#include "absl/status/statusor.h"
#include "quota/decision.hpp"
#include "quota/lease/leased_limiter.hpp"
#include "quota/policy/token_bucket.hpp"
#include "quota/redis/redis_store.hpp"

namespace quota::redis {

class LeaseAuthority {
 public:
  LeaseAuthority(std::shared_ptr<RedisStore<TokenBucket>> store, TokenBucket policy)
      : store_(std::move(store)), policy_(policy) {}

  absl::StatusOr<Decision> grant(std::string_view key, std::int64_t units,
                                 std::string_view grant_id) {
    round_trips_.fetch_add(1, std::memory_order_relaxed);
    auto outcome = store_->apply_attempt(policy_, key, Nanos{0}, units, grant_id);
    if (!outcome.ok()) return outcome.status();
    return outcome->decision;
  }

  // Calls of grant(): the round trips to Redis.
  std::int64_t round_trips() const { return round_trips_.load(std::memory_order_relaxed); }

 private:
  std::shared_ptr<RedisStore<TokenBucket>> store_;
  TokenBucket policy_;
  std::atomic<std::int64_t> round_trips_{0};
};

static_assert(quota::LeaseAuthority<LeaseAuthority>);

}  // namespace quota::redis
