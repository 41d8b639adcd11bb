// regions_report.hpp — runs the regions scenario (regions.hpp) with regional pools and
// with every global decision at the central authority, prints its table and verdict
// lines, and writes its SVG chart.
//
// Verdict lines, one per strategy and check:
//   <strategy>  global budget within r*T + B + <extra> | OVER ...: worst interval ...
//   <strategy>  <region> cut off [a s, b s): held H, admitted A while cut off (<= H | OVER
//               its grants), then U unavailable (fail closed)
//   <strategy>  N cross-region round trips for M decisions
//   verdict: regional-leases vs central: cross-region round trips X vs Y (Z x fewer), <cut
//            region> admitted A while cut off from its grants vs 0, false denials F vs G,
//            global envelope holds for both | BROKEN
// Exit status (run_regions_scenario): 0 when both envelopes hold and the cut-off region
// admitted no more than it held; 1 when not; 3 when a decision failed or the chart could
// not be written.
#pragma once

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "chart.hpp"
#include "regions.hpp"
#include "report.hpp"

namespace gateway_sim::regions {

inline int run_regions_scenario(const RegionsConfig& c, const std::string& svg_path) {
  const quota::TokenBucket g = c.global();
  const std::string& cut_name = c.names[c.cut_region];
  const double cut_from_s = static_cast<double>(c.cut_from().count()) / 1e9;
  const double cut_until_s = static_cast<double>(c.cut_until().count()) / 1e9;
  std::printf("quota gateway simulator, scenario regions: %lld s simulated, seed %llu\n",
              static_cast<long long>(c.seconds), static_cast<unsigned long long>(c.seed));
  std::printf("  global budget: r = %s units/s, B = %s, at a central authority\n",
              with_commas(c.global_rate).c_str(), with_commas(c.global_burst).c_str());
  std::printf("  regions:");
  for (std::size_t i = 0; i < c.names.size(); ++i) {
    std::printf(" %s %s/s%s", c.names[i].c_str(), with_commas(c.offered_per_s[i]).c_str(),
                i + 1 < c.names.size() ? "," : "");
  }
  std::printf(
      " offered (Poisson, cost 1, %d tenants each, %d gateways each, own authority per "
      "region)\n",
      c.tenants_per_region, c.gateways_per_region);
  std::printf(
      "  regional grants: %lld units, renewed at %lld, expiry %lld ms; %s cut off from the "
      "central authority during [%.0f s, %.0f s); the route fails closed\n",
      static_cast<long long>(c.lease.units), static_cast<long long>(c.lease.low_water),
      static_cast<long long>(c.lease.expiry.count() / 1'000'000), cut_name.c_str(), cut_from_s,
      cut_until_s);

  std::vector<RegionsRun> runs;
  for (RegionsStrategy s : {RegionsStrategy::kRegionalLeases, RegionsStrategy::kCentral}) {
    runs.push_back(run_regions(c, s));
    if (runs.back().errors > 0) {
      std::fprintf(stderr, "gateway_sim: %s: %lld decisions failed\n", runs.back().name.c_str(),
                   static_cast<long long>(runs.back().errors));
      return 3;
    }
  }

  std::printf("\n%-16s %-7s %11s %11s %11s %12s %13s\n", "strategy", "region", "offered",
              "admitted", "denied", "unavailable", "false denied");
  for (const RegionsRun& r : runs) {
    for (std::size_t i = 0; i < c.names.size(); ++i) {
      const RegionStats& s = r.regions[i];
      std::printf("%-16s %-7s %11s %11s %11s %12s %13s\n", r.name.c_str(), c.names[i].c_str(),
                  with_commas(s.offered).c_str(), with_commas(s.admitted).c_str(),
                  with_commas(s.denied).c_str(), with_commas(s.unavailable).c_str(),
                  with_commas(s.false_denied).c_str());
    }
  }
  std::printf("\n");
  int exit_code = 0;
  const auto false_denied = [](const RegionsRun& r) {
    std::int64_t n = 0;
    for (const RegionStats& s : r.regions) n += s.false_denied;
    return n;
  };
  for (const RegionsRun& r : runs) {
    const char* n = r.name.c_str();
    const auto& w = r.report.witness;
    const std::string promise =
        r.promised_extra > 0
            ? absl::StrFormat("r*T + B + %s (regional grants)", with_commas(r.promised_extra))
            : std::string("r*T + B");
    const double span_s = static_cast<double>(w.last_time_ns - w.first_time_ns) / 1e9;
    std::printf(
        "%-16s global budget %s %s: worst interval [%.3f s, %.3f s] admitted %s vs r*T + B = "
        "%.0f\n",
        n, r.report.holds() ? "within" : "OVER", promise.c_str(),
        static_cast<double>(w.first_time_ns) / 1e9, static_cast<double>(w.last_time_ns) / 1e9,
        with_commas(static_cast<std::int64_t>(w.admitted)).c_str(),
        static_cast<double>(c.global_rate) * span_s + static_cast<double>(g.burst));
    if (!r.report.holds()) exit_code = 1;
    const RegionStats& cut = r.regions[c.cut_region];
    const bool within =
        cut.admitted_while_cut <= cut.held_at_cut && cut.admitted_after_unavailable == 0;
    std::printf(
        "%-16s %s cut off [%.0f s, %.0f s): held %lld, admitted %lld while cut off (%s), then "
        "%s unavailable (fail closed)\n",
        n, cut_name.c_str(), cut_from_s, cut_until_s, static_cast<long long>(cut.held_at_cut),
        static_cast<long long>(cut.admitted_while_cut),
        within ? "<= what it held" : "OVER what it held",
        with_commas(cut.unavailable_while_cut).c_str());
    if (!within) exit_code = 1;
    std::printf("%-16s %s cross-region round trips for %s decisions\n", n,
                with_commas(r.round_trips).c_str(), with_commas(r.decisions).c_str());
  }
  const RegionsRun& lease = runs[0];
  const RegionsRun& central = runs[1];
  std::printf(
      "verdict: regional-leases vs central: cross-region round trips %s vs %s (%.0fx fewer), "
      "%s admitted %lld while cut off from its grants vs %lld, false denials %s vs %s, global "
      "envelope %s\n",
      with_commas(lease.round_trips).c_str(), with_commas(central.round_trips).c_str(),
      static_cast<double>(central.round_trips) /
          static_cast<double>(std::max<std::int64_t>(lease.round_trips, 1)),
      cut_name.c_str(), static_cast<long long>(lease.regions[c.cut_region].admitted_while_cut),
      static_cast<long long>(central.regions[c.cut_region].admitted_while_cut),
      with_commas(false_denied(lease)).c_str(), with_commas(false_denied(central)).c_str(),
      lease.report.holds() && central.report.holds() ? "holds for both" : "BROKEN");
  std::printf(
      "\nfalse denials: a request denied (any level, or unavailable) while the global contract, "
      "charged with every region's admissions, had room for it.\n");

  // The chart: admitted per second per region (regional leases, solid; central, dashed),
  // and every region's cumulative admissions against the promised envelopes.
  const char* colors[] = {"#1f77b4", "#2ca02c", "#d62728", "#9467bd"};
  std::vector<Series> rates;
  for (std::size_t k = 0; k < runs.size(); ++k) {
    for (std::size_t i = 0; i < c.names.size(); ++i) {
      rates.push_back({runs[k].name + ": " + c.names[i], colors[i % 4], k == 0 ? "" : "4 3",
                       runs[k].regions[i].per_second});
    }
  }
  const double end_s = static_cast<double>(c.seconds);
  const double rate = static_cast<double>(c.global_rate);
  std::vector<Series> totals;
  for (std::size_t k = 0; k < runs.size(); ++k) {
    totals.push_back({runs[k].name + ": all regions", k == 0 ? "#ff7f0e" : "#8c564b",
                      k == 0 ? "" : "4 3", runs[k].cumulative});
  }
  const double b = static_cast<double>(g.burst);
  const double extra = static_cast<double>(lease.promised_extra);
  totals.push_back(
      Series{"r*T + B, shared budget", "#000000", "7 5", {{0.0, b}, {end_s, rate * end_s + b}}});
  totals.push_back(Series{"r*T + B + regional grants",
                          "#7f7f7f",
                          "2 3",
                          {{0.0, b + extra}, {end_s, rate * end_s + b + extra}}});
  const std::string svg = render_svg(
      {Panel{absl::StrFormat("regions: admitted per second, %s cut off in [%.0f s, %.0f s) "
                             "(seed %d)",
                             cut_name, cut_from_s, cut_until_s, c.seed),
             "simulated time (s)", "admitted units per second", std::move(rates)},
       Panel{"regions: cumulative admitted, every region, against the global envelope",
             "simulated time T (s)", "admitted units since 0", std::move(totals)}});
  const std::string path = svg_path.empty() ? default_svg_path("_regions") : svg_path;
  if (write_file(path, svg)) {
    std::printf("chart: %s\n", path.c_str());
  } else {
    std::fprintf(stderr, "gateway_sim: cannot write chart to %s: %s\n", path.c_str(),
                 std::strerror(errno));
    exit_code = std::max(exit_code, 3);
  }
  return exit_code;
}

}  // namespace gateway_sim::regions
