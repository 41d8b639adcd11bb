// Tests for quota/gateway/leases/leased_backend.hpp: leased tenant and global budgets decided
// locally from grants, taken from one in-process authority; the envelope
// A(T) <= r·T + B + Σ outstanding grants checked by the verifier with several holders, a
// holder paused past expiry, a restarted holder and a downgrade while grants are out.
#include "quota/gateway/leases/leased_backend.hpp"

#include <catch2/catch.hpp>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "quota/store/sharded_store.hpp"
#include "quota/verify/envelope.hpp"
#include "support/lease_rules.hpp"

using namespace std::chrono_literals;
using quota::GrantLedger;
using quota::Nanos;
using quota::TokenBucket;
using quota::gateway::KeyPolicy;
using quota::gateway::LeaseMetrics;
using quota::gateway::Level;
using quota::gateway::StoreBackend;
using quota::testing::build;
using quota::testing::lease_levels_spec;
using quota::testing::lease_on;

namespace {

using Store = quota::ShardedStore<KeyPolicy>;
using Holder = quota::testing::LeaseHolder<StoreBackend<Store>>;

quota::gateway::Request read(const std::string& tenant) {
  return {.who = {.tenant = tenant, .plan = "free"}, .route = "read"};
}

const quota::gateway::LeaseSpec kOff{};

}  // namespace

TEST_CASE("a leased global budget costs the authority one round trip per grant") {
  Store store;
  StoreBackend inner(store);
  GrantLedger ledger;
  LeaseMetrics metrics;
  const TokenBucket global{.rate = {1000, 1s}, .burst = 1000};
  Holder h(inner, ledger,
           build(lease_levels_spec(1, {.rate = {1000, 1s}, .burst = 1000}, kOff, global,
                                   lease_on(50, 10, 1s))),
           0x51, &metrics);
  int admitted = 0;
  for (int i = 0; i < 400; ++i) {
    auto r = h.gateway.decide(read("t" + std::to_string(i % 4)), Nanos{0});
    REQUIRE(r.ok());
    admitted += r->decision.allowed ? 1 : 0;
  }
  CHECK(admitted == 400);
  // 50 units per grant; renewed at 10 left: 400 units, at most 400/40 + 1 grants.
  CHECK(h.backend.grant_requests() <= 11);
  CHECK(h.backend.grant_requests() >= 8);
  const auto& c = metrics.at(Level::kGlobal);
  CHECK(c.grants.load() == h.backend.grant_requests());
  CHECK(c.units_granted.load() == 50 * c.grants.load());
  CHECK(c.units_held.load() == c.units_granted.load() - 400);
  CHECK(metrics.at(Level::kTenant).grants.load() == 0);
  // The authority's record lists every grant, with the holder's incarnation and version.
  const auto grants = ledger.outstanding(Nanos{0});
  REQUIRE(grants.size() == static_cast<std::size_t>(c.grants.load()));
  for (const auto& g : grants) {
    CHECK(g.key == "{~global}read");
    CHECK(g.incarnation == 0x51);
    CHECK(g.grant_id.rfind("51-", 0) == 0);
    CHECK(g.version == 1);
    CHECK(g.units == 50);
    CHECK(g.expires_at == Nanos{1s});
  }
  // The holder's own view agrees with the gauge.
  const auto held = h.backend.holdings(Nanos{0});
  REQUIRE(held.size() == 1);
  CHECK(held[0].units == c.units_held.load());
  // The authority's budget was charged the grants, not the requests.
  const auto* rule =
      h.registry.current()->find(Level::kGlobal, {.tenant = "x", .plan = "free"}, "read");
  REQUIRE(rule != nullptr);
  auto left =
      store.apply(KeyPolicy{.policy = &rule->policy, .version = 1}, "{~global}read", Nanos{0}, 0);
  REQUIRE(left.ok());
  CHECK(left->remaining == 1000 - c.units_granted.load());
  // Past expiry: nothing held is spent, the rest is counted unused.
  const std::int64_t before = c.units_held.load();
  REQUIRE(h.gateway.decide(read("t0"), Nanos{1s})->decision.allowed);
  CHECK(c.units_unused_at_expiry.load() == before);
  CHECK(ledger.outstanding(Nanos{1s}).size() == 1);
}

