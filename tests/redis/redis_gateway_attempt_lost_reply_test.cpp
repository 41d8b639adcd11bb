// The lost-reply tests of gateway attempts over Redis (quota/redis/gateway_store.hpp,
// twin/gateway_attempts.hpp), against a real redis-server behind a proxy that forwards a
// decision's script call and drops its reply (support/lossy_proxy.hpp). The server ran
// the script — decided, deducted and recorded the attempt in one call — so the first
// caller gets the route's fail mode (503), and a retry with the same attempt id, through
// the same gateway or another gateway process (another GatewayStore and Gateway on the
// same server), replays the server's decision and deducts nothing more. Also: requests
// with a global level (two slots, a pending record), attempt deadlines on Redis, and
// concurrent duplicates of one attempt through two processes.
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "quota/gateway/gateway.hpp"
#include "quota/redis/gateway_store.hpp"
#include "support/gateway_rules.hpp"
#include "support/lossy_proxy.hpp"
#include "support/printers.hpp"
#include "support/redis_server.hpp"

using namespace std::chrono_literals;
using quota::Nanos;
using quota::Reason;
using quota::TokenBucket;
using quota::gateway::Gateway;
using quota::gateway::Request;
using quota::gateway::RuleRegistry;
using quota::redis::GatewayStore;
using quota::testing::build;

namespace {

constexpr quota::Rate kSlow{.units = 1, .per = std::chrono::hours(1)};

Request read(const char* tenant, const char* id = "") {
  return {.who = {.tenant = tenant, .plan = "free"}, .route = "read", .attempt_id = id};
}

// Two gateway processes on one server: `a` through the proxy, `b` directly; both with
// `spec`, and pending attempts claimed for 2 s.
struct Pair {
  explicit Pair(const std::string& name, const quota::gateway::RuleSetSpec& spec)
      : proxy(quota::testing::redis_port()),
        through_proxy({.pool = std::make_shared<quota::redis::ConnectionPool>(proxy_config(), 1),
                       .prefix = quota::testing::unique_prefix(name),
                       .attempt_pending = 2s}),
        direct({.pool = quota::testing::redis_pool(1),
                .prefix = through_proxy.options().prefix,
                .attempt_pending = 2s}),
        registry_a(build(spec)),
        registry_b(build(spec)),
        a(through_proxy, registry_a),
        b(direct, registry_b) {}

  quota::redis::ConnectionConfig proxy_config() const {
    auto cfg = quota::testing::redis_config();
    cfg.port = proxy.port();
    return cfg;
  }

  std::string redis_key(const char* key) const {
    auto k = through_proxy.redis_key(key);
    REQUIRE(k.ok());
    return *k;
  }

  // The remaining units of tenant `t` (a plain request through `b`, which spends 1).
  std::int64_t remaining_after_one(const char* t) {
    auto r = b.decide(read(t), Nanos{0});
    REQUIRE(r.ok());
    return r->decision.remaining;
  }

  quota::testing::LossyProxy proxy;
  GatewayStore through_proxy;
  GatewayStore direct;
  RuleRegistry registry_a;
  RuleRegistry registry_b;
  Gateway a;
  Gateway b;
};

}  // namespace

TEST_CASE("redis attempts: a reply lost after the script ran is replayed, deducted once") {
  static int runs = 0;  // a fresh key space per run (Catch runs it again per SECTION)
  Pair p("gw-lost-reply-" + std::to_string(++runs),
         quota::testing::levels_spec(1, TokenBucket{.rate = kSlow, .burst = 10}));
  // Load the script first, so that the reply lost is the decision's.
  REQUIRE(p.a.decide(read("warm", "warm-1"), Nanos{0})->decision.allowed);

  p.proxy.drop_reply_to(p.redis_key("{acme}read"));
  auto lost = p.a.decide(read("acme", "att-1"), Nanos{0});
  REQUIRE(lost.ok());
  REQUIRE(p.proxy.dropped() == 1);
  CHECK_FALSE(lost->decision.allowed);
  CHECK(lost->decision.reason == Reason::kUnavailable);  // the route fails closed

  SECTION("the retry through the same gateway replays the server's decision") {
    auto retry = p.a.decide(read("acme", "att-1"), 1s);
    REQUIRE(retry.ok());
    CHECK(retry->replayed);
    CHECK(retry->decision.allowed);
    CHECK(retry->decision.reason == Reason::kAllowed);
    CHECK(retry->decision.remaining == 9);
  }
  SECTION("the retry through another gateway process replays it") {
    auto retry = p.b.decide(read("acme", "att-1"), 1s);
    REQUIRE(retry.ok());
    CHECK(retry->replayed);
    CHECK(retry->decision.allowed);
    CHECK(retry->decision.remaining == 9);
    auto again = p.a.decide(read("acme", "att-1"), 2s);
    REQUIRE(again.ok());
    CHECK(again->replayed);
    CHECK(again->decision == retry->decision);
  }
  // Deducted once: 10 − 1 (the attempt) − 1 (this request).
  CHECK(p.remaining_after_one("acme") == 8);
  // The record lives in the tenant's slot for the gateway's attempt_ttl.
  auto lease = p.direct.options().pool->acquire();
  REQUIRE(lease.ok());
  auto ttl = (*lease)->command({"PTTL", p.direct.options().prefix + "a{acme}att-1"});
  REQUIRE(ttl.ok());
  CHECK((*ttl)->integer > 0);
  CHECK((*ttl)->integer <= std::chrono::duration_cast<std::chrono::milliseconds>(
                               quota::gateway::GatewayOptions{}.attempt_ttl)
                               .count());
}

