// Tests for the state format version of the Lua twins (quota/redis/twin/common.hpp):
// every twin writes its current version (the token bucket 1, the others 0) and rejects a
// state carrying any other version as QUOTA_CORRUPT (kDataLoss naming the key), writing
// nothing.
#include <chrono>
#include <string>
#include <string_view>
#include <vector>

#include <catch2/catch.hpp>

#include "quota/gateway/gateway.hpp"
#include "quota/policy/fixed_window.hpp"
#include "quota/policy/sliding_log.hpp"
#include "quota/policy/sliding_window_estimate.hpp"
#include "quota/policy/token_bucket.hpp"
#include "quota/redis/gateway_store.hpp"
#include "quota/redis/redis_store.hpp"
#include "support/gateway_rules.hpp"
#include "support/printers.hpp"
#include "support/redis_server.hpp"

using namespace std::chrono_literals;
using quota::Nanos;
using quota::RedisStore;
using quota::TokenBucket;
using quota::testing::with_cost;

namespace {

// Where each twin keeps its version (twin/<policy>.hpp): the byte of the state that holds
// the version bits, the mask of version 1 in it, and the version the twin writes.
template <class P>
struct VersionBits;
template <>
struct VersionBits<TokenBucket> {  // '<I5I3I7i5I4I4': bits 30-31 of the nanoseconds
  static constexpr const char* name = "token-bucket";
  static constexpr std::size_t bytes = 28, at = 23;
  static constexpr unsigned char one = 0x40;
  static constexpr unsigned version = 1;
  static TokenBucket policy() { return {.rate = {.units = 1, .per = 3600s}, .burst = 10}; }
};
template <>
struct VersionBits<quota::FixedWindow> {  // '<I3i5I4': bit 31 of the nanoseconds field
  static constexpr const char* name = "fixed-window";
  static constexpr std::size_t bytes = 12, at = 11;
  static constexpr unsigned char one = 0x80;
  static constexpr unsigned version = 0;
  static quota::FixedWindow policy() { return {.limit = 10, .window = 1h}; }
};
template <>
struct VersionBits<quota::SlidingWindowEstimate> {  // '<I6I6i5I4': bit 31 likewise
  static constexpr const char* name = "window-estimate";
  static constexpr std::size_t bytes = 21, at = 20;
  static constexpr unsigned char one = 0x80;
  static constexpr unsigned version = 0;
  static quota::SlidingWindowEstimate policy() { return {.limit = 10, .window = 1h}; }
};

template <class S>
quota::redis::Reply run_in(S& store, std::vector<std::string_view> args) {
  auto lease = store.options().pool->acquire();
  REQUIRE(lease.ok());
  auto r = (*lease)->command(args);
  REQUIRE(r.ok());
  return std::move(*r);
}

std::string value_of(const quota::redis::Reply& r) {
  REQUIRE(r->type == REDIS_REPLY_STRING);
  return std::string(r->str, r->len);
}

}  // namespace

TEMPLATE_TEST_CASE("a state of another format version is QUOTA_CORRUPT, nothing written", "",
                   TokenBucket, quota::FixedWindow, quota::SlidingWindowEstimate) {
  using V = VersionBits<TestType>;
  const TestType p = V::policy();
  for (const auto time : {quota::redis::TimeSource::kCaller, quota::redis::TimeSource::kServer}) {
    const bool caller = time == quota::redis::TimeSource::kCaller;
    RedisStore<TestType> store(
        {.pool = quota::testing::redis_pool(),
         .prefix = quota::testing::unique_prefix(std::string("state-version-") + V::name +
                                                 (caller ? "-caller" : "-server")),
         .time = time});
    auto first = store.apply(p, "{acme}v", Nanos{5s}, 1);
    INFO(first.status());
    REQUIRE(first.ok());
    auto key = store.redis_key("{acme}v");
    REQUIRE(key.ok());
    const std::string v0 = value_of(run_in(store, {"GET", *key}));
    REQUIRE(v0.size() == V::bytes);
    // The bits hold the current version.
    const unsigned char mask = V::one | static_cast<unsigned char>(V::one << 1);
    CHECK((static_cast<unsigned char>(v0[V::at]) & mask) == V::one * V::version);
    for (unsigned version = 0; version < 4; ++version) {
      const unsigned bits = V::one * version;
      // (the fixed window and the estimate have one version bit)
      if (version == V::version || (bits & ~unsigned{mask}) != 0) continue;
      std::string other = v0;
      other[V::at] = static_cast<char>((static_cast<unsigned char>(other[V::at]) & ~mask) | bits);
      run_in(store, {"SET", *key, other});
      auto d = store.apply(p, "{acme}v", Nanos{6s}, 1);
      REQUIRE_FALSE(d.ok());
      CHECK(absl::IsDataLoss(d.status()));
      CHECK(d.status().message().find(*key) != absl::string_view::npos);
      CHECK(value_of(run_in(store, {"GET", *key})) == other);  // nothing written
    }
    // Back at the current version the state is read again.
    run_in(store, {"SET", *key, v0});
    auto d = store.apply(p, "{acme}v", Nanos{6s}, 1);
    REQUIRE(d.ok());
    CHECK(d->remaining == 8);
  }
}

