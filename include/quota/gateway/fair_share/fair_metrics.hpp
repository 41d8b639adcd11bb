// quota/gateway/fair_share/fair_metrics.hpp — the fair-share allocators' state as Prometheus text.
//
// render_prometheus(gateway.fair_shares()) renders what each fair-share budget of a
// Gateway (fair_limits.hpp, FairLimitStats) is doing, one series per budget labelled by
// the rule's name and the budget's key (both from configuration: a global rule's key is
// its route and limit, never a tenant), so the number of series is bounded by the rule
// set; per-tenant state is not a label (FairLimitStats::tenants lists it). Families
// (text format 0.0.4):
//
//   quota_fair_share_budget_units             gauge    units the allocator divides
//   quota_fair_share_units_in_use             gauge    admitted units still in use
//   quota_fair_share_use_ratio                gauge    units in use / budget (the level of
//                                                      use; 0.7 and 0.9 are the defaults'
//                                                      share and pause thresholds)
//   quota_fair_share_active_tenants           gauge    tenants active in the period
//   quota_fair_share_constrained_tenants      gauge    held to their share (last allocation)
//   quota_fair_share_share_sum_units          gauge    Σ shares of the last allocation
//   quota_fair_share_capacity_units           gauge    budget − reserve it divided
//   quota_fair_share_reserve_units            gauge    the reserve this process may release
//   quota_fair_share_denials_total            counter  by reason: over_share, paused,
//                                                      request_too_large
//   quota_fair_share_allocations_total        counter  allocation periods
//   quota_fair_share_fallback_periods_total   counter  periods on the fixed part (the
//                                                      exchange, e.g. Redis, unreachable)
//   quota_fair_share_late_reports_total       counter  this holder's reports after the seal
//
// And render_prometheus(gateway.reserve_releases(), now), the operator's releases of a
// reserve: labelled by rule and tenant — a tenant id as a label only here, where an
// operator named it, at most FairLimits::kMaxReleases per budget:
//
//   quota_fair_share_reserve_released_units   gauge    units released (0 once ended)
//   quota_fair_share_reserve_in_use_units     gauge    of them, admitted and in use
//   quota_fair_share_reserve_seconds_left     gauge    until the release ends (0: ended)
//
// Thread safety: a pure function of a snapshot (Gateway::fair_shares() takes it under
// each budget's mutex; the values may be stale at once).
//
//   std::string text = quota::gateway::render_prometheus(metrics) +
//                      quota::gateway::render_prometheus(gateway.fair_shares());
#pragma once

#include <chrono>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "absl/numeric/int128.h"
#include "absl/strings/str_cat.h"
#include "quota/detail/keyed_states.hpp"
#include "quota/gateway/fair_share/fair_limits.hpp"
#include "quota/gateway/metrics.hpp"

