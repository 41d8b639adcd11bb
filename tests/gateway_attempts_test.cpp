// Tests of the in-process attempt cache (quota/attempts.hpp), alone and through
// Gateway: attempt ids are per tenant; the cache stays within its bound without scanning,
// forgetting expired records from the oldest end (a full cache whose oldest record expired
// admits a new id, one full of live records refuses it, an abandoned record leaves at
// once); the default ttl; a randomized comparison against a plain map of live records;
// and four threads on one cache.
#include "quota/attempts.hpp"

#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "quota/gateway/gateway.hpp"
#include "quota/store/sharded_store.hpp"
#include "support/gateway_rules.hpp"
#include "support/seed.hpp"

using namespace std::chrono_literals;
using quota::AttemptCache;
using quota::AttemptKey;
using quota::Decision;
using quota::Nanos;
using quota::gateway::Gateway;
using quota::gateway::KeyPolicy;
using quota::gateway::Request;
using quota::gateway::RuleRegistry;
using quota::testing::build;

namespace {

using Store = quota::ShardedStore<KeyPolicy>;

// read: 1 unit of a burst of 10, refilled at 1 unit per hour (nothing comes back in a test).
const quota::gateway::RuleSetSpec kSpec = quota::testing::levels_spec(
    1, quota::TokenBucket{.rate = {.units = 1, .per = std::chrono::hours(1)}, .burst = 10});

Request read(const char* tenant, const char* id) {
  return {.who = {.tenant = tenant, .plan = "free"}, .route = "read", .attempt_id = id};
}

Decision decision(std::int64_t remaining) {
  return {.allowed = true,
          .remaining = remaining,
          .retry_after = Nanos{0},
          .reset_after = Nanos{0},
          .version = 1,
          .reason = quota::Reason::kAllowed};
}

// Begins `id` in the empty scope at `now` and finishes it with decision(remaining).
void keep(AttemptCache& cache, const char* id, Nanos now, std::int64_t remaining = 0) {
  auto b = cache.begin(id, "f", now);
  REQUIRE(b.ok());
  REQUIRE_FALSE(b->replay.has_value());
  cache.finish(id, decision(remaining));
}

// The remaining of the decision replayed for `id` at `now`; nullopt when it is not replayed
// (the attempt is then open: abandoned here, so that the cache is as it was).
std::optional<std::int64_t> replayed(AttemptCache& cache, const char* id, Nanos now) {
  auto b = cache.begin(id, "f", now);
  REQUIRE(b.ok());
  if (!b->replay.has_value()) {
    cache.abandon(id);
    return std::nullopt;
  }
  return b->replay->remaining;
}

}  // namespace

TEST_CASE("attempts: two tenants using the same id both decide, each replays its own") {
  RuleRegistry registry(build(kSpec));
  Store store;
  Gateway gw(store, registry);
  auto a = gw.decide(read("acme", "req-1"), 1s);
  auto b = gw.decide(read("globex", "req-1"), 1s);
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  CHECK_FALSE(a->replayed);
  CHECK_FALSE(b->replayed);
  CHECK(a->decision.allowed);
  CHECK(b->decision.allowed);
  CHECK(gw.attempts().size() == 2);
  // Each spends on a retry nothing more; a tenant's second attempt spends its own budget.
  auto a_again = gw.decide(read("acme", "req-1"), 2s);
  auto b_again = gw.decide(read("globex", "req-1"), 2s);
  REQUIRE(a_again.ok());
  REQUIRE(b_again.ok());
  CHECK(a_again->replayed);
  CHECK(b_again->replayed);
  CHECK(a_again->decision == a->decision);
  CHECK(b_again->decision == b->decision);
  auto a_next = gw.decide(read("acme", "req-2"), 3s);
  REQUIRE(a_next.ok());
  CHECK(a_next->decision.remaining == 8);
  auto b_next = gw.decide(read("globex", "req-2"), 3s);
  REQUIRE(b_next.ok());
  CHECK(b_next->decision.remaining == 8);
}

