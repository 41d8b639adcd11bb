// Tests for estimate-then-settle (quota/gateway/settle.hpp through Gateway): refund the
// surplus (capped, once, not after expiry), record or charge the deficit, clear errors
// that change nothing, and a settle racing new acquires on 8 threads.
#include "quota/gateway/settle.hpp"

#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <random>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "quota/gateway/gateway.hpp"
#include "quota/store/local_store.hpp"
#include "quota/store/sharded_store.hpp"
#include "support/gateway_rules.hpp"
#include "support/seed.hpp"

using namespace std::chrono_literals;
using quota::Nanos;
using quota::TokenBucket;
using quota::gateway::Gateway;
using quota::gateway::KeyPolicy;
using quota::gateway::KeyState;
using quota::gateway::RuleRegistry;
using quota::testing::build;

namespace {

const quota::gateway::Request kChat{.who = {.tenant = "acme", .plan = "free"}, .route = "read"};

// The tenant's read bucket, observed at `now` without spending.
template <class Store>
quota::MicroUnits tokens(Store& store, RuleRegistry& registry, Nanos now) {
  auto rules = registry.current();
  const auto* rule =
      rules->find(quota::gateway::Level::kTenant, {.tenant = "acme", .plan = "free"}, "read");
  const KeyPolicy kp{.policy = &rule->policy, .version = rules->version()};
  auto t = store.update(kp, "{acme}read", now, [&](KeyState& s) {
    quota::gateway::migrate(s, rule->policy, rules->version(), now);
    auto& st = std::get<TokenBucket::State>(s.state);
    std::get<TokenBucket>(s.policy).refill(st, now.count());
    return st.tokens;
  });
  REQUIRE(t.ok());
  return *t;
}

}  // namespace

