// Revocation at once over Redis (quota/gateway/leases/lease_revocation.hpp with RedisGrantLedger
// and its pub/sub subscription; a real redis-server, server time): two holders of the
// global key, each with its own store, connections, ledger and subscription. Holder A
// installs a new rule set; with `revoke: at_once` holder B, which never reloads, stops
// spending its grant within a bounded wait and decides at the authority after; without
// it B spends its grant until it expires. The ledger lists revoked grants; the envelope
// holds on the admissions; a subscription cut off falls back to expiry and comes back.
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
#include "support/gateway_fixtures.hpp"
#include "support/lease_rules.hpp"
#include "support/lossy_proxy.hpp"
#include "support/redis_server.hpp"
#include "support/revoke_fixtures.hpp"

using namespace std::chrono_literals;
using quota::Nanos;
using quota::gateway::LeaseRevoke;

using quota::testing::check_after_revocation;
using quota::testing::kRevokeGlobal;
using quota::testing::revoke_eventually;
using quota::testing::revoke_rules;
using quota::testing::RevokePair;

TEST_CASE("over Redis, revoke: at_once stops a holder on the old rules within a bounded wait",
          "[redis][lease][revoke]") {
  RevokePair p("gw-lease-revoke", LeaseRevoke::kAtOnce);
  REQUIRE(p.a.holder.registry.publish(revoke_rules(2, LeaseRevoke::kAtOnce)).ok());
  // The revocation was recorded and published by A's install; B hears it on its
  // subscription and drops the 19 units it holds.
  REQUIRE(revoke_eventually([&] { return p.b.global().units_revoked.load() == 19; }));
  check_after_revocation(p, "over Redis, revoked at once");
}

TEST_CASE("over Redis, without revoke: at_once a holder on the old rules spends its grant",
          "[redis][lease][revoke]") {
  RevokePair p("gw-lease-norevoke", LeaseRevoke::kAtExpiry);
  REQUIRE(p.a.holder.registry.publish(revoke_rules(2, LeaseRevoke::kAtExpiry)).ok());
  std::this_thread::sleep_for(200ms);  // what a notification would have had
  CHECK(p.b.global().units_revoked.load() == 0);
  const std::int64_t b_grants = p.b.holder.backend.grant_requests();
  std::uint64_t version = 0;
  for (int i = 0; i < 13; ++i) {
    REQUIRE(p.request(p.b, Nanos{1ms}, &version));
    CHECK(version == 1);
  }
  CHECK(p.b.holder.backend.grant_requests() == b_grants);  // all from its v1 grant
  auto listed = p.a.ledger.outstanding("{~global}read");
  REQUIRE(listed.ok());
  for (const auto& g : *listed) CHECK_FALSE(g.revoked);
  while (p.request(p.a, Nanos{2ms})) {
  }
  while (p.request(p.b, Nanos{2ms})) {
  }
  // B spent all 19 units of its v1 grant after the change; only A's was dropped. (Nothing
  // refills here, so the envelope cannot tell the two apart; the in-process test
  // gateway_lease_revoke_test shows B's grant on top of a refilled budget.)
  const auto& a = p.a.global();
  CHECK(a.units_dropped_on_rule_change.load() == 19);
  CHECK(static_cast<std::int64_t>(p.log.size()) + a.units_held.load() + 19 == kRevokeGlobal.burst);
  auto report =
      quota::verify::verify_token_bucket(p.log, kRevokeGlobal.rate, kRevokeGlobal.burst, 0);
  REQUIRE(report.ok());
  CHECK(report->holds());
}

TEST_CASE("over Redis, a holder whose subscription is cut off falls back to expiry",
          "[redis][lease][revoke]") {
  // B's subscription goes through a proxy that the test blocks.
  quota::testing::LossyProxy proxy(quota::testing::redis_port());
  auto via_proxy = quota::testing::redis_config();
  via_proxy.port = proxy.port();
  RevokePair p(
      "gw-lease-revoke-cut", LeaseRevoke::kAtOnce,
      {.connection = via_proxy, .ping_every = 100ms, .backoff_min = 5ms, .backoff_max = 20ms});
  const std::uint64_t before = p.b.ledger.subscriptions();
  proxy.set_blocked(true);
  quota::redis::Connection admin(quota::testing::redis_config());
  REQUIRE(admin.command({"CLIENT", "KILL", "TYPE", "pubsub"}).ok());
  REQUIRE(revoke_eventually([&] { return !p.b.ledger.subscribed(); }));
  REQUIRE(p.a.holder.registry.publish(revoke_rules(2, LeaseRevoke::kAtOnce)).ok());
  std::this_thread::sleep_for(200ms);  // what a notification would have had
  CHECK(p.b.global().units_revoked.load() == 0);
  // Not told: B spends its v1 grant ...
  const std::int64_t b_grants = p.b.holder.backend.grant_requests();
  std::uint64_t version = 0;
  for (int i = 0; i < 5; ++i) {
    REQUIRE(p.request(p.b, Nanos{1ms}, &version));
    CHECK(version == 1);
  }
  CHECK(p.b.holder.backend.grant_requests() == b_grants);
  REQUIRE(p.b.holder.backend.holdings(Nanos{1ms}).size() == 1);
  // ... until it expires (a minute of B's clock): the 14 units left expire unspent, and
  // the authority refuses a new grant under v1, so B decides there from then on.
  for (int i = 0; i < 5; ++i) REQUIRE(p.request(p.b, Nanos{1min}));
  CHECK(p.b.global().units_unused_at_expiry.load() == 14);
  CHECK(p.b.global().units_revoked.load() == 0);
  CHECK(p.b.holder.backend.grant_requests() == b_grants);
  CHECK(p.b.holder.backend.holdings(Nanos{1min}).empty());
  // The link back: B subscribes again by itself.
  proxy.set_blocked(false);
  REQUIRE(revoke_eventually([&] { return p.b.ledger.subscribed(); }));
  CHECK(p.b.ledger.subscriptions() > before);
}
