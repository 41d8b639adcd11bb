// Estimate tickets in Redis (quota/redis/tickets.hpp), through two Gateways that share one
// Redis as two processes behind a load balancer would (each its own connections and
// TicketStore): an estimate taken at one settles at the other, once; racing settles apply
// one refund; another tenant's settle, an unknown, expired or malformed ticket change
// nothing; the record sits in the tenant's hash slot and Redis forgets it after 2·ttl.
#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "quota/gateway/gateway.hpp"
#include "quota/redis/gateway_store.hpp"
#include "quota/redis/tickets.hpp"
#include "quota/redis/transport/cluster.hpp"
#include "support/gateway_fixtures.hpp"
#include "support/gateway_rules.hpp"
#include "support/redis_server.hpp"

namespace redis_tickets_test {

using namespace std::chrono_literals;
using quota::Nanos;
using quota::TokenBucket;
using quota::gateway::Gateway;
using quota::gateway::RuleRegistry;
using quota::redis::GatewayStore;
using quota::redis::GatewayStoreOptions;
using quota::redis::RedisTickets;
using quota::testing::build;
using quota::testing::kSlow;
using quota::testing::read;

// One gateway process: its connections, its budgets' store, its tickets, its Gateway.
struct Process {
  Process(const std::string& prefix, RuleRegistry& registry, Nanos ttl)
      : options{.pool = quota::testing::redis_pool(4), .prefix = prefix},
        store(options),
        tickets(std::make_shared<RedisTickets>(options, ttl)),
        gw(store, registry, {.tickets = tickets}) {}
  GatewayStoreOptions options;
  GatewayStore store;
  std::shared_ptr<RedisTickets> tickets;
  Gateway gw;
};

std::string fresh_prefix(const char* test) {
  static int runs = 0;
  return quota::testing::unique_prefix(std::string(test) + "-" + std::to_string(++runs));
}

// Tenant, user and global budgets of 1000 that do not refill (kSlow): the tenant and user
// levels in the tenant's slot, the global one in its own.
quota::gateway::RuleSetSpec three_levels() {
  const TokenBucket b{.rate = kSlow, .burst = 1000};
  return quota::testing::spec(1, b, b, b);
}

std::int64_t remaining_after_one(Gateway& gw) {
  auto r = gw.decide(read("acme", "u-1"), Nanos{0});
  REQUIRE(r.ok());
  REQUIRE(r->decision.allowed);
  return r->decision.remaining;
}

TEST_CASE("redis tickets: an estimate taken at one gateway settles at another, once") {
  RuleRegistry registry(build(three_levels()));
  const std::string prefix = fresh_prefix("tickets");
  Process a(prefix, registry, 10min), b(prefix, registry, 10min);
  auto est = a.gw.acquire_estimate(read("acme", "u-1"), 600, Nanos{0});
  REQUIRE(est.ok());
  REQUIRE(est->decision.allowed);
  REQUIRE(est->ticket.has_value());
  const auto id = *est->ticket;

  // Another tenant's settle, at either process: refused, nothing given back.
  auto stranger = b.gw.settle("other", id, 0, Nanos{0});
  CHECK(stranger.status().code() == absl::StatusCode::kNotFound);
  CHECK(a.gw.settle("acme", id ^ 1, 0, Nanos{0}).status().code() == absl::StatusCode::kNotFound);
  CHECK(b.gw.settle("a{b", id, 0, Nanos{0}).status().code() == absl::StatusCode::kInvalidArgument);

  auto settled = b.gw.settle("acme", id, 150, Nanos{0});
  REQUIRE(settled.ok());
  CHECK(settled->surplus == 450);
  REQUIRE(settled->refunded.size() == 3);  // user, tenant, global
  for (quota::MicroUnits m : settled->refunded) CHECK(m == 450 * quota::kMicrosPerUnit);
  CHECK(a.gw.settle("acme", id, 150, Nanos{0}).status().code() ==
        absl::StatusCode::kFailedPrecondition);
  CHECK(b.gw.settle("acme", id, 150, Nanos{0}).status().code() ==
        absl::StatusCode::kFailedPrecondition);
  CHECK(remaining_after_one(a.gw) == 1000 - 600 + 450 - 1);

  // The record is in the tenant's hash slot, beside its budgets.
  const std::string key = a.tickets->key("acme", id);
  auto budget = a.store.redis_key("{acme}read");
  REQUIRE(budget.ok());
  CHECK(quota::redis::key_slot(key) == quota::redis::key_slot(*budget));
}

TEST_CASE("redis tickets: settles racing at two gateways apply one refund") {
  RuleRegistry registry(build(three_levels()));
  const std::string prefix = fresh_prefix("tickets-race");
  Process a(prefix, registry, 10min), b(prefix, registry, 10min);
  for (int round = 0; round < 5; ++round) {
    auto est = a.gw.acquire_estimate(read("acme", "u-1"), 100, Nanos{0});
    REQUIRE(est.ok());
    REQUIRE(est->ticket.has_value());
    std::atomic<int> ok{0}, refused{0};
    std::vector<std::thread> threads;
    for (int t = 0; t < 8; ++t) {
      threads.emplace_back([&, t] {
        auto s = (t % 2 == 0 ? a : b).gw.settle("acme", *est->ticket, 0, Nanos{0});
        (s.ok() ? ok : refused).fetch_add(1);
        if (!s.ok() && s.status().code() != absl::StatusCode::kFailedPrecondition) {
          refused.fetch_add(100);  // any other error fails the check below
        }
      });
    }
    for (auto& t : threads) t.join();
    CHECK(ok.load() == 1);
    CHECK(refused.load() == 7);
  }
  // Five estimates of 100, each given back whole exactly once.
  CHECK(remaining_after_one(b.gw) == 999);
}

TEST_CASE("redis tickets: expired after the ttl on the server's clock, forgotten after two") {
  RuleRegistry registry(build(three_levels()));
  const std::string prefix = fresh_prefix("tickets-ttl");
  Process a(prefix, registry, 300ms), b(prefix, registry, 300ms);
  auto est = a.gw.acquire_estimate(read("acme", "u-1"), 200, Nanos{0});
  REQUIRE(est.ok());
  REQUIRE(est->ticket.has_value());
  auto admin = quota::testing::redis_pool(1);
  auto lease = admin->acquire();
  REQUIRE(lease.ok());
  auto pttl = (*lease)->command({"PTTL", a.tickets->key("acme", *est->ticket)});
  REQUIRE(pttl.ok());
  CHECK((*pttl)->integer > 0);
  CHECK((*pttl)->integer <= 600);
  std::this_thread::sleep_for(400ms);
  // The caller's `now` does not matter: the server's clock says it expired.
  auto late = b.gw.settle("acme", *est->ticket, 0, Nanos{0});
  CHECK(late.status().code() == absl::StatusCode::kDeadlineExceeded);
  CHECK(late.status().message().find("the estimate stays spent") != std::string::npos);
  CHECK(remaining_after_one(a.gw) == 1000 - 200 - 1);
  std::this_thread::sleep_for(300ms);
  CHECK(b.gw.settle("acme", *est->ticket, 0, Nanos{0}).status().code() ==
        absl::StatusCode::kNotFound);
}

TEST_CASE("redis tickets: a malformed record is an error and settles nothing") {
  RuleRegistry registry(build(three_levels()));
  const std::string prefix = fresh_prefix("tickets-bad");
  Process a(prefix, registry, 10min);
  auto est = a.gw.acquire_estimate(read("acme", "u-1"), 300, Nanos{0});
  REQUIRE(est.ok());
  REQUIRE(est->ticket.has_value());
  const std::string key = a.tickets->key("acme", *est->ticket);
  auto admin = quota::testing::redis_pool(1);
  auto lease = admin->acquire();
  REQUIRE(lease.ok());
  auto good = (*lease)->command({"HGET", key, "b"});
  REQUIRE(good.ok());
  const std::string record((*good)->str, (*good)->len);
  int probes = 0;
  for (const std::string& bad : {std::string("garbage"), record + " 1", record.substr(0, 20),
                                 std::string("300 0 0 1 1 9 1 1 1 0 0 0 5:{acme")}) {
    INFO(bad);
    REQUIRE((*lease)->command({"HSET", key, "b", bad}).ok());
    auto s = a.gw.settle("acme", *est->ticket, 0, Nanos{0});
    CHECK(s.status().code() == absl::StatusCode::kInternal);
    CHECK(remaining_after_one(a.gw) == 1000 - 300 - ++probes);
  }
  // The ticket was put back open: with its record restored, it settles.
  REQUIRE((*lease)->command({"HSET", key, "b", record}).ok());
  auto s = a.gw.settle("acme", *est->ticket, 300, Nanos{0});
  REQUIRE(s.ok());
  CHECK(s->surplus == 0);
}

TEST_CASE("redis tickets: a Redis that cannot answer is Unavailable, nothing taken") {
  // Loopback port 1: privileged, nothing listens there, every connect is refused.
  quota::redis::ConnectionConfig config = quota::testing::redis_config(200ms);
  config.port = 1;
  GatewayStoreOptions options{.pool = std::make_shared<quota::redis::ConnectionPool>(config, 1),
                              .prefix = fresh_prefix("tickets-down")};
  RedisTickets tickets(options, 10min);
  auto taken = tickets.take("acme", 42, Nanos{0});
  CHECK(taken.status().code() == absl::StatusCode::kUnavailable);
  auto issued = tickets.issue({.tenant = "acme"}, Nanos{0});
  CHECK(issued.status().code() == absl::StatusCode::kUnavailable);
}

}  // namespace redis_tickets_test
