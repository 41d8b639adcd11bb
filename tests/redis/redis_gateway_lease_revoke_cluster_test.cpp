// Revocation at once on a Redis Cluster (3 masters, cmake/redis_cluster.sh): two holders
// of the global key, each with its own ClusterPool whose seed is a node that does NOT own
// the `{~lease}` slot, so the revocation's PUBLISH runs on another node than the one each
// ledger subscribed at (RedisGrantLedger subscribes at the cluster's seed node). Holder A
// installs a new rule set with `revoke: at_once`; holder B, which never reloads, hears it
// through the cluster, drops what it holds and decides at the authority after; the ledger
// lists the revoked grants and the envelope holds on the admissions. A subscription cut at
// its node subscribes again at the next node of the cluster's map, and hears from there.
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "quota/redis/transport/cluster.hpp"
#include "quota/redis/transport/connection.hpp"
#include "quota/verify/envelope.hpp"
#include "support/redis_cluster.hpp"
#include "support/revoke_fixtures.hpp"

using quota::Nanos;
using quota::gateway::LeaseRevoke;
using quota::testing::check_after_revocation;
using quota::testing::revoke_eventually;
using quota::testing::revoke_rules;
using quota::testing::RevokePair;

TEST_CASE("on a Redis Cluster, revoke: at_once reaches a holder subscribed at another node",
          "[redis][cluster][lease][revoke]") {
  const int lease_slot = quota::redis::key_slot("{~lease}revoked");
  const int lease_owner = quota::testing::slot_owner(lease_slot);
  REQUIRE(lease_owner != 0);
  int seed = 0;
  for (const int port : quota::testing::cluster_ports()) {
    if (port != lease_owner) seed = port;
  }
  REQUIRE(seed != 0);
  INFO("{~lease} slot " << lease_slot << " on node " << lease_owner << ", seed " << seed);
  auto on_cluster = [seed](const std::string& prefix) {
    quota::redis::GatewayStoreOptions o;
    o.cluster = std::make_shared<quota::redis::ClusterPool>(quota::testing::node_config(seed), 2);
    o.prefix = prefix;
    return o;
  };

  RevokePair p("gw-lease-revoke-cluster", LeaseRevoke::kAtOnce, on_cluster);
  const std::uint64_t b_subscriptions = p.b.ledger.subscriptions();
  REQUIRE(b_subscriptions >= 1);
  REQUIRE(p.a.holder.registry.publish(revoke_rules(2, LeaseRevoke::kAtOnce)).ok());
  // Published on the {~lease} node, heard at the seed: B drops the 19 units it holds.
  REQUIRE(revoke_eventually([&] { return p.b.global().units_revoked.load() == 19; }));
  // Heard as a message, not by the catch-up read of a new subscription.
  CHECK(p.b.ledger.subscriptions() == b_subscriptions);
  check_after_revocation(p, "cluster, revoked at once");
}

TEST_CASE("on a Redis Cluster, a revocation subscription cut at its node moves to the next",
          "[redis][cluster][lease][revoke]") {
  const std::vector<int> ports = quota::testing::cluster_ports();
  const int seed = ports.front();
  auto on_cluster = [seed](const std::string& prefix) {
    quota::redis::GatewayStoreOptions o;
    o.cluster = std::make_shared<quota::redis::ClusterPool>(quota::testing::node_config(seed), 2);
    o.prefix = prefix;
    return o;
  };
  RevokePair p("gw-lease-revoke-move", LeaseRevoke::kAtOnce, on_cluster);
  const std::string channel = p.prefix + "lease:revoked";
  // PUBSUB NUMSUB of the ledgers' channel at one node: how many of A and B listen there.
  const auto listening_at = [&](int port) -> long long {
    quota::redis::Connection c(quota::testing::node_config(port));
    auto r = c.command({"PUBSUB", "NUMSUB", channel});
    REQUIRE(r.ok());
    REQUIRE((*r)->type == REDIS_REPLY_ARRAY);
    REQUIRE((*r)->elements == 2);
    return (*r)->element[1]->integer;
  };
  // Both subscribed first at the seed (no slot map was loaded yet).
  REQUIRE(listening_at(seed) == 2);
  const std::uint64_t a_before = p.a.ledger.subscriptions();
  const std::uint64_t b_before = p.b.ledger.subscriptions();
  quota::redis::Connection admin(quota::testing::node_config(seed));
  REQUIRE(admin.command({"CLIENT", "KILL", "TYPE", "pubsub"}).ok());
  REQUIRE(revoke_eventually([&] {
    return p.a.ledger.subscriptions() > a_before && p.b.ledger.subscriptions() > b_before &&
           p.a.ledger.subscribed() && p.b.ledger.subscribed();
  }));
  // Both moved on to another node of the map.
  CHECK(listening_at(seed) == 0);
  long long elsewhere = 0;
  for (const int port : ports) elsewhere += port == seed ? 0 : listening_at(port);
  CHECK(elsewhere == 2);
  // And a revocation still reaches B there, as a message.
  const std::uint64_t b_subscriptions = p.b.ledger.subscriptions();
  REQUIRE(p.a.holder.registry.publish(revoke_rules(2, LeaseRevoke::kAtOnce)).ok());
  REQUIRE(revoke_eventually([&] { return p.b.global().units_revoked.load() == 19; }));
  CHECK(p.b.ledger.subscriptions() == b_subscriptions);
}