namespace quota::gateway {

namespace detail {

// units / budget with six decimals, exactly rounded down (budget ≥ 1).
inline std::string fair_use_ratio(std::int64_t units, std::int64_t budget) {
  if (budget < 1 || units < 0) return "0";
  const absl::int128 micro = absl::int128(units) * 1'000'000 / budget;
  return absl::StrCat(static_cast<std::int64_t>(micro / 1'000'000), ".",
                      absl::Dec(static_cast<std::int64_t>(micro % 1'000'000), absl::kZeroPad6));
}

}  // namespace detail

inline std::string render_prometheus(std::span<const FairLimitStats> budgets) {
  std::string out;
  // One family: its HELP and TYPE lines, then `emit_for(stats, emit)` for every budget,
  // where emit(value) or emit(value, ",reason=\"...\"") writes one sample.
  const auto family = [&](std::string_view name, std::string_view type, std::string_view help,
                          const auto& emit_for) {
    const absl::string_view n = quota::detail::to_absl(name);
    absl::StrAppend(&out, "# HELP ", n, " ", quota::detail::to_absl(help), "\n# TYPE ", n, " ",
                    quota::detail::to_absl(type), "\n");
    for (const FairLimitStats& s : budgets) {
      const std::string labels = absl::StrCat("rule=\"", detail::prom_escape(s.rule),
                                              "\",budget=\"", detail::prom_escape(s.key), "\"");
      emit_for(s, [&](const auto& value, std::string_view extra = {}) {
        absl::StrAppend(&out, n, "{", labels, quota::detail::to_absl(extra), "} ", value, "\n");
      });
    }
  };
  const auto last = [](const FairLimitStats& s) {
    return s.last.value_or(fair::FairShareAllocation{});
  };
  family("quota_fair_share_budget_units", "gauge", "Units the fair-share allocator divides.",
         [](const FairLimitStats& s, const auto& emit) { emit(s.config.budget); });
  family("quota_fair_share_units_in_use", "gauge", "Admitted units still in use.",
         [](const FairLimitStats& s, const auto& emit) { emit(s.units_in_use); });
  family("quota_fair_share_use_ratio", "gauge", "Units in use over the budget.",
         [](const FairLimitStats& s, const auto& emit) {
           emit(detail::fair_use_ratio(s.units_in_use, s.config.budget));
         });
  family("quota_fair_share_active_tenants", "gauge", "Tenants active in the current period.",
         [](const FairLimitStats& s, const auto& emit) { emit(s.active_tenants); });
  family("quota_fair_share_constrained_tenants", "gauge",
         "Tenants held to their share in the last allocation.",
         [&](const FairLimitStats& s, const auto& emit) { emit(last(s).constrained); });
  family("quota_fair_share_share_sum_units", "gauge", "Sum of the shares of the last allocation.",
         [&](const FairLimitStats& s, const auto& emit) { emit(last(s).share_sum); });
  family("quota_fair_share_capacity_units", "gauge",
         "Budget minus reserve divided by the last allocation.",
         [&](const FairLimitStats& s, const auto& emit) { emit(last(s).capacity); });
  family("quota_fair_share_reserve_units", "gauge",
         "The reserve this process may release to tenants (never part of a share).",
         [](const FairLimitStats& s, const auto& emit) { emit(s.reserve_units); });
  family("quota_fair_share_denials_total", "counter", "Requests refused by the allocator.",
         [](const FairLimitStats& s, const auto& emit) {
           emit(s.over_share, ",reason=\"over_share\"");
           emit(s.paused, ",reason=\"paused\"");
           emit(s.too_large, ",reason=\"request_too_large\"");
         });
  family("quota_fair_share_allocations_total", "counter", "Allocation periods.",
         [](const FairLimitStats& s, const auto& emit) { emit(s.allocations); });
  family("quota_fair_share_fallback_periods_total", "counter",
         "Allocation periods on the fixed part: the asks exchange failed.",
         [](const FairLimitStats& s, const auto& emit) { emit(s.exchange_failures); });
  family("quota_fair_share_late_reports_total", "counter",
         "This holder's asks reports that came after their period was sealed.",
         [](const FairLimitStats& s, const auto& emit) { emit(s.late_reports); });
  return out;
}

// The reserve releases (Gateway::reserve_releases) at `now` (the fair-share clock).
inline std::string render_prometheus(std::span<const ReserveRelease> releases, Nanos now) {
  std::string out;
  const auto family = [&](const char* name, const char* help, const auto& value) {
    absl::StrAppend(&out, "# HELP ", name, " ", help, "\n# TYPE ", name, " gauge\n");
    for (const ReserveRelease& r : releases) {
      absl::StrAppend(&out, name, "{rule=\"", detail::prom_escape(r.rule), "\",tenant=\"",
                      detail::prom_escape(r.tenant), "\"} ", value(r), "\n");
    }
  };
  family("quota_fair_share_reserve_released_units",
         "Units of a fair-share reserve an operator released to a tenant (0 once ended).",
         [&](const ReserveRelease& r) { return r.until > now ? r.units : 0; });
  family("quota_fair_share_reserve_in_use_units",
         "Units admitted from a reserve release and still in use.",
         [](const ReserveRelease& r) { return r.in_use; });
  family("quota_fair_share_reserve_seconds_left", "Seconds until a reserve release ends.",
         [&](const ReserveRelease& r) {
           return r.until > now ? std::chrono::ceil<std::chrono::seconds>(r.until - now).count()
                                : std::int64_t{0};
         });
  return out;
}

}  // namespace quota::gateway
