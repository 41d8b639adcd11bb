// Leased gateway budgets over Redis (quota/gateway/leases/leased_backend.hpp with
// quota::redis::GatewayStore as the authority and RedisGrantLedger as its record; a real
// redis-server, server time): several holders on their own threads, each with its own
// store, connections and incarnation, share a global budget and tenant budgets through
// grants; the union of their admissions stays within the budgets, every granted unit is
// accounted for, the grants are listed at the authority, and a rule change reaches a
// holder that never reloads at its grant's expiry.
#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "quota/gateway/leases/leased_backend.hpp"
#include "quota/redis/gateway_store.hpp"
#include "quota/redis/grant_ledger.hpp"
#include "quota/verify/envelope.hpp"
#include "support/gateway_fixtures.hpp"
#include "support/lease_rules.hpp"
#include "support/lossy_proxy.hpp"
#include "support/redis_server.hpp"

using namespace std::chrono_literals;
using quota::Nanos;
using quota::TokenBucket;
using quota::gateway::LeaseMetrics;
using quota::gateway::Level;
using quota::redis::GatewayStore;
using quota::redis::RedisGrantLedger;
using quota::testing::build;
using quota::testing::kSlow;
using quota::testing::lease_levels_spec;
using quota::testing::lease_on;

namespace {

using Holder = quota::testing::LeaseHolder<GatewayStore, RedisGrantLedger>;

// One gateway process: its own connections, store, record and holder.
struct Process {
  Process(const std::string& prefix, std::shared_ptr<const quota::gateway::RuleSet> rules,
          std::uint64_t incarnation)
      : store({.pool = quota::testing::redis_pool(4), .prefix = prefix}),
        ledger(store),
        holder(store, ledger, std::move(rules), incarnation, &metrics) {}
  GatewayStore store;
  RedisGrantLedger ledger;
  LeaseMetrics metrics;
  Holder holder;
};

std::int64_t sum(const std::vector<std::unique_ptr<Process>>& ps, Level level,
                 std::atomic<std::int64_t> quota::LeaseCounters::*field) {
  std::int64_t n = 0;
  for (const auto& p : ps) n += (p->metrics.at(level).*field).load();
  return n;
}

}  // namespace

