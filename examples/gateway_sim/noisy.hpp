// noisy.hpp — the noisy-neighbour scenario (--scenario noisy-neighbour): the motivating
// LLM case of issue 22, one global budget of an upstream provider's tokens per minute
// shared by one noisy tenant and many small ones, decided with and without fair share.
//
// The model (numbers in NoisyConfig, printed by the run):
//   - the global budget is one exact quota::TokenBucket (4,000,000 tokens per minute, burst
//     B) in an in-process quota::LocalStore; a request costs its tokens, all or nothing;
//   - the noisy tenant sends 20 requests of 200,000 tokens in 30 s (one every 1.5 s from
//     t = 10 s): double the budget's rate on its own;
//   - 1,000 small tenants keep sending requests of 1,000..3,000 tokens (Poisson arrivals,
//     each tenant at the same mean rate), together a fixed share of the budget's rate;
//   - fcfs: every request draws from the global bucket, first come first served;
//   - fair-share: the requests go through a quota::gateway::Gateway whose global rule has
//     the `fair_share` option (noisy_gateway.hpp): the gateway asks its FairShare
//     allocator (budget: the global budget's tokens per lease period; one lease period
//     stands for one lease expiry: admitted tokens leave its use one period after their
//     admission) for the request's tenant, then the global bucket; tokens the bucket
//     refuses leave at once (nothing was spent). At every period boundary the allocator
//     recomputes the shares from each tenant's decayed asks (no tenant reports a demand).
//     The pause is at 100 % of the budget: the reserve absorbs the small tenants' Poisson
//     peaks (with the default 90 % those peaks are paused whenever the noisy tenant holds
//     its share).
// Everything is single-threaded and seeded: the same seed gives the same output.
//
// What is checked (noisy_report.hpp prints it):
//   - the global envelope: every admitted request against r·T + B over every interval
//     (quota/verify/envelope.hpp), for both strategies;
//   - fair shares per window of 10 s: each tenant's share is the exact weighted max-min
//     allocation (all weights 1) of the window's budget minus the reserve, r·10 s·(1 − 10 %),
//     among the tokens the tenants asked for in the window; a small tenant gets at least
//     its fair share in a window when it is admitted min(asked, share), or, when its share
//     is below what it asked, comes within one of its requests of the share (requests are
//     all or nothing);
//   - a small tenant's denial is FALSE when a reference bucket with the global contract,
//     charged with the small tenants' admissions only, had room for it: the budget would
//     have served it but for what the noisy tenant took.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "noisy_gateway.hpp"
#include "quota/fair/fair_share_config.hpp"
#include "quota/fair/weighted_max_min.hpp"
#include "quota/quota.hpp"
#include "quota/verify/envelope.hpp"
#include "strategies.hpp"
#include "traffic.hpp"

namespace gateway_sim::noisy {

using namespace std::chrono_literals;

struct NoisyConfig {
  std::uint64_t seed = 1;
  std::int64_t seconds = 60;
  // The global budget: 4,000,000 tokens per minute with a burst of 15 s of it.
  std::int64_t budget_per_min = 4'000'000;
  std::int64_t burst = 1'000'000;
  // The noisy tenant: `noisy_requests` of `noisy_tokens` spread evenly over
  // [noisy_start_s, noisy_start_s + noisy_span_s).
  std::int64_t noisy_requests = 20, noisy_tokens = 200'000, noisy_start_s = 10, noisy_span_s = 30;
  // The small tenants: together `small_permille` of the budget's rate, requests of
  // small_min..small_max tokens (uniform).
  int small_tenants = 1000;
  std::int64_t small_permille = 600, small_min = 1000, small_max = 3000;
  // Fair share: the lease period (one lease expiry) and the window of the fairness check.
  std::int64_t lease_s = 10, window_s = 10;
  // Budget set from the lease period. Pause at 100 %: tenants below the water level may
  // use the reserve for their peaks, constrained tenants stop at budget − reserve.
  quota::fair::FairShareConfig fair{.pause_permille = 1000};

