// tests/redis/support/store_fixtures.hpp — what the RedisStore tests share: a store's
// options on the test server, one command on a store's server, a budget of 10 for each
// policy (with the sizes of its twin's state), window states written by hand (as doubles, and in
// the twin's own form).
//
// The helpers use Catch2 assertions: call them on the test's own thread only.
#pragma once

#include <chrono>
#include <cstddef>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <catch2/catch.hpp>

#include "quota/policy/fixed_window.hpp"
#include "quota/policy/sliding_log.hpp"
#include "quota/policy/sliding_window_estimate.hpp"
#include "quota/policy/token_bucket.hpp"
#include "quota/redis/redis_store.hpp"
#include "support/redis_server.hpp"

namespace quota::testing {

// A store's options on the test server, under a key prefix of the test's own.
inline RedisStoreOptions options(const std::string& test,
                                 redis::TimeSource time = redis::TimeSource::kCaller) {
  return RedisStoreOptions{.pool = redis_pool(), .prefix = unique_prefix(test), .time = time};
}

// Runs one command on a store's server.
template <class S>
redis::Reply run_in(S& store, std::vector<std::string_view> args) {
  auto lease = store.options().pool->acquire();
  REQUIRE(lease.ok());
  auto r = (*lease)->command(args);
  REQUIRE(r.ok());
  return std::move(*r);
}

// run_in on a token bucket store's server.
inline redis::Reply run(RedisStore<TokenBucket>& store, std::vector<std::string_view> args) {
  return run_in(store, std::move(args));
}

// A budget of 10 units, refilled at one unit a second.
inline const TokenBucket kTen{.rate = {.units = 1, .per = std::chrono::seconds(1)}, .burst = 10};

// Each policy with a budget of 10, and the sizes of its twin's packed state (a corrupt
// state of such a size is only found out of range): `bytes` the twin's form, `doubles`
// the same state as struct-packed doubles (0: none), a length the twin rejects.
template <class P>
struct TenOf;
template <>
struct TenOf<TokenBucket> {
  static constexpr const char* name = "token-bucket";
  static constexpr std::size_t bytes = 28;
  static constexpr std::size_t doubles = 32;
  static TokenBucket policy() {
    using namespace std::chrono_literals;
    return {.rate = {.units = 1, .per = 600s}, .burst = 10};
  }
};
template <class W, std::size_t Bytes, std::size_t Doubles>
struct TenOfWindow {
  static constexpr std::size_t bytes = Bytes;
  static constexpr std::size_t doubles = Doubles;
  static W policy() {
    using namespace std::chrono_literals;
    return {.limit = 10, .window = 1h};
  }
};
template <>
struct TenOf<FixedWindow> : TenOfWindow<FixedWindow, 12, 24> {
  static constexpr const char* name = "fixed-window";
};
template <>
struct TenOf<SlidingWindowEstimate> : TenOfWindow<SlidingWindowEstimate, 21, 32> {
  static constexpr const char* name = "window-estimate";
};
template <>
struct TenOf<SlidingLog> : TenOfWindow<SlidingLog, 24, 0> {
  static constexpr const char* name = "sliding-log";
};

// A window policy's state as struct-packed doubles, the straightforward form the MEMORY
// USAGE test compares the twin's with: the fixed window's (count, seconds, nanoseconds),
// the estimate's (cur, prev, seconds, nanoseconds).
inline void set_doubles(RedisStore<FixedWindow>& store, const std::string& key,
                        const FixedWindow::State& st) {
  const std::string c = std::to_string(st.count), sec = std::to_string(st.last / 1'000'000'000),
                    ns = std::to_string(st.last % 1'000'000'000);
  run_in(store, {"EVAL",
                 "redis.call('SET', KEYS[1], struct.pack('<ddd', ARGV[1] + 0, ARGV[2] + 0, "
                 "ARGV[3] + 0), 'PX', 3600000)",
                 "1", key, c, sec, ns});
}
inline void set_doubles(RedisStore<SlidingWindowEstimate>& store, const std::string& key,
                        const SlidingWindowEstimate::State& st) {
  const std::string c = std::to_string(st.cur), p = std::to_string(st.prev),
                    sec = std::to_string(st.last / 1'000'000'000),
                    ns = std::to_string(st.last % 1'000'000'000);
  run_in(store, {"EVAL",
                 "redis.call('SET', KEYS[1], struct.pack('<dddd', ARGV[1] + 0, ARGV[2] + 0, "
                 "ARGV[3] + 0, ARGV[4] + 0), 'PX', 3600000)",
                 "1", key, c, p, sec, ns});
}

// A window policy's state in its Lua twin's current form, unmarked (its TTL not known to
// cover it, as a caller-time write leaves it): the fixed window's '<I3i5I4' (count below
// 2^24) or '<I7i5I4' (count, seconds, nanoseconds), the estimate's '<I6I6i5I4' (cur,
// prev, seconds, nanoseconds).
inline void set_state(RedisStore<FixedWindow>& store, const std::string& key,
                      const FixedWindow::State& st) {
  const std::int64_t sec = st.last / 1'000'000'000 - (st.last % 1'000'000'000 < 0 ? 1 : 0);
  const std::string c = std::to_string(st.count), s = std::to_string(sec),
                    ns = std::to_string(st.last - sec * 1'000'000'000);
  run_in(store, {"EVAL",
                 "local f = '<I7i5I4' if ARGV[1] + 0 < 16777216 then f = '<I3i5I4' end "
                 "redis.call('SET', KEYS[1], struct.pack(f, ARGV[1] + 0, ARGV[2] + 0, "
                 "ARGV[3] + 0), 'PX', 3600000)",
                 "1", key, c, s, ns});
}
inline void set_state(RedisStore<SlidingWindowEstimate>& store, const std::string& key,
                      const SlidingWindowEstimate::State& st) {
  const std::int64_t sec = st.last / 1'000'000'000 - (st.last % 1'000'000'000 < 0 ? 1 : 0);
  const std::string c = std::to_string(st.cur), p = std::to_string(st.prev),
                    s = std::to_string(sec), ns = std::to_string(st.last - sec * 1'000'000'000);
  run_in(store, {"EVAL",
                 "redis.call('SET', KEYS[1], struct.pack('<I6I6i5I4', ARGV[1] + 0, ARGV[2] + 0, "
                 "ARGV[3] + 0, ARGV[4] + 0), 'PX', 3600000)",
                 "1", key, c, p, s, ns});
}

}  // namespace quota::testing