TEST_CASE("redis attempts: a denial whose reply was lost is replayed as that denial") {
  Pair p("gw-lost-denial", quota::testing::levels_spec(1, TokenBucket{.rate = kSlow, .burst = 1}));
  REQUIRE(p.a.decide(read("warm", "warm-1"), Nanos{0})->decision.allowed);
  REQUIRE(p.b.decide(read("acme"), Nanos{0})->decision.allowed);  // the only unit
  p.proxy.drop_reply_to(p.redis_key("{acme}read"));
  auto lost = p.a.decide(read("acme", "deny-1"), Nanos{0});
  REQUIRE(lost.ok());
  REQUIRE(p.proxy.dropped() == 1);
  CHECK(lost->decision.reason == Reason::kUnavailable);
  auto retry = p.b.decide(read("acme", "deny-1"), 1s);
  REQUIRE(retry.ok());
  CHECK(retry->replayed);
  CHECK_FALSE(retry->decision.allowed);
  CHECK(retry->decision.reason == Reason::kOverLimit);
  CHECK(retry->decision.retry_after > Nanos{0});
  // The same id for another request (cost 3, not 1) is InvalidArgument.
  auto other = p.b.acquire_estimate(read("acme", "deny-1"), 3, Nanos{0});
  CHECK(other.status().code() == absl::StatusCode::kInvalidArgument);
}

TEST_CASE("redis attempts with a global level: the tenant's levels are never deducted twice") {
  static int runs = 0;
  Pair p("gw-lost-global-" + std::to_string(++runs),
         quota::testing::levels_spec(1, TokenBucket{.rate = kSlow, .burst = 10}, std::nullopt,
                                     TokenBucket{.rate = kSlow, .burst = 100}));
  // Loads both scripts (the tenant's and global decisions, then the record's completion).
  REQUIRE(p.a.decide(read("warm", "warm-1"), Nanos{0})->decision.allowed);
  const std::string global = p.redis_key("{~global}read");

  SECTION("the tenant's reply lost: a retry waits for the claim, then completes the decision") {
    p.proxy.drop_reply_to(p.redis_key("{acme}read"));
    auto lost = p.a.decide(read("acme", "g-1"), Nanos{0});
    REQUIRE(lost.ok());
    REQUIRE(p.proxy.dropped() == 1);
    CHECK(lost->decision.reason == Reason::kUnavailable);
    // Recorded pending with the tenant's decision, claimed for attempt_pending (2 s).
    auto busy = p.b.decide(read("acme", "g-1"), Nanos{0});
    CHECK(busy.status().code() == absl::StatusCode::kAborted);
    // Once the claim lapses the retry completes it (retried for at most 10 s).
    auto retry = busy;
    const auto give_up = std::chrono::steady_clock::now() + 10s;
    while (retry.status().code() == absl::StatusCode::kAborted &&
           std::chrono::steady_clock::now() < give_up) {
      std::this_thread::sleep_for(100ms);
      retry = p.b.decide(read("acme", "g-1"), 1s);
    }
    REQUIRE(retry.ok());
    CHECK_FALSE(retry->replayed);  // this call decided the global level
    CHECK(retry->decision.allowed);
    CHECK(retry->decision.remaining == 9);  // the tenant's, as recorded
    auto again = p.a.decide(read("acme", "g-1"), 2s);
    REQUIRE(again.ok());
    CHECK(again->replayed);
    CHECK(again->decision == retry->decision);
    CHECK(p.remaining_after_one("acme") == 8);
  }
  SECTION("the global level's reply lost: the pending record is dropped, the tenant given back") {
    p.proxy.drop_reply_to(global);
    auto lost = p.a.decide(read("acme", "g-2"), Nanos{0});
    REQUIRE(lost.ok());
    REQUIRE(p.proxy.dropped() == 1);
    CHECK(lost->decision.reason == Reason::kUnavailable);
    auto retry = p.b.decide(read("acme", "g-2"), 1s);
    REQUIRE(retry.ok());
    CHECK_FALSE(retry->replayed);
    CHECK(retry->decision.allowed);
    CHECK(retry->decision.remaining == 9);
    CHECK(p.remaining_after_one("acme") == 8);
  }
}