TEST_CASE("a sliding log meta of another format version is QUOTA_CORRUPT") {
  // The meta's nanoseconds (a double in [0, 10^9)) carry the version as multiples of 2^30.
  RedisStore<quota::SlidingLog> store({.pool = quota::testing::redis_pool(),
                                       .prefix = quota::testing::unique_prefix("log-version"),
                                       .time = quota::redis::TimeSource::kCaller});
  const quota::SlidingLog p{.limit = 10, .window = 1h};
  REQUIRE(store.apply(p, "{acme}v", Nanos{5'000'000'007}, 1).ok());
  auto key = store.redis_key("{acme}v");
  REQUIRE(key.ok());
  const std::string v0 = value_of(run_in(store, {"GET", *key}));
  run_in(store, {"EVAL",
                 "local s, ns, used = struct.unpack('<ddd', redis.call('GET', KEYS[1])) "
                 "assert(ns == 7) "
                 "redis.call('SET', KEYS[1], struct.pack('<ddd', s, ns + 2^30, used))",
                 "1", *key});
  auto d = store.apply(p, "{acme}v", Nanos{6s}, 1);
  REQUIRE_FALSE(d.ok());
  CHECK(absl::IsDataLoss(d.status()));
  CHECK(d.status().message().find(*key) != absl::string_view::npos);
  run_in(store, {"SET", *key, v0});
  auto again = store.apply(p, "{acme}v", Nanos{6s}, 1);
  REQUIRE(again.ok());
  CHECK(again->remaining == 8);
}

TEST_CASE("a gateway state of another format version is QUOTA_CORRUPT, nothing written") {
  // '<I7i6I3I7i6I4I5I3I4c35': bits 30-31 of the nanoseconds field (bytes 29-32) are the
  // format version (1: byte 32's 0x40); bits 53-55 of the rule-set version (byte 6's top
  // three bits) must be zero.
  quota::redis::GatewayStore store({.pool = quota::testing::redis_pool(),
                                    .prefix = quota::testing::unique_prefix("gw-version"),
                                    .time = quota::redis::TimeSource::kCaller});
  const quota::gateway::RulePolicy tb = TokenBucket{.rate = {.units = 1, .per = 1s}, .burst = 10};
  const quota::gateway::LevelCheck level[] = {
      {.policy = &tb, .key = "{acme}read", .shadow = false}};
  REQUIRE(store.decide(with_cost(level, 1), 1, Nanos{5s}).ok());
  auto key = store.redis_key("{acme}read");
  REQUIRE(key.ok());
  auto lease = store.options().pool->acquire();
  REQUIRE(lease.ok());
  auto cmd = [&](std::vector<std::string_view> args) {
    auto r = (*lease)->command(args);
    REQUIRE(r.ok());
    return std::move(*r);
  };
  const std::string v0 = value_of(cmd({"GET", *key}));
  REQUIRE(v0.size() == quota::redis::kGatewayStateBytes);
  CHECK((static_cast<unsigned char>(v0[6]) & 0xe0) == 0);
  CHECK((static_cast<unsigned char>(v0[32]) & 0xc0) == 0x40);
  for (int change = 0; change < 6; ++change) {
    std::string other = v0;
    if (change < 3) {  // format versions 0, 2 and 3
      const unsigned char bits = change == 0 ? 0x00 : change == 1 ? 0x80 : 0xc0;
      other[32] = static_cast<char>((static_cast<unsigned char>(other[32]) & 0x3f) | bits);
    } else {  // a rule-set version past 2^53 - 1
      other[6] = static_cast<char>(static_cast<unsigned char>(other[6]) | (0x20 << (change - 3)));
    }
    cmd({"SET", *key, other});
    auto d = store.decide(with_cost(level, 1), 1, Nanos{6s});
    CHECK(d.status().code() == absl::StatusCode::kDataLoss);
    CHECK(d.status().message().find(*key) != std::string::npos);
    CHECK(value_of(cmd({"GET", *key})) == other);
  }
  cmd({"SET", *key, v0});
  auto d = store.decide(with_cost(level, 1), 1, Nanos{6s});
  REQUIRE(d.ok());
  CHECK(d->parts[0].allowed);
}