TEST_CASE("holders share global and tenant budgets in Redis through leases",
          "[redis][lease][concurrency]") {
  const std::string prefix = quota::testing::unique_prefix("gw-lease");
  const TokenBucket global{.rate = kSlow, .burst = 600};
  const TokenBucket tenant{.rate = kSlow, .burst = 100};
  auto rules =
      build(lease_levels_spec(1, tenant, lease_on(10, 2, 1min), global, lease_on(25, 5, 1min)));
  constexpr int kProcesses = 3;
  std::vector<std::unique_ptr<Process>> ps;
  for (int i = 0; i < kProcesses; ++i) {
    ps.push_back(std::make_unique<Process>(prefix, rules, 0x100 + i));
  }
  const std::uint64_t seed = 1202;
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  std::mutex mu;
  std::map<std::string, std::int64_t> admitted_by_tenant;
  std::int64_t admitted = 0;
  std::int64_t decisions = 0;
  std::vector<std::thread> threads;
  for (int i = 0; i < kProcesses; ++i) {
    threads.emplace_back([&, i] {
      std::mt19937_64 rng(seed + i);
      std::map<std::string, std::int64_t> mine;
      std::int64_t n = 0, ok = 0;
      for (int k = 0; k < 400; ++k) {
        const std::string who = "t" + std::to_string(rng() % 10);
        auto r = ps[i]->holder.gateway.decide(
            {.who = {.tenant = who, .plan = "free"}, .route = "read"}, Nanos{k * 1ms});
        if (!r.ok()) continue;  // counted below as not admitted
        ++n;
        if (r->decision.allowed) {
          ++ok;
          ++mine[who];
        }
      }
      std::lock_guard<std::mutex> lock(mu);
      decisions += n;
      admitted += ok;
      for (const auto& [who, c] : mine) admitted_by_tenant[who] += c;
    });
  }
  for (auto& t : threads) t.join();
  CHECK(decisions == kProcesses * 400);
  // 1,200 requests for 600 units: the global budget bounds them, exactly: nothing
  // refills (1 unit per hour) and a unit is admitted only from a grant taken from it.
  const std::int64_t granted = sum(ps, Level::kGlobal, &quota::LeaseCounters::units_granted);
  const std::int64_t held = sum(ps, Level::kGlobal, &quota::LeaseCounters::units_held);
  CHECK(granted <= global.burst);
  CHECK(granted >= global.burst - 25);  // at most one grant's worth is left unasked
  CHECK(admitted + held == granted);    // every granted unit spent or still held
  CHECK(admitted >= global.burst - kProcesses * (25 + 5) - 25);
  for (const auto& [who, n] : admitted_by_tenant) {
    INFO(who);
    CHECK(n <= tenant.burst);
  }
  // The authority lists who holds what: every grant of the global key, from the three
  // incarnations, summing to what the holders were granted.
  auto listed = ps[0]->ledger.outstanding("{~global}read");
  REQUIRE(listed.ok());
  std::int64_t listed_units = 0;
  std::map<std::uint64_t, int> by_holder;
  for (const auto& g : *listed) {
    listed_units += g.units;
    ++by_holder[g.incarnation];
    CHECK(g.version == 1);
  }
  CHECK(listed_units == granted);
  CHECK(by_holder.size() == kProcesses);
  // Authority round trips for the global level: one per grant (plus the denials at the
  // end), against one per request without leases.
  std::int64_t grant_requests = 0;
  for (const auto& p : ps) grant_requests += p->holder.backend.grant_requests();
  std::printf("%lld decisions, %lld grant requests (global and tenants)\n",
              static_cast<long long>(decisions), static_cast<long long>(grant_requests));
  CHECK(grant_requests * 3 < decisions);
  CHECK(sum(ps, Level::kGlobal, &quota::LeaseCounters::renewals) > 0);
  CHECK(sum(ps, Level::kGlobal, &quota::LeaseCounters::renewal_ns_total) > 0);
  CHECK(sum(ps, Level::kGlobal, &quota::LeaseCounters::record_failures) == 0);
  const std::string text = quota::gateway::render_prometheus(ps[0]->metrics);
  CHECK(text.find("quota_lease_units_held{level=\"global\"} " +
                  std::to_string(ps[0]->metrics.at(Level::kGlobal).units_held.load()) + "\n") !=
        std::string::npos);
}

TEST_CASE("over Redis, a rule change reaches a holder that never reloads at its grant's expiry",
          "[redis][lease]") {
  const std::string prefix = quota::testing::unique_prefix("gw-lease-version");
  const TokenBucket tenant{.rate = kSlow, .burst = 1000};
  auto v1 =
      build(lease_levels_spec(1, tenant, {}, {.rate = kSlow, .burst = 500}, lease_on(50, 0, 1min)));
  auto v2 =
      build(lease_levels_spec(2, tenant, {}, {.rate = kSlow, .burst = 100}, lease_on(10, 0, 1min)));
  Process a(prefix, v1, 1), b(prefix, v1, 2);
  const auto read = [](const char* t) {
    return quota::gateway::Request{.who = {.tenant = t, .plan = "free"}, .route = "read"};
  };
  REQUIRE(a.holder.gateway.decide(read("x"), Nanos{0})->decision.allowed);
  REQUIRE(b.holder.gateway.decide(read("y"), Nanos{0})->decision.allowed);
  // A reloads (v2: burst 100): its v1 grant is dropped; the authority converts the key.
  REQUIRE(a.holder.registry.publish(v2).ok());
  auto ra = a.holder.gateway.decide(read("x"), Nanos{1ms});
  REQUIRE(ra.ok());
  CHECK(ra->decision.version == 2);
  CHECK(a.metrics.at(Level::kGlobal).units_dropped_on_rule_change.load() == 49);
  // B keeps spending its v1 grant until it expires, then takes a grant under v2.
  // (The holder's clock is the caller's `now`: a minute passes for B without waiting.)
  auto rb = b.holder.gateway.decide(read("y"), Nanos{1min - 1ms});
  REQUIRE(rb.ok());
  CHECK(rb->decision.version == 1);
  rb = b.holder.gateway.decide(read("y"), Nanos{1min});
  REQUIRE(rb.ok());
  CHECK(rb->decision.version == 2);
  auto listed = b.ledger.outstanding("{~global}read");
  REQUIRE(listed.ok());
  std::map<std::uint64_t, std::int64_t> versions;
  for (const auto& g : *listed) versions[g.version] += g.units;
  CHECK(versions[1] == 100);      // the two v1 grants: a minute of the server's clock to go
  CHECK(versions[2] == 10 + 50);  // A's v2 grant, and B's: asked as v1, taken under v2
}

