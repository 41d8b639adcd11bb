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
#include <numeric>
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

namespace {

// PUBSUB NUMSUB of `channel` at each node of the cluster, in cluster_ports() order: how
// many of the holders' subscriptions are at each node.
std::vector<long long> listening(const std::string& channel) {
  std::vector<long long> out;
  for (const int port : quota::testing::cluster_ports()) {
    quota::redis::Connection c(quota::testing::node_config(port));
    auto r = c.command({"PUBSUB", "NUMSUB", channel});
    const bool ok = r.ok() && (*r)->type == REDIS_REPLY_ARRAY && (*r)->elements == 2;
    out.push_back(ok ? (*r)->element[1]->integer : -1);
  }
  return out;
}

}  // namespace

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
  // Both subscribed, neither at the {~lease} node (both at the seed, the first node tried).
  const std::vector<int> ports = quota::testing::cluster_ports();
  const std::vector<long long> at = listening(p.prefix + "lease:revoked");
  CHECK(std::accumulate(at.begin(), at.end(), 0LL) == 2);
  for (std::size_t i = 0; i < ports.size(); ++i) {
    if (ports[i] == lease_owner) CHECK(at[i] == 0);
  }
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
  auto on_cluster = [seed = ports.front()](const std::string& prefix) {
    quota::redis::GatewayStoreOptions o;
    o.cluster = std::make_shared<quota::redis::ClusterPool>(quota::testing::node_config(seed), 2);
    o.prefix = prefix;
    return o;
  };
  RevokePair p("gw-lease-revoke-move", LeaseRevoke::kAtOnce, on_cluster);
  const std::string channel = p.prefix + "lease:revoked";
  const std::vector<long long> before = listening(channel);
  REQUIRE(std::accumulate(before.begin(), before.end(), 0LL) == 2);
  const std::uint64_t a_before = p.a.ledger.subscriptions();
  const std::uint64_t b_before = p.b.ledger.subscriptions();
  // Every subscription cut where it is: each comes back at the next node of the map.
  for (const int port : ports) {
    quota::redis::Connection admin(quota::testing::node_config(port));
    REQUIRE(admin.command({"CLIENT", "KILL", "TYPE", "pubsub"}).ok());
  }
  REQUIRE(revoke_eventually([&] {
    return p.a.ledger.subscriptions() > a_before && p.b.ledger.subscriptions() > b_before &&
           p.a.ledger.subscribed() && p.b.ledger.subscribed();
  }));
  const std::vector<long long> after = listening(channel);
  INFO("NUMSUB by node, before " << before[0] << " " << before[1] << " " << before[2] << ", after "
                                 << after[0] << " " << after[1] << " " << after[2]);
  CHECK(std::accumulate(after.begin(), after.end(), 0LL) == 2);
  CHECK(after != before);  // on the same nodes again only if neither moved on
  // And a revocation still reaches B there, as a message.
  const std::uint64_t b_subscriptions = p.b.ledger.subscriptions();
  REQUIRE(p.a.holder.registry.publish(revoke_rules(2, LeaseRevoke::kAtOnce)).ok());
  REQUIRE(revoke_eventually([&] { return p.b.global().units_revoked.load() == 19; }));
  CHECK(p.b.ledger.subscriptions() == b_subscriptions);
}
