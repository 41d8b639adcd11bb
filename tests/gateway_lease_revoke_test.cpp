// Tests for quota/gateway/leases/lease_revocation.hpp in process: a rule change with
// `lease.revoke: at_once` reaches the holders of its keys at once (the GrantLedger's
// listeners), not at the grants' expiry; the authority refuses grants under the old
// version; the ledger lists revoked grants; the envelope holds with no grant term.
// Over Redis (pub/sub): redis/redis_gateway_lease_revoke_test.cpp.
#include "quota/gateway/leases/lease_revocation.hpp"

#include <catch2/catch.hpp>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "quota/gateway/leases/leased_backend.hpp"
#include "quota/store/sharded_store.hpp"
#include "quota/verify/envelope.hpp"
#include "support/lease_rules.hpp"

using namespace std::chrono_literals;
using quota::GrantLedger;
using quota::Nanos;
using quota::TokenBucket;
using quota::gateway::LeaseMetrics;
using quota::gateway::LeaseRevoke;
using quota::gateway::LeaseSpec;
using quota::gateway::Level;
using quota::gateway::StoreBackend;
using quota::testing::build;
using quota::testing::lease_levels_spec;
using quota::testing::lease_on;
using quota::verify::AdmittedEvent;

namespace {

using RevokeStore = quota::ShardedStore<quota::gateway::KeyPolicy>;
using RevokeHolder = quota::testing::LeaseHolder<StoreBackend<RevokeStore>>;

const TokenBucket kRevokeGlobal{.rate = {10, 1s}, .burst = 100};
const TokenBucket kRevokeTenant{.rate = {1000, 1s}, .burst = 1000};

LeaseSpec with_revoke(LeaseSpec l, LeaseRevoke r) {
  l.revoke = r;
  return l;
}

// v1: the global budget leased in grants of 20; v2: the same budget in grants of 10.
std::shared_ptr<const quota::gateway::RuleSet> revoke_rules(std::uint64_t version,
                                                            LeaseRevoke revoke) {
  const LeaseSpec lease = version == 1 ? lease_on(20, 5, 1h) : lease_on(10, 2, 1h);
  return build(
      lease_levels_spec(version, kRevokeTenant, {}, kRevokeGlobal, with_revoke(lease, revoke)));
}

std::string global_rule_id(const quota::gateway::RuleSet& set) {
  const auto* r = set.find(Level::kGlobal, {.tenant = "a", .plan = "free"}, "read");
  return r == nullptr ? std::string() : r->id;
}

// Two holders of the global key on v1, each with one grant (1 unit spent, 19 held); the
// budget then refills to its burst (10 s at 10/s); holder A installs v2.
struct TwoHolders {
  explicit TwoHolders(LeaseRevoke revoke)
      : a(inner, ledger, revoke_rules(1, revoke), 0xa, &metrics_a),
        b(inner, ledger, revoke_rules(1, revoke), 0xb, &metrics_b) {
    quota::gateway::revoke_on_publish(a.registry, ledger);
    REQUIRE(request(a, Nanos{0}));
    REQUIRE(request(b, Nanos{0}));
    REQUIRE(a.registry.publish(revoke_rules(2, revoke)).ok());
  }

  bool request(RevokeHolder& h, Nanos t, std::uint64_t* version = nullptr) {
    auto r = h.gateway.decide({.who = {.tenant = "a", .plan = "free"}, .route = "read"}, t);
    REQUIRE(r.ok());
    if (r->decision.allowed) log.push_back({t.count(), 1});
    if (version != nullptr) *version = r->decision.version;
    return r->decision.allowed;
  }

  RevokeStore store;
  StoreBackend<RevokeStore> inner{store};
  GrantLedger ledger;
  LeaseMetrics metrics_a, metrics_b;
  RevokeHolder a, b;
  std::vector<AdmittedEvent> log;
};

constexpr Nanos kLater = 10s;

}  // namespace

