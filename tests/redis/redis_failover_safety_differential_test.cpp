// Differential test of failover safety in the four policy twins (twin/skeleton.hpp's
// `spent` section, the sliding log's own; RedisStoreOptions::failover_safety): random
// traces in caller-time mode, with failovers recorded on the node at random times, must
// decide exactly as the C++ policy whose state is replaced by `policy.exhausted(at)`
// whenever it is missing or older than the failover time `at` — the Redis counterpart of
// StoreOptions::assume_spent_at.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <map>
#include <optional>
#include <random>
#include <string>

#include <catch2/catch.hpp>

#include "quota/policy/fixed_window.hpp"
#include "quota/policy/sliding_log.hpp"
#include "quota/policy/sliding_window_estimate.hpp"
#include "quota/policy/token_bucket.hpp"
#include "quota/redis/redis_store.hpp"
#include "support/policy_variants.hpp"
#include "support/printers.hpp"
#include "support/redis_server.hpp"
#include "support/seed.hpp"

using quota::Nanos;

namespace {

std::int64_t last_of(const quota::TokenBucket::State& s) { return s.last; }
std::int64_t last_of(const quota::FixedWindow::State& s) { return s.last; }
std::int64_t last_of(const quota::SlidingWindowEstimate::State& s) { return s.last; }
std::int64_t last_of(const quota::SlidingLog::State& s) { return s.last(); }

const char* kind(const quota::TokenBucket&) { return "tb"; }
const char* kind(const quota::FixedWindow&) { return "fw"; }
const char* kind(const quota::SlidingWindowEstimate&) { return "swe"; }
const char* kind(const quota::SlidingLog&) { return "log"; }

std::int64_t capacity(const quota::TokenBucket& p) { return p.burst; }
template <class W>
std::int64_t capacity(const W& p) {
  return p.limit;
}

}  // namespace

TEMPLATE_TEST_CASE("failover safety: the twins read a state older than the failover as spent then",
                   "", quota::TokenBucket, quota::FixedWindow, quota::SlidingWindowEstimate,
                   quota::SlidingLog) {
  using P = TestType;
  const std::uint64_t seed = quota::testing::test_seed(20261202);
  INFO("seed " << seed);
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  std::mt19937_64 rng(seed);
  const auto policies = quota::testing::policy_variants<P>();
  auto pool = quota::testing::redis_pool(1);
  quota::RedisStore<P> store(quota::RedisStoreOptions{
      .pool = pool,
      .prefix = quota::testing::unique_prefix(std::string("failover-diff-") + kind(policies[0])),
      .time = quota::redis::TimeSource::kCaller,
      .failover_safety = true});
  std::map<std::string, std::optional<typename P::State>> states;
  std::optional<std::int64_t> failover_at;
  std::int64_t now = 1'000'000'000'000'000'000;
  int requests = 0, allowed = 0, replaced = 0;
  for (int i = 0; i < 3000; ++i) {
    switch (rng() % 10) {
      case 0:
        now -= static_cast<std::int64_t>(rng() % 500'000'000);  // backwards
        break;
      case 1:
        now += 3'000'000'000 + static_cast<std::int64_t>(rng() % 7'000'000'000);
        break;
      default:
        now += static_cast<std::int64_t>(rng() % 400'000'000);
    }
    if (rng() % 25 == 0) {
      // a failover seen at or somewhat before now; the node keeps the latest
      const std::int64_t at = now - static_cast<std::int64_t>(rng() % 2'000'000'000);
      pool->node_watch().record_failover(Nanos{at});
      failover_at = std::max(failover_at.value_or(at), at);
    }
    const std::size_t k = rng() % policies.size();
    const P& p = policies[k];
    const std::string key = "{fo}" + std::to_string(k);
    const std::int64_t cost = static_cast<std::int64_t>(rng() % (capacity(p) + 2));
    auto& st = states[key];
    if (failover_at.has_value() && (!st.has_value() || last_of(*st) < *failover_at)) {
      st = p.exhausted(Nanos{*failover_at});
      ++replaced;
    } else if (!st.has_value()) {
      st = p.init(Nanos{now});
    }
    const quota::Decision expected = p.apply(*st, Nanos{now}, cost);
    auto got = store.apply(p, key, Nanos{now}, cost);
    INFO("request " << i << " key " << key << " now " << now << " cost " << cost << " failover at "
                    << failover_at.value_or(-1));
    INFO(got.status().ToString());
    REQUIRE(got.ok());
    REQUIRE(*got == expected);
    ++requests;
    allowed += expected.allowed;
  }
  std::printf("%d requests, %d allowed, %d states read as spent at a failover\n", requests, allowed,
              replaced);
  CHECK(replaced > 50);
  CHECK(allowed > requests / 5);
  CHECK(allowed < requests);
}
