// report.hpp — the simulator's output: the table, each strategy's verdicts, and the SVG
// chart of the hot tenant's cumulative admitted cost against r·T + B.
#pragma once

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "analysis.hpp"
#include "chart.hpp"
#include "options.hpp"
#include "run.hpp"
#include "traffic.hpp"

namespace gateway_sim {

// One strategy's checked run and what came of it.
struct Row {
  std::string name;
  std::vector<std::int64_t> allowance;  // per tenant; -1: no promise
  std::string note;
  RunResult run;
  Analysis a;
  double decisions_per_s = 0;
};

// "+12.50" over the envelope; "-3.25" or "0.00" within it.
inline std::string format_units(std::int64_t micro) {
  return absl::StrFormat(micro > 0 ? "%+.2f" : "%.2f", static_cast<double>(micro) / 1e6);
}

inline std::string with_commas(std::int64_t v) {
  std::string s = absl::StrCat(v < 0 ? -v : v);
  for (int i = static_cast<int>(s.size()) - 3; i > 0; i -= 3)
    s.insert(static_cast<std::size_t>(i), ",");
  return v < 0 ? "-" + s : s;
}

// gateway_sim<suffix>.svg beside the executable (so `bash cmake/run.sh demo`, run from
// the source tree, writes into the build tree), else in the current directory. A scenario
// names its own chart by its suffix ("_noisy", "_regions", ...).
inline std::string default_svg_path(std::string_view suffix = "") {
  const std::string file = "gateway_sim" + std::string(suffix) + ".svg";
  char buf[4096];
  const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) return file;
  std::string exe(buf, static_cast<std::size_t>(n));
  const auto slash = exe.rfind('/');
  return slash == std::string::npos ? file : exe.substr(0, slash + 1) + file;
}

inline const char* color_of(const std::string& name) {
  if (name == "local-full") return "#d62728";
  if (name == "local-split") return "#ff7f0e";
  if (name == "shared") return "#2ca02c";
  if (name == "redis") return "#1f77b4";
  if (name == "leases") return "#9467bd";
  if (name == "redis-leases") return "#17becf";
  if (name == "redis-coalesced") return "#e377c2";
  return "#8c564b";
}

// Prints the table and each strategy's verdicts; returns the exit status they call for
// (0, 1 when a strategy broke the envelope it promises, 3 when decisions failed).
inline int print_table(const std::vector<Row>& rows, const Options& o) {
  const auto& tc = o.traffic;
  std::printf("\n%-15s %14s %14s %13s %13s %13s %13s\n", "strategy", "hot admitted", "contract",
              "worst excess", "false", "quiet", "decisions/s");
  std::printf("%-15s %14s %14s %13s %13s %13s %13s\n", "", "units/s", "r/s, B", "over rT+B",
              "denials", "denials", "");
  int exit_code = 0;
  for (const Row& row : rows) {
    const TenantStats& hot = row.a.tenants[0];
    std::int64_t false_denied = 0, quiet_denied = 0;
    for (std::size_t t = 0; t < row.a.tenants.size(); ++t) {
      false_denied += row.a.tenants[t].false_denied;
      if (t > 0) quiet_denied += row.a.tenants[t].denied;
    }
    std::printf("%-15s %14.1f %14s %13s %13s %13s %13s\n", row.name.c_str(),
                static_cast<double>(hot.admitted_units) / static_cast<double>(tc.seconds),
                absl::StrFormat("%d, %d", o.rate, o.burst).c_str(),
                format_units(hot.report.excess_micro()).c_str(), with_commas(false_denied).c_str(),
                with_commas(quiet_denied).c_str(),
                with_commas(static_cast<std::int64_t>(row.decisions_per_s)).c_str());
  }
  std::printf("\n");
  for (const Row& row : rows) {
    const TenantStats& hot = row.a.tenants[0];
    const auto& w = hot.report.witness;
    if (w.empty) {
      std::printf("%-15s hot tenant: nothing admitted\n", row.name.c_str());
    } else {
      const double span_s = static_cast<double>(w.last_time_ns - w.first_time_ns) / 1e9;
      std::printf(
          "%-15s hot tenant %s: worst interval [%.3f s, %.3f s] admitted %s units vs "
          "r*T + B = %.1f\n",
          row.name.c_str(), hot.report.holds() ? "within r*T + B" : "OVER r*T + B",
          static_cast<double>(w.first_time_ns) / 1e9, static_cast<double>(w.last_time_ns) / 1e9,
          with_commas(static_cast<std::int64_t>(w.admitted)).c_str(),
          static_cast<double>(o.rate) * span_s + static_cast<double>(hot.report.burst));
    }
    // Every tenant against the envelope the strategy promises (r*T + B + allowance).
    int quiet_over = 0, broken = 0;
    std::int64_t errors = 0;
    for (std::size_t t = 0; t < row.a.tenants.size(); ++t) {
      const auto& report = row.a.tenants[t].report;
      if (t > 0 && !report.holds()) ++quiet_over;
      if (row.allowance[t] >= 0 && report.excess_micro() > quota::to_micro(row.allowance[t])) {
        ++broken;
      }
      errors += row.a.tenants[t].errors;
    }
    if (quiet_over > 0) {
      std::printf("%-15s %d quiet tenant(s) OVER their r*T + B\n", row.name.c_str(), quiet_over);
    }
    if (row.allowance[0] > 0) {
      std::printf("%-15s promises r*T + B + %lld (holders x q_max): hot excess %s %s %lld\n",
                  row.name.c_str(), static_cast<long long>(row.allowance[0]),
                  format_units(hot.report.excess_micro()).c_str(),
                  hot.report.excess_micro() <= quota::to_micro(row.allowance[0]) ? "<=" : ">",
                  static_cast<long long>(row.allowance[0]));
    }
    if (!row.note.empty()) std::printf("%-15s %s\n", row.name.c_str(), row.note.c_str());
    if (errors > 0) {
      std::printf("%-12s %lld decisions FAILED (no answer), first: %s\n", row.name.c_str(),
                  static_cast<long long>(errors), row.run.first_error.c_str());
      exit_code = std::max(exit_code, 3);
    }
    if (broken > 0) {
      std::printf("%-12s BROKE the envelope it promises (%d tenant(s))\n", row.name.c_str(),
                  broken);
      exit_code = std::max(exit_code, 1);
    }
  }
  std::printf(
      "\nfalse denials: denied while the tenant's contract bucket, charged with what the "
      "strategy admitted, had room.\n");
  std::printf(
      "decisions/s: all %d gateway threads deciding flat out (no lock-step) for %lld ms of "
      "wall time, on %u hardware threads.\n",
      tc.gateways, static_cast<long long>(kThroughputWindow.count()),
      std::thread::hardware_concurrency());

  return exit_code;
}