TEST_CASE("redis attempts: past the recorded deadline the decision is expired, its units spent") {
  static int runs = 0;
  Pair p("gw-deadline-" + std::to_string(++runs),
         quota::testing::levels_spec(1, TokenBucket{.rate = kSlow, .burst = 10}));
  REQUIRE(p.a.decide(read("warm", "warm-1"), Nanos{0})->decision.allowed);
  Request req = read("acme", "dl-1");
  req.deadline = Nanos{5s};

  SECTION("a decision replayed before its deadline, expired after it") {
    auto first = p.a.decide(req, 1s);
    REQUIRE(first.ok());
    CHECK(first->decision.allowed);
    auto before = p.b.decide(req, 4s);
    REQUIRE(before.ok());
    CHECK(before->replayed);
    CHECK(before->decision.allowed);
    Request later = req;
    later.deadline = Nanos{100s};  // a retry's own deadline does not extend the attempt's
    auto after = p.b.decide(later, 6s);
    REQUIRE(after.ok());
    CHECK(after->replayed);
    CHECK_FALSE(after->decision.allowed);
    CHECK(after->decision.reason == Reason::kAttemptExpired);
    CHECK(p.remaining_after_one("acme") == 8);  // spent once, not given back
  }
  SECTION("a reply lost, the retry past the deadline: expired, the units stay spent") {
    p.proxy.drop_reply_to(p.redis_key("{acme}read"));
    auto lost = p.a.decide(req, 1s);
    REQUIRE(lost.ok());
    REQUIRE(p.proxy.dropped() == 1);
    // (the request's own deadline has passed: the store is not asked, replayed = false)
    auto retry = p.a.decide(req, 6s);
    REQUIRE(retry.ok());
    CHECK_FALSE(retry->replayed);
    CHECK(retry->decision.reason == Reason::kAttemptExpired);
    CHECK(p.remaining_after_one("acme") == 8);
    // Without a deadline of its own, the retry reads the record: expired by its deadline.
    Request undated = req;
    undated.deadline = std::nullopt;
    auto read_back = p.b.decide(undated, 7s);
    REQUIRE(read_back.ok());
    CHECK(read_back->replayed);
    CHECK(read_back->decision.reason == Reason::kAttemptExpired);
    CHECK(p.remaining_after_one("acme") == 7);
  }
  SECTION("a request arriving after its deadline decides nothing") {
    auto late = p.b.decide(req, 6s);
    REQUIRE(late.ok());
    CHECK_FALSE(late->replayed);
    CHECK(late->decision.reason == Reason::kAttemptExpired);
    CHECK(p.remaining_after_one("acme") == 9);
  }
}

TEST_CASE("redis attempts: concurrent duplicates through two processes are decided once") {
  GatewayStore store_a({.pool = quota::testing::redis_pool(4),
                        .prefix = quota::testing::unique_prefix("gw-attempt-concurrent")});
  GatewayStore store_b({.pool = quota::testing::redis_pool(4), .prefix = store_a.options().prefix});
  const auto spec = quota::testing::levels_spec(1, TokenBucket{.rate = kSlow, .burst = 100});
  RuleRegistry registry_a(build(spec));
  RuleRegistry registry_b(build(spec));
  Gateway a(store_a, registry_a);
  Gateway b(store_b, registry_b);
  constexpr int kRounds = 5;
  constexpr int kThreads = 8;
  for (int round = 0; round < kRounds; ++round) {
    const std::string id = "c-" + std::to_string(round);
    std::vector<absl::StatusOr<quota::gateway::Result>> results(kThreads);
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&, t] {
        Request req = read("acme");
        req.attempt_id = id;
        results[t] = (t % 2 == 0 ? a : b).decide(req, Nanos{0});
      });
    }
    for (std::thread& t : threads) t.join();
    int fresh = 0;
    for (const auto& r : results) {
      REQUIRE(r.ok());  // one slot: no call ever waits for another's record
      CHECK(r->decision.allowed);
      CHECK(r->decision.remaining == 99 - round);
      if (!r->replayed) ++fresh;
    }
    CHECK(fresh == 1);
  }
  auto next = b.decide(read("acme"), Nanos{0});
  REQUIRE(next.ok());
  CHECK(next->decision.remaining == 100 - kRounds - 1);
}
