// global_lease_report.hpp — runs the global-lease scenario (global_lease.hpp) with and
// without leases, prints its table and verdict lines, and writes its SVG chart.
//
// Lines, one per strategy (no-leases, leases, non-blocking) and check:
//   <strategy>  global budget within r*T + B [+ sum of outstanding grants (max S <= bound)]
//               | OVER ...: worst excess X units; worst interval ...
//   <strategy>  N authority round trips for D decisions (...)
//   verdict: leases vs no-leases: authority round trips per decision x vs y (Kx fewer),
//            false denials F vs G, admitted A vs B units, global envelope holds for both
//            (leases within r*T + B + sum of outstanding grants) | BROKEN
//   verdict: non-blocking vs leases (grant round trip L): false denials F vs G (+x % of
//            decisions), admitted A vs B units
// Exit status (run_global_lease_scenario): 0 when the envelope each strategy promises
// holds (no-leases: r·T + B; leases: r·T + B + Σ outstanding grants, with Σ at most
// H·(units + low_water)); 1 when not; 3 when a call failed or the chart could not be
// written.
#pragma once

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_format.h"
#include "chart.hpp"
#include "global_lease.hpp"
#include "report.hpp"

namespace gateway_sim::global_lease {

inline int run_global_lease_scenario(const GlobalLeaseConfig& c, const std::string& svg_path) {
  const auto reqs = generate_global(c);
  const quota::TokenBucket& g = c.global;
  const std::int64_t third = c.seconds / 3;
  std::printf("quota gateway simulator, scenario global-lease: %lld s simulated, seed %llu\n",
              static_cast<long long>(c.seconds), static_cast<unsigned long long>(c.seed));
  std::printf(
      "  global budget: %s units/s, burst B = %s, shared by %s tenants (Zipf %.1f) through %d "
      "gateway processes (each tenant routed to one)\n",
      with_commas(g.rate.units).c_str(), with_commas(g.burst).c_str(),
      with_commas(c.tenants).c_str(), c.zipf, c.gateways);
  std::printf(
      "  tenants' own limits: %s units/s, burst %s, each in its gateway's own store (none "
      "reached here); requests cost 1\n",
      with_commas(c.tenant.rate.units).c_str(), with_commas(c.tenant.burst).c_str());
  std::printf(
      "  offered load: %.1fx the global rate for %lld s, %.1fx for %lld s, %.1fx for %lld s\n",
      c.load[0], static_cast<long long>(third), c.load[1], static_cast<long long>(third), c.load[2],
      static_cast<long long>(c.seconds - 2 * third));
  std::printf(
      "  leases: the global rule with lease on: %s units a grant, renewed at %s, expiry %lld ms; "
      "H*(units + low_water) = %s\n",
      with_commas(c.lease.units).c_str(), with_commas(c.lease.low_water).c_str(),
      static_cast<long long>(c.lease.expiry.count() / 1'000'000),
      with_commas(c.grants_bound()).c_str());
  std::printf("  %s requests\n", with_commas(static_cast<std::int64_t>(reqs.size())).c_str());

  std::vector<std::pair<GlobalLeaseRun, GlobalLeaseAnalysis>> rows;
  for (Strategy strategy : {Strategy::kNoLeases, Strategy::kLeases, Strategy::kNonBlocking}) {
    GlobalLeaseRun run = run_global_lease(c, reqs, strategy);
    if (!run.error.empty()) {
      std::fprintf(stderr, "gateway_sim: %s: %s\n", run.name.c_str(), run.error.c_str());
      return 3;
    }
    auto a = analyze_global_lease(c, reqs, run);
    if (!a.ok()) {
      std::fprintf(stderr, "gateway_sim: %s: %s\n", run.name.c_str(),
                   std::string(a.status().message()).c_str());
      return 3;
    }
    rows.emplace_back(std::move(run), *std::move(a));
  }

  std::printf("\n%-12s %10s %10s %10s %12s %12s %12s %12s\n", "strategy", "admitted", "denied",
              "false", "authority", "round trips", "over", "most units");
  std::printf("%-12s %10s %10s %10s %12s %12s %12s %12s\n", "", "units", "requests", "denials",
              "round trips", "/ decision", "r*T+B", "held");
  for (const auto& [run, a] : rows) {
    std::printf("%-12s %10s %10s %10s %12s %12.6f %12s %12s\n", run.name.c_str(),
                with_commas(a.admitted).c_str(),
                with_commas(a.denied_global + a.denied_tenant).c_str(),
                with_commas(a.false_denials).c_str(), with_commas(a.round_trips).c_str(),
                a.round_trips_per_decision(), format_units(a.plain.excess_micro()).c_str(),
                run.leased ? with_commas(run.max_held).c_str() : "-");
  }
  std::printf("\n");
  int exit_code = 0;
  for (const auto& [run, a] : rows) {
    const char* n = run.name.c_str();
    const std::string promise =
        run.leased ? absl::StrFormat("r*T + B + sum of outstanding grants (held at most %s <= %s)",
                                     with_commas(run.max_held), with_commas(c.grants_bound()))
                   : "r*T + B";
    const bool holds = a.envelope.holds() && (!run.leased || run.max_held <= c.grants_bound());
    const auto& w = a.envelope.witness;
    std::printf("%-10s global budget %s %s: worst excess %s units", n, holds ? "within" : "OVER",
                promise.c_str(), format_units(a.envelope.excess_micro()).c_str());
    if (!w.empty) {
      std::printf("; worst interval [%.3f s, %.3f s] admitted %s units",
                  static_cast<double>(w.first_time_ns) / 1e9,
                  static_cast<double>(w.last_time_ns) / 1e9,
                  with_commas(static_cast<std::int64_t>(w.admitted)).c_str());
    }
    std::printf("\n");
    if (!holds) exit_code = 1;
    if (run.leased) {
      std::printf("%-10s over r*T + B alone: %s units (what the grants out added)\n", n,
                  format_units(a.plain.excess_micro()).c_str());
      std::printf(
          "%-10s %s authority round trips for %s decisions: %s grant requests, %s granted (each "
          "also recorded: one more call)\n",
          n, with_commas(a.round_trips).c_str(), with_commas(a.decisions).c_str(),
          with_commas(run.grant_requests).c_str(), with_commas(run.grant_records).c_str());
      std::printf(
          "%-10s the ledger listed at most %s units in grants not expired (whole grants, spent "
          "or not)\n",
          n, with_commas(run.max_listed).c_str());
    } else {
      std::printf(
          "%-10s %s authority round trips for %s decisions (one per decision that "
          "reached the global level)\n",
          n, with_commas(a.round_trips).c_str(), with_commas(a.decisions).c_str());
    }
  }
  const GlobalLeaseAnalysis& direct = rows[0].second;
  const GlobalLeaseAnalysis& leases = rows[1].second;
  const bool both_hold = exit_code == 0;
  const double fewer = leases.round_trips == 0
                           ? 0.0
                           : direct.round_trips_per_decision() / leases.round_trips_per_decision();
  std::printf(
      "verdict: leases vs no-leases: authority round trips per decision %.4f vs %.4f (%sx "
      "fewer), false denials %s vs %s, admitted %s vs %s units, global envelope %s\n",
      leases.round_trips_per_decision(), direct.round_trips_per_decision(),
      with_commas(static_cast<std::int64_t>(std::floor(fewer))).c_str(),
      with_commas(leases.false_denials).c_str(), with_commas(direct.false_denials).c_str(),
      with_commas(leases.admitted).c_str(), with_commas(direct.admitted).c_str(),
      both_hold ? "holds for both (leases within r*T + B + sum of outstanding grants)" : "BROKEN");
  const GlobalLeaseAnalysis& non_blocking = rows[2].second;
  std::printf(
      "verdict: non-blocking vs leases (grant round trip %lld us of simulated time vs none): "
      "false denials %s vs %s (+%.3f %% of decisions), admitted %s vs %s units\n",
      static_cast<long long>(c.renewal_latency.count() / 1000),
      with_commas(non_blocking.false_denials).c_str(), with_commas(leases.false_denials).c_str(),
      100.0 * static_cast<double>(non_blocking.false_denials - leases.false_denials) /
          static_cast<double>(std::max<std::int64_t>(1, non_blocking.decisions)),
      with_commas(non_blocking.admitted).c_str(), with_commas(leases.admitted).c_str());
  std::printf(
      "\nfalse denials: denied by the global rule while the global contract, charged with every "
      "admission, had room for the request.\n");

  // The chart: cumulative admitted units against r*T + B; the grants outstanding.
  const double end_s = static_cast<double>(c.seconds);
  const double rate_per_s =
      static_cast<double>(g.rate.units) * 1e9 / static_cast<double>(g.rate.per.count());
  std::vector<Series> admitted;
  admitted.push_back({"no-leases", "#1f77b4", "", direct.admitted_curve});
  admitted.push_back({"leases", "#d62728", "4 3", leases.admitted_curve});
  admitted.push_back(Series{"r*T + B, shared budget",
                            "#000000",
                            "7 5",
                            {{0.0, static_cast<double>(g.burst)},
                             {end_s, rate_per_s * end_s + static_cast<double>(g.burst)}}});
  std::vector<std::pair<double, double>> outstanding = {{0.0, 0.0}};
  for (const auto& p : rows[1].first.held_curve) outstanding.push_back(p);
  std::vector<Series> grants;
  grants.push_back({"leases: units held", "#d62728", "", std::move(outstanding)});
  grants.push_back(Series{"H*(units + low_water)",
                          "#000000",
                          "7 5",
                          {{0.0, static_cast<double>(c.grants_bound())},
                           {end_s, static_cast<double>(c.grants_bound())}}});
  std::vector<Series> peaks;
  peaks.push_back({"no-leases", "#1f77b4", "", direct.peak_curve});
  peaks.push_back({"leases", "#d62728", "4 3", leases.peak_curve});
  peaks.push_back(
      Series{"B, shared budget",
             "#000000",
             "7 5",
             {{0.0, static_cast<double>(g.burst)}, {end_s, static_cast<double>(g.burst)}}});
  peaks.push_back(Series{"B + most units held",
                         "#d62728",
                         "2 4",
                         {{0.0, static_cast<double>(g.burst + rows[1].first.max_held)},
                          {end_s, static_cast<double>(g.burst + rows[1].first.max_held)}}});
  const std::string svg = render_svg(
      {Panel{absl::StrFormat("global budget shared by %d tenants: cumulative admitted units "
                             "(seed %d)",
                             c.tenants, c.seed),
             "simulated time T (s)", "admitted units since 0", std::move(admitted)},
       Panel{"the verifier's peak: most units admitted over an interval ending then, minus r*T",
             "simulated time T (s)", "units (per 100 ms)", std::move(peaks)},
       Panel{absl::StrFormat("leases: units the %d holders held together, after each grant",
                             c.gateways),
             "simulated time T (s)", "units", std::move(grants)}});
  const std::string path = svg_path.empty() ? default_svg_path("_global_lease") : svg_path;
  if (write_file(path, svg)) {
    std::printf("chart: %s\n", path.c_str());
  } else {
    std::fprintf(stderr, "gateway_sim: cannot write chart to %s: %s\n", path.c_str(),
                 std::strerror(errno));
    exit_code = std::max(exit_code, 3);
  }
  return exit_code;
}

}  // namespace gateway_sim::global_lease
