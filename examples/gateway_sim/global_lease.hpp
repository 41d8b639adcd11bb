// global_lease.hpp — the global-lease scenario (--scenario global-lease): one global
// budget shared by many tenants, decided by several gateway processes through leases
// (quota/gateway/leases/leased_backend.hpp) and, on the same requests, without.
//
// The model (numbers in GlobalLeaseConfig, printed by the run):
//   - the authority is one in-process store (a StoreBackend over a LocalStore) holding
//     the global budget, an exact token bucket every tenant shares; a wrapper counts its
//     calls (authority round trips), and a wrapper of the GrantLedger counts the grants'
//     records (over Redis a record is one more call; the revocation check before a
//     grant, a third there, is not modelled: the simulated ledger has no revocations);
//   - G gateway processes, each a quota::gateway::Gateway with its own incarnation,
//     registry and rules, over a region::ScopeRouter (quota/region/scope_router.hpp): the
//     tenants' own limits in that process's own store, the global level at the authority;
//     tenants are routed to one gateway each (by a seeded hash), as a load balancer
//     sticky by tenant does, so each tenant's limit is exact and the only budget at the
//     authority is the shared one;
//   - 10,000 tenants with Zipf-distributed rates send requests of 1 unit (Poisson
//     arrivals), together 0.6×, then 1.5×, then 0.9× the global rate, a third of the run
//     each: below the budget, saturating it, and near it;
//   - leases: the global rule has `lease: on` (units, low water, expiry below); no-leases:
//     the same rules without, so every decision is one call to the authority;
//   - non-blocking: leases in the non-blocking mode (LeasedBackendOptions::renewals): a
//     grant request is answered `renewal_latency` of simulated time after it is posted
//     (SimulatedRenewals), and a request finding too little held meanwhile is denied at
//     once. Leases above decide with a round trip of no simulated time, so the extra
//     false denials of non-blocking are the price of never waiting.
// Everything is single-threaded on simulated time and seeded: the same seed gives the same
// output.
//
// What is checked (global_lease_report.hpp prints it):
//   - the global envelope on every admitted request, over every interval, with the
//     envelope verifier (quota/verify/envelope.hpp): r·T + B without leases, r·T + B +
//     Σ outstanding grants with leases, Σ the most units the holders held at once
//     (LeasedBackend::holdings, summed right after each grant arrives: the sum only grows
//     then), which must be at most H·(units + low_water) for H holders. (Units admitted
//     in an interval come from grants held at its start or taken within it, and the
//     authority grants at most r·T + B within it.)
//   - a denial is FALSE when the global rule denied while a reference bucket with the
//     global contract, charged with every admission, had room for it: the budget could
//     have served it (leases strand units in grants other gateways hold);
//   - authority round trips per decision: calls to the authority plus grant records.
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "quota/gateway/gateway.hpp"
#include "quota/gateway/leases/leased_backend.hpp"
#include "quota/region/scope_router.hpp"
#include "quota/store/local_store.hpp"
#include "quota/verify/envelope.hpp"
#include "traffic.hpp"

