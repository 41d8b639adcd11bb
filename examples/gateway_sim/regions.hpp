// regions.hpp — the regions scenario: three regions share one global budget, one of them
// cut off from the central authority for a while.
//
// Each region ("eu", "us", "ap") runs several gateways (`gateways_per_region`, each
// request to one of them in turn) that serve its tenants from the region's own in-process
// authority (a ShardedStore: their tenant budgets) and reach the central authority
// (another store: the global budget) through the region's path, which the scenario cuts
// (quota/testing/fault_backend.hpp: every call fails as unavailable). Two ways to decide
// the global level, on the same seeded request stream:
//
//   regional-leases  quota::region::BasicRegionalPool in every gateway, over the region's ONE
//                    pool record (regions_pool.hpp: PoolModel, which the pool's Lua is
//                    proven equal to): the region holds regional grants of the global
//                    budget, refilled at the low-water mark by the gateway that takes the
//                    pool's lock; one cross-region round trip per grant. Promises r·T + B
//                    + Σ regional grants (3 × (units + low_water)). Cut off, a region
//                    spends what its pool holds, then answers kUnavailable (the route
//                    fails closed). A refill takes no simulated time (refill_wait 0).
//   central          quota::region::ScopeRouter alone: every global decision at the
//                    central authority, a cross-region round trip per request. Promises
//                    r·T + B. Cut off, a region answers kUnavailable at once.
//
// Time is simulated (1 ms steps, one thread): the same stream gives the same table on
// every run. A FALSE denial is a request denied (by any level, or unavailable) while an
// exact reference bucket of the global contract, charged with every region's admissions
// up to that millisecond, had room for it.
#pragma once

#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "quota/gateway/gateway.hpp"
#include "quota/gateway/rules/rule_registry.hpp"
#include "quota/policy/token_bucket.hpp"
#include "quota/region/basic_regional_pool.hpp"
#include "quota/region/scope_router.hpp"
#include "quota/store/sharded_store.hpp"
#include "quota/testing/fault_backend.hpp"
#include "quota/verify/envelope.hpp"
#include "regions_pool.hpp"

namespace gateway_sim::regions {

using namespace std::chrono_literals;

struct RegionsConfig {
  std::uint64_t seed = 1;
  std::int64_t seconds = 60;
  std::vector<std::string> names = {"eu", "us", "ap"};
  std::vector<std::int64_t> offered_per_s = {2400, 2400, 1800};  // 110 % of the budget
  int tenants_per_region = 30;
  int gateways_per_region = 3;
  std::int64_t global_rate = 6000, global_burst = 1200;  // units per second, units
  std::int64_t tenant_rate = 1000, tenant_burst = 200;   // never the limit here
  quota::gateway::LeaseSpec lease{.mode = quota::gateway::LeaseMode::kOn,
                                  .units = 200,
                                  .expiry = std::chrono::seconds(1),
                                  .low_water = 50};
  std::size_t cut_region = 2;  // "ap", cut off during [seconds / 3, 2 · seconds / 3)