  quota::TokenBucket global() const {
    return {.rate = {.units = budget_per_min, .per = 60s}, .burst = burst};
  }
  std::int64_t per_lease() const { return budget_per_min * lease_s / 60; }
  quota::fair::FairShareConfig fair_config() const {
    quota::fair::FairShareConfig c = fair;
    c.budget = per_lease();
    return c;
  }
  // The budget a window of the fairness check divides: r·window minus the reserve.
  std::int64_t window_capacity() const {
    quota::fair::FairShareConfig c = fair;
    c.budget = budget_per_min * window_s / 60;
    return c.share_capacity();
  }
};

struct NoisyRequest {
  std::int64_t time_ns;
  std::uint32_t tenant;  // 0 is the noisy tenant, 1..small_tenants the small ones
  std::int64_t tokens;
};

// The seeded request stream, in time order.
inline std::vector<NoisyRequest> generate_noisy(const NoisyConfig& c) {
  std::vector<NoisyRequest> out;
  const std::int64_t end_ns = c.seconds * 1'000'000'000;
  for (std::int64_t i = 0; i < c.noisy_requests; ++i) {
    const std::int64_t t =
        c.noisy_start_s * 1'000'000'000 + c.noisy_span_s * 1'000'000'000 * i / c.noisy_requests;
    if (t < end_ns) out.push_back({t, 0, c.noisy_tokens});
  }
  // Each small tenant's mean rate in requests per ns: its share of the tokens over the
  // mean request size.
  const double tokens_per_ns = static_cast<double>(c.budget_per_min) / 60e9 *
                               static_cast<double>(c.small_permille) / 1000.0 / c.small_tenants;
  const double req_per_ns = tokens_per_ns / (static_cast<double>(c.small_min + c.small_max) / 2);
  for (int s = 1; s <= c.small_tenants; ++s) {
    SplitMix64 rng(c.seed * 0x9e3779b97f4a7c15ULL + 0x632be59bd9b4e019ULL * s);
    double t = -std::log1p(-rng.uniform()) / req_per_ns;
    while (t < static_cast<double>(end_ns)) {
      const std::int64_t tokens =
          c.small_min + rng.below(static_cast<int>(c.small_max - c.small_min + 1));
      out.push_back({static_cast<std::int64_t>(t), static_cast<std::uint32_t>(s), tokens});
      t += -std::log1p(-rng.uniform()) / req_per_ns;
    }
  }
  std::sort(out.begin(), out.end(), [](const NoisyRequest& a, const NoisyRequest& b) {
    return a.time_ns != b.time_ns ? a.time_ns < b.time_ns : a.tenant < b.tenant;
  });
  return out;
}

// Why a request was refused.
enum class Refusal : std::uint8_t { kNone, kGlobal, kOverShare, kPaused, kOverBudget };

struct NoisyRun {
  std::string name;
  std::vector<Refusal> refusal;  // per request, in the stream's order
  std::string error;             // a failed call: the run stops there
  // fair-share: allocations made, those whose shares summed past budget − reserve, and
  // the largest sum.
  std::int64_t allocations = 0, allocations_over = 0, max_share_sum = 0;
};

inline std::string tenant_name(std::uint32_t t) {
  return t == 0 ? "noisy" : absl::StrCat("small-", t);
}

// How requests meet the global bucket: first come first served, or asked of a FairShare
// first, with the scenario's pause (fair-share) or the default pause of 90 %
// (fair-share-p90).
enum class NoisyStrategy : std::uint8_t { kFcfs, kFairShare, kFairSharePause90 };

inline std::string strategy_name(NoisyStrategy s) {
  return s == NoisyStrategy::kFcfs        ? "fcfs"
         : s == NoisyStrategy::kFairShare ? "fair-share"
                                          : "fair-share-p90";
}

// Replays the stream through the global bucket: first come first served (fcfs), or through
// a Gateway whose global rule has the fair_share option (noisy_gateway.hpp).
inline NoisyRun run_noisy(const NoisyConfig& c, const std::vector<NoisyRequest>& reqs,
                          NoisyStrategy strategy) {
  if (strategy != NoisyStrategy::kFcfs) {
    quota::fair::FairShareConfig fc = c.fair_config();
    if (strategy == NoisyStrategy::kFairSharePause90) {
      fc.pause_permille = quota::fair::FairShareConfig{}.pause_permille;
    }
    return run_noisy_gateway<NoisyRun, NoisyRequest, Refusal>(
        reqs, c.global(), fc, quota::Nanos{c.lease_s * 1'000'000'000}, strategy_name(strategy));
  }
  NoisyRun out{strategy_name(strategy), {}, ""};
  const quota::TokenBucket policy = c.global();
  quota::LocalStore<quota::TokenBucket> store;
  const std::string key = "{global}llm";
  for (const NoisyRequest& r : reqs) {
    auto o = decide_in(store, policy, key, quota::Nanos{r.time_ns}, r.tokens);
    if (!o.ok()) {
      out.error = std::string(o.status().message());
      return out;
    }
    out.refusal.push_back(o->allowed ? Refusal::kNone : Refusal::kGlobal);
  }
  return out;
}

struct NoisyAnalysis {
  std::int64_t noisy_admitted = 0, noisy_requests_admitted = 0, small_admitted = 0, small_asked = 0,
               small_denied = 0, small_false_denied = 0;
  std::int64_t refused_global = 0, refused_over_share = 0, refused_paused = 0;
  int small_active = 0, small_fair_every_window = 0;  // tenants that sent anything
  quota::verify::TokenBucketReport global;
  // Cumulative admitted tokens over time (seconds, tokens): the noisy tenant, the small ones.
  std::vector<std::pair<double, double>> noisy_curve, small_curve;
};

inline NoisyAnalysis analyze_noisy(const NoisyConfig& c, const std::vector<NoisyRequest>& reqs,
                                   const NoisyRun& run) {
  NoisyAnalysis a;
  const quota::TokenBucket policy = c.global();
  quota::verify::TokenBucketVerifier verifier(policy.rate, policy.burst);
  quota::TokenBucket::State ref = policy.init(quota::Nanos{0});
  const std::size_t n = static_cast<std::size_t>(c.small_tenants) + 1;
  const std::int64_t window_ns = c.window_s * 1'000'000'000;
  const std::int64_t windows = (c.seconds * 1'000'000'000 + window_ns - 1) / window_ns;
  // Per window and tenant: asked, admitted, the largest request.
  struct Cell {
    std::int64_t asked = 0, admitted = 0, largest = 0;
  };
  std::vector<std::vector<Cell>> cells(static_cast<std::size_t>(windows), std::vector<Cell>(n));
  std::int64_t cum_noisy = 0, cum_small = 0;
  a.noisy_curve.emplace_back(0.0, 0.0);
  a.small_curve.emplace_back(0.0, 0.0);
  for (std::size_t i = 0; i < run.refusal.size(); ++i) {
    const NoisyRequest& r = reqs[i];
    const bool allowed = run.refusal[i] == Refusal::kNone;
    Cell& cell = cells[static_cast<std::size_t>(r.time_ns / window_ns)][r.tenant];
    cell.asked += r.tokens;
    cell.largest = std::max(cell.largest, r.tokens);
    policy.refill(ref, r.time_ns);
    if (allowed) {
      cell.admitted += r.tokens;
      (void)verifier.add({.time_ns = r.time_ns, .cost = r.tokens});
    }
    if (r.tenant == 0) {
      if (allowed) {
        a.noisy_admitted += r.tokens;
        ++a.noisy_requests_admitted;
        // A step: the tokens arrive at once.
        a.noisy_curve.emplace_back(static_cast<double>(r.time_ns) / 1e9,
                                   static_cast<double>(cum_noisy));
        cum_noisy += r.tokens;
        a.noisy_curve.emplace_back(static_cast<double>(r.time_ns) / 1e9,
                                   static_cast<double>(cum_noisy));
      }
    } else {
      a.small_asked += r.tokens;
      if (allowed) {
        a.small_admitted += r.tokens;
        ref.tokens -= quota::to_micro(r.tokens);
        cum_small += r.tokens;
      } else {
        ++a.small_denied;
        if (ref.tokens >= quota::to_micro(r.tokens)) ++a.small_false_denied;
      }
      if (i % 64 == 0 || i + 1 == run.refusal.size()) {
        a.small_curve.emplace_back(static_cast<double>(r.time_ns) / 1e9,
                                   static_cast<double>(cum_small));
      }
    }
    switch (run.refusal[i]) {
      case Refusal::kGlobal:
        ++a.refused_global;
        break;
      case Refusal::kOverShare:
      case Refusal::kOverBudget:
        ++a.refused_over_share;
        break;
      case Refusal::kPaused:
        ++a.refused_paused;
        break;
      case Refusal::kNone:
        break;
    }
  }
  const double end_s = static_cast<double>(c.seconds);
  a.noisy_curve.emplace_back(end_s, static_cast<double>(cum_noisy));
  a.small_curve.emplace_back(end_s, static_cast<double>(cum_small));
  a.global = verifier.report();

  // Fair shares per window: weighted max-min of the window's capacity among the asks.
  std::vector<bool> active(n, false), fair_always(n, true);
  const std::vector<std::int64_t> weights(n, 1);
  for (const auto& row : cells) {
    std::vector<std::int64_t> demands(n);
    for (std::size_t t = 0; t < n; ++t) demands[t] = row[t].asked;
    auto shares = quota::fair::weighted_max_min(c.window_capacity(), demands, weights);
    for (std::size_t t = 1; t < n; ++t) {
      if (row[t].asked == 0) continue;
      active[t] = true;
      const std::int64_t share = shares.ok() ? (*shares)[t] : 0;
      const bool ok = share >= row[t].asked ? row[t].admitted >= row[t].asked
                                            : row[t].admitted + row[t].largest > share;
      if (!ok) fair_always[t] = false;
    }
  }
  for (std::size_t t = 1; t < n; ++t) {
    if (!active[t]) continue;
    ++a.small_active;
    if (fair_always[t]) ++a.small_fair_every_window;
  }
  return a;
}

}  // namespace gateway_sim::noisy
