// Two gateway processes leasing one global key over Redis, for the tests of revocation at
// once (redis_gateway_lease_revoke_test, redis_gateway_lease_revoke_cluster_test): each
// RevokeProcess has its own store, connections, RedisGrantLedger (and its subscription) and
// LeasedBackend holder; a RevokePair starts both on rule set v1, subscribed, each holding
// one grant of 20 (1 unit spent, 19 held), with A's registry revoking on publish.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "quota/gateway/lease_revocation.hpp"
#include "quota/gateway/leased_backend.hpp"
#include "quota/redis/gateway_store.hpp"
#include "quota/redis/grant_ledger.hpp"
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
  return build(lease_levels_spec(version, {.rate = kSlow, .burst = 1000}, {}, kRevokeGlobal, lease));
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

  const gateway::LeaseCounters& global() const { return metrics.at(gateway::Level::kGlobal); }
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
  RevokePair(const std::string& name, gateway::LeaseRevoke revoke, redis::RevocationFeed b_feed = {})
      : RevokePair(
            name, revoke,
            [](const std::string& p) {
              return redis::GatewayStoreOptions{.pool = redis_pool(2), .prefix = p};
            },
            std::move(b_feed)) {}

  bool request(RevokeProcess& p, Nanos t, std::uint64_t* version = nullptr) {
    auto r = p.holder.gateway.decide({.who = {.tenant = "acme", .plan = "free"}, .route = "read"}, t);
    REQUIRE(r.ok());
    if (r->decision.allowed) log.push_back({t.count(), 1});
    if (version != nullptr) *version = r->decision.version;
    return r->decision.allowed;
  }

  std::string prefix;
  RevokeProcess a, b;
  std::vector<verify::AdmittedEvent> log;
};

}  // namespace quota::testing