  quota::TokenBucket global() const {
    return {.rate = {.units = global_rate, .per = 1s}, .burst = global_burst};
  }
  quota::Nanos cut_from() const { return quota::Nanos{seconds * 1'000'000'000 / 3}; }
  quota::Nanos cut_until() const { return quota::Nanos{seconds * 2'000'000'000 / 3}; }
  std::int64_t promised_extra() const {
    return static_cast<std::int64_t>(names.size()) * lease.max_held();
  }
};

enum class RegionsStrategy { kRegionalLeases, kCentral };

struct RegionStats {
  std::int64_t offered = 0, admitted = 0, denied = 0, unavailable = 0, false_denied = 0;
  std::int64_t admitted_while_cut = 0, unavailable_while_cut = 0;
  std::int64_t admitted_after_unavailable = 0;          // while cut, after its first kUnavailable
  std::int64_t held_at_cut = 0;                         // regional grants held when cut off
  std::vector<std::pair<double, double>> per_second{};  // (s, admitted in that second)
};

struct RegionsRun {
  std::string name;
  std::vector<RegionStats> regions{};
  std::vector<quota::verify::AdmittedEvent> global_log{};  // every region's admissions
  std::vector<std::pair<double, double>> cumulative{};     // (s, admitted since 0), all regions
  std::int64_t decisions = 0;
  std::int64_t round_trips = 0;  // calls to the central authority, refused ones included
  std::int64_t errors = 0;       // decisions that failed (none expected)
  std::int64_t promised_extra = 0;
  quota::verify::TokenBucketReport report{};
};

namespace detail {

using Store = quota::ShardedStore<quota::gateway::KeyPolicy>;
using Local = quota::gateway::StoreBackend<Store>;
using Path = quota::testing::FaultBackend<Local>;

using Pool = quota::region::BasicRegionalPool<quota::GrantLedger, PoolRecord, Path>;
using PoolBackend = quota::region::ScopeRouter<Local, Pool>;
using CentralBackend = quota::region::ScopeRouter<Local, Path>;

// One gateway of a region: with regional leases its own BasicRegionalPool over the region's
// record; with the central strategy every global level through the region's path.
template <class Backend>
struct Node {
  std::unique_ptr<Pool> pool;
  Backend backend;
  quota::gateway::RuleRegistry registry;
  quota::gateway::Gateway gateway{backend, registry};

  Node(std::unique_ptr<Pool> p, Local& local, std::shared_ptr<const quota::gateway::RuleSet> rules)
      : pool(std::move(p)), backend(local, *pool), registry(std::move(rules)) {}
  Node(Path& path, Local& local, std::shared_ptr<const quota::gateway::RuleSet> rules)
      : backend(local, path), registry(std::move(rules)) {}
};

// What one region is made of, for either strategy.
template <class Backend>
struct Region {
  Store store;
  Local local{store};
  Path path;
  PoolRecord record;  // regional leases: the region's pool, shared by its gateways
  std::vector<std::unique_ptr<Node<Backend>>> gateways;

  explicit Region(Local& central) : path(central) {}

  std::int64_t held() {
    if constexpr (std::is_same_v<Backend, PoolBackend>) {
      auto r = record.read("{~global}read");
      return r.ok() ? r->total : 0;
    } else {
      return 0;
    }
  }
};

inline std::shared_ptr<const quota::gateway::RuleSet> rules(const RegionsConfig& c) {
  quota::gateway::RuleSetSpec s;
  s.version = 1;
  s.routes = {{.name = "read", .cost = 1}};
  const auto add = [&](quota::gateway::Level level, const char* name, std::int64_t rate,
                       std::int64_t burst) {
    s.rules.push_back(
        {.level = level,
         .tenant = "",
         .plan = level == quota::gateway::Level::kGlobal ? "" : "free",
         .route = "read",
         .name = name,
         .policy = quota::TokenBucket{.rate = {.units = rate, .per = 1s}, .burst = burst},
         .shadow = false});
  };
  add(quota::gateway::Level::kTenant, "tenant", c.tenant_rate, c.tenant_burst);
  add(quota::gateway::Level::kGlobal, "global", c.global_rate, c.global_burst);
  auto set = quota::gateway::RuleSet::create(std::move(s));
  return set.ok() ? *set : nullptr;
}

// `node(region, i)`: the region's i-th gateway.
template <class Backend, class MakeNode>
RegionsRun run(const RegionsConfig& c, std::string name, MakeNode node) {
  RegionsRun out;
  out.name = std::move(name);
  out.regions.resize(c.names.size());
  auto set = rules(c);
  if (set == nullptr) {
    ++out.errors;
    return out;
  }
  Store central_store;
  Local central(central_store);
  std::vector<std::unique_ptr<Region<Backend>>> regions;
  for (std::size_t i = 0; i < c.names.size(); ++i) {
    regions.push_back(std::make_unique<Region<Backend>>(central));
    for (int g = 0; g < c.gateways_per_region; ++g) {
      regions.back()->gateways.push_back(node(*regions.back(), i, set));
    }
  }
  std::mt19937_64 rng(c.seed);
  std::vector<std::poisson_distribution<int>> arrivals;
  for (std::int64_t per_s : c.offered_per_s) {
    arrivals.emplace_back(static_cast<double>(per_s) / 1000);
  }
  const quota::TokenBucket g = c.global();
  auto reference = g.init(quota::Nanos{0});
  std::vector<bool> unavailable_seen(c.names.size(), false);
  std::vector<std::int64_t> this_second(c.names.size(), 0);
  std::int64_t total = 0;
  struct Denial {
    std::size_t region;
  };
  const quota::Nanos end{c.seconds * 1'000'000'000};
  for (quota::Nanos t{0}; t < end; t += 1ms) {
    if (t == c.cut_from()) {
      regions[c.cut_region]->record.set_now(t);
      out.regions[c.cut_region].held_at_cut = regions[c.cut_region]->held();
      regions[c.cut_region]->path.fail(
          absl::UnavailableError("cut off from the central authority"));
    }
    if (t == c.cut_until()) regions[c.cut_region]->path.heal();
    const bool cut = t >= c.cut_from() && t < c.cut_until();
    std::vector<Denial> denials;  // judged after this millisecond's admissions
    for (std::size_t i = 0; i < regions.size(); ++i) {
      RegionStats& rs = out.regions[i];
      regions[i]->record.set_now(t);
      const int n = arrivals[i](rng);
      for (int k = 0; k < n; ++k) {
        const std::string tenant = "t" + std::to_string(rng() % c.tenants_per_region);
        auto& gateways = regions[i]->gateways;
        auto r = gateways[static_cast<std::size_t>(rs.offered) % gateways.size()]->gateway.decide(
            {.who = {.tenant = tenant, .plan = "free"}, .route = "read"}, t);
        ++out.decisions;
        ++rs.offered;
        if (!r.ok()) {
          ++out.errors;
          continue;
        }
        const quota::Decision& d = r->decision;
        const bool in_cut = cut && i == c.cut_region;
        if (d.allowed) {
          ++rs.admitted;
          ++this_second[i];
          ++total;
          out.global_log.push_back({t.count(), 1});
          reference.tokens -= quota::to_micro(1);
          if (in_cut) {
            ++rs.admitted_while_cut;
            if (unavailable_seen[i]) ++rs.admitted_after_unavailable;
          }
          continue;
        }
        denials.push_back({i});
        if (d.reason == quota::Reason::kUnavailable) {
          ++rs.unavailable;
          if (in_cut) {
            ++rs.unavailable_while_cut;
            unavailable_seen[i] = true;
          }
        } else {
          ++rs.denied;
        }
      }
    }
    for (const Denial& d : denials) {
      if (reference.tokens >= quota::to_micro(1)) ++out.regions[d.region].false_denied;
    }
    g.refill(reference, (t + 1ms).count());
    if ((t + 1ms).count() % 1'000'000'000 == 0) {
      const double s = static_cast<double>((t + 1ms).count()) / 1e9;
      for (std::size_t i = 0; i < regions.size(); ++i) {
        out.regions[i].per_second.emplace_back(s, static_cast<double>(this_second[i]));
        this_second[i] = 0;
      }
      out.cumulative.emplace_back(s, static_cast<double>(total));
    }
  }
  for (const auto& r : regions) out.round_trips += r->path.calls();
  return out;
}

}  // namespace detail

inline RegionsRun run_regions(const RegionsConfig& c, RegionsStrategy strategy) {
  RegionsRun out;
  if (strategy == RegionsStrategy::kRegionalLeases) {
    quota::GrantLedger ledger;  // the central record of the regional grants
    out = detail::run<detail::PoolBackend>(
        c, "regional-leases", [&](detail::Region<detail::PoolBackend>& r, std::size_t i, auto set) {
          const quota::region::PoolOptions options{.region = 0x10 + i,
                                                   .units = c.lease.units,
                                                   .expiry = c.lease.expiry,
                                                   .low_water = c.lease.low_water,
                                                   .refill_wait = quota::Nanos{0}};
          return std::make_unique<detail::Node<detail::PoolBackend>>(
              std::make_unique<detail::Pool>(r.record, r.path, ledger, options), r.local,
              std::move(set));
        });
    out.promised_extra = c.promised_extra();
  } else {
    out = detail::run<detail::CentralBackend>(
        c, "central", [](detail::Region<detail::CentralBackend>& r, std::size_t, auto set) {
          return std::make_unique<detail::Node<detail::CentralBackend>>(r.path, r.local,
                                                                        std::move(set));
        });
    out.promised_extra = 0;
  }
  auto report = quota::verify::verify_token_bucket(out.global_log, c.global().rate,
                                                   c.global().burst, out.promised_extra);
  if (report.ok()) {
    out.report = *report;
  } else {
    ++out.errors;  // reported as a failed run, never as a verdict
  }
  return out;
}

}  // namespace gateway_sim::regions