TEST_CASE("attempts: the scope is part of the key; ids without one share the empty scope") {
  AttemptCache cache(10s, 10);
  REQUIRE(cache.begin({.scope = "acme", .id = "x"}, "fp-a", Nanos{0}).ok());
  // Another scope, another fingerprint: its own attempt, not InvalidArgument.
  REQUIRE(cache.begin({.scope = "globex", .id = "x"}, "fp-b", Nanos{0}).ok());
  cache.finish({.scope = "acme", .id = "x"}, decision(1), std::nullopt);
  cache.finish({.scope = "globex", .id = "x"}, decision(2), std::nullopt);
  auto a = cache.begin({.scope = "acme", .id = "x"}, "fp-a", 1s);
  auto b = cache.begin({.scope = "globex", .id = "x"}, "fp-b", 1s);
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  CHECK(a->replay->remaining == 1);
  CHECK(b->replay->remaining == 2);
  // Within one scope another fingerprint is still another request.
  CHECK(cache.begin({.scope = "acme", .id = "x"}, "fp-b", 1s).status().code() ==
        absl::StatusCode::kInvalidArgument);
  // A scope and id are not their concatenation.
  CHECK(cache.begin({.scope = "acm", .id = "ex"}, "fp-c", 1s).ok());
  // The overloads without a scope use the empty one.
  REQUIRE(cache.begin("x", "fp-d", 1s).ok());
  cache.finish("x", decision(4));
  CHECK(cache.begin({.scope = "", .id = "x"}, "fp-d", 2s)->replay->remaining == 4);
  cache.abandon({.scope = "acme", .id = "x"});
  CHECK(cache.size() == 3);
}

TEST_CASE("attempts: a full cache whose oldest record expired admits a new id") {
  AttemptCache cache(10s, 3);
  keep(cache, "a", Nanos{0}, 1);
  keep(cache, "b", 1s, 2);
  keep(cache, "c", 2s, 3);
  CHECK(cache.begin("d", "f", 9s).status().code() == absl::StatusCode::kResourceExhausted);
  // At 10 s "a" expired: it makes room for "d", and the others are still replayed.
  keep(cache, "d", 10s, 4);
  CHECK(cache.size() == 3);
  CHECK(replayed(cache, "b", 10s) == 2);
  CHECK(replayed(cache, "c", 10s) == 3);
  CHECK(replayed(cache, "d", 10s) == 4);
  // "a" is forgotten: a new id again, refused while "b", "c", "d" live.
  CHECK(cache.begin("a", "f", 10s).status().code() == absl::StatusCode::kResourceExhausted);
  keep(cache, "a", 11s, 5);  // "b" expired at 11 s
  CHECK(replayed(cache, "a", 11s) == 5);
}

TEST_CASE("attempts: a cache full of live records refuses a new id and loses none") {
  AttemptCache cache(60s, 100);
  for (int i = 0; i < 100; ++i) keep(cache, std::to_string(i).c_str(), Nanos{i}, i);
  for (Nanos t : {Nanos{100}, Nanos{30s}, Nanos{60s} - Nanos{1}}) {
    CHECK(cache.begin("new", "f", t).status().code() == absl::StatusCode::kResourceExhausted);
  }
  CHECK(cache.size() == 100);
  for (int i = 0; i < 100; ++i) CHECK(replayed(cache, std::to_string(i).c_str(), 59s) == i);
}

TEST_CASE("attempts: an abandoned record leaves at once; its id begun again lives its own ttl") {
  AttemptCache cache(10s, 3);
  keep(cache, "a", Nanos{0});
  REQUIRE(cache.begin("b", "f", 1s).ok());
  keep(cache, "c", 2s);
  cache.abandon("b");  // its decision failed
  CHECK(cache.size() == 2);
  keep(cache, "x", 3s);  // the room "b" left
  CHECK(cache.begin("y", "f", 3s).status().code() == absl::StatusCode::kResourceExhausted);
  // "b" again, once "a" expired: a fresh attempt that expires at 20 s, not at 11 s.
  keep(cache, "b", 10s, 7);
  CHECK(replayed(cache, "b", 19s) == 7);
  CHECK_FALSE(replayed(cache, "b", 20s).has_value());
}

