// Tests of the gateway store's coalescing (GatewayStoreOptions::coalesce) against a real
// redis-server: script calls of many threads pipelined together, each decided exactly as
// the in-process gateway decides it alone; a one-off budget admitted exactly; a corrupt
// key and a flushed script cache handled per call; bad options.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include <catch2/catch.hpp>

#include "quota/gateway/gateway.hpp"
#include "quota/redis/gateway_store.hpp"
#include "quota/store/local_store.hpp"
#include "support/coalescing.hpp"
#include "support/gateway_rules.hpp"
#include "support/printers.hpp"
#include "support/redis_server.hpp"
#include "support/seed.hpp"

using namespace std::chrono_literals;
using quota::FixedWindow;
using quota::Nanos;
using quota::TokenBucket;
using quota::gateway::Gateway;
using quota::gateway::KeyPolicy;
using quota::gateway::LevelCheck;
using quota::gateway::RulePolicy;
using quota::gateway::RuleRegistry;
using quota::redis::GatewayStore;
using quota::redis::GatewayStoreOptions;
using quota::redis::TimeSource;
using quota::testing::with_cost;

namespace {

GatewayStoreOptions coalescing(const std::string& test, int coalesce, int calls, TimeSource time) {
  GatewayStoreOptions o{.pool = quota::testing::redis_pool(4),
                        .prefix = quota::testing::unique_prefix(test),
                        .time = time,
                        .ttl_margin = 1h};
  o.coalesce = coalesce;
  o.coalesce_calls = calls;
  return o;
}

}  // namespace

