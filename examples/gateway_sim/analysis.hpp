// analysis.hpp — what a run's decisions mean: each tenant's verdict from the envelope
// verifier and its false denials against an exact reference bucket (see the top of
// gateway_sim.cpp), and the hot tenant's cumulative admitted cost for the chart.
#pragma once

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

#include "options.hpp"
#include "quota/quota.hpp"
#include "quota/verify/envelope.hpp"
#include "run.hpp"

namespace gateway_sim {

struct TenantStats {
  std::int64_t requests = 0, offered_units = 0, admitted_units = 0, denied = 0, false_denied = 0,
               errors = 0;
  quota::verify::TokenBucketReport report;
};

struct Analysis {
  std::vector<TenantStats> tenants;
  std::vector<std::pair<double, double>> hot_curve;  // (seconds, cumulative admitted units)
  std::int64_t decisions = 0;
};

inline Analysis analyze(RunResult& run, const Tenants& tenants, const Options& o) {
  auto& recs = run.records;
  // Time order; at one instant admissions first (see "reference" at the top).
  std::sort(recs.begin(), recs.end(), [](const Record& a, const Record& b) {
    if (a.time_ns != b.time_ns) return a.time_ns < b.time_ns;
    if ((a.outcome == kAllowed) != (b.outcome == kAllowed)) return a.outcome == kAllowed;
    if (a.tenant != b.tenant) return a.tenant < b.tenant;
    return a.cost < b.cost;
  });
  const std::size_t n = tenants.contract.size();
  Analysis out;
  out.tenants.resize(n);
  out.decisions = static_cast<std::int64_t>(recs.size());
  std::vector<quota::verify::TokenBucketVerifier> verifiers;
  std::vector<TokenBucket::State> ref(n);
  std::vector<bool> seen(n, false);
  for (std::size_t t = 0; t < n; ++t) {
    const TokenBucket& c = tenants.contract[t];
    verifiers.emplace_back(c.rate, t == 0 && o.verify_burst >= 0 ? o.verify_burst : c.burst);
  }

  const int points = 600;
  const std::int64_t end_ns = o.traffic.seconds * 1'000'000'000;
  std::int64_t cum = 0;
  int next_point = 0;
  auto emit_until = [&](std::int64_t t) {
    while (next_point <= points && end_ns * next_point / points < t) {
      out.hot_curve.emplace_back(static_cast<double>(end_ns) * next_point / points / 1e9,
                                 static_cast<double>(cum));
      ++next_point;
    }
  };
  for (const Record& r : recs) {
    TenantStats& ts = out.tenants[r.tenant];
    const TokenBucket& c = tenants.contract[r.tenant];
    ++ts.requests;
    ts.offered_units += r.cost;
    if (!seen[r.tenant]) {
      ref[r.tenant] = c.init(Nanos{r.time_ns});
      seen[r.tenant] = true;
    }
    TokenBucket::State& s = ref[r.tenant];
    c.refill(s, r.time_ns);
    if (r.outcome == kAllowed) {
      s.tokens -= quota::to_micro(r.cost);  // may go below zero: the strategy overspent
      ts.admitted_units += r.cost;
      (void)verifiers[r.tenant].add({.time_ns = r.time_ns, .cost = r.cost});
      if (r.tenant == 0) {
        emit_until(r.time_ns);
        cum += r.cost;
      }
    } else if (r.outcome == kDenied) {
      ++ts.denied;
      if (s.tokens >= quota::to_micro(r.cost)) ++ts.false_denied;
    } else {
      ++ts.errors;
    }
  }
  emit_until(end_ns + 1);
  for (std::size_t t = 0; t < n; ++t) out.tenants[t].report = verifiers[t].report();
  return out;
}

}  // namespace gateway_sim