TEST_CASE("with revoke: at_once, a holder on the old rules stops spending its grant at once",
          "[lease][revoke]") {
  TwoHolders t(LeaseRevoke::kAtOnce);
  // The install revoked both v1 grants: B, which never reloads, dropped its 19 units as
  // the notification came (before any further decision), and so did A.
  CHECK(t.metrics_b.at(Level::kGlobal).units_revoked.load() == 19);
  CHECK(t.metrics_a.at(Level::kGlobal).units_revoked.load() == 19);
  CHECK(t.b.backend.holdings(Nanos{1ms}).empty());
  CHECK(t.metrics_b.at(Level::kGlobal).units_held.load() == 0);
  // The authority records the revocation and lists the revoked grants as revoked.
  const std::string rule = global_rule_id(*t.a.registry.current());
  auto below = t.ledger.revoked_below(rule);
  REQUIRE(below.ok());
  CHECK(*below == 2);
  const auto listed = t.ledger.outstanding(Nanos{1ms});
  REQUIRE(listed.size() == 2);
  for (const auto& g : listed) {
    CHECK(g.revoked);
    CHECK(g.rule == rule);
    CHECK(g.asked_version == 1);
  }
  // B's later decisions go to the authority (no grant: its grant requests stay at 1);
  // A takes v2 grants. Both spend the refilled budget until it is gone.
  const std::int64_t b_grants = t.b.backend.grant_requests();
  std::uint64_t version = 0;
  int b_admitted = 0;
  while (b_admitted < 30 && t.request(t.b, kLater, &version)) ++b_admitted;
  CHECK(b_admitted == 30);
  CHECK(t.b.backend.grant_requests() == b_grants);
  CHECK(t.b.backend.holdings(kLater).empty());
  while (t.request(t.a, kLater)) {
  }
  while (t.request(t.b, kLater)) {
  }
  // No unit of the revoked grants was spent: at kLater the admissions are the refilled
  // budget and nothing more, so the envelope holds without any grant term (what A still
  // holds of its v2 grants was taken from the budget too).
  std::int64_t held_a = t.metrics_a.at(Level::kGlobal).units_held.load();
  CHECK(static_cast<std::int64_t>(t.log.size()) + held_a == 2 + kRevokeGlobal.burst);
  auto report =
      quota::verify::verify_token_bucket(t.log, kRevokeGlobal.rate, kRevokeGlobal.burst, 0);
  REQUIRE(report.ok());
  std::printf("revoked at once: %s\n", quota::verify::to_string(*report).c_str());
  CHECK(report->holds());
}

TEST_CASE("without revoke: at_once, a holder on the old rules spends its grant until expiry",
          "[lease][revoke]") {
  TwoHolders t(LeaseRevoke::kAtExpiry);
  CHECK(t.metrics_b.at(Level::kGlobal).units_revoked.load() == 0);
  CHECK(t.metrics_a.at(Level::kGlobal).units_revoked.load() == 0);
  for (const auto& g : t.ledger.outstanding(Nanos{1ms})) CHECK_FALSE(g.revoked);
  // B spends its v1 grant locally (down to its low-water mark of 5 before it renews).
  const std::int64_t b_grants = t.b.backend.grant_requests();
  std::uint64_t version = 0;
  for (int i = 0; i < 13; ++i) {
    REQUIRE(t.request(t.b, kLater, &version));
    CHECK(version == 1);
  }
  CHECK(t.b.backend.grant_requests() == b_grants);
  REQUIRE(t.b.backend.holdings(kLater).size() == 1);
  CHECK(t.b.backend.holdings(kLater)[0].units == 6);
  while (t.request(t.a, kLater)) {
  }
  while (t.request(t.b, kLater)) {
  }
  // B's 19 held units came on top of the refilled budget: the envelope needs them.
  auto with_grant =
      quota::verify::verify_token_bucket(t.log, kRevokeGlobal.rate, kRevokeGlobal.burst, 19);
  auto without =
      quota::verify::verify_token_bucket(t.log, kRevokeGlobal.rate, kRevokeGlobal.burst, 0);
  REQUIRE(with_grant.ok());
  REQUIRE(without.ok());
  CHECK(with_grant->holds());
  CHECK_FALSE(without->holds());
}

