// Fault tests for quota/redis/redis_store.hpp against a real redis-server of their own
// (this test kills, restarts and pauses it): calls during a fault return kUnavailable
// within the deadline — never hang, never allow or deny — and the next calls recover;
// SCRIPT FLUSH during load loses and doubles no decision.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "quota/policy/token_bucket.hpp"
#include "quota/redis/redis_store.hpp"
#include "support/printers.hpp"
#include "support/redis_server.hpp"

using namespace std::chrono_literals;
using quota::Nanos;
using quota::RedisStore;
using quota::RedisStoreOptions;
using quota::TokenBucket;
using Clock = std::chrono::steady_clock;

namespace {

// The deadline of every call in these tests, and how much later than it a call may
// return on a loaded 2-core machine under a sanitizer (connect + send + read, each
// bounded by the deadline, plus scheduling).
constexpr auto kDeadline = 50ms;
constexpr auto kSlack = 900ms;

struct LoadResult {
  std::atomic<int> ok{0}, unavailable{0}, other{0}, allowed{0};
  std::atomic<std::int64_t> worst_us{0};
};

// Runs `threads` threads calling `store.apply` until `stop`; records outcomes and the
// slowest call.
void load(RedisStore<TokenBucket>& store, const TokenBucket& policy, const std::string& key,
          int threads, std::atomic<bool>& stop, LoadResult& out) {
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&] {
      while (!stop.load()) {
        const auto t0 = Clock::now();
        auto d = store.apply(policy, key, Nanos{0}, 1);
        const auto us = std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - t0);
        std::int64_t prev = out.worst_us.load();
        while (us.count() > prev && !out.worst_us.compare_exchange_weak(prev, us.count())) {
        }
        if (d.ok()) {
          ++out.ok;
          out.allowed += d->allowed;
        } else if (absl::IsUnavailable(d.status())) {
          ++out.unavailable;
        } else {
          ++out.other;
        }
      }
    });
  }
  for (auto& t : pool) t.join();
}

RedisStoreOptions fault_options(const std::string& test) {
  return RedisStoreOptions{.pool = quota::testing::redis_pool(4, kDeadline),
                           .prefix = quota::testing::unique_prefix(test)};
}

// Waits (bounded) until the store answers again.
bool recovers(RedisStore<TokenBucket>& store, const TokenBucket& p, const std::string& key) {
  for (int i = 0; i < 200; ++i) {
    if (store.apply(p, key, Nanos{0}, 1).ok()) return true;
    std::this_thread::sleep_for(25ms);
  }
  return false;
}

const TokenBucket kPolicy{.rate = {.units = 1'000'000, .per = 1s}, .burst = 1'000'000};

}  // namespace

TEST_CASE(
    "redis-server killed mid-load: calls fail unavailable within the deadline, then recover") {
  RedisStore<TokenBucket> store(fault_options("kill"));
  const std::string key = "{faults}kill";
  REQUIRE(store.apply(kPolicy, key, Nanos{0}, 1).ok());
  std::atomic<bool> stop{false};
  LoadResult result;
  std::thread loader([&] { load(store, kPolicy, key, 4, stop, result); });
  std::this_thread::sleep_for(150ms);
  REQUIRE(quota::testing::kill_redis());
  std::this_thread::sleep_for(300ms);  // calls keep failing meanwhile
  const int failed_while_down = result.unavailable.load();
  REQUIRE(quota::testing::redis_script("restart"));
  REQUIRE(recovers(store, kPolicy, key));
  const int ok_before = result.ok.load();
  std::this_thread::sleep_for(150ms);
  stop = true;
  loader.join();
  INFO("ok " << result.ok << " unavailable " << result.unavailable << " other " << result.other
             << " slowest call " << result.worst_us << " us");
  CHECK(failed_while_down > 0);
  CHECK(result.other == 0);
  CHECK(result.ok > ok_before);  // the load itself recovered after the restart
  CHECK(std::chrono::microseconds(result.worst_us.load()) < kDeadline + kSlack);
}

