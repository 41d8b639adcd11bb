// LeasedLimiter with Redis as the authority (a real redis-server, server time): grants
// are charged once even when the reply is lost, and 8 gateway threads with leases stay
// within r*T + B + H*q_max.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "quota/clock.hpp"
#include "quota/lease/leased_limiter.hpp"
#include "quota/redis/lease_authority.hpp"
#include "quota/redis/redis_store.hpp"
#include "quota/verify/envelope.hpp"
#include "support/printers.hpp"
#include "support/redis_server.hpp"

using namespace std::chrono_literals;
using quota::TokenBucket;
using quota::verify::AdmittedEvent;

namespace {

std::shared_ptr<quota::RedisStore<TokenBucket>> store_for(const std::string& test) {
  return std::make_shared<quota::RedisStore<TokenBucket>>(quota::RedisStoreOptions{
      .pool = quota::testing::redis_pool(8), .prefix = quota::testing::unique_prefix(test)});
}

}  // namespace

TEST_CASE("a grant id replays the same grant from Redis", "[redis][lease]") {
  const TokenBucket central{.rate = {.units = 1, .per = 1h}, .burst = 10};
  quota::redis::LeaseAuthority authority(store_for("lease-replay"), central);
  auto first = authority.grant("{acme}read", 10, "inc1-1");
  REQUIRE(first.ok());
  CHECK(first->allowed);
  // The same id again (a retry after a lost reply): the same grant, nothing charged.
  auto again = authority.grant("{acme}read", 10, "inc1-1");
  REQUIRE(again.ok());
  CHECK(again->allowed);
  CHECK(again->remaining == first->remaining);
  // A new id finds the bucket empty: the first grant was charged exactly once.
  auto other = authority.grant("{acme}read", 1, "inc1-2");
  REQUIRE(other.ok());
  CHECK_FALSE(other->allowed);
  // The same id for another amount is an error, not a second grant.
  CHECK_FALSE(authority.grant("{acme}read", 5, "inc1-1").ok());
}

TEST_CASE("8 gateways leasing from Redis stay within r*T + B + H*q_max", "[redis][lease]") {
  // 20,000 units/s, burst 500, grants of up to 100: 8 threads asking as fast as they can
  // for 1.5 s on the steady clock (which on one machine runs at the rate of the server's).
  const TokenBucket central{.rate = {.units = 20'000, .per = 1s}, .burst = 500};
  const std::int64_t q_max = 100;
  quota::redis::LeaseAuthority authority(store_for("lease-envelope"), central);
  constexpr int kGateways = 8;
  std::vector<std::vector<AdmittedEvent>> logs(kGateways);
  std::atomic<int> errors{0};
  quota::SteadyClock clock;
  const quota::Nanos end = clock.now() + 1500ms;
  std::vector<std::thread> threads;
  for (int g = 0; g < kGateways; ++g) {
    threads.emplace_back([&, g] {
      auto leased = quota::LeasedLimiter<quota::redis::LeaseAuthority>::create(
          authority, {.q_min = 1, .q_max = q_max, .grant_ttl = 500ms, .central = central});
      if (!leased.ok()) {
        errors.fetch_add(1);
        return;
      }
      while (clock.now() < end) {
        auto d = (*leased)->acquire("{acme}read", 1);
        if (!d.ok()) {
          errors.fetch_add(1);
          continue;
        }
        if (d->allowed) logs[static_cast<std::size_t>(g)].push_back({clock.now().count(), 1});
      }
    });
  }
  for (auto& t : threads) t.join();
  REQUIRE(errors.load() == 0);
  std::vector<AdmittedEvent> all;
  for (const auto& l : logs) all.insert(all.end(), l.begin(), l.end());
  std::stable_sort(all.begin(), all.end(), [](const AdmittedEvent& a, const AdmittedEvent& b) {
    return a.time_ns < b.time_ns;
  });
  REQUIRE(all.size() > 1000);
  // Each admission is logged just after its local decision, and each grant's request
  // started before the server decided it: the logged times can only be later than the
  // true ones, by up to one decision, so allow one more unit per holder.
  auto report =
      quota::verify::verify_token_bucket(all, central.rate, central.burst, kGateways * (q_max + 1));
  REQUIRE(report.ok());
  INFO(quota::verify::to_string(*report) << "; round trips " << authority.round_trips());
  CHECK(report->holds());
  // Leasing saved round trips: far fewer than admissions.
  CHECK(authority.round_trips() * 10 < static_cast<std::int64_t>(all.size()));
}
