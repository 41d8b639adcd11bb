// Fair shares of a global budget through the Gateway (quota/gateway/fair_share/fair_limits.hpp, the
// rule option fair_share_spec.hpp), in-process: the thresholds (free, borrowed, paused,
// over share) with their reasons, HTTP answers and metrics and nothing deducted on a
// refusal; a lone tenant reaching the whole budget; borrowed capacity reclaimed within
// one period; Σ shares ≤ budget − reserve at every allocation and every active tenant at
// its fair share in every period of a steady overload; the global envelope with the
// verifier, unleased and leased at four holders (r·T + B + Σ outstanding grants). The rule's
// validation is in rule_file_fair_share_test.cpp.
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "quota/fair/weighted_max_min.hpp"
#include "quota/gateway/gateway.hpp"
#include "quota/gateway/leases/leased_backend.hpp"
#include "quota/http.hpp"
#include "quota/store/local_store.hpp"
#include "quota/store/sharded_store.hpp"
#include "quota/verify/envelope.hpp"
#include "support/gateway_rules.hpp"

using namespace std::chrono_literals;
using quota::Nanos;
using quota::Reason;
using quota::TokenBucket;
using quota::gateway::FairShareSpec;
using quota::gateway::Gateway;
using quota::gateway::KeyPolicy;
using quota::gateway::Level;
using quota::gateway::Metrics;
using quota::gateway::Outcome;
using quota::gateway::Request;
using quota::gateway::RuleRegistry;
using quota::gateway::RuleSetSpec;
using quota::testing::build;

