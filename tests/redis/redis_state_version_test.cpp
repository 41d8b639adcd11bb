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

TEST_CASE("a gateway scope of another format or out of range is QUOTA_CORRUPT, nothing written") {
  // A scope of one record named "" (twin/gateway.hpp): the header '<BBI2I6' (format 113,
  // records, entries' bytes, expiry), the record '<i6I3I7i6I4I5I3' at byte 10, its entry
  // at byte 44 (the name's length 0, the rule-set version '<I7' at 45, the policy at 52).
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
  REQUIRE(v0.size() == quota::redis::kGatewayHeaderBytes + quota::redis::kGatewayRecordBytes +
                           quota::redis::kGatewayEntryBytes);
  REQUIRE(static_cast<unsigned char>(v0[0]) == 113);
  REQUIRE(v0[1] == 1);
  CHECK((static_cast<unsigned char>(v0[51]) & 0xe0) == 0);
  const struct {
    const char* what;
    std::size_t at;
    unsigned char byte;
  } changes[] = {{"format 0", 0, 0},
                 {"format 112", 0, 112},
                 {"format 114", 0, 114},
                 {"two records in the header", 1, 2},
                 {"the entries' length", 2, 44},
                 {"tokens' micro-units past 999999", 18, 0xff},
                 {"nanoseconds past 999999999", 35, 0xff},
                 {"a rule-set version past 2^53 - 1", 51, 0x20},
                 {"the entry's name longer than the value", 44, 9}};
  for (const auto& change : changes) {
    INFO(change.what);
    std::string other = v0;
    // (the header's bytes set; the others' bits added)
    other[change.at] = static_cast<char>(
        change.at < 4 ? change.byte : static_cast<unsigned char>(other[change.at]) | change.byte);
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