TEST_CASE("the authority refuses grants under a revoked version: the holder decides there",
          "[lease][revoke]") {
  TwoHolders t(LeaseRevoke::kAtOnce);
  // C starts on v1 after the revocation and never heard of it: its first grant request is
  // refused by the authority, so it decides every request there.
  LeaseMetrics metrics_c;
  RevokeHolder c(t.inner, t.ledger, revoke_rules(1, LeaseRevoke::kAtOnce), 0xc, &metrics_c);
  for (int i = 0; i < 5; ++i) REQUIRE(t.request(c, kLater));
  CHECK(c.backend.grant_requests() == 0);
  CHECK(c.backend.holdings(kLater).empty());
  CHECK(metrics_c.at(Level::kGlobal).grants.load() == 0);
  CHECK(metrics_c.at(Level::kGlobal).renewals.load() == 0);
  // The same revocation recorded again (another gateway installing v2) changes nothing.
  REQUIRE(
      t.ledger.revoke({.rule = global_rule_id(*revoke_rules(1, LeaseRevoke::kAtOnce)), .below = 2})
          .ok());
  REQUIRE(
      t.ledger.revoke({.rule = global_rule_id(*revoke_rules(1, LeaseRevoke::kAtOnce)), .below = 1})
          .ok());
  CHECK(*t.ledger.revoked_below(global_rule_id(*revoke_rules(1, LeaseRevoke::kAtOnce))) == 2);
  CHECK(t.metrics_b.at(Level::kGlobal).units_revoked.load() == 19);
}

TEST_CASE("which rule changes revoke: at_once leased rules changed or removed", "[lease][revoke]") {
  const auto at_once = revoke_rules(1, LeaseRevoke::kAtOnce);
  const auto at_expiry = revoke_rules(1, LeaseRevoke::kAtExpiry);
  const std::string id = global_rule_id(*at_once);
  // The lease changed (v2: grants of 10), at_once on either side: revoked below v2.
  auto r = quota::gateway::revocations_between(*at_once, *revoke_rules(2, LeaseRevoke::kAtOnce));
  REQUIRE(r.size() == 1);
  CHECK(r[0].rule == id);
  CHECK(r[0].below == 2);
  CHECK(quota::gateway::revocations_between(*at_expiry, *revoke_rules(2, LeaseRevoke::kAtOnce))
            .size() == 1);
  CHECK(quota::gateway::revocations_between(*at_once, *revoke_rules(2, LeaseRevoke::kAtExpiry))
            .size() == 1);
  // Neither side asks for it: nothing.
  CHECK(quota::gateway::revocations_between(*at_expiry, *revoke_rules(2, LeaseRevoke::kAtExpiry))
            .empty());
  // The same rule in a new version: nothing changed, nothing revoked.
  auto same = build(lease_levels_spec(7, kRevokeTenant, {}, kRevokeGlobal,
                                      with_revoke(lease_on(20, 5, 1h), LeaseRevoke::kAtOnce)));
  CHECK(quota::gateway::revocations_between(*at_once, *same).empty());
  // The rule removed (no global rule in v3): revoked.
  auto removed = build(quota::testing::levels_spec(3, kRevokeTenant, std::nullopt, std::nullopt));
  r = quota::gateway::revocations_between(*at_once, *removed);
  REQUIRE(r.size() == 1);
  CHECK(r[0].below == 3);
}

TEST_CASE("a revocation the authority cannot record stops the publish", "[lease][revoke]") {
  quota::gateway::RuleRegistry registry(revoke_rules(1, LeaseRevoke::kAtOnce));
  registry.before_publish([](const quota::gateway::RuleSet&, const quota::gateway::RuleSet&) {
    return absl::UnavailableError("authority down");
  });
  auto s = registry.publish(revoke_rules(2, LeaseRevoke::kAtOnce));
  CHECK(s.code() == absl::StatusCode::kUnavailable);
  CHECK(registry.current()->version() == 1);
}