TEST_CASE("coalesced gateway calls decide exactly like the in-process gateway, one by one") {
  // Each thread has tenants and a global key of its own, so its results do not depend on
  // how the threads interleave, and compares every decision, refund and charge with an
  // in-process backend of its own. The threads share the store, so their script calls
  // go together.
  const std::uint64_t seed = quota::testing::test_seed(20261130);
  INFO("seed " << seed);
  std::printf("gateway coalescing differential: seed %llu\n",
              static_cast<unsigned long long>(seed));
  std::mt19937_64 rules_rng(seed);
  // Rule sets by version (shared, read-only): token buckets with fractional rates and a
  // one-off budget, fixed windows.
  const std::vector<RulePolicy> menu = {
      TokenBucket{.rate = {.units = 1, .per = 3s}, .burst = 12},
      TokenBucket{.rate = {.units = 7, .per = 2s}, .burst = 30},
      TokenBucket{.rate = {.units = 0, .per = 1s}, .burst = 25},
      TokenBucket{.rate = {.units = 3, .per = 7ms}, .burst = 9},
      FixedWindow{.limit = 20, .window = 1s},
      FixedWindow{.limit = 7, .window = std::chrono::microseconds(1250)},
  };
  struct Rules {
    RulePolicy user, tenant, global;
  };
  std::vector<Rules> versions;  // versions[v - 1]
  std::uniform_int_distribution<std::size_t> pick(0, menu.size() - 1);
  for (int v = 0; v < 6; ++v) {
    versions.push_back({menu[pick(rules_rng)], menu[pick(rules_rng)], menu[pick(rules_rng)]});
  }

  GatewayStore redis(coalescing("gw-coalesce-diff", 64, 1, TimeSource::kCaller));
  constexpr int kThreads = 6, kOps = 700;
  std::atomic<int> mismatches{0}, errors{0}, denials{0};
  std::vector<std::string> first_problem(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937_64 rng(seed + static_cast<std::uint64_t>(t) + 1);
      quota::LocalStore<KeyPolicy> local_store({.max_keys = 100'000});
      quota::gateway::StoreBackend local(local_store);
      auto problem = [&](const std::string& what) {
        if (first_problem[t].empty()) first_problem[t] = what;
      };
      std::int64_t now_us = 1'000'000;
      struct Spent {
        std::string key;
        std::uint64_t version;
        RulePolicy policy;
        Nanos at;
      };
      std::vector<Spent> spent;
      const std::string global_key = "{~global-" + std::to_string(t) + "}read";
      for (int op = 0; op < kOps; ++op) {
        // Time: forward in small or large steps, sometimes back.
        const int sk = std::uniform_int_distribution<int>(0, 19)(rng);
        if (sk < 12) {
          now_us += std::uniform_int_distribution<std::int64_t>(0, 2000)(rng);
        } else if (sk < 19) {
          now_us += std::uniform_int_distribution<std::int64_t>(0, 3'000'000)(rng);
        } else {
          now_us -= std::uniform_int_distribution<std::int64_t>(0, 5000)(rng);
        }
        const Nanos now{now_us * 1000};
        const std::uint64_t version = std::uniform_int_distribution<std::uint64_t>(
            1, std::min<std::uint64_t>(versions.size(), 1 + op / 100))(rng);
        const Rules& rules = versions[version - 1];
        const std::string tenant = "t" + std::to_string(t) + "-" +
                                   std::to_string(std::uniform_int_distribution<int>(0, 2)(rng));
        const std::string user_key = "{" + tenant + "}read/u1";
        const std::string tenant_key = "{" + tenant + "}read";
        const std::string where = "thread " + std::to_string(t) + " op " + std::to_string(op);
        const int what = std::uniform_int_distribution<int>(0, 9)(rng);
        if (what < 7) {
          std::vector<LevelCheck> levels;
          std::uniform_int_distribution<int> coin(0, 3);
          if (coin(rng) != 0) levels.push_back({&rules.user, user_key, coin(rng) == 0});
          levels.push_back({&rules.tenant, tenant_key, coin(rng) == 0});
          if (coin(rng) == 0) levels.push_back({&rules.global, global_key, coin(rng) == 0});
          const std::int64_t cost = std::uniform_int_distribution<std::int64_t>(1, 6)(rng);
          auto l = local.decide(with_cost(levels, cost), version, now);
          auto r = redis.decide(with_cost(levels, cost), version, now);
          if (!l.ok() || !r.ok()) {
            errors.fetch_add(1);
            problem(where + ": " + r.status().ToString());
            continue;
          }
          bool equal = l->parts.size() == r->parts.size() && r->time == now;
          for (std::size_t i = 0; equal && i < l->parts.size(); ++i) {
            equal = l->parts[i] == r->parts[i];
          }
          if (!equal) {
            mismatches.fetch_add(1);
            problem(where + ": decisions differ");
            continue;
          }
          if (!l->parts.back().allowed) denials.fetch_add(1);
          if (l->parts.size() == levels.size() &&
              std::all_of(l->parts.begin(), l->parts.end(), [](auto& d) { return d.allowed; })) {
            for (const LevelCheck& lc : levels) {
              spent.push_back({std::string(lc.key), version, *lc.policy, now});
            }
          }
        } else if (what < 9 && !spent.empty()) {
          const Spent& s =
              spent[std::uniform_int_distribution<std::size_t>(0, spent.size() - 1)(rng)];
          const std::int64_t units = std::uniform_int_distribution<std::int64_t>(0, 20)(rng);
          auto l = local.refund(s.policy, s.version, s.key, units, s.at, now);
          auto r = redis.refund(s.policy, s.version, s.key, units, s.at, now);
          if (!l.ok() || !r.ok()) {
            errors.fetch_add(1);
            problem(where + ": refund " + r.status().ToString());
          } else if (*l != *r) {
            mismatches.fetch_add(1);
            problem(where + ": refunds differ");
          }
        } else {
          const std::int64_t units = std::uniform_int_distribution<std::int64_t>(0, 30)(rng);
          auto l = local.charge(rules.tenant, version, tenant_key, units, now);
          auto r = redis.charge(rules.tenant, version, tenant_key, units, now);
          if (!l.ok() || !r.ok()) {
            errors.fetch_add(1);
            problem(where + ": charge " + r.status().ToString());
          } else if (*l != *r) {
            mismatches.fetch_add(1);
            problem(where + ": charges differ");
          }
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  for (int t = 0; t < kThreads; ++t) {
    INFO("thread " << t << ": " << first_problem[t]);
    CHECK(first_problem[t].empty());
  }
  CHECK(errors.load() == 0);
  CHECK(mismatches.load() == 0);
  CHECK(denials.load() > 100);  // the budgets bound
  const auto stats = redis.coalesce_stats();
  std::printf("gateway coalescing differential: %llu script calls in %llu round trips\n",
              static_cast<unsigned long long>(stats.decisions),
              static_cast<unsigned long long>(stats.round_trips));
  CHECK(stats.decisions >= std::uint64_t{kThreads} * kOps);
  CHECK(stats.round_trips < stats.decisions);  // calls that waited went together
}

TEST_CASE("coalesced gateway: threads on one budget admit exactly it") {
  // Rate 0: a one-off budget, so the count admitted does not depend on timing.
  GatewayStore store(coalescing("gw-coalesce-budget", 32, 2, TimeSource::kServer));
  RuleRegistry registry(quota::testing::build(
      quota::testing::levels_spec(1, TokenBucket{.rate = {.units = 0, .per = 1s}, .burst = 200})));
  Gateway gw(store, registry);
  std::atomic<int> admitted{0}, errors{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 60; ++i) {
        auto r = gw.decide({.who = {.tenant = "hot", .plan = "free", .user = ""}, .route = "read"},
                           Nanos{0});
        if (!r.ok()) {
          errors.fetch_add(1);
        } else if (r->decision.allowed) {
          admitted.fetch_add(1);
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  CHECK(errors.load() == 0);
  CHECK(admitted.load() == 200);
  const auto stats = store.coalesce_stats();
  INFO("round trips " << stats.round_trips << ", script calls " << stats.decisions);
  CHECK(stats.decisions == 480);
  CHECK(stats.round_trips < stats.decisions);
}

TEST_CASE("coalesced gateway: a corrupt key or a flushed script cache, per call") {
  // The first call is held in flight by CLIENT PAUSE WRITE (scripts wait, CLIENT UNPAUSE
  // does not); the others then wait in the store and go together in one pipelined write.
  const RulePolicy ten = TokenBucket{.rate = {.units = 1, .per = 1h}, .burst = 10};
  const bool flush = GENERATE(false, true);
  INFO((flush ? "script cache flushed" : "a corrupt key"));
  GatewayStore store(
      coalescing(flush ? "gw-coalesce-flush" : "gw-coalesce-corrupt", 16, 1, TimeSource::kServer));
  const std::vector<std::string> keys = {"{t0}a", "{t1}a", "{t2}a", "{bad}x", "{t3}a", "{t4}a"};
  auto admin = quota::testing::redis_pool(1);
  auto lease = admin->acquire();
  REQUIRE(lease.ok());
  auto bad = store.redis_key("{bad}x");
  REQUIRE(bad.ok());
  if (flush) {
    // Every script known to the store, then forgotten by the server: each call of the
    // write gets NOSCRIPT and is sent again with EVAL, all in one further write.
    const LevelCheck warm[] = {{.policy = &ten, .key = "{warm}a", .shadow = false}};
    REQUIRE(store.decide(with_cost(warm, 1), 1, Nanos{0}).ok());
    REQUIRE((*lease)->command({"SCRIPT", "FLUSH"}).ok());
  } else {
    REQUIRE((*lease)->command({"SET", *bad, "17"}).ok());
  }
  REQUIRE((*lease)->command({"CLIENT", "PAUSE", "1500", "WRITE"}).ok());
  std::vector<absl::StatusOr<quota::gateway::LevelsResult>> got(keys.size(),
                                                                absl::UnknownError("not run"));
  auto call = [&](std::size_t i) {
    const LevelCheck level[] = {{.policy = &ten, .key = keys[i], .shadow = false}};
    got[i] = store.decide(with_cost(level, static_cast<std::int64_t>(i) + 1), 1, Nanos{0});
  };
  const auto before = store.coalesce_stats().round_trips;
  std::vector<std::thread> threads;
  threads.emplace_back([&] { call(0); });
  while (store.coalesce_stats().round_trips == before) std::this_thread::yield();
  for (std::size_t i = 1; i < keys.size(); ++i) threads.emplace_back([&, i] { call(i); });
  const bool all_waited = quota::testing::wait_for_waiting(store, keys.size() - 1);
  REQUIRE((*lease)->command({"CLIENT", "UNPAUSE"}).ok());
  for (auto& th : threads) th.join();
  REQUIRE(all_waited);  // (else the pause ended before they all waited)

  const auto stats = store.coalesce_stats();
  INFO("round trips " << stats.round_trips << ", calls " << stats.decisions);
  CHECK(stats.round_trips - before == 2);  // the first alone, then the five together
  for (std::size_t i = 0; i < keys.size(); ++i) {
    INFO(keys[i] << ": " << got[i].status());
    if (keys[i] == "{bad}x" && !flush) {
      REQUIRE_FALSE(got[i].ok());
      CHECK(absl::IsDataLoss(got[i].status()));
      continue;
    }
    REQUIRE(got[i].ok());
    const std::int64_t cost = static_cast<std::int64_t>(i) + 1;
    REQUIRE(got[i]->parts.size() == 1);
    CHECK(got[i]->parts[0].allowed);
    CHECK(got[i]->parts[0].remaining == 10 - cost);
    // Charged exactly once: a charge of 0 reports the debt (none), a decision of cost 11
    // is over the burst and shows what is left.
    const LevelCheck level[] = {{.policy = &ten, .key = keys[i], .shadow = false}};
    auto peek = store.decide(with_cost(level, 11), 1, Nanos{0});
    REQUIRE(peek.ok());
    CHECK(peek->parts[0].remaining == 10 - cost);
  }
}

TEST_CASE("coalesced gateway: bad options fail every call, naming the field") {
  for (auto [coalesce, calls, field] :
       {std::tuple{-1, 2, "coalesce"},
        std::tuple{quota::redis::kGatewayMaxCoalesce + 1, 2, "coalesce"},
        std::tuple{8, 0, "coalesce_calls"}}) {
    GatewayStore store(coalescing("gw-coalesce-opts", coalesce, calls, TimeSource::kServer));
    const RulePolicy ten = TokenBucket{.rate = {.units = 1, .per = 1h}, .burst = 10};
    const LevelCheck level[] = {{.policy = &ten, .key = "{acme}a", .shadow = false}};
    auto r = store.decide(with_cost(level, 1), 1, Nanos{0});
    INFO(r.status());
    CHECK(r.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK(r.status().message().find(std::string(field) + "=") != std::string::npos);
    CHECK(store.coalesce_stats().round_trips == 0);
  }
}
