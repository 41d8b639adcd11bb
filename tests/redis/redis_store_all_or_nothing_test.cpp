// Tests of RedisStore::apply_all: a hierarchical check deducts from every bucket or from
// none, for every policy exactly as the C++ policies decide.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <random>
#include <string>
#include <typeinfo>
#include <vector>

#include <catch2/catch.hpp>

#include "quota/policy/fixed_window.hpp"
#include "quota/policy/sliding_log.hpp"
#include "quota/policy/sliding_window_estimate.hpp"
#include "quota/policy/token_bucket.hpp"
#include "quota/redis/redis_store.hpp"
#include "support/policy_variants.hpp"
#include "support/printers.hpp"
#include "support/seed.hpp"
#include "support/store_fixtures.hpp"

using namespace std::chrono_literals;
using quota::Decision;
using quota::Nanos;
using quota::Reason;
using quota::RedisStore;
using quota::RedisStoreOptions;
using quota::TokenBucket;
using quota::redis::TimeSource;
using quota::testing::options;

TEST_CASE("a hierarchical check deducts from every bucket or from none") {
  RedisStore<TokenBucket> store(options("hier"));
  const TokenBucket tenant_wide{.rate = {.units = 1, .per = 1s}, .burst = 10};
  const TokenBucket route{.rate = {.units = 1, .per = 1s}, .burst = 3};
  using Req = RedisStore<TokenBucket>::Request;
  const std::vector<Req> both = {{&tenant_wide, "{acme}", 2}, {&route, "{acme}create", 2}};
  auto first = store.apply_all(both, Nanos{0});
  REQUIRE(first.ok());
  CHECK(first->decision.allowed);
  CHECK(first->decision.remaining == 1);  // the least: route 3 − 2
  REQUIRE(first->parts.size() == 2);
  CHECK(first->parts[0].remaining == 8);
  auto second = store.apply_all(both, Nanos{0});
  REQUIRE(second.ok());
  CHECK_FALSE(second->decision.allowed);  // the route bucket has 1 left
  CHECK(second->decision.reason == Reason::kOverLimit);
  CHECK(second->decision.retry_after == 1s);
  CHECK(second->parts[0].remaining == 8);  // the tenant-wide bucket was not charged
  CHECK_FALSE(second->parts[0].allowed);   // each part carries the call's outcome
  auto tenant = store.apply(tenant_wide, "{acme}", Nanos{0}, 1);
  REQUIRE(tenant.ok());
  CHECK(tenant->remaining == 7);
  const std::vector<Req> cross = {{&tenant_wide, "{acme}", 1}, {&route, "{other}create", 1}};
  CHECK(absl::IsInvalidArgument(store.apply_all(cross, Nanos{0}).status()));
}

TEMPLATE_TEST_CASE("all-or-nothing checks match the C++ policies: every bucket deducted or none",
                   "", TokenBucket, quota::FixedWindow, quota::SlidingWindowEstimate,
                   quota::SlidingLog) {
  // Random checks over one, two or three buckets of one tenant, each with its own
  // parameters, at nondecreasing times (caller time). The model: each bucket's C++ policy
  // decides on a copy of its state; when all allow, the copies are kept (all deducted);
  // else none is (the next decision refills over the whole gap, which is the same as
  // refilling now and then, as time never goes back here).
  const auto seed = quota::testing::test_seed(20261201);
  INFO("seed " << seed);
  std::mt19937_64 rng(seed);
  const auto policies = quota::testing::policy_variants<TestType>();
  RedisStore<TestType> store(options(std::string("all-or-none-") + typeid(TestType).name()));
  const std::string keys[3] = {"{aon}a", "{aon}b", "{aon}c"};
  std::optional<typename TestType::State> model[3];
  Nanos now{1'000'000'000'000};
  int all_allowed = 0, some_denied = 0;
  for (int step = 0; step < 600; ++step) {
    now += Nanos{static_cast<std::int64_t>(rng() % 300'000'000)};
    std::vector<std::size_t> which = {0, 1, 2};
    std::shuffle(which.begin(), which.end(), rng);
    which.resize(1 + rng() % 3);
    std::vector<typename RedisStore<TestType>::Request> reqs;
    std::vector<typename TestType::State> copies;
    std::vector<Decision> want;
    bool all = true;
    for (std::size_t b : which) {
      const std::int64_t cost = 1 + static_cast<std::int64_t>(rng() % 3);
      reqs.push_back({&policies[b], keys[b], cost});
      if (!model[b]) model[b] = policies[b].init(now);
      copies.push_back(*model[b]);
      want.push_back(policies[b].apply(copies.back(), now, cost));
      all = all && want.back().allowed;
    }
    INFO("step " << step << ": " << which.size() << " buckets");
    auto got = store.apply_all(reqs, now);
    REQUIRE(got.ok());
    REQUIRE(got->parts.size() == which.size());
    REQUIRE(got->decision.allowed == all);
    for (std::size_t j = 0; j < which.size(); ++j) {
      INFO("bucket " << keys[which[j]]);
      if (all) {
        CHECK(got->parts[j] == want[j]);
      } else if (!want[j].allowed) {
        CHECK_FALSE(got->parts[j].allowed);
        CHECK(got->parts[j].reason == want[j].reason);
        CHECK(got->parts[j].retry_after == want[j].retry_after);
      }
    }
    if (all) {
      for (std::size_t j = 0; j < which.size(); ++j) model[which[j]] = copies[j];
      ++all_allowed;
    } else {
      ++some_denied;
    }
  }
  CHECK(all_allowed > 50);
  CHECK(some_denied > 50);
}
