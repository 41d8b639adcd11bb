// Tests of RedisStore::apply_attempt: an attempt id makes a decision idempotent, also
// when its reply was lost on the way (support/lossy_proxy.hpp).
#include <chrono>
#include <memory>

#include <catch2/catch.hpp>

#include "quota/policy/token_bucket.hpp"
#include "quota/redis/redis_store.hpp"
#include "support/lossy_proxy.hpp"
#include "support/printers.hpp"
#include "support/redis_server.hpp"
#include "support/store_fixtures.hpp"

using namespace std::chrono_literals;
using quota::Decision;
using quota::Nanos;
using quota::Reason;
using quota::RedisStore;
using quota::RedisStoreOptions;
using quota::TokenBucket;
using quota::redis::TimeSource;
using quota::testing::kTen;
using quota::testing::options;

TEST_CASE("an attempt id makes a decision idempotent, even when its reply was lost") {
  quota::testing::LossyProxy proxy(quota::testing::redis_port());
  auto cfg = quota::testing::redis_config();
  cfg.port = proxy.port();
  auto opts = options("attempt");
  opts.pool = std::make_shared<quota::redis::ConnectionPool>(cfg, 1);
  RedisStore<TokenBucket> store(opts);
  // Load the script first, so that the lost reply is the decision's.
  REQUIRE(store.apply(kTen, "{acme}warm", Nanos{0}, 1).ok());

  proxy.drop_next_reply();
  auto lost = store.apply_attempt(kTen, "{acme}att", Nanos{0}, 4, "attempt-1");
  REQUIRE_FALSE(lost.ok());
  CHECK(absl::IsUnavailable(lost.status()));
  CHECK(proxy.dropped() == 1);

  // The retry replays the first decision: it ran on the server, and charges nothing more.
  auto retry = store.apply_attempt(kTen, "{acme}att", Nanos{0}, 4, "attempt-1");
  REQUIRE(retry.ok());
  CHECK(retry->replayed);
  CHECK(retry->decision.allowed);
  CHECK(retry->decision.remaining == 6);
  auto again = store.apply_attempt(kTen, "{acme}att", Nanos{5}, 4, "attempt-1");
  REQUIRE(again.ok());
  CHECK(again->replayed);
  CHECK(again->decision == retry->decision);
  auto next = store.apply_attempt(kTen, "{acme}att", Nanos{0}, 1);
  REQUIRE(next.ok());
  CHECK_FALSE(next->replayed);
  CHECK(next->decision.remaining == 5);  // 10 − 4 (once) − 1

  // The same id with another cost or another key is an error, and charges nothing.
  auto other_cost = store.apply_attempt(kTen, "{acme}att", Nanos{0}, 3, "attempt-1");
  CHECK(absl::IsInvalidArgument(other_cost.status()));
  auto other_key = store.apply_attempt(kTen, "{acme}other", Nanos{0}, 4, "attempt-1");
  CHECK(absl::IsInvalidArgument(other_key.status()));
  auto after = store.apply(kTen, "{acme}att", Nanos{0}, 1);
  REQUIRE(after.ok());
  CHECK(after->remaining == 4);
  CHECK(absl::IsInvalidArgument(
      store.apply_attempt(kTen, "{acme}att", Nanos{0}, 1, "bad\nid").status()));

  // The record expires after attempt_ttl.
  auto lease = store.options().pool->acquire();
  REQUIRE(lease.ok());
  auto ttl = (*lease)->command({"PTTL", store.options().prefix + "a{acme}attempt-1"});
  REQUIRE(ttl.ok());
  CHECK((*ttl)->integer > 0);
  CHECK((*ttl)->integer <= std::chrono::milliseconds(store.options().attempt_ttl).count());
}