namespace gateway_sim::global_lease {

using namespace std::chrono_literals;
namespace gw = quota::gateway;

struct GlobalLeaseConfig {
  std::uint64_t seed = 1;
  std::int64_t seconds = 60;
  int gateways = 8;
  int tenants = 10'000;
  double zipf = 1.0;  // tenant i's rate is proportional to 1 / (i + 1)^zipf
  // The global budget, and each tenant's own limit (never reached by these loads).
  quota::TokenBucket global{.rate = {.units = 10'000, .per = 1s}, .burst = 2'000};
  quota::TokenBucket tenant{.rate = {.units = 5'000, .per = 1s}, .burst = 5'000};
  gw::LeaseSpec lease{.mode = gw::LeaseMode::kOn, .units = 1'000, .expiry = 1s, .low_water = 200};
  // The offered load, a multiple of the global rate, in each third of the run.
  double load[3] = {0.6, 1.5, 0.9};
  // non-blocking: from a grant request posted to its answer.
  quota::Nanos renewal_latency = 1ms;

  // The most the grants can hold: H·(units + low_water).
  std::int64_t grants_bound() const { return gateways * (lease.units + lease.low_water); }
};

struct GlobalRequest {
  std::int64_t time_ns;
  std::uint32_t tenant;
  std::uint32_t gateway;
};

// The seeded request stream, in time order.
inline std::vector<GlobalRequest> generate_global(const GlobalLeaseConfig& c) {
  std::vector<double> cumulative(static_cast<std::size_t>(c.tenants));
  double sum = 0;
  for (int i = 0; i < c.tenants; ++i) {
    sum += 1.0 / std::pow(i + 1.0, c.zipf);
    cumulative[static_cast<std::size_t>(i)] = sum;
  }
  std::vector<std::uint32_t> gateway_of(static_cast<std::size_t>(c.tenants));
  for (int i = 0; i < c.tenants; ++i) {
    SplitMix64 h(c.seed * 0x9e3779b97f4a7c15ULL + static_cast<std::uint64_t>(i));
    gateway_of[static_cast<std::size_t>(i)] = static_cast<std::uint32_t>(h.below(c.gateways));
  }
  SplitMix64 rng(c.seed * 0x2545f4914f6cdd1dULL + 22);
  const double rate_per_ns =
      static_cast<double>(c.global.rate.units) / static_cast<double>(c.global.rate.per.count());
  const std::int64_t end_ns = c.seconds * 1'000'000'000;
  std::vector<GlobalRequest> out;
  double t = 0;
  for (int phase = 0; phase < 3; ++phase) {
    const double phase_end = static_cast<double>(end_ns) * (phase + 1) / 3;
    const double per_ns = rate_per_ns * c.load[phase];
    if (per_ns <= 0) {
      t = phase_end;
      continue;
    }
    while (true) {
      t += -std::log1p(-rng.uniform()) / per_ns;
      if (t >= phase_end) {
        t = phase_end;  // memoryless: the next phase starts afresh
        break;
      }
      const double pick = rng.uniform() * sum;
      const auto it = std::upper_bound(cumulative.begin(), cumulative.end(), pick);
      const auto tenant = static_cast<std::uint32_t>(
          std::min<std::ptrdiff_t>(it - cumulative.begin(), c.tenants - 1));
      out.push_back({static_cast<std::int64_t>(t), tenant, gateway_of[tenant]});
    }
  }
  return out;
}

// The authority's backend, counting its calls (round trips over a network).
template <class Inner>
class CountingBackend final : public gw::Backend {
 public:
  explicit CountingBackend(Inner& inner) : inner_(inner) {}
  absl::StatusOr<gw::LevelsResult> decide(std::span<const gw::LevelCheck> levels,
                                          std::uint64_t version, quota::Nanos now) override {
    ++calls;
    return inner_.decide(levels, version, now);
  }
  absl::StatusOr<quota::MicroUnits> refund(const gw::RulePolicy& policy, std::uint64_t version,
                                           gw::LevelKey key, std::int64_t units,
                                           quota::Nanos spent_at, quota::Nanos now) override {
    ++calls;
    return inner_.refund(policy, version, key, units, spent_at, now);
  }
  absl::StatusOr<quota::MicroUnits> charge(const gw::RulePolicy& policy, std::uint64_t version,
                                           gw::LevelKey key, std::int64_t units,
                                           quota::Nanos now) override {
    ++calls;
    return inner_.charge(policy, version, key, units, now);
  }
  std::int64_t calls = 0;

 private:
  Inner& inner_;
};

// The grant ledger, counting records (over Redis each is a call) and the largest Σ of the
// grants it lists as outstanding (whole grants, spent or not), taken after each record.
class CountingLedger {
 public:
  absl::Status record(const quota::GrantRecord& g) {
    ++records;
    auto s = ledger_.record(g);
    std::int64_t sum = 0;
    for (const auto& o : ledger_.outstanding(g.granted_at)) sum += o.units;
    max_outstanding = std::max(max_outstanding, sum);
    return s;
  }
  std::optional<quota::GrantRecord> replay(std::string_view id) { return ledger_.replay(id); }

  std::int64_t records = 0, max_outstanding = 0;

 private:
  quota::GrantLedger ledger_;
};

enum class Outcome : std::uint8_t { kAdmitted, kDeniedGlobal, kDeniedTenant };

// The renewal thread of a non-blocking holder on simulated time: a task posted at t (the
// time of the last run_until) runs at t + latency, in the order posted.
class SimulatedRenewals final : public quota::detail::Renewals {
 public:
  explicit SimulatedRenewals(quota::Nanos latency) : latency_(latency) {}
  bool post(Task task) override {
    queue_.push_back({now_ + latency_, std::move(task.run)});
    return true;
  }
  // Runs the tasks due by `now`; later posts are due from `now`.
  void run_until(quota::Nanos now) {
    now_ = now;
    while (!queue_.empty() && queue_.front().first <= now) {
      auto run = std::move(queue_.front().second);
      queue_.pop_front();
      run();
    }
  }

 private:
  quota::Nanos latency_;
  quota::Nanos now_{0};
  std::deque<std::pair<quota::Nanos, std::function<void()>>> queue_;
};

enum class Strategy : std::uint8_t { kNoLeases, kLeases, kNonBlocking };

struct GlobalLeaseRun {
  std::string name;
  bool leased = false;
  std::vector<Outcome> outcome{};  // per request, in the stream's order
  std::string error{};             // a failed call: the run stops there
  std::int64_t authority_calls = 0, grant_requests = 0, grant_records = 0;
  // The most units the holders held at once (unspent, unexpired: the Σ of the envelope;
  // it only grows when a grant arrives, so it is sampled right after each), and the most
  // the ledger listed as granted and not expired (whole grants, spent or not).
  std::int64_t max_held = 0, max_listed = 0;
  std::vector<std::pair<double, double>> held_curve{};  // (s, Σ held) after each grant
};

inline gw::RuleSetSpec global_lease_rules(const GlobalLeaseConfig& c, bool leased) {
  gw::RuleSetSpec s;
  s.routes = {{.name = "read", .cost = 1}};
  s.rules.push_back({.level = gw::Level::kTenant,
                     .plan = "free",
                     .route = "read",
                     .name = "tenant",
                     .policy = c.tenant});
  s.rules.push_back({.level = gw::Level::kGlobal,
                     .route = "read",
                     .name = "global",
                     .policy = c.global,
                     .lease = leased ? c.lease : gw::LeaseSpec{}});
  return s;
}

// Replays the stream through G gateway processes over one authority.
inline GlobalLeaseRun run_global_lease(const GlobalLeaseConfig& c,
                                       const std::vector<GlobalRequest>& reqs, Strategy strategy) {
  const bool leased = strategy != Strategy::kNoLeases;
  using Store = quota::LocalStore<gw::KeyPolicy>;
  using Authority = CountingBackend<gw::StoreBackend<Store>>;
  using Split = quota::region::ScopeRouter<gw::StoreBackend<Store>, Authority>;
  using Leased = gw::LeasedBackend<Split, CountingLedger>;
  GlobalLeaseRun out;
  out.name = strategy == Strategy::kNoLeases ? "no-leases"
             : strategy == Strategy::kLeases ? "leases"
                                             : "non-blocking";
  out.leased = leased;
  auto rules = gw::RuleSet::create(global_lease_rules(c, leased));
  if (!rules.ok()) {
    out.error = std::string(rules.status().message());
    return out;
  }
  Store authority_store;
  gw::StoreBackend<Store> authority_backend(authority_store);
  Authority authority(authority_backend);
  CountingLedger ledger;
  // leases: LeasedBackend over ScopeRouter(tenants, authority), the tenants' levels passing
  // through. non-blocking: ScopeRouter(tenants, LeasedBackend over the authority), so that
  // only the global level is the leased backend's (which never lets a deciding thread
  // reach the authority: every level it is given must be leased).
  using Central = gw::LeasedBackend<Authority, CountingLedger>;
  using CentralSplit = quota::region::ScopeRouter<gw::StoreBackend<Store>, Central>;
  struct Process {
    Process(Authority& a, CountingLedger& l, std::shared_ptr<const gw::RuleSet> r,
            Strategy strategy, std::uint64_t incarnation, quota::Nanos latency)
        : local(tenants),
          split(local, a),
          backend(split, l, {.incarnation = incarnation}),
          renewals(latency),
          central(a, l, {.incarnation = incarnation, .renewals = &renewals}),
          central_split(local, central),
          registry(std::move(r)) {
      if (strategy == Strategy::kLeases) {
        grant_requests = [this] { return backend.grant_requests(); };
        holdings = [this](quota::Nanos now) { return backend.holdings(now); };
      } else {
        grant_requests = [this] { return central.grant_requests(); };
        holdings = [this](quota::Nanos now) { return central.holdings(now); };
      }
      gw::Backend& decider = strategy == Strategy::kNoLeases ? static_cast<gw::Backend&>(split)
                             : strategy == Strategy::kLeases ? static_cast<gw::Backend&>(backend)
                                                             : central_split;
      gateway = std::make_unique<gw::Gateway>(decider, registry);
    }
    absl::StatusOr<gw::Result> decide(const gw::Request& r, quota::Nanos now) {
      return gateway->decide(r, now);
    }
    Store tenants;
    gw::StoreBackend<Store> local;
    Split split;
    Leased backend;
    SimulatedRenewals renewals;  // non-blocking's
    Central central;
    CentralSplit central_split;
    gw::RuleRegistry registry;
    // The leased backend of the strategy: its grant requests and what it holds.
    std::function<std::int64_t()> grant_requests;
    std::function<std::vector<gw::Holding>(quota::Nanos)> holdings;
    std::unique_ptr<gw::Gateway> gateway;
  };
  std::vector<std::unique_ptr<Process>> processes;
  for (int g = 0; g < c.gateways; ++g) {
    processes.push_back(std::make_unique<Process>(
        authority, ledger, *rules, strategy, static_cast<std::uint64_t>(g) + 1, c.renewal_latency));
  }
  std::vector<std::int64_t> grants_seen(processes.size(), 0);
  std::vector<std::string> names;
  for (int i = 0; i < c.tenants; ++i) names.push_back(absl::StrCat("t", i));
  out.outcome.reserve(reqs.size());
  // After a grant arrives anywhere: Σ held by every holder (it only grows then).
  const auto sample_held = [&](quota::Nanos now) {
    bool granted = false;
    for (std::size_t g = 0; g < processes.size(); ++g) {
      const std::int64_t asked = processes[g]->grant_requests();
      granted = granted || asked != grants_seen[g];
      grants_seen[g] = asked;
    }
    if (!granted) return;
    std::int64_t held = 0;
    for (auto& p : processes) {
      for (const gw::Holding& h : p->holdings(now)) held += h.units;
    }
    out.max_held = std::max(out.max_held, held);
    out.held_curve.emplace_back(static_cast<double>(now.count()) / 1e9, static_cast<double>(held));
  };
  for (const GlobalRequest& r : reqs) {
    const quota::Nanos now{r.time_ns};
    if (strategy == Strategy::kNonBlocking) {
      for (auto& p : processes) p->renewals.run_until(now);
      sample_held(now);
    }
    auto d = processes[r.gateway]->decide(
        {.who = {.tenant = names[r.tenant], .plan = "free"}, .route = "read"}, now);
    if (!d.ok()) {
      out.error = std::string(d.status().message());
      return out;
    }
    if (leased) sample_held(now);
    out.outcome.push_back(d->decision.allowed   ? Outcome::kAdmitted
                          : d->rule == "global" ? Outcome::kDeniedGlobal
                                                : Outcome::kDeniedTenant);
  }
  out.authority_calls = authority.calls;
  out.grant_records = ledger.records;
  out.max_listed = ledger.max_outstanding;
  for (auto& p : processes) out.grant_requests += p->grant_requests();
  return out;
}

struct GlobalLeaseAnalysis {
  std::int64_t decisions = 0, admitted = 0, denied_global = 0, denied_tenant = 0, false_denials = 0,
               round_trips = 0;
  quota::verify::TokenBucketReport envelope;  // r·T + B + Σ outstanding (0 without leases)
  quota::verify::TokenBucketReport plain;     // r·T + B
  std::vector<std::pair<double, double>> admitted_curve;  // (s, cumulative units)
  // (s, the largest A[i..j] − r·(t_j − t_i) over intervals ending in each 100 ms): the
  // verifier's peak as it runs, for the chart (doubles; the verdict is the verifier's).
  std::vector<std::pair<double, double>> peak_curve;

  double round_trips_per_decision() const {
    return decisions == 0 ? 0.0 : static_cast<double>(round_trips) / static_cast<double>(decisions);
  }
};

inline absl::StatusOr<GlobalLeaseAnalysis> analyze_global_lease(
    const GlobalLeaseConfig& c, const std::vector<GlobalRequest>& reqs, const GlobalLeaseRun& run) {
  GlobalLeaseAnalysis a;
  const quota::TokenBucket& policy = c.global;
  quota::TokenBucket::State ref = policy.init(quota::Nanos{0});
  std::vector<quota::verify::AdmittedEvent> log;
  log.reserve(run.outcome.size());
  a.admitted_curve.emplace_back(0.0, 0.0);
  std::int64_t next_sample_ns = 100'000'000;
  const double rate_per_ns =
      static_cast<double>(policy.rate.units) / static_cast<double>(policy.rate.per.count());
  double peak = 0, peak_in_sample = 0;  // ending at the last admission, and in this 100 ms
  std::int64_t last_admitted_ns = 0;
  for (std::size_t i = 0; i < run.outcome.size(); ++i) {
    const GlobalRequest& r = reqs[i];
    while (r.time_ns >= next_sample_ns) {
      a.admitted_curve.emplace_back(static_cast<double>(next_sample_ns) / 1e9,
                                    static_cast<double>(a.admitted));
      a.peak_curve.emplace_back(static_cast<double>(next_sample_ns) / 1e9, peak_in_sample);
      peak_in_sample = 0;
      next_sample_ns += 100'000'000;
    }
    policy.refill(ref, r.time_ns);
    ++a.decisions;
    switch (run.outcome[i]) {
      case Outcome::kAdmitted:
        ++a.admitted;
        ref.tokens -= quota::to_micro(1);
        log.push_back({.time_ns = r.time_ns, .cost = 1});
        peak =
            std::max(0.0, peak - rate_per_ns * static_cast<double>(r.time_ns - last_admitted_ns)) +
            1;
        last_admitted_ns = r.time_ns;
        peak_in_sample = std::max(peak_in_sample, peak);
        break;
      case Outcome::kDeniedGlobal:
        ++a.denied_global;
        if (ref.tokens >= quota::to_micro(1)) ++a.false_denials;
        break;
      case Outcome::kDeniedTenant:
        ++a.denied_tenant;
        break;
    }
  }
  a.admitted_curve.emplace_back(static_cast<double>(c.seconds), static_cast<double>(a.admitted));
  a.round_trips = run.authority_calls + run.grant_records;
  auto envelope = quota::verify::verify_token_bucket(log, policy.rate, policy.burst,
                                                     run.leased ? run.max_held : 0);
  if (!envelope.ok()) return envelope.status();
  auto plain = quota::verify::verify_token_bucket(log, policy.rate, policy.burst, 0);
  if (!plain.ok()) return plain.status();
  a.envelope = *std::move(envelope);
  a.plain = *std::move(plain);
  return a;
}

}  // namespace gateway_sim::global_lease