TEST_CASE("attempts: expired records left by a quiet spell drain as new ids arrive") {
  AttemptCache cache(1s, 100);
  for (int i = 0; i < 100; ++i) keep(cache, ("old-" + std::to_string(i)).c_str(), Nanos{0});
  // An hour later: each begin forgets two expired records and adds one.
  for (int i = 0; i < 50; ++i) keep(cache, ("new-" + std::to_string(i)).c_str(), 1h);
  CHECK(cache.size() == 50);
  CHECK(replayed(cache, "new-0", 1h) == 0);
}

TEST_CASE("attempts: a record found expired by its own id is decided afresh") {
  AttemptCache cache(10s, 2);
  keep(cache, "a", Nanos{0}, 1);
  CHECK(replayed(cache, "a", 10s - Nanos{1}) == 1);
  auto again = cache.begin("a", "another request", 10s);  // expired: another fingerprint is fine
  REQUIRE(again.ok());
  CHECK_FALSE(again->replay.has_value());
  CHECK(cache.size() == 1);
}

TEST_CASE("attempts: the default ttl is 60 s") {
  CHECK(quota::gateway::GatewayOptions{}.attempt_ttl == 60s);
  RuleRegistry registry(build(kSpec));
  Store store;
  Gateway gw(store, registry);
  REQUIRE(gw.decide(read("acme", "r"), Nanos{0})->decision.allowed);
  auto within = gw.decide(read("acme", "r"), 60s - Nanos{1});
  REQUIRE(within.ok());
  CHECK(within->replayed);
  auto after = gw.decide(read("acme", "r"), 60s);
  REQUIRE(after.ok());
  CHECK_FALSE(after->replayed);
  CHECK(after->decision.remaining == 8);
}

// Random begin / finish / abandon and time steps (non-decreasing, as from one clock) over
// 2 scopes × 5 ids, against a plain map of the live records: with every record expiring
// ttl after its begin, the cache must answer exactly as if expired records were gone at
// once — replay, Aborted, InvalidArgument, a fresh attempt, or ResourceExhausted when the
// live records fill it — and never hold more than its bound.
TEST_CASE("attempts: random operations answer as a map of the live records") {
  const std::uint64_t seed = quota::testing::test_seed(20261206);
  INFO("seed " << seed);
  std::mt19937_64 rng(seed);
  constexpr std::size_t kMax = 4;
  const Nanos ttl{40};
  AttemptCache cache(ttl, kMax);

  struct Live {
    std::string fingerprint;
    bool done = false;
    std::int64_t remaining = 0;  // the finished decision's
    std::optional<Nanos> deadline;
    Nanos expires_at{0};
  };
  std::map<std::pair<std::string, std::string>, Live> model;
  const char* scopes[] = {"acme", "globex"};
  const char* ids[] = {"a", "b", "c", "d", "e"};
  const char* fingerprints[] = {"f1", "f2"};
  Nanos now{0};
  std::int64_t next_remaining = 0;
  int replays = 0, fresh = 0, exhausted = 0, aborted = 0, invalid = 0;

  for (int step = 0; step < 20000; ++step) {
    const std::string scope = scopes[rng() % 2];
    const std::string id = ids[rng() % 5];
    const AttemptKey key{.scope = scope, .id = id};
    const auto mkey = std::make_pair(scope, id);
    std::erase_if(model, [&](const auto& e) { return e.second.expires_at <= now; });
    INFO("step " << step << " at " << now.count() << " ns, " << scope << "/" << id);
    const auto live = model.find(mkey);
    switch (rng() % 8) {
      case 0:
      case 1:
      case 2: {  // begin
        const std::string fp = fingerprints[rng() % 2];
        auto b = cache.begin(key, fp, now);
        if (live == model.end()) {
          if (model.size() >= kMax) {
            REQUIRE(b.status().code() == absl::StatusCode::kResourceExhausted);
            ++exhausted;
          } else {
            REQUIRE(b.ok());
            REQUIRE_FALSE(b->replay.has_value());
            model[mkey] = {.fingerprint = fp,
                           .done = false,
                           .remaining = 0,
                           .deadline = std::nullopt,
                           .expires_at = now + ttl};
            ++fresh;
          }
        } else if (live->second.fingerprint != fp) {
          REQUIRE(b.status().code() == absl::StatusCode::kInvalidArgument);
          ++invalid;
        } else if (!live->second.done) {
          REQUIRE(b.status().code() == absl::StatusCode::kAborted);
          ++aborted;
        } else {
          REQUIRE(b.ok());
          REQUIRE(b->replay.has_value());
          CHECK(b->replay->remaining == live->second.remaining);
          CHECK(b->deadline == live->second.deadline);
          ++replays;
        }
        break;
      }
      case 3:
      case 4: {  // finish (as the Gateway does: only an attempt it opened, here any)
        const std::optional<Nanos> deadline =
            rng() % 2 == 0 ? std::nullopt : std::optional<Nanos>(now + Nanos{5});
        cache.finish(key, decision(++next_remaining), deadline);
        if (live != model.end()) {
          live->second.done = true;
          live->second.remaining = next_remaining;
          live->second.deadline = deadline;
        }
        break;
      }
      case 5:  // abandon
        cache.abandon(key);
        if (live != model.end()) model.erase(live);
        break;
      default:  // time passes: often a little, sometimes past every record
        now += Nanos{rng() % 16 == 0 ? 50 : static_cast<std::int64_t>(rng() % 8)};
        break;
    }
    REQUIRE(cache.size() <= kMax);
    REQUIRE(cache.size() >= model.size());
  }
  // Every answer occurred.
  CHECK(replays > 0);
  CHECK(fresh > 0);
  CHECK(exhausted > 0);
  CHECK(aborted > 0);
  CHECK(invalid > 0);
}

