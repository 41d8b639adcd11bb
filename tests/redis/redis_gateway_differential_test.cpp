// Differential test of quota/redis/twin/gateway.hpp: the Lua twin of the gateway's
// KeyState (rule changes, debt, refunds, all-or-nothing levels) against the in-process
// backend (StoreBackend over LocalStore<KeyPolicy>), on random operation sequences with
// the caller's clock and a cost per level. Every decision, remaining, retry_after,
// reset_after and version, and every refunded or charged amount, must be identical.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "quota/gateway/backend.hpp"
#include "quota/redis/gateway_store.hpp"
#include "quota/store/local_store.hpp"
#include "support/gateway_rules.hpp"
#include "support/printers.hpp"
#include "support/redis_server.hpp"
#include "support/seed.hpp"

using namespace std::chrono_literals;
using quota::FixedWindow;
using quota::Nanos;
using quota::SlidingLog;
using quota::SlidingWindowEstimate;
using quota::TokenBucket;
using quota::gateway::KeyPolicy;
using quota::gateway::LevelCheck;
using quota::gateway::RulePolicy;
using quota::testing::with_cost;

namespace {

// Policies inside the Lua twin's range, with fractional rates, rate 0, and windows that
// divide 1 s or are whole seconds; all four kinds (sliding log and estimate: 12..17).
RulePolicy random_policy(std::mt19937_64& rng) {
  std::uniform_int_distribution<int> pick(0, 17);
  std::uniform_int_distribution<std::int64_t> burst(1, 40);
  switch (pick(rng)) {
    case 0:
      return TokenBucket{.rate = {.units = 1, .per = 3s}, .burst = burst(rng)};
    case 1:
      return TokenBucket{.rate = {.units = 7, .per = 2s}, .burst = burst(rng)};
    case 2:
      return TokenBucket{.rate = {.units = 1000, .per = 1s}, .burst = burst(rng)};
    case 3:
      return TokenBucket{.rate = {.units = 0, .per = 1s}, .burst = burst(rng)};
    case 4:
      return TokenBucket{.rate = {.units = 3, .per = 7ms}, .burst = burst(rng)};
    case 5:
      return TokenBucket{.rate = {.units = 5'000'000, .per = 1s}, .burst = 2'000'000'000};
    // The same rate in other words: the Lua twin's m and p (rate reduced by
    // g = gcd(units·10^6, per)) are equal, g is not — a state written under one and
    // decided under the other must be converted as a rule change, not taken as is.
    case 10:
      return TokenBucket{.rate = {.units = 1, .per = 1s}, .burst = burst(rng)};
    case 11:
      return TokenBucket{.rate = {.units = 2, .per = 2s}, .burst = burst(rng)};
    case 12:
      return SlidingLog{.limit = burst(rng), .window = 1s};
    case 13:
      return SlidingLog{.limit = burst(rng), .window = Nanos{12'345'678}};
    case 14:
      return SlidingLog{.limit = burst(rng), .window = 60s};
    case 15:
      return SlidingWindowEstimate{.limit = burst(rng), .window = 1s};
    case 16:
      return SlidingWindowEstimate{.limit = burst(rng), .window = std::chrono::microseconds(1250)};
    case 17:
      return SlidingWindowEstimate{.limit = burst(rng), .window = 60s};
    case 6:
      return FixedWindow{.limit = burst(rng), .window = 1s};
    case 7:
      return FixedWindow{.limit = burst(rng), .window = 10ms};
    case 8:
      return FixedWindow{.limit = burst(rng), .window = std::chrono::microseconds(1250)};
    default:
      return FixedWindow{.limit = burst(rng), .window = 60s};
  }
}

// Policies past 2^53 micro-units or ns (twin/gateway_codec.hpp's kGatewayRange: up to
// 10^12 units and 10^17 ns), beside narrow ones (a rule change converts between them):
// the monthly token budgets of large tenants, bounds exactly, long windows.
RulePolicy random_wide_policy(std::mt19937_64& rng) {
  std::uniform_int_distribution<int> pick(0, 11);
  std::uniform_int_distribution<std::int64_t> big(9'007'199'255, 1'000'000'000'000);
  switch (pick(rng)) {
    case 10:  // the estimate's longest window (below 2^52 ns)
      return SlidingWindowEstimate{.limit = big(rng), .window = std::chrono::seconds(4'500'000)};
    case 11:  // the log's longest window (kMaxFillNs)
      return SlidingLog{.limit = big(rng), .window = Nanos{9'000'000'000'000'000}};
    case 0:
      return TokenBucket{.rate = {.units = 1'000'000, .per = 60s}, .burst = 43'200'000'000};
    case 1:
      return TokenBucket{.rate = {.units = 1'000'000, .per = 60s}, .burst = 100'000'000'000};
    case 2:  // both bounds: 10^12 units in 10^17 ns
      return TokenBucket{.rate = {.units = 1, .per = 100us}, .burst = 1'000'000'000'000};
    case 3:  // 400 days to fill, a coprime period
      return TokenBucket{.rate = {.units = 7, .per = Nanos{999'983}}, .burst = 241'920'000'000};
    case 4:
      return TokenBucket{.rate = {.units = 3'000'000, .per = 1s}, .burst = big(rng)};
    case 5:
      return TokenBucket{.rate = {.units = 0, .per = 1s}, .burst = big(rng)};
    case 6:
      return FixedWindow{.limit = big(rng), .window = std::chrono::seconds(100'000'000)};
    case 7:
      return FixedWindow{.limit = big(rng), .window = std::chrono::hours(24 * 400)};
    case 8:
      return TokenBucket{.rate = {.units = 1'000, .per = 1s}, .burst = 2'000'000'000};
    default:
      return random_policy(rng);
  }
}

// A trace's scale: costs up to `cost`, refunds and charges up to `amount` units, and its
// rare long time steps up to `long_step` ns.
struct Scale {
  std::int64_t cost, amount, long_step;
};

// Every field (Decision's ==; support/printers.hpp shows both on a mismatch).
void check_same(const quota::Decision& local, const quota::Decision& redis) {
  CHECK(local == redis);
}

// `ops` random operations on levels of policies from `policy`, at `scale`.
void differential(const char* name, std::uint64_t default_seed,
                  RulePolicy (*policy)(std::mt19937_64&), const Scale& scale, int ops) {
  const std::uint64_t seed = quota::testing::test_seed(default_seed);
  INFO("seed " << seed);
  std::mt19937_64 rng(seed);

  quota::LocalStore<KeyPolicy> local_store({.max_keys = 1'000'000});
  quota::gateway::StoreBackend local(local_store);
  // A long TTL margin: keys must not expire in wall-clock time during the test while the
  // simulated clock says they are still in use.
  quota::redis::GatewayStore redis({.pool = quota::testing::redis_pool(2),
                                    .prefix = quota::testing::unique_prefix(name),
                                    .time = quota::redis::TimeSource::kCaller,
                                    .ttl_margin = 1h});

  // Rule sets by version: version v gives each level kind its policy.
  struct Rules {
    RulePolicy user, tenant, global;
  };
  std::vector<Rules> versions;  // versions[v - 1]
  auto add_version = [&] { versions.push_back({policy(rng), policy(rng), policy(rng)}); };
  add_version();

  const std::vector<std::string> tenants = {"a", "b", "c"};
  // Arbitrary nanoseconds, from a time of today's epoch (beyond 2^53 ns: the twin's two
  // limbs).
  std::int64_t now_ns = 1'764'000'000'123'456'789;
  int decisions = 0, refunds = 0, charges = 0, denials = 0, conversions = 0, own_costs = 0;
  struct Spent {
    std::string key;
    std::uint64_t version;
    RulePolicy policy;
    Nanos at;
  };
  std::vector<Spent> spent;

  // costs: mostly small, sometimes up to the scale (log-uniform)
  auto amount = [&](std::int64_t hi) {
    if (hi <= 90 || std::uniform_int_distribution<int>(0, 1)(rng) == 0) {
      return std::uniform_int_distribution<std::int64_t>(0, std::min<std::int64_t>(hi, 90))(rng);
    }
    const int bits = std::uniform_int_distribution<int>(1, 63 - __builtin_clzll(hi))(rng);
    return std::uniform_int_distribution<std::int64_t>(0, std::int64_t{1} << bits)(rng);
  };
  for (int op = 0; op < ops; ++op) {
    // Time: mostly forward in small or large steps, sometimes backwards.
    std::uniform_int_distribution<int> step_kind(0, 19);
    const int sk = step_kind(rng);
    if (sk < 10) {
      now_ns += std::uniform_int_distribution<std::int64_t>(0, 2'000'000)(rng);
    } else if (sk < 17) {
      now_ns += std::uniform_int_distribution<std::int64_t>(0, 3'000'000'000)(rng);
    } else if (sk < 18) {
      // now and then past any time to fill (~139 days at most: more than 9·10^6 s)
      now_ns += std::uniform_int_distribution<std::int64_t>(
          0, std::uniform_int_distribution<int>(0, 49)(rng) == 0 ? scale.long_step
                                                                 : 200'000'000'000)(rng);
    } else {
      now_ns -= std::uniform_int_distribution<std::int64_t>(0, 5'000'000)(rng);
    }
    const Nanos now{now_ns};
    if (std::uniform_int_distribution<int>(0, 99)(rng) < 3) {
      add_version();
      ++conversions;
    }
    // Mostly the newest rule set; sometimes an older one (a process mid-rollout).
    const std::uint64_t newest = versions.size();
    std::uint64_t version = newest;
    if (newest > 1 && std::uniform_int_distribution<int>(0, 9)(rng) == 0) {
      version = std::uniform_int_distribution<std::uint64_t>(1, newest - 1)(rng);
    }
    const Rules& rules = versions[version - 1];
    const std::string& tenant = tenants[std::uniform_int_distribution<std::size_t>(0, 2)(rng)];
    const std::string user_key = "{" + tenant + "}read/u1";
    const std::string tenant_key = "{" + tenant + "}read";
    const std::string global_key = "{~global}read";

    const int what = std::uniform_int_distribution<int>(0, 9)(rng);
    INFO("op " << op << " at " << now_ns << " ns, version " << version << ", kind " << what);
    if (what < 7) {
      std::vector<LevelCheck> levels;
      std::uniform_int_distribution<int> coin(0, 3);
      if (coin(rng) != 0) levels.push_back({&rules.user, user_key, coin(rng) == 0});
      levels.push_back({&rules.tenant, tenant_key, coin(rng) == 0});
      if (coin(rng) == 0) levels.push_back({&rules.global, global_key, coin(rng) == 0});
      std::int64_t cost = std::max<std::int64_t>(1, amount(scale.cost) % scale.cost);
      if (scale.cost == 8) cost = std::uniform_int_distribution<std::int64_t>(1, 8)(rng);
      if (std::uniform_int_distribution<int>(0, 49)(rng) == 0) cost = 0;
      if (std::uniform_int_distribution<int>(0, 49)(rng) == 0) cost = 50;
      std::vector<LevelCheck> costed = with_cost(levels, cost);
      // Half the requests cost each level its own (random) units.
      if (coin(rng) < 2) {
        for (LevelCheck& lc : costed) {
          lc.cost = scale.cost == 8 ? std::uniform_int_distribution<std::int64_t>(0, 12)(rng)
                                    : amount(scale.cost);
        }
        ++own_costs;
      }
      auto l = local.decide(costed, version, now);
      auto r = redis.decide(costed, version, now);
      REQUIRE(l.ok());
      INFO(r.status().ToString());
      REQUIRE(r.ok());
      CHECK(r->time == now);
      REQUIRE(l->parts.size() == r->parts.size());
      for (std::size_t i = 0; i < l->parts.size(); ++i) check_same(l->parts[i], r->parts[i]);
      ++decisions;
      if (!l->parts.back().allowed) ++denials;
      if (l->parts.size() == levels.size() &&
          std::all_of(l->parts.begin(), l->parts.end(), [](auto& d) { return d.allowed; })) {
        for (const LevelCheck& lc : levels) {
          spent.push_back({std::string(lc.key), version, *lc.policy, now});
        }
      }
    } else if (what < 9 && !spent.empty()) {
      const Spent& s = spent[std::uniform_int_distribution<std::size_t>(0, spent.size() - 1)(rng)];
      const std::int64_t units = scale.amount == 90
                                     ? std::uniform_int_distribution<std::int64_t>(0, 60)(rng)
                                     : amount(scale.amount);
      auto l = local.refund(s.policy, s.version, s.key, units, s.at, now);
      auto r = redis.refund(s.policy, s.version, s.key, units, s.at, now);
      REQUIRE(l.ok());
      INFO(r.status().ToString());
      REQUIRE(r.ok());
      CHECK(*l == *r);
      ++refunds;
    } else {
      const std::string& key =
          std::uniform_int_distribution<int>(0, 1)(rng) == 0 ? tenant_key : user_key;
      const RulePolicy& policy = key == tenant_key ? rules.tenant : rules.user;
      const std::int64_t units = scale.amount == 90
                                     ? std::uniform_int_distribution<std::int64_t>(0, 90)(rng)
                                     : amount(scale.amount);
      auto l = local.charge(policy, version, key, units, now);
      auto r = redis.charge(policy, version, key, units, now);
      REQUIRE(l.ok());
      INFO(r.status().ToString());
      REQUIRE(r.ok());
      CHECK(*l == *r);
      ++charges;
    }
  }
  std::printf(
      "gateway differential: %d decisions (%d denied, %d with a cost per level), %d refunds, "
      "%d charges, %d rule changes\n",
      decisions, denials, own_costs, refunds, charges, conversions);
  // The trace exercised every path.
  CHECK(decisions > ops * 7 / 12);
  CHECK(denials > ops / 24);
  CHECK(refunds > ops / 24);
  CHECK(charges > ops / 24);
  CHECK(conversions > ops / 120);
  CHECK(own_costs > ops / 6);
}

}  // namespace

TEST_CASE("the gateway's Lua twin decides exactly like the in-process KeyState") {
  differential("gwdiff", 20261129, random_policy,
               {.cost = 8, .amount = 90, .long_step = 12'000'000'000'000'000}, 12'000);
}

TEST_CASE("past 2^53 micro-units and ns the gateway's twin still decides like KeyState") {
  // capacities up to 10^12 units, spans up to 10^17 ns, long steps past two of them
  differential(
      "gwdiff-wide", 20261205, random_wide_policy,
      {.cost = 400'000'000'000, .amount = 3'000'000'000'000, .long_step = 250'000'000'000'000'000},
      6'000);
}

TEST_CASE("a monthly token budget on the Redis gateway: deepest debt, then the retry") {
  // 1,000,000 tokens per minute; budgets of 30 days (4.32·10^10) and of 10^11 tokens. The
  // whole budget is spent, then a charge of what the request really used pushes the level
  // to its deepest debt (−capacity); the retry of one token waits a time to fill and a
  // token, the reset two times to fill: past 2^53 ns for the larger budget. In-process
  // and Redis agree at every step.
  quota::LocalStore<KeyPolicy> local_store({.max_keys = 100});
  quota::gateway::StoreBackend local(local_store);
  quota::redis::GatewayStore redis({.pool = quota::testing::redis_pool(1),
                                    .prefix = quota::testing::unique_prefix("gw-monthly"),
                                    .time = quota::redis::TimeSource::kCaller,
                                    .ttl_margin = 1h});
  for (const std::int64_t burst : {std::int64_t{43'200'000'000}, std::int64_t{100'000'000'000}}) {
    INFO("burst " << burst);
    const RulePolicy budget = TokenBucket{.rate = {.units = 1'000'000, .per = 60s}, .burst = burst};
    REQUIRE(quota::redis::GatewayStore::check(budget).ok());
    const std::string key = "{tenant}tokens" + std::to_string(burst);
    const LevelCheck level[] = {{.policy = &budget, .key = key, .shadow = false}};
    Nanos now{1'764'000'000'000'000'000};
    auto decide = [&](std::int64_t cost) {
      auto l = local.decide(with_cost(level, cost), 1, now);
      auto r = redis.decide(with_cost(level, cost), 1, now);
      REQUIRE(l.ok());
      REQUIRE(r.ok());
      REQUIRE(r->parts.size() == 1);
      check_same(l->parts[0], r->parts[0]);
      return r->parts[0];
    };
    const quota::Decision all = decide(burst);
    CHECK(all.allowed);
    CHECK(all.reset_after == Nanos{burst * 60'000});
    // the request used twice its estimate and more: the level goes to its deepest debt
    auto l = local.charge(budget, 1, key, 2 * burst + 1, now);
    auto r = redis.charge(budget, 1, key, 2 * burst + 1, now);
    REQUIRE(l.ok());
    REQUIRE(r.ok());
    CHECK(*l == *r);
    CHECK(*r == quota::to_micro(burst));  // left as debt: −capacity
    const quota::Decision deep = decide(1);
    CHECK_FALSE(deep.allowed);
    CHECK(deep.remaining == -burst);
    // −burst back to +1 token: burst + 1 tokens at 60 µs each; back to full: 2·burst
    CHECK(deep.retry_after == Nanos{(burst + 1) * 60'000});
    CHECK(deep.reset_after == Nanos{2 * burst * 60'000});
    // 30 days on, still in debt or just refilled; then exactly at the retry time
    const Nanos start = now;
    now = start + std::chrono::hours(24 * 30);
    decide(1);
    now = start + deep.retry_after - Nanos{1};
    CHECK_FALSE(decide(1).allowed);
    now = start + deep.retry_after;
    CHECK(decide(1).allowed);
  }
}