TEST_CASE("CLIENT PAUSE longer than the deadline: unavailable within the deadline, then recovery") {
  RedisStore<TokenBucket> store(fault_options("pause"));
  const std::string key = "{faults}pause";
  REQUIRE(store.apply(kPolicy, key, Nanos{0}, 1).ok());
  quota::redis::Connection admin(quota::testing::redis_config());
  auto paused = admin.command({"CLIENT", "PAUSE", "600", "ALL"});
  REQUIRE(paused.ok());
  REQUIRE((*paused)->type == REDIS_REPLY_STATUS);
  const auto t0 = Clock::now();
  auto d = store.apply(kPolicy, key, Nanos{0}, 1);
  const auto took = Clock::now() - t0;
  REQUIRE_FALSE(d.ok());
  CHECK(absl::IsUnavailable(d.status()));
  INFO(d.status().ToString());
  CHECK(took < kDeadline + kSlack);
  CHECK(took < 550ms);  // it did not wait for the pause to end
  REQUIRE(recovers(store, kPolicy, key));
}

TEST_CASE("SCRIPT FLUSH during load: every call still decides, and exactly the budget is spent") {
  // A one-off budget (rate 0) of 300 units: 4 threads asking for more than that must be
  // admitted exactly 300 times, whatever the flushes do.
  const TokenBucket once{.rate = {.units = 0, .per = 1s}, .burst = 300};
  auto opts = fault_options("flush");
  opts.pool = quota::testing::redis_pool(4, 2s);
  RedisStore<TokenBucket> store(opts);
  const std::string key = "{faults}flush";
  quota::redis::Connection admin(quota::testing::redis_config());
  std::atomic<bool> stop{false};
  std::atomic<int> flushes{0};
  std::thread flusher([&] {
    while (!stop.load()) {
      if (admin.command({"SCRIPT", "FLUSH"}).ok()) ++flushes;
      std::this_thread::sleep_for(2ms);
    }
  });
  std::atomic<int> calls{0}, allowed{0}, errors{0};
  std::mutex mu;
  std::string last_error;
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 150; ++i) {
        auto d = store.apply(once, key, Nanos{0}, 1);
        ++calls;
        if (!d.ok()) {
          std::lock_guard<std::mutex> lock(mu);
          ++errors;
          last_error = d.status().ToString();
        } else {
          allowed += d->allowed;
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  stop = true;
  flusher.join();
  INFO("flushes " << flushes << " calls " << calls << " last error " << last_error);
  CHECK(flushes > 5);
  CHECK(errors == 0);
  CHECK(allowed == 300);
}

TEST_CASE(
    "BUSY (a script running too long) and READONLY (a replica) are unavailable, never decisions") {
  RedisStore<TokenBucket> store(fault_options("busy"));
  const std::string key = "{faults}busy";
  REQUIRE(store.apply(kPolicy, key, Nanos{0}, 1).ok());
  quota::redis::Connection admin(quota::testing::redis_config());

  SECTION("READONLY") {
    // A replica of a master that does not exist: it refuses writes at once.
    REQUIRE(admin.command({"REPLICAOF", "127.0.0.1", "1"}).ok());
    auto d = store.apply(kPolicy, key, Nanos{0}, 1);
    REQUIRE(admin.command({"REPLICAOF", "NO", "ONE"}).ok());
    REQUIRE_FALSE(d.ok());
    CHECK(absl::IsUnavailable(d.status()));
    CHECK(d.status().message().find("READONLY") != absl::string_view::npos);
  }
  SECTION("BUSY") {
    REQUIRE(admin.command({"CONFIG", "SET", "busy-reply-threshold", "20"}).ok());
    // Another client runs a script that never ends (it writes nothing, so SCRIPT KILL
    // can stop it).
    std::thread looping([] {
      auto cfg = quota::testing::redis_config(3s);
      quota::redis::Connection c(cfg);
      (void)c.command({"EVAL", "while true do end", "0"});
    });
    std::this_thread::sleep_for(200ms);
    auto d = store.apply(kPolicy, key, Nanos{0}, 1);
    quota::redis::Connection killer(quota::testing::redis_config());
    for (int i = 0; i < 50; ++i) {
      auto k = killer.command({"SCRIPT", "KILL"});
      if (k.ok() && (*k)->type == REDIS_REPLY_STATUS) break;
      std::this_thread::sleep_for(20ms);
    }
    looping.join();
    REQUIRE(admin.command({"CONFIG", "SET", "busy-reply-threshold", "5000"}).ok());
    REQUIRE_FALSE(d.ok());
    CHECK(absl::IsUnavailable(d.status()));
    CHECK(d.status().message().find("BUSY") != absl::string_view::npos);
  }
  REQUIRE(recovers(store, kPolicy, key));
}