TEST_CASE("settle refunds the surplus once; twice, late or unknown is an error, no change") {
  RuleRegistry registry(build(quota::testing::basic_spec(1, 0, 100)));  // rate 0: no refill
  quota::LocalStore<KeyPolicy> store;
  Gateway gw(store, registry, {.ticket_ttl = 10s});
  auto est = gw.acquire_estimate(kChat, 30, Nanos{0});
  REQUIRE(est.ok());
  REQUIRE(est->decision.allowed);
  REQUIRE(est->ticket.has_value());
  CHECK(est->decision.remaining == 70);
  // Another tenant's settle of it: refused, nothing given back, the ticket still open.
  auto stranger = gw.settle("other", *est->ticket, 0, 1s);
  CHECK(stranger.status().code() == absl::StatusCode::kNotFound);
  CHECK(absl::StrContains(stranger.status().message(), "no such ticket of tenant \"other\""));
  CHECK(tokens(store, registry, 1s) == quota::to_micro(70));
  auto s = gw.settle("acme", *est->ticket, 12, 1s);
  REQUIRE(s.ok());
  CHECK(s->surplus == 18);
  CHECK(s->deficit == 0);
  CHECK(s->refunded == std::vector<quota::MicroUnits>{quota::to_micro(18)});
  CHECK(tokens(store, registry, 1s) == quota::to_micro(88));

  auto twice = gw.settle("acme", *est->ticket, 12, 2s);
  CHECK(twice.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK(tokens(store, registry, 2s) == quota::to_micro(88));

  CHECK(gw.settle("acme", 987654, 1, 2s).status().code() == absl::StatusCode::kNotFound);
  CHECK(gw.settle("acme", *est->ticket, -1, 2s).status().code() ==
        absl::StatusCode::kInvalidArgument);

  auto late = gw.acquire_estimate(kChat, 20, 2s);
  REQUIRE(late->ticket.has_value());
  CHECK(gw.settle("acme", *late->ticket, 0, 12s + 1ns).status().code() ==
        absl::StatusCode::kDeadlineExceeded);
  CHECK(tokens(store, registry, 13s) == quota::to_micro(68));  // the estimate stays spent
  // Still expired (not "unknown") on a second late try, and never settled.
  CHECK(gw.settle("acme", *late->ticket, 0, 13s).status().code() ==
        absl::StatusCode::kDeadlineExceeded);
  // At exactly the expiry it is still in time.
  auto edge = gw.acquire_estimate(kChat, 8, 20s);
  CHECK(gw.settle("acme", *edge->ticket, 8, 30s).ok());
}

TEST_CASE("the refund never goes above the burst") {
  RuleRegistry registry(build(quota::testing::basic_spec(1, 100, 100)));
  quota::LocalStore<KeyPolicy> store;
  Gateway gw(store, registry);
  auto est = gw.acquire_estimate(kChat, 30, Nanos{0});
  REQUIRE(est->ticket.has_value());
  // 1 s later the bucket has refilled to 100 at 100/s: nothing can be given back.
  auto s = gw.settle("acme", *est->ticket, 0, 1s);
  REQUIRE(s.ok());
  CHECK(s->surplus == 30);
  CHECK(s->refunded == std::vector<quota::MicroUnits>{0});
  CHECK(tokens(store, registry, 1s) == quota::to_micro(100));
  // Partly refilled: the refund fills it up to the burst and no further.
  auto est2 = gw.acquire_estimate(kChat, 50, 2s);
  auto s2 = gw.settle("acme", *est2->ticket, 0, 2s + 300ms);  // 50 + 30 refilled, 20 room left
  CHECK(s2->refunded == std::vector<quota::MicroUnits>{quota::to_micro(20)});
  CHECK(tokens(store, registry, 2s + 300ms) == quota::to_micro(100));
}

TEST_CASE("a deficit is recorded; with charge_deficit it is charged, as debt beyond the budget") {
  SECTION("recorded only") {
    RuleRegistry registry(build(quota::testing::basic_spec(1, 0, 100)));
    quota::LocalStore<KeyPolicy> store;
    Gateway gw(store, registry);
    auto est = gw.acquire_estimate(kChat, 10, Nanos{0});
    auto s = gw.settle("acme", *est->ticket, 25, Nanos{0});
    REQUIRE(s.ok());
    CHECK(s->deficit == 15);
    CHECK(s->debt == std::vector<quota::MicroUnits>{0});
    CHECK(tokens(store, registry, Nanos{0}) == quota::to_micro(90));
  }
  SECTION("charged") {
    RuleRegistry registry(build(quota::testing::basic_spec(1, 1, 100)));
    quota::LocalStore<KeyPolicy> store;
    Gateway gw(store, registry, {.charge_deficit = true});
    auto est = gw.acquire_estimate(kChat, 90, Nanos{0});
    auto s = gw.settle("acme", *est->ticket, 115, Nanos{0});  // deficit 25, only 10 left
    REQUIRE(s.ok());
    CHECK(s->deficit == 25);
    CHECK(s->debt == std::vector<quota::MicroUnits>{quota::to_micro(15)});
    // The debt is paid by refill first: 15 s to pay, 1 more to admit one unit.
    CHECK_FALSE(gw.decide(kChat, 16s - 1ns)->decision.allowed);
    CHECK(gw.decide(kChat, 16s)->decision.allowed);
  }
}

TEST_CASE("settle gives back to every level the estimate was taken from") {
  auto spec = quota::testing::basic_spec(1, 0, 100);
  spec.rules.push_back({.level = quota::gateway::Level::kUser,
                        .plan = "free",
                        .route = "read",
                        .name = "free-user",
                        .policy = TokenBucket{.rate = {.units = 0, .per = 1s}, .burst = 40}});
  RuleRegistry registry(build(spec));
  quota::LocalStore<KeyPolicy> store;
  Gateway gw(store, registry);
  const quota::gateway::Request req{.who = {.tenant = "acme", .plan = "free", .user = "u1"},
                                    .route = "read"};
  auto est = gw.acquire_estimate(req, 30, Nanos{0});
  REQUIRE(est->ticket.has_value());
  CHECK(est->decision.remaining == 10);  // the user level is the tighter one
  auto s = gw.settle("acme", *est->ticket, 5, Nanos{0});
  REQUIRE(s.ok());
  CHECK(s->refunded == std::vector<quota::MicroUnits>{quota::to_micro(25), quota::to_micro(25)});
  CHECK(gw.acquire_estimate(req, 35, Nanos{0})->decision.allowed);  // user level: 35 back
  // A denied estimate has no ticket.
  auto denied = gw.acquire_estimate(req, 10, Nanos{0});
  CHECK_FALSE(denied->decision.allowed);
  CHECK_FALSE(denied->ticket.has_value());
}

TEST_CASE("settles racing new acquires on 8 threads: each ticket once, exact accounting") {
  const std::uint64_t seed = quota::testing::test_seed(6006);
  INFO("seed " << seed);
  constexpr std::int64_t kBurst = 1'000'000;
  constexpr int kThreads = 8;
  constexpr int kPre = 800;        // tickets issued up front, each settled by two racing threads
  constexpr int kPerThread = 300;  // new acquire + settle pairs per thread
  RuleRegistry registry(build(quota::testing::basic_spec(1, 0, kBurst)));
  quota::ShardedStore<KeyPolicy> store;
  Gateway gw(store, registry, {.charge_deficit = true});
  std::mt19937_64 rng(seed);
  std::vector<quota::gateway::TicketId> pre;
  std::vector<std::int64_t> pre_actual;
  std::int64_t expected_spent = 0;
  for (int j = 0; j < kPre; ++j) {
    auto e = gw.acquire_estimate(kChat, 10, Nanos{0});
    REQUIRE(e->ticket.has_value());
    pre.push_back(*e->ticket);
    pre_actual.push_back(static_cast<std::int64_t>(rng() % 13));  // 0..12: surplus or deficit
    expected_spent += pre_actual.back();
  }
  std::vector<std::uint64_t> thread_seeds;
  for (int t = 0; t < kThreads; ++t) thread_seeds.push_back(rng());
  std::vector<std::atomic<int>> wins(kPre);
  std::atomic<std::int64_t> spent_new{0};
  std::atomic<int> errors{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937_64 r(thread_seeds[t]);
      int next_pre = t % 4;  // threads t and t+4 race on the same pre-issued tickets
      for (int i = 0; i < kPerThread || next_pre < kPre; ++i) {
        if (i < kPerThread) {
          auto e = gw.acquire_estimate(kChat, 10, Nanos{0});
          if (!e.ok() || !e->ticket.has_value()) {
            errors.fetch_add(1);
          } else {
            const auto actual = static_cast<std::int64_t>(r() % 13);
            if (gw.settle("acme", *e->ticket, actual, Nanos{0}).ok()) {
              spent_new.fetch_add(actual);
            } else {
              errors.fetch_add(1);
            }
            // A second settle of the same ticket never applies.
            if (gw.settle("acme", *e->ticket, actual, Nanos{0}).status().code() !=
                absl::StatusCode::kFailedPrecondition) {
              errors.fetch_add(1);
            }
          }
        }
        if (next_pre < kPre) {
          auto s = gw.settle("acme", pre[next_pre], pre_actual[next_pre], Nanos{0});
          if (s.ok()) {
            wins[next_pre].fetch_add(1);
          } else if (s.status().code() != absl::StatusCode::kFailedPrecondition) {
            errors.fetch_add(1);
          }
          next_pre += 4;
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  CHECK(errors.load() == 0);
  int once = 0;
  for (const auto& w : wins) once += w.load() == 1 ? 1 : 0;
  CHECK(once == kPre);
  // Rate 0: the bucket holds exactly the burst minus every actual cost.
  CHECK(tokens(store, registry, Nanos{0}) ==
        quota::to_micro(kBurst - expected_spent - spent_new.load()));
}

namespace {

using quota::gateway::TicketBook;

// A ticket issued at `at` that expires ttl (10 s) later, as the Gateway issues them.
quota::gateway::Ticket ticket_at(Nanos at) {
  return {.tenant = "acme",
          .levels = {},
          .estimate = 1,
          .acquired_at = at,
          .spent_at = at,
          .expires_at = at + 10s};
}

}  // namespace

TEST_CASE(
    "the ticket book: full of tickets still kept it refuses; the oldest forgettable one "
    "makes room") {
  TicketBook book(10s, 3);
  for (Nanos t : {Nanos{0}, Nanos{1s}, Nanos{2s}}) {
    auto id = book.issue(ticket_at(t), t);
    REQUIRE(id.ok());
    CHECK(*id == static_cast<quota::gateway::TicketId>(t / 1s + 1));  // 1, 2, 3
  }
  // Ticket 1 expires at 10 s and is kept as a tombstone until one ttl later.
  CHECK(book.issue(ticket_at(15s), 15s).status().code() == absl::StatusCode::kResourceExhausted);
  CHECK(book.issue(ticket_at(20s), 20s).status().code() == absl::StatusCode::kResourceExhausted);
  CHECK(book.take("acme", 1, 20s).status().code() == absl::StatusCode::kDeadlineExceeded);
  auto next = book.issue(ticket_at(20s + 1ns), 20s + 1ns);
  REQUIRE(next.ok());
  CHECK(*next == 4);  // ids keep counting past the forgotten ones
  CHECK(book.size() == 3);
  CHECK(book.take("acme", 1, 20s + 1ns).status().code() == absl::StatusCode::kNotFound);
  CHECK(book.take("acme", 2, 20s + 1ns).status().code() == absl::StatusCode::kDeadlineExceeded);
  CHECK(book.take("acme", 0, 20s + 1ns).status().code() == absl::StatusCode::kNotFound);
  CHECK(book.take("acme", 5, 20s + 1ns).status().code() == absl::StatusCode::kNotFound);
  auto open = book.take("acme", 4, 21s);
  REQUIRE(open.ok());
  CHECK(open->acquired_at == 20s + 1ns);
}

TEST_CASE("the ticket book: a ticket being settled is kept, and holds the ones behind it") {
  TicketBook book(10s, 3);
  for (Nanos t : {Nanos{0}, Nanos{1s}, Nanos{2s}}) REQUIRE(book.issue(ticket_at(t), t).ok());
  REQUIRE(book.take("acme", 1, 5s).ok());  // a settle in flight
  // An hour on, every ticket is forgettable but the first is still being settled.
  CHECK(book.issue(ticket_at(1h), 1h).status().code() == absl::StatusCode::kResourceExhausted);
  book.done("acme", 1);
  REQUIRE(book.issue(ticket_at(1h), 1h).ok());  // forgets tickets 1 and 2
  CHECK(book.size() == 2);
  CHECK(book.take("acme", 1, 1h).status().code() == absl::StatusCode::kNotFound);
  CHECK(book.take("acme", 2, 1h).status().code() == absl::StatusCode::kNotFound);
  CHECK(book.take("acme", 3, 1h).status().code() == absl::StatusCode::kDeadlineExceeded);
}

TEST_CASE("the ticket book: tickets left by a quiet spell drain as new ones are issued") {
  TicketBook book(10s, 100);
  for (int i = 0; i < 100; ++i) REQUIRE(book.issue(ticket_at(Nanos{0}), Nanos{0}).ok());
  CHECK(book.issue(ticket_at(1s), 1s).status().code() == absl::StatusCode::kResourceExhausted);
  // An hour later each issue forgets two old tickets and adds one.
  for (int i = 0; i < 50; ++i) REQUIRE(book.issue(ticket_at(1h), 1h).ok());
  CHECK(book.size() == 50);
  CHECK(book.take("acme", 100, 1h).status().code() == absl::StatusCode::kNotFound);
  CHECK(book.take("acme", 101, 1h).ok());
}

TEST_CASE("tickets at the ends of the clock are kept and forgotten without overflow") {
  // The ticket book compares times a caller's clock gave, whatever they are (the asan
  // stage's UBSan traps an overflow).
  RuleRegistry registry(build(quota::testing::basic_spec(1, 0, 100)));
  quota::LocalStore<KeyPolicy> store;
  Gateway gw(store, registry, {.ticket_ttl = 10s});
  auto early = gw.acquire_estimate(kChat, 5, Nanos{-35'201'652'629'508});
  REQUIRE(early.ok());
  REQUIRE(early->ticket.has_value());
  auto late = gw.acquire_estimate(kChat, 5, Nanos::max() - Nanos{2});
  REQUIRE(late.ok());
  REQUIRE(late->ticket.has_value());
  // The early ticket was forgotten long ago by the late clock; the late one settles.
  CHECK(gw.settle("acme", *early->ticket, 1, Nanos::max() - Nanos{1}).status().code() ==
        absl::StatusCode::kNotFound);
  CHECK(gw.settle("acme", *late->ticket, 1, Nanos::max() - Nanos{1}).ok());
}
