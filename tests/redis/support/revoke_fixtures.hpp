// Two gateway processes leasing one global key over Redis, for the tests of revocation at
// once (redis_gateway_lease_revoke_test, redis_gateway_lease_revoke_cluster_test): each
// RevokeProcess has its own store, connections, RedisGrantLedger (and its subscription) and
// LeasedBackend holder; a RevokePair starts both on rule set v1, subscribed, each holding
// one grant of 20 (1 unit spent, 19 held), with A's registry revoking on publish.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "quota/gateway/leases/lease_revocation.hpp"
#include "quota/gateway/leases/leased_backend.hpp"
#include "quota/redis/gateway_store.hpp"
#include "quota/redis/grant_ledger.hpp"
#include "quota/verify/envelope.hpp"
#include "quota/verify/events.hpp"
#include "support/gateway_fixtures.hpp"
#include "support/lease_rules.hpp"
#include "support/redis_server.hpp"

namespace quota::testing {

inline const TokenBucket kRevokeGlobal{.rate = kSlow, .burst = 100};

// v1: the global budget leased in grants of 20 (low water 5), v2: in grants of 10; each
// grant lives a minute of the holder's clock.
inline std::shared_ptr<const gateway::RuleSet> revoke_rules(std::uint64_t version,
                                                            gateway::LeaseRevoke revoke) {
  using namespace std::chrono_literals;
  gateway::LeaseSpec lease = version == 1 ? lease_on(20, 5, 1min) : lease_on(10, 2, 1min);
  lease.revoke = revoke;
  return build(
      lease_levels_spec(version, {.rate = kSlow, .burst = 1000}, {}, kRevokeGlobal, lease));
}

// One gateway process: its own connections (`store`: a pool or a cluster, and the prefix),
// store, ledger (and subscription) and holder.
struct RevokeProcess {
  RevokeProcess(redis::GatewayStoreOptions store_options, gateway::LeaseRevoke revoke,
                std::uint64_t incarnation, redis::RevocationFeed feed = {})
      : store(std::move(store_options)),
        ledger(store, std::chrono::minutes(1), std::move(feed)),
        holder(store, ledger, revoke_rules(1, revoke), incarnation, &metrics) {}
  redis::GatewayStore store;
  redis::RedisGrantLedger ledger;
  gateway::LeaseMetrics metrics;
  LeaseHolder<redis::GatewayStore, redis::RedisGrantLedger> holder;

  const quota::LeaseCounters& global() const { return metrics.at(gateway::Level::kGlobal); }
};

// Polls `done` every 10 ms for at most 20 s (generous for sanitizer builds on a busy
// machine): nothing is timed, only that it happens.
template <class Fn>
bool revoke_eventually(Fn done) {
  for (int i = 0; i < 2000; ++i) {
    if (done()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return done();
}

// A and B on v1, subscribed, each holding one grant (1 unit spent, 19 held). `connect`
// gives each process's store options with `prefix`.
struct RevokePair {
  template <class Connect>
  RevokePair(const std::string& name, gateway::LeaseRevoke revoke, Connect connect,
             redis::RevocationFeed b_feed = {})
      : prefix(unique_prefix(name)),
        a(connect(prefix), revoke, 0xa),
        b(connect(prefix), revoke, 0xb, std::move(b_feed)) {
    gateway::revoke_on_publish(a.holder.registry, a.ledger);
    REQUIRE(revoke_eventually([&] { return a.ledger.subscribed() && b.ledger.subscribed(); }));
    REQUIRE(request(a, Nanos{0}));
    REQUIRE(request(b, Nanos{0}));
  }
  // On the tests' redis-server, two connections per process.
  RevokePair(const std::string& name, gateway::LeaseRevoke revoke,
             redis::RevocationFeed b_feed = {})
      : RevokePair(
            name, revoke,
            [](const std::string& p) {
              return redis::GatewayStoreOptions{.pool = redis_pool(2), .prefix = p};
            },
            std::move(b_feed)) {}

  bool request(RevokeProcess& p, Nanos t, std::uint64_t* version = nullptr) {
    auto r =
        p.holder.gateway.decide({.who = {.tenant = "acme", .plan = "free"}, .route = "read"}, t);
    REQUIRE(r.ok());
    if (r->decision.allowed) log.push_back({t.count(), 1});
    if (version != nullptr) *version = r->decision.version;
    return r->decision.allowed;
  }

  std::string prefix;
  RevokeProcess a, b;
  std::vector<verify::AdmittedEvent> log;
};

// After A installed v2 with revoke: at_once and B dropped the 19 units it held: B holds
// nothing, the ledger lists both v1 grants revoked, B decides at the authority (asks no
// grant), and once both spent the rest of the budget (nothing refills: 1 unit an hour)
// every unit was admitted, is held by A, or was dropped unspent with the revoked grants
// (A's own may be dropped by its first v2 decision before the notification comes); the
// envelope holds on the admissions.
inline void check_after_revocation(RevokePair& p, const char* label) {
  using namespace std::chrono_literals;
  CHECK(p.b.holder.backend.holdings(Nanos{1ms}).empty());
  CHECK(p.b.global().units_held.load() == 0);
  auto listed = p.a.ledger.outstanding("{~global}read");
  REQUIRE(listed.ok());
  REQUIRE(listed->size() == 2);
  for (const auto& g : *listed) {
    CHECK(g.revoked);
    CHECK(g.asked_version == 1);
    CHECK_FALSE(g.rule.empty());
  }
  const std::int64_t b_grants = p.b.holder.backend.grant_requests();
  for (int i = 0; i < 30; ++i) REQUIRE(p.request(p.b, Nanos{1ms}));
  CHECK(p.b.holder.backend.grant_requests() == b_grants);
  while (p.request(p.a, Nanos{2ms})) {
  }
  while (p.request(p.b, Nanos{2ms})) {
  }
  const auto& a = p.a.global();
  CHECK(a.units_revoked.load() + a.units_dropped_on_rule_change.load() == 19);
  CHECK(static_cast<std::int64_t>(p.log.size()) + a.units_held.load() + 19 + 19 ==
        kRevokeGlobal.burst);
  auto report = verify::verify_token_bucket(p.log, kRevokeGlobal.rate, kRevokeGlobal.burst, 0);
  REQUIRE(report.ok());
  std::printf("%s: %s\n", label, verify::to_string(*report).c_str());
  CHECK(report->holds());
}

}  // namespace quota::testing