TEST_CASE("over Redis, a grant whose reply was lost is retried with its id and taken once",
          "[redis][lease]") {
  quota::testing::LossyProxy proxy(quota::testing::redis_port());
  auto cfg = quota::testing::redis_config();
  cfg.port = proxy.port();
  const std::string prefix = quota::testing::unique_prefix("gw-lease-lost");
  GatewayStore through_proxy(
      {.pool = std::make_shared<quota::redis::ConnectionPool>(cfg, 1), .prefix = prefix});
  GatewayStore direct({.pool = quota::testing::redis_pool(1), .prefix = prefix});
  RedisGrantLedger ledger(through_proxy);
  LeaseMetrics metrics;
  const TokenBucket global{.rate = kSlow, .burst = 100};
  quota::gateway::RuleRegistry registry(build(
      lease_levels_spec(1, {.rate = kSlow, .burst = 100}, {}, global, lease_on(10, 0, 1min))));
  quota::gateway::LeasedBackend<GatewayStore, RedisGrantLedger> leased(
      through_proxy, ledger,
      {.incarnation = 0xab, .backoff_min = 1ms, .backoff_max = 1ms, .metrics = &metrics});
  quota::gateway::Gateway gw(leased, registry);
  const quota::gateway::Request req{.who = {.tenant = "acme", .plan = "free"}, .route = "read"};
  // The first grant (10 units), nine of them spent.
  for (int i = 0; i < 9; ++i) REQUIRE(gw.decide(req, Nanos{0})->decision.allowed);
  // The tenth spends the last unit; the reply to its renewal is lost after Redis ran it.
  auto global_key = direct.redis_key("{~global}read");
  REQUIRE(global_key.ok());
  proxy.drop_reply_to(*global_key);
  REQUIRE(gw.decide(req, Nanos{0})->decision.allowed);
  REQUIRE(proxy.dropped() == 1);
  CHECK(metrics.at(Level::kGlobal).renewal_failures.load() == 1);
  // After the backoff the same grant id is asked again: Redis replays the grant.
  auto r = gw.decide(req, Nanos{10ms});
  REQUIRE(r.ok());
  CHECK(r->decision.allowed);
  CHECK(leased.grant_requests() == 3);
  // Taken once: 100 − 10 − 10, and 1 more by this check.
  const auto* rule = registry.current()->find(Level::kGlobal, req.who, "read");
  REQUIRE(rule != nullptr);
  const quota::gateway::LevelCheck check{.policy = &rule->policy, .key = "{~global}read"};
  auto left = direct.decide(std::span(&check, 1), 1, Nanos{0});
  REQUIRE(left.ok());
  CHECK(left->parts.at(0).remaining == 79);
  auto listed = ledger.outstanding("{~global}read");
  REQUIRE(listed.ok());
  REQUIRE(listed->size() == 2);
  CHECK((*listed)[0].grant_id == "ab-1");
  CHECK((*listed)[1].grant_id == "ab-2");
}