TEST_CASE("all or nothing across leased and unleased levels") {
  Store store;
  StoreBackend inner(store);
  GrantLedger ledger;
  LeaseMetrics metrics;
  SECTION("a leased tenant level gets its cost back into the grant when global denies") {
    Holder h(inner, ledger,
             build(lease_levels_spec(1, {.rate = {0, 1s}, .burst = 100}, lease_on(20, 0, 1h),
                                     {.rate = {0, 1s}, .burst = 3}, kOff)),
             7, &metrics);
    for (int i = 0; i < 3; ++i) REQUIRE(h.gateway.decide(read("a"), Nanos{0})->decision.allowed);
    const auto denied = h.gateway.decide(read("a"), Nanos{0});
    REQUIRE(denied.ok());
    CHECK_FALSE(denied->decision.allowed);
    CHECK(denied->rule == "global");
    CHECK(h.backend.holdings(Nanos{0})[0].units == 17);  // 20 granted, 3 spent
    CHECK(metrics.at(Level::kTenant).units_held.load() == 17);
  }
  SECTION("an unleased tenant level is refunded at the authority when leased global denies") {
    Holder h(inner, ledger,
             build(lease_levels_spec(1, {.rate = {0, 1s}, .burst = 100}, kOff,
                                     {.rate = {0, 1s}, .burst = 4}, lease_on(2, 0, 1h))),
             7, &metrics);
    for (int i = 0; i < 4; ++i) REQUIRE(h.gateway.decide(read("a"), Nanos{0})->decision.allowed);
    const auto denied = h.gateway.decide(read("a"), Nanos{0});
    REQUIRE(denied.ok());
    CHECK_FALSE(denied->decision.allowed);
    CHECK(denied->rule == "global");
    CHECK(denied->decision.retry_after == quota::kNever);
    CHECK(metrics.at(Level::kGlobal).denials_while_leased.load() == 1);
    // The tenant budget kept 4 units spent, not 5: the denied request was given back.
    const auto rules = h.registry.current();
    const auto* tenant = rules->find(Level::kTenant, {.tenant = "a", .plan = "free"}, "read");
    REQUIRE(tenant != nullptr);
    auto d =
        store.apply(KeyPolicy{.policy = &tenant->policy, .version = 1}, "{a}read", Nanos{0}, 0);
    REQUIRE(d.ok());
    CHECK(d->remaining == 96);
  }
}

TEST_CASE("a rule change reaches a leased key within one lease expiry") {
  Store store;
  StoreBackend inner(store);
  GrantLedger ledger;
  LeaseMetrics metrics;
  const TokenBucket tenant{.rate = {1000, 1s}, .burst = 1000};
  auto v1 = build(lease_levels_spec(1, tenant, kOff, {.rate = {100, 1s}, .burst = 100},
                                    lease_on(40, 0, 500ms)));
  auto v2 = build(
      lease_levels_spec(2, tenant, kOff, {.rate = {10, 1s}, .burst = 10}, lease_on(5, 0, 500ms)));
  Holder a(inner, ledger, v1, 1, &metrics);
  Holder b(inner, ledger, v1, 2, &metrics);
  REQUIRE(a.gateway.decide(read("x"), Nanos{0})->decision.allowed);
  // (B decides another tenant: the tenant key A converts to v2 would carry version 2.)
  REQUIRE(b.gateway.decide(read("y"), Nanos{0})->decision.allowed);
  // A reloads: its v1 grant is dropped at its next decision, which takes a v2 grant.
  REQUIRE(a.registry.publish(v2).ok());
  auto ra = a.gateway.decide(read("x"), Nanos{1ms});
  REQUIRE(ra.ok());
  CHECK(ra->decision.version == 2);
  CHECK(metrics.at(Level::kGlobal).units_dropped_on_rule_change.load() == 39);
  // B never reloads: it spends its v1 grant until the grant expires ...
  auto rb = b.gateway.decide(read("y"), Nanos{499ms});
  REQUIRE(rb.ok());
  CHECK(rb->decision.version == 1);
  // ... and then its grant is taken from the key the authority converted to v2.
  rb = b.gateway.decide(read("y"), Nanos{500ms});
  REQUIRE(rb.ok());
  CHECK(rb->decision.version == 2);
  for (const auto& g : ledger.outstanding(Nanos{500ms})) CHECK(g.version == 2);
}

TEST_CASE("lease: auto leases a key only above the measured rate") {
  Store store;
  StoreBackend inner(store);
  GrantLedger ledger;
  const quota::gateway::LeaseSpec automatic{.mode = quota::gateway::LeaseMode::kAuto,
                                            .units = 20,
                                            .expiry = 1s,
                                            .low_water = 0,
                                            .auto_rate = 100};
  Holder h(inner, ledger,
           build(lease_levels_spec(1, {.rate = {1000, 1s}, .burst = 1000}, kOff,
                                   {.rate = {1000, 1s}, .burst = 1000}, automatic)),
           3);
  // 50 decisions per second: below 100/s, every one goes to the authority.
  for (int i = 0; i < 100; ++i) {
    REQUIRE(h.gateway.decide(read("q"), Nanos{i * 20ms})->decision.allowed);
  }
  CHECK(h.backend.grant_requests() == 0);
  // 1000 per second: leased from the next window on.
  for (int i = 0; i < 2000; ++i) {
    REQUIRE(h.gateway.decide(read("q"), Nanos{2s + i * 1ms})->decision.allowed);
  }
  CHECK(h.backend.grant_requests() > 0);
  CHECK(h.backend.grant_requests() <= 1000 / 20 + 2);
}

