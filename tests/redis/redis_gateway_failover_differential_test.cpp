// Differential test of failover safety in the gateway's twin (twin/gateway.hpp,
// GatewayStoreOptions::failover_safety): random single-level decisions in caller-time
// mode, with failovers recorded on the node at random times, must decide exactly as
// KeyPolicy::apply on a state replaced by KeyPolicy::exhausted(at) whenever it is
// missing or older than the failover time `at`.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <map>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "quota/gateway/key_state.hpp"
#include "quota/redis/gateway_store.hpp"
#include "support/printers.hpp"
#include "support/redis_server.hpp"
#include "support/seed.hpp"

using namespace std::chrono_literals;
using quota::Nanos;
using quota::gateway::KeyPolicy;
using quota::gateway::KeyState;
using quota::gateway::RulePolicy;

TEST_CASE("failover safety: the gateway twin reads a state older than the failover as spent") {
  const std::uint64_t seed = quota::testing::test_seed(20261203);
  INFO("seed " << seed);
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  std::mt19937_64 rng(seed);
  auto pool = quota::testing::redis_pool(1);
  quota::redis::GatewayStore store({.pool = pool,
                                    .prefix = quota::testing::unique_prefix("gw-failover-diff"),
                                    .time = quota::redis::TimeSource::kCaller,
                                    .ttl_margin = 1h,
                                    .failover_safety = true});
  // One policy per key: token buckets and fixed windows (the gateway twin's kinds).
  const std::vector<RulePolicy> policies = {
      quota::TokenBucket{.rate = {.units = 5, .per = 1s}, .burst = 6},
      quota::TokenBucket{.rate = {.units = 1, .per = 3s}, .burst = 4},
      quota::FixedWindow{.limit = 5, .window = 1s}, quota::FixedWindow{.limit = 3, .window = 2s}};
  std::map<std::size_t, std::optional<KeyState>> states;
  std::optional<std::int64_t> failover_at;
  std::int64_t now = 1'764'000'000'123'456'789;
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
      const std::int64_t at = now - static_cast<std::int64_t>(rng() % 2'000'000'000);
      pool->node_watch().record_failover(Nanos{at});
      failover_at = std::max(failover_at.value_or(at), at);
    }
    const std::size_t k = rng() % policies.size();
    const KeyPolicy kp{.policy = &policies[k], .version = 1};
    const std::string key = "{t" + std::to_string(k) + "}read";
    const std::int64_t cost = static_cast<std::int64_t>(rng() % 7);
    auto& st = states[k];
    if (failover_at.has_value() &&
        (!st.has_value() || quota::gateway::detail::latest_time(*st) < *failover_at)) {
      st = kp.exhausted(Nanos{*failover_at});
      ++replaced;
    } else if (!st.has_value()) {
      st = kp.init(Nanos{now});
    }
    const quota::Decision expected = kp.apply(*st, Nanos{now}, cost);
    const quota::gateway::LevelCheck level{.policy = &policies[k], .key = key, .cost = cost};
    auto got = store.decide(std::span(&level, 1), 1, Nanos{now});
    INFO("request " << i << " key " << key << " now " << now << " cost " << cost << " failover at "
                    << failover_at.value_or(-1));
    INFO(got.status().ToString());
    REQUIRE(got.ok());
    REQUIRE(got->parts.size() == 1);
    REQUIRE(got->parts.front() == expected);
    ++requests;
    allowed += expected.allowed;
  }
  std::printf("%d requests, %d allowed, %d states read as spent at a failover\n", requests, allowed,
              replaced);
  CHECK(replaced > 50);
  CHECK(allowed > requests / 5);
  CHECK(allowed < requests);
}