// Four threads on one cache, each with ids of its own scope, on one clock that every call
// moves on (so the threads' begins interleave out of time order): a record a thread just
// finished is replayed to it, an abandoned one is decided afresh, and the cache never
// holds more than its bound.
TEST_CASE("attempts: threads on one cache each find their own records") {
  const std::uint64_t seed = quota::testing::test_seed(33);
  constexpr std::size_t kMax = 64;
  const Nanos ttl{2'000};
  AttemptCache cache(ttl, kMax);
  std::atomic<std::int64_t> clock{0};
  std::atomic<int> failures{0};
  std::atomic<std::int64_t> exhausted{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937_64 rng(seed + static_cast<std::uint64_t>(t));
      const std::string scope = "tenant-" + std::to_string(t);
      for (int i = 0; i < 20'000; ++i) {
        const std::string id = std::to_string(rng() % 50);
        const AttemptKey key{.scope = scope, .id = id};
        const Nanos now{clock.fetch_add(1)};
        auto b = cache.begin(key, "f", now);
        if (!b.ok()) {
          if (b.status().code() != absl::StatusCode::kResourceExhausted) ++failures;
          ++exhausted;
          continue;
        }
        if (b->replay.has_value()) continue;
        if (rng() % 4 == 0) {
          cache.abandon(key);
          auto again = cache.begin(key, "f", now);  // nothing was kept: decided afresh
          if (again.ok()) {
            if (again->replay.has_value()) ++failures;
            cache.abandon(key);
          }
          continue;
        }
        cache.finish(key, decision(i), std::nullopt);
        auto replay = cache.begin(key, "f", now);
        // Replayed, unless another thread began with a time past this record's expiry
        // meanwhile (this one was descheduled) and forgot it.
        const bool replayed =
            replay.ok() && replay->replay.has_value() && replay->replay->remaining == i;
        if (!replayed && clock.load() < now.count() + ttl.count()) ++failures;
        if (replay.ok() && !replay->replay.has_value()) cache.abandon(key);
        if (cache.size() > kMax) ++failures;
      }
    });
  }
  for (std::thread& th : threads) th.join();
  CHECK(failures.load() == 0);
  CHECK(cache.size() <= kMax);
  INFO("begins refused while full: " << exhausted.load());
}