namespace {

// Route "call" (the request's cost): plan "free" gets `tenant` per tenant (rule "tenant"),
// everyone shares `global` (rule "global") with `fair`.
RuleSetSpec fair_spec(FairShareSpec fair, TokenBucket global,
                      TokenBucket tenant = {.rate = {0, 1s}, .burst = 1'000'000}) {
  RuleSetSpec s{.version = 1, .routes = {{.name = "call", .cost = 1}}, .rules = {}};
  s.rules.push_back({.level = Level::kTenant,
                     .plan = "free",
                     .route = "call",
                     .name = "tenant",
                     .policy = tenant});
  s.rules.push_back({.level = Level::kGlobal,
                     .route = "call",
                     .name = "global",
                     .policy = global,
                     .fair_share = fair});
  return s;
}

// 1,000 units per 1 s period; reserve 10 %, shares above 70 %, pause above 90 %.
const FairShareSpec kFair{.enabled = true, .period = 1s, .budget = 1'000};

Request call(const std::string& tenant, std::int64_t units) {
  return {.who = {.tenant = tenant, .plan = "free"}, .route = "call", .cost = units};
}

struct Fixture {
  explicit Fixture(RuleSetSpec s) : registry(build(std::move(s), &metrics)), gw(store, registry) {}
  quota::gateway::Result decide(const std::string& tenant, std::int64_t units, Nanos t) {
    auto r = gw.decide(call(tenant, units), t);
    REQUIRE(r.ok());
    return *r;
  }
  bool admits(const std::string& tenant, std::int64_t units, Nanos t) {
    return decide(tenant, units, t).decision.allowed;
  }
  std::uint64_t global_count(Outcome o) {
    auto c = metrics.counters({.rule = "global", .route = "call", .level = "global"});
    REQUIRE(c.ok());
    return (*c)->count(o);
  }
  Metrics metrics;
  RuleRegistry registry;
  quota::LocalStore<KeyPolicy> store;
  Gateway gw;
};

}  // namespace

TEST_CASE(
    "free below shares_above, borrowed up to pause_above, then paused: 429, nothing "
    "deducted") {
  // The global bucket holds 1,100 (no refill), a's tenant bucket 750.
  Fixture f(fair_spec(kFair, {.rate = {0, 1s}, .burst = 1'100}, {.rate = {0, 1s}, .burst = 750}));
  CHECK(f.admits("a", 400, Nanos{0}));
  CHECK(f.admits("b", 200, Nanos{0}));            // 600 in use: free
  CHECK(f.admits("a", 200, 100ms));               // 800: past 70 %, nobody constrained: borrowed
  const auto paused = f.decide("a", 150, 200ms);  // 950 > 900
  CHECK_FALSE(paused.decision.allowed);
  CHECK(paused.decision.reason == Reason::kPaused);
  CHECK(paused.rule == "global");
  CHECK(paused.decision.retry_after > Nanos{0});
  CHECK(paused.decision.retry_after <= 800ms);  // the first units leave at 1 s
  auto policy = quota::http::describe("global", TokenBucket{.rate = {0, 1s}, .burst = 1'100});
  REQUIRE(policy.ok());
  const quota::http::Answer a = quota::http::answer(paused.decision, *policy);
  CHECK(a.status == 429);
  CHECK(a.reason == "paused");
  CHECK(a.retry_after_seconds == 1);
  CHECK(f.global_count(Outcome::kDenied) == 1);
  CHECK(f.global_count(Outcome::kAllowed) == 3);

  // Nothing was deducted: at 1 s (the units in use have left the allocator) a's tenant
  // bucket still holds exactly 150 and the global bucket 300.
  CHECK(f.admits("a", 150, 1s));
  const auto tenant_full = f.decide("a", 1, 1s);
  CHECK(tenant_full.decision.reason == Reason::kOverLimit);
  CHECK(tenant_full.rule == "tenant");
  CHECK(f.admits("b", 150, 1s));
  const auto global_full = f.decide("b", 1, 1s);
  CHECK(global_full.decision.reason == Reason::kOverLimit);
  CHECK(global_full.rule == "global");
  const auto stats = f.gw.fair_shares();
  REQUIRE(stats.size() == 1);
  CHECK(stats[0].key == "{~global}call");
  CHECK(stats[0].paused == 1);
  CHECK(stats[0].allocations == 2);  // at 0 and at 1 s
}

TEST_CASE("a lone tenant reaches the whole budget") {
  Fixture f(fair_spec(kFair, {.rate = {0, 1s}, .burst = 1'000'000}));
  std::int64_t admitted = 0;
  for (int i = 0; i < 12; ++i) admitted += f.admits("solo", 100, Nanos{i * 1ms}) ? 100 : 0;
  CHECK(admitted == 1'000);  // the budget, no cap at 70 %, 90 % or budget − reserve
  // The next period: its units have left; again the whole budget.
  admitted = 0;
  for (int i = 0; i < 12; ++i) admitted += f.admits("solo", 100, 1s + Nanos{i * 1ms}) ? 100 : 0;
  CHECK(admitted == 1'000);
  // A cost above the allocator's budget can never pass it: request_too_large, its cap.
  const auto big = f.decide("solo", 1'001, 3s);
  CHECK(big.decision.reason == Reason::kRequestTooLarge);
  CHECK(big.request_cap == 1'000);
}

TEST_CASE("a constrained tenant is held to its share: over_share, the other gets its share") {
  Fixture f(fair_spec(kFair, {.rate = {0, 1s}, .burst = 1'000'000}));
  // Period 0: a alone takes the budget (its units leave at 1 s); b arrives and asks
  // 1,000, all paused.
  for (int i = 0; i < 10; ++i) CHECK(f.admits("a", 100, Nanos{0}));
  for (int i = 0; i < 10; ++i) {
    const auto r = f.decide("b", 100, 500ms + Nanos{i * 1ms});
    CHECK(r.decision.reason == Reason::kPaused);
  }
  // Period 1: estimates 500 and 500 > 900 in all: both constrained at shares of 450.
  std::int64_t a_admitted = 0, b_admitted = 0;
  for (int i = 0; i < 4; ++i) a_admitted += f.admits("a", 100, 1s + Nanos{i * 1ms}) ? 100 : 0;
  const auto over = f.decide("a", 100, 1s + 10ms);
  CHECK_FALSE(over.decision.allowed);
  CHECK(over.decision.reason == Reason::kOverShare);
  CHECK(over.decision.retry_after == 990ms);  // the next allocation
  auto policy = quota::http::describe("global", TokenBucket{.rate = {0, 1s}, .burst = 1'000'000});
  REQUIRE(policy.ok());
  CHECK(quota::http::answer(over.decision, *policy).reason == "over_share");
  CHECK(quota::http::answer(over.decision, *policy).status == 429);
  for (int i = 0; i < 4; ++i)
    b_admitted += f.admits("b", 100, 1s + 20ms + Nanos{i * 1ms}) ? 100 : 0;
  b_admitted += f.admits("b", 50, 1s + 30ms) ? 50 : 0;
  CHECK(a_admitted == 400);
  CHECK(b_admitted == 450);  // its share, whole
  const auto stats = f.gw.fair_shares();
  REQUIRE(stats.size() == 1);
  REQUIRE(stats[0].last.has_value());
  CHECK(stats[0].last->share_sum == 900);
  CHECK(stats[0].last->constrained == 2);
  CHECK(stats[0].over_share >= 1);
}

TEST_CASE("capacity borrowed by a lone tenant is reclaimed within one period") {
  Fixture f(fair_spec(kFair, {.rate = {0, 1s}, .burst = 1'000'000}));
  std::int64_t held = 0;
  for (int i = 0; i < 10; ++i) held += f.admits("borrower", 100, Nanos{0}) ? 100 : 0;
  REQUIRE(held == 1'000);  // in use until 1 s
  // Others arrive in the same period: paused (the budget is borrowed).
  for (const char* t : {"x", "y", "z"}) {
    for (int i = 0; i < 3; ++i) CHECK(f.decide(t, 100, 600ms).decision.reason == Reason::kPaused);
  }
  // From the first allocation after their arrival (1 s, when the borrowed units have
  // left) every newcomer gets its max-min share of the period's asks (300 each, the
  // borrower 1,000: 225 each of 900) in whole requests of 100, and the borrower no more
  // than its share of the allocation.
  const std::vector<std::int64_t> asked = {300, 300, 300, 1'000}, weights = {1, 1, 1, 1};
  auto fair = quota::fair::weighted_max_min(900, asked, weights);
  REQUIRE(fair.ok());
  for (int period = 1; period <= 3; ++period) {
    const Nanos start = Nanos{period * 1'000'000'000LL};
    std::map<std::string, std::int64_t> got;
    for (int i = 0; i < 3; ++i) {
      for (const char* t : {"x", "y", "z"}) got[t] += f.admits(t, 100, start + Nanos{i}) ? 100 : 0;
      got["borrower"] += f.admits("borrower", 100, start + Nanos{10 + i}) ? 100 : 0;
    }
    for (int i = 0; i < 7; ++i) got["borrower"] += f.admits("borrower", 100, start + 1ms) ? 100 : 0;
    INFO("period " << period << ": x " << got["x"] << ", y " << got["y"] << ", z " << got["z"]
                   << ", borrower " << got["borrower"]);
    for (const char* t : {"x", "y", "z"}) CHECK(got[t] >= (*fair)[0] - 99);
    const auto stats = f.gw.fair_shares();
    REQUIRE(stats.size() == 1);
    for (const auto& t : stats[0].tenants) {
      if (t.tenant == "borrower") CHECK(got["borrower"] <= t.share);
    }
  }
}

TEST_CASE("steady overload: shares sum to at most budget - reserve, every tenant at its share") {
  // Four tenants ask 100, 200, 400 and 800 units per period (1,500 > 900) in requests of
  // 50, interleaved; max-min of 900: 100, 200, 300, 300.
  Fixture f(fair_spec(kFair, {.rate = {0, 1s}, .burst = 1'000'000'000}));
  const std::vector<std::pair<std::string, std::int64_t>> asks = {
      {"t100", 100}, {"t200", 200}, {"t400", 400}, {"t800", 800}};
  std::vector<std::int64_t> demands, weights;
  for (const auto& [t, n] : asks) {
    demands.push_back(n);
    weights.push_back(1);
  }
  auto fair = quota::fair::weighted_max_min(900, demands, weights);
  REQUIRE(fair.ok());
  const int kPeriods = 12;
  int windows_checked = 0;
  for (int p = 0; p < kPeriods; ++p) {
    std::map<std::string, std::int64_t> got;
    const Nanos start{p * 1'000'000'000LL};
    // Each step: every tenant with asks left asks 50.
    for (int step = 0; step < 16; ++step) {
      for (const auto& [t, n] : asks) {
        if (step * 50 >= n) continue;
        got[t] += f.admits(t, 50, start + Nanos{step * 1'000'000LL}) ? 50 : 0;
      }
    }
    const auto stats = f.gw.fair_shares();
    REQUIRE(stats.size() == 1);
    CHECK(stats[0].allocation_errors == 0);
    CHECK(stats[0].max_share_sum <= stats[0].config.share_capacity());  // every allocation
    if (p < 3) continue;  // the estimates of the asks settle in the first periods
    ++windows_checked;
    for (std::size_t i = 0; i < asks.size(); ++i) {
      INFO("period " << p << " tenant " << asks[i].first << " got " << got[asks[i].first]
                     << " fair " << (*fair)[i]);
      // At its fair share, in whole requests of 50.
      CHECK(got[asks[i].first] >= std::min(asks[i].second, (*fair)[i]) - 49);
    }
  }
  CHECK(windows_checked == kPeriods - 3);
}

TEST_CASE("random traffic: the global envelope r*T + B holds on what was admitted") {
  const std::uint64_t seed = 2202;
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  std::mt19937_64 rng(seed);
  const TokenBucket global{.rate = {1'000, 1s}, .burst = 500};
  // The budget is the rate × period: 1,000 per 1 s.
  Fixture f(fair_spec({.enabled = true, .period = 1s}, global));
  std::vector<quota::verify::AdmittedEvent> log;
  std::map<Reason, int> reasons;
  for (Nanos t{0}; t < 10s; t += 1ms) {
    const int n = static_cast<int>(rng() % 3);
    for (int k = 0; k < n; ++k) {
      const std::string who = "t" + std::to_string(rng() % (rng() % 4 == 0 ? 2 : 20));
      const std::int64_t units = 1 + static_cast<std::int64_t>(rng() % 20);
      const auto r = f.decide(who, units, t);
      ++reasons[r.decision.reason];
      if (r.decision.allowed) log.push_back({t.count(), units});
    }
  }
  auto report = quota::verify::verify_token_bucket(log, global.rate, global.burst, 0);
  REQUIRE(report.ok());
  std::printf("%zu admitted; %s; paused %d, over_share %d, over_limit %d\n", log.size(),
              quota::verify::to_string(*report).c_str(), reasons[Reason::kPaused],
              reasons[Reason::kOverShare], reasons[Reason::kOverLimit]);
  CHECK(report->holds());
  const auto stats = f.gw.fair_shares();
  REQUIRE(stats.size() == 1);
  CHECK(stats[0].config.budget == 1'000);
  CHECK(stats[0].allocations == 10);  // at 0, 1 s, ..., 9 s
  CHECK(stats[0].allocation_errors == 0);
  CHECK(stats[0].max_share_sum <= stats[0].config.share_capacity());
  CHECK(reasons[Reason::kPaused] + reasons[Reason::kOverShare] > 0);  // the allocator worked
}

TEST_CASE("leased global budget with fair shares at four holders: r*T + B + sum of grants") {
  const std::uint64_t seed = 2203;
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  std::mt19937_64 rng(seed);
  const TokenBucket global{.rate = {2'000, 1s}, .burst = 400};
  RuleSetSpec s = fair_spec({.enabled = true, .period = 200ms}, global);  // budget 400
  s.rules[1].lease = {
      .mode = quota::gateway::LeaseMode::kOn, .units = 40, .expiry = 200ms, .low_water = 10};
  auto rules = build(s);
  quota::ShardedStore<KeyPolicy> store;
  quota::gateway::StoreBackend inner(store);
  quota::GrantLedger ledger;
  constexpr int kHolders = 4;
  using Backend = quota::gateway::LeasedBackend<quota::gateway::StoreBackend<decltype(store)>>;
  struct Holder {
    Holder(decltype(inner)& in, quota::GrantLedger& l,
           std::shared_ptr<const quota::gateway::RuleSet> r, std::uint64_t incarnation)
        : registry(std::move(r)),
          backend(in, l, {.incarnation = incarnation}),
          gw(backend, registry, {.fair_share_holders = kHolders}) {}
    RuleRegistry registry;
    Backend backend;
    Gateway gw;
  };
  std::vector<std::unique_ptr<Holder>> holders;
  for (int i = 0; i < kHolders; ++i) {
    holders.push_back(std::make_unique<Holder>(inner, ledger, rules, i + 1));
  }
  std::vector<quota::verify::AdmittedEvent> log;
  std::map<Reason, int> reasons;
  for (Nanos t{0}; t < 3s; t += 1ms) {
    for (int i = 0; i < kHolders; ++i) {
      const int n = static_cast<int>(rng() % 2);
      for (int k = 0; k < n; ++k) {
        const std::string who = "t" + std::to_string(rng() % 8);
        const std::int64_t units = 1 + static_cast<std::int64_t>(rng() % 10);
        auto r = holders[i]->gw.decide(call(who, units), t);
        REQUIRE(r.ok());
        ++reasons[r->decision.reason];
        if (r->decision.allowed) log.push_back({t.count(), units});
      }
    }
  }
  auto report =
      quota::verify::verify_token_bucket(log, global.rate, global.burst, kHolders * (40 + 10));
  REQUIRE(report.ok());
  std::printf("%zu admitted; %s; paused %d, over_share %d, over_limit %d\n", log.size(),
              quota::verify::to_string(*report).c_str(), reasons[Reason::kPaused],
              reasons[Reason::kOverShare], reasons[Reason::kOverLimit]);
  CHECK(report->holds());
  std::int64_t capacities = 0;
  for (const auto& h : holders) {
    const auto stats = h->gw.fair_shares();
    REQUIRE(stats.size() == 1);
    CHECK(stats[0].config.budget == 100);  // ⌊400 / 4⌋
    CHECK(stats[0].allocation_errors == 0);
    CHECK(stats[0].max_share_sum <= stats[0].config.share_capacity());
    capacities += stats[0].config.share_capacity();
  }
  CHECK(capacities <= 400 - 40);  // Σ over the holders ≤ budget − reserve
  CHECK(reasons[Reason::kPaused] + reasons[Reason::kOverShare] > 0);
}

TEST_CASE("two gateways given one FairLimits hold a tenant to one share, wherever it calls") {
  // A process that switches between gateways (quota-server: leased or not) passes both the
  // same GatewayOptions::fair_limits; each gateway alone would grant the whole budget.
  Metrics metrics;
  RuleRegistry registry(build(fair_spec(kFair, {.rate = {0, 1s}, .burst = 1'000'000}), &metrics));
  quota::LocalStore<KeyPolicy> store;
  quota::gateway::GatewayOptions shared;
  shared.fair_limits = std::make_shared<quota::gateway::FairLimits>();
  Gateway one(store, registry, shared), two(store, registry, shared);
  std::int64_t admitted = 0;
  for (int i = 0; i < 12; ++i) {
    auto& gw = i % 2 == 0 ? one : two;
    auto r = gw.decide(call("solo", 100), Nanos{i * 1ms});
    REQUIRE(r.ok());
    admitted += r->decision.allowed ? 100 : 0;
  }
  CHECK(admitted == 1'000);  // one budget across both, as through one gateway
  REQUIRE(one.fair_shares().size() == 1);
  CHECK(two.fair_shares().size() == 1);
  CHECK(one.fair_shares()[0].key == two.fair_shares()[0].key);

  // Without it, each gateway's own allocator grants the whole budget again.
  Gateway three(store, registry), four(store, registry);
  admitted = 0;
  for (int i = 0; i < 24; ++i) {
    auto& gw = i % 2 == 0 ? three : four;
    auto r = gw.decide(call("other", 100), 2s + Nanos{i * 1ms});
    REQUIRE(r.ok());
    admitted += r->decision.allowed ? 100 : 0;
  }
  CHECK(admitted == 2'000);
}

TEST_CASE("fair shares at the ends of the clock: boundaries and waits saturate") {
  // A caller's clock may read anything; the period arithmetic must not overflow (the
  // asan stage's UBSan traps if it does). Near the lowest time, then the highest.
  Fixture f(
      fair_spec(kFair, {.rate = {0, 1s}, .burst = 1'000'000}, {.rate = {0, 1s}, .burst = 750}));
  const Nanos low = Nanos::min() + 1ms;
  CHECK(f.admits("a", 400, low));
  const Nanos high = Nanos::max() - 1ms;  // another period: a's 400 are no longer in use
  CHECK(f.admits("a", 300, high));
  CHECK(f.admits("b", 500, high));               // 800 in use: borrowed
  const auto paused = f.decide("b", 200, high);  // 1,000 > 900: paused
  CHECK(paused.decision.reason == Reason::kPaused);
  CHECK(paused.decision.retry_after >= Nanos{1});
}
