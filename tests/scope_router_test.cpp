// quota/region/scope_router.hpp, also the backend of gateway_global_lease_redis_bench and
// of gateway_sim --scenario global-lease: the tenant levels are decided in the process's own
// store and never reach the authority; the global level only at the authority; all or
// nothing across the two (a global denial or failure gives the tenant's units back).
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "quota/gateway/backend.hpp"
#include "quota/region/scope_router.hpp"
#include "quota/store/local_store.hpp"
#include "support/lease_rules.hpp"

using namespace std::chrono_literals;
using quota::Nanos;
using quota::TokenBucket;
using quota::gateway::LevelCheck;
using quota::gateway::LevelsResult;
using Store = quota::LocalStore<quota::gateway::KeyPolicy>;
using Inner = quota::gateway::StoreBackend<Store>;

namespace {

// The authority: counts its calls, fails while `down`, and records every key it saw.
struct Authority final : quota::gateway::Backend {
  explicit Authority(Inner& i) : inner(i) {}
  Inner& inner;
  bool down = false;
  int calls = 0;
  std::vector<std::string> keys{};
  absl::StatusOr<LevelsResult> decide(std::span<const LevelCheck> levels, std::uint64_t v,
                                      Nanos now) override {
    ++calls;
    for (const LevelCheck& l : levels) keys.emplace_back(l.key);
    if (down) return absl::UnavailableError("authority down");
    return inner.decide(levels, v, now);
  }
  absl::StatusOr<quota::MicroUnits> refund(const quota::gateway::RulePolicy& p, std::uint64_t v,
                                           quota::gateway::LevelKey k, std::int64_t u, Nanos s,
                                           Nanos n) override {
    ++calls;
    keys.emplace_back(k.key);
    return inner.refund(p, v, k, u, s, n);
  }
  absl::StatusOr<quota::MicroUnits> charge(const quota::gateway::RulePolicy& p, std::uint64_t v,
                                           quota::gateway::LevelKey k, std::int64_t u,
                                           Nanos n) override {
    ++calls;
    keys.emplace_back(k.key);
    return inner.charge(p, v, k, u, n);
  }
};

}  // namespace

TEST_CASE("split backend: tenant levels here, the global level at the authority, all or nothing",
          "[gateway][split]") {
  // Tenant: burst 5; global: burst 2; both refill once an hour (not within the test).
  auto rules = quota::testing::build(
      quota::testing::lease_levels_spec(1, TokenBucket{.rate = {1, 1h}, .burst = 5}, {},
                                        TokenBucket{.rate = {1, 1h}, .burst = 2}, {}));
  auto checks = rules->plan({.tenant = "a", .plan = "free"}, "read");
  REQUIRE(checks.ok());
  std::vector<LevelCheck> levels;
  for (const auto& c : *checks) {
    levels.push_back({.policy = &c.rule->policy,
                      .key = c.key,
                      .shadow = c.shadow,
                      .cost = c.cost,
                      .rule = c.rule});
  }
  REQUIRE(levels.size() == 2);
  REQUIRE(quota::region::is_central(levels[1].key));
  REQUIRE_FALSE(quota::region::is_central(levels[0].key));

  Store here, there;
  Inner local(here), global(there);
  Authority authority(global);
  quota::region::ScopeRouter split(local, authority);
  const auto decide = [&](std::span<const LevelCheck> l) {
    auto r = split.decide(l, 1, Nanos{0});
    REQUIRE(r.ok());
    return *r;
  };

  for (int i = 0; i < 2; ++i) {
    const LevelsResult r = decide(levels);
    REQUIRE(r.parts.size() == 2);
    CHECK(r.parts[0].allowed);
    CHECK(r.parts[1].allowed);
  }
  // The global budget is empty: the tenant level admitted, the global one denied, and the
  // tenant's unit given back.
  const LevelsResult denied = decide(levels);
  REQUIRE(denied.parts.size() == 2);
  CHECK(denied.parts[0].allowed);
  CHECK_FALSE(denied.parts[1].allowed);
  // An authority that fails: the tenant's unit is given back too, and the error returned.
  authority.down = true;
  CHECK(split.decide(levels, 1, Nanos{0}).status().code() == absl::StatusCode::kUnavailable);
  authority.down = false;

  // Only the global key ever reached the authority, once per decision (no refund there).
  CHECK(authority.calls == 4);
  for (const auto& k : authority.keys) CHECK(k == std::string(levels[1].key));
  CHECK(there.size() == 1);
  CHECK(here.size() == 1);
  // The tenant paid for the two admitted requests only: 3 of its 5 units are left.
  std::vector<LevelCheck> tenant_only = {levels[0]};
  tenant_only[0].cost = 4;
  CHECK_FALSE(decide(tenant_only).parts[0].allowed);
  tenant_only[0].cost = 3;
  CHECK(decide(tenant_only).parts[0].allowed);
  CHECK(authority.calls == 4);
}
