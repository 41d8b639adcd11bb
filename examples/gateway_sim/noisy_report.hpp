// noisy_report.hpp — runs the noisy-neighbour scenario (noisy.hpp) with and without fair
// share, prints its table and verdict lines, and writes its SVG chart.
//
// Verdict lines, one per strategy (fcfs, fair-share, fair-share-p90) and check:
//   <strategy>  global budget within r*T + B | OVER r*T + B: worst interval ...
//   <strategy>  small tenants at or above their fair share in every 10 s window: N of M
//   <strategy>  noisy tenant admitted X tokens (N of 20 requests)
//   <strategy>  shares within budget - reserve (C) at N of N allocations, largest sum S
//   verdict: <fair strategy> vs fcfs: small tenants at their fair share in every window
//            N vs M (more than | as many as | fewer than), noisy tenant X vs Y tokens
//            (...), global envelope holds for both | BROKEN
// Exit status (run_noisy_scenario): 0 when the global envelope holds for every strategy
// and every allocation's shares fit budget − reserve, 1 when not, 3 when a call failed or
// the chart could not be written.
#pragma once

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_format.h"
#include "chart.hpp"
#include "noisy.hpp"
#include "report.hpp"

namespace gateway_sim::noisy {

inline int run_noisy_scenario(const NoisyConfig& c, const std::string& svg_path) {
  const auto reqs = generate_noisy(c);
  const quota::TokenBucket g = c.global();
  const auto fc = c.fair_config();
  std::printf("quota gateway simulator, scenario noisy-neighbour: %lld s simulated, seed %llu\n",
              static_cast<long long>(c.seconds), static_cast<unsigned long long>(c.seed));
  std::printf("  global budget: %s tokens per minute, burst B = %s (one exact token bucket)\n",
              with_commas(c.budget_per_min).c_str(), with_commas(g.burst).c_str());
  std::printf("  noisy tenant: %lld requests of %s tokens in [%lld s, %lld s)\n",
              static_cast<long long>(c.noisy_requests), with_commas(c.noisy_tokens).c_str(),
              static_cast<long long>(c.noisy_start_s),
              static_cast<long long>(c.noisy_start_s + c.noisy_span_s));
  std::printf(
      "  small tenants: %d, requests of %lld..%lld tokens (Poisson), together %.1f%% of the "
      "budget's rate (%s tokens/min)\n",
      c.small_tenants, static_cast<long long>(c.small_min), static_cast<long long>(c.small_max),
      static_cast<double>(c.small_permille) / 10,
      with_commas(c.budget_per_min * c.small_permille / 1000).c_str());
  std::printf(
      "  fair share: lease period %lld s (tokens expire one period after admission), budget "
      "%s per period, reserve %lld%%, shares above %lld%%, pause above %lld%% (fair-share-p90: "
      "90%%); shares recomputed once per period from decayed asks\n",
      static_cast<long long>(c.lease_s), with_commas(fc.budget).c_str(),
      static_cast<long long>(fc.reserve_permille / 10),
      static_cast<long long>(fc.share_permille / 10),
      static_cast<long long>(fc.pause_permille / 10));
  std::printf("  %zu requests; fairness checked per %lld s window against a capacity of %s\n",
              reqs.size(), static_cast<long long>(c.window_s),
              with_commas(c.window_capacity()).c_str());

  std::vector<std::pair<NoisyRun, NoisyAnalysis>> rows;
  for (NoisyStrategy strategy :
       {NoisyStrategy::kFcfs, NoisyStrategy::kFairShare, NoisyStrategy::kFairSharePause90}) {
    NoisyRun run = run_noisy(c, reqs, strategy);
    if (!run.error.empty()) {
      std::fprintf(stderr, "gateway_sim: %s: %s\n", run.name.c_str(), run.error.c_str());
      return 3;
    }
    NoisyAnalysis a = analyze_noisy(c, reqs, run);
    rows.emplace_back(std::move(run), std::move(a));
  }

  std::printf("\n%-14s %15s %15s %13s %13s %13s %15s\n", "strategy", "noisy admitted",
              "small admitted", "small asked", "small denied", "false denied", "global over");
  std::printf("%-14s %15s %15s %13s %13s %13s %15s\n", "", "tokens", "tokens", "tokens", "requests",
              "requests", "r*T+B, tokens");
  for (const auto& [run, a] : rows) {
    std::printf("%-14s %15s %15s %13s %13s %13s %15s\n", run.name.c_str(),
                with_commas(a.noisy_admitted).c_str(), with_commas(a.small_admitted).c_str(),
                with_commas(a.small_asked).c_str(), with_commas(a.small_denied).c_str(),
                with_commas(a.small_false_denied).c_str(),
                format_units(a.global.excess_micro()).c_str());
  }
  std::printf("\n");
  int exit_code = 0;
  for (const auto& [run, a] : rows) {
    const char* n = run.name.c_str();
    const auto& w = a.global.witness;
    if (w.empty) {
      std::printf("%-14s global budget: nothing admitted\n", n);
    } else {
      const double span_s = static_cast<double>(w.last_time_ns - w.first_time_ns) / 1e9;
      std::printf(
          "%-14s global budget %s: worst interval [%.3f s, %.3f s] admitted %s tokens vs "
          "r*T + B = %.0f\n",
          n, a.global.holds() ? "within r*T + B" : "OVER r*T + B",
          static_cast<double>(w.first_time_ns) / 1e9, static_cast<double>(w.last_time_ns) / 1e9,
          with_commas(static_cast<std::int64_t>(w.admitted)).c_str(),
          static_cast<double>(c.budget_per_min) / 60 * span_s + static_cast<double>(g.burst));
    }
    if (!a.global.holds()) exit_code = 1;
    std::printf(
        "%-14s small tenants at or above their fair share in every %lld s window: %d of %d "
        "(%.1f%%)\n",
        n, static_cast<long long>(c.window_s), a.small_fair_every_window, a.small_active,
        a.small_active == 0 ? 0.0 : 100.0 * a.small_fair_every_window / a.small_active);
    std::printf("%-14s noisy tenant admitted %s tokens (%lld of %lld requests)\n", n,
                with_commas(a.noisy_admitted).c_str(),
                static_cast<long long>(a.noisy_requests_admitted),
                static_cast<long long>(c.noisy_requests));
    std::printf("%-14s refusals: %lld by the global bucket, %lld over share, %lld paused\n", n,
                static_cast<long long>(a.refused_global),
                static_cast<long long>(a.refused_over_share),
                static_cast<long long>(a.refused_paused));
    if (run.allocations > 0) {
      std::printf(
          "%-14s shares within budget - reserve (%s) at %lld of %lld allocations, largest sum "
          "%s\n",
          n, with_commas(fc.share_capacity()).c_str(),
          static_cast<long long>(run.allocations - run.allocations_over),
          static_cast<long long>(run.allocations), with_commas(run.max_share_sum).c_str());
      if (run.allocations_over > 0) exit_code = 1;
    }
  }
  // Each fair share against first come first served, on the same stream.
  const NoisyAnalysis& f = rows[0].second;
  auto compare = [](std::int64_t x, std::int64_t y) {
    return x < y ? "fewer than" : x == y ? "as many as" : "more than";
  };
  for (std::size_t i = 1; i < rows.size(); ++i) {
    const NoisyAnalysis& s = rows[i].second;
    std::printf(
        "verdict: %s vs fcfs: small tenants at their fair share in every window %d vs %d (%s), "
        "noisy tenant %s vs %s tokens (%s), global envelope %s\n",
        rows[i].first.name.c_str(), s.small_fair_every_window, f.small_fair_every_window,
        compare(s.small_fair_every_window, f.small_fair_every_window),
        with_commas(s.noisy_admitted).c_str(), with_commas(f.noisy_admitted).c_str(),
        compare(s.noisy_admitted, f.noisy_admitted),
        s.global.holds() && f.global.holds() ? "holds for both" : "BROKEN");
  }
  std::printf(
      "\nfalse denials: a small tenant denied while the global contract, charged with the small "
      "tenants' admissions only, had room for it.\n");

  // The chart: cumulative admitted tokens per strategy, and the envelope r*T + B.
  const double end_s = static_cast<double>(c.seconds);
  const double rate_per_s = static_cast<double>(c.budget_per_min) / 60;
  std::vector<Series> series;
  const char* colors[3][2] = {
      {"#d62728", "#ff9896"}, {"#1f77b4", "#aec7e8"}, {"#2ca02c", "#98df8a"}};
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const auto& [run, a] = rows[i];
    series.push_back({run.name + ": noisy", colors[i][0], "", a.noisy_curve});
    series.push_back({run.name + ": small", colors[i][1], "4 3", a.small_curve});
  }
  series.push_back(Series{"r*T + B, shared budget",
                          "#000000",
                          "7 5",
                          {{0.0, static_cast<double>(g.burst)},
                           {end_s, rate_per_s * end_s + static_cast<double>(g.burst)}}});
  const std::string svg = render_svg(
      {Panel{absl::StrFormat("noisy neighbour: cumulative admitted tokens (seed %d)", c.seed),
             "simulated time T (s)", "admitted tokens since 0", std::move(series)}});
  const std::string path = svg_path.empty() ? default_svg_path("_noisy") : svg_path;
  if (write_file(path, svg)) {
    std::printf("chart: %s\n", path.c_str());
  } else {
    std::fprintf(stderr, "gateway_sim: cannot write chart to %s: %s\n", path.c_str(),
                 std::strerror(errno));
    exit_code = std::max(exit_code, 3);
  }
  return exit_code;
}

}  // namespace gateway_sim::noisy