namespace {

// A backend whose decisions of the global key fail with kUnavailable while `down`.
struct FlakyBackend final : quota::gateway::Backend {
  explicit FlakyBackend(StoreBackend<Store>& i) : inner(i) {}
  StoreBackend<Store>& inner;
  bool down = false;
  int global_calls = 0;
  absl::StatusOr<quota::gateway::LevelsResult> decide(
      std::span<const quota::gateway::LevelCheck> levels, std::uint64_t version,
      Nanos now) override {
    if (levels.front().key.starts_with("{~global}")) {
      ++global_calls;
      if (down) return absl::UnavailableError("authority down");
    }
    return inner.decide(levels, version, now);
  }
  absl::StatusOr<quota::MicroUnits> refund(const quota::gateway::RulePolicy& p, std::uint64_t v,
                                           quota::gateway::LevelKey k, std::int64_t u, Nanos s,
                                           Nanos n) override {
    return inner.refund(p, v, k, u, s, n);
  }
  absl::StatusOr<quota::MicroUnits> charge(const quota::gateway::RulePolicy& p, std::uint64_t v,
                                           quota::gateway::LevelKey k, std::int64_t u,
                                           Nanos n) override {
    return inner.charge(p, v, k, u, n);
  }
};

}  // namespace

TEST_CASE("a failed renewal backs off, keeps its grant id, and the route fails closed") {
  Store store;
  StoreBackend inner(store);
  FlakyBackend flaky(inner);
  GrantLedger ledger;
  LeaseMetrics metrics;
  quota::gateway::RuleRegistry registry(
      build(lease_levels_spec(1, {.rate = {1000, 1s}, .burst = 1000}, kOff,
                              {.rate = {1000, 1s}, .burst = 1000}, lease_on(10, 0, 1s))));
  quota::gateway::LeasedBackend leased(
      flaky, ledger,
      {.incarnation = 9, .backoff_min = 100ms, .backoff_max = 100ms, .metrics = &metrics});
  quota::gateway::Gateway gw(leased, registry);
  for (int i = 0; i < 9; ++i) REQUIRE(gw.decide(read("f"), Nanos{0})->decision.allowed);
  CHECK(flaky.global_calls == 1);
  flaky.down = true;
  // The 10th spends the last unit held; its renewal fails (its own answer stands).
  REQUIRE(gw.decide(read("f"), Nanos{0})->decision.allowed);
  CHECK(flaky.global_calls == 2);
  const auto& c = metrics.at(Level::kGlobal);
  CHECK(c.renewal_failures.load() == 1);
  // Nothing held, backing off (jitter: 50..100 ms): the failure, not another request.
  auto r = gw.decide(read("f"), Nanos{1ms});
  REQUIRE(r.ok());
  CHECK_FALSE(r->decision.allowed);
  CHECK(r->decision.reason == quota::Reason::kUnavailable);
  CHECK(flaky.global_calls == 2);
  // After the backoff the grant request is retried with the same grant id.
  flaky.down = false;
  auto after = gw.decide(read("f"), Nanos{200ms});
  REQUIRE(after.ok());
  CHECK(after->decision.allowed);
  CHECK(flaky.global_calls == 3);
  const auto grants = ledger.outstanding(Nanos{200ms});
  REQUIRE(grants.size() == 2);
  CHECK(grants[0].grant_id == "9-1");
  CHECK(grants[1].grant_id == "9-2");
  CHECK(c.renewals.load() == 2);
  CHECK(c.renewal_ns_total.load() > 0);
}

TEST_CASE("a leased level in shadow: decided from the grant, counted, never denies") {
  Store store;
  StoreBackend inner(store);
  GrantLedger ledger;
  quota::gateway::Metrics metrics;
  auto spec = lease_levels_spec(1, {.rate = {0, 1s}, .burst = 100}, kOff,
                                {.rate = {0, 1s}, .burst = 2}, lease_on(2, 0, 1h));
  for (auto& r : spec.rules) r.shadow = r.level == Level::kGlobal;
  Holder h(inner, ledger, build(spec, &metrics), 4);
  for (int i = 0; i < 5; ++i) {
    auto r = h.gateway.decide(read("s"), Nanos{0});
    REQUIRE(r.ok());
    CHECK(r->decision.allowed);
    CHECK(r->decision.reason == (i < 2 ? quota::Reason::kAllowed : quota::Reason::kShadow));
  }
  std::uint64_t would_deny = 0;
  for (const auto& c : metrics.snapshot()) {
    if (c->labels().level == "global")
      would_deny = c->count(quota::gateway::Outcome::kShadowWouldDeny);
  }
  CHECK(would_deny == 3);
  // The grant, and the renewal of the request that spent its last unit (denied: the
  // budget never refills, so the key is not asked again before the lease's expiry).
  CHECK(h.backend.grant_requests() == 2);
}