// Writes the chart to o.svg (default_svg_path() when empty) and prints where; returns 0,
// or 3 when it could not be written.
inline int write_chart(const std::vector<Row>& rows,
                       const std::vector<std::vector<Request>>& traffic, const Options& o) {
  const auto& tc = o.traffic;
  int exit_code = 0;
  // ------------------------------------------------------------------------- the chart
  // The offered load first (local-full runs along it, on top), the envelope last (shared
  // runs along it, beneath).
  std::vector<Series> series;
  {
    // The hot tenant's offered cost: the same for every strategy.
    std::vector<std::pair<std::int64_t, std::int64_t>> ev;
    for (const auto& g : traffic) {
      for (const Request& r : g) {
        if (r.tenant == 0) ev.emplace_back(r.time_ns, r.cost);
      }
    }
    std::sort(ev.begin(), ev.end());
    Series offered{"offered", "#bbbbbb", "", {{0.0, 0.0}}};
    std::int64_t cum = 0;
    std::size_t k = 0;
    for (int p = 1; p <= 600; ++p) {
      const std::int64_t t = tc.seconds * 1'000'000'000 * p / 600;
      for (; k < ev.size() && ev[k].first <= t; ++k) cum += ev[k].second;
      offered.points.emplace_back(static_cast<double>(t) / 1e9, static_cast<double>(cum));
    }
    series.push_back(std::move(offered));
  }
  for (const Row& row : rows) {
    series.push_back(Series{row.name, color_of(row.name), "", row.a.hot_curve});
  }
  series.push_back(Series{absl::StrFormat("r*T + B (r=%d/s, B=%d)", o.rate, o.burst),
                          "#000000",
                          "7 5",
                          {{0.0, static_cast<double>(o.burst)},
                           {static_cast<double>(tc.seconds),
                            static_cast<double>(o.rate) * static_cast<double>(tc.seconds) +
                                static_cast<double>(o.burst)}}});
  // The same minus r*T: the envelope becomes the flat line B.
  std::vector<Series> minus_rt = series;
  for (Series& ser : minus_rt) {
    for (auto& [x, y] : ser.points) y -= static_cast<double>(o.rate) * x;
  }
  const double b = static_cast<double>(o.burst);
  std::vector<Series> zoomed = minus_rt;
  const std::string svg = render_svg(
      {Panel{absl::StrFormat("tenant-0: cumulative admitted units (%d gateways, seed %d)",
                             tc.gateways, tc.seed),
             "simulated time T (s)", "admitted units since 0", std::move(series)},
       Panel{"tenant-0: admitted minus r*T (the envelope is the line at B)", "simulated time T (s)",
             "admitted units - r*T", std::move(minus_rt)},
       Panel{"the same, zoomed to [-2B, 3B]: shared stays at or under B", "simulated time T (s)",
             "admitted units - r*T", std::move(zoomed), -2 * b, 3 * b}});
  const std::string path = o.svg.empty() ? default_svg_path() : o.svg;
  if (write_file(path, svg)) {
    std::printf("chart: %s\n", path.c_str());
  } else {
    std::fprintf(stderr, "gateway_sim: cannot write chart to %s: %s\n", path.c_str(),
                 std::strerror(errno));
    exit_code = std::max(exit_code, 3);
  }
  return exit_code;
}

}  // namespace gateway_sim
