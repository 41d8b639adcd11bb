// quota/gateway/leases/lease_metrics.hpp — what leases do, counted per budget level.
//
// A LeasedBackend (leased_backend.hpp) counts in one LeaseCounters
// (lease/lease_counters.hpp) per level — user, tenant, global: labels from configuration
// only, never a key — the units held now, grants taken and the units they brought,
// renewals (grant requests) with their latency and failures, units unused at expiry,
// units dropped by a rule change, units revoked at once, and denials answered while
// leased (and, in the non-blocking mode, while a grant request was under way). Units held per key
// are listed by LeasedBackend::holdings() (keys are not metric labels: they are unbounded).
// Counters are relaxed atomics, exact once traffic stops.
//
// Thread safety: any thread.
//
//   quota::gateway::LeaseMetrics lease_metrics;
//   quota::gateway::LeasedBackend leased(inner, ledger, {.metrics = &lease_metrics});
//   std::string text = quota::gateway::render_prometheus(lease_metrics);
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "quota/detail/keyed_states.hpp"
#include "quota/gateway/rules/rule_spec.hpp"
#include "quota/lease/lease_counters.hpp"

namespace quota::gateway {

class LeaseMetrics {
 public:
  LeaseCounters& at(Level level) { return levels_[static_cast<std::size_t>(level)]; }
  const LeaseCounters& at(Level level) const { return levels_[static_cast<std::size_t>(level)]; }

 private:
  std::array<LeaseCounters, 3> levels_{};
};

// Prometheus text (0.0.4): quota_lease_* families, one sample per level.
inline std::string render_prometheus(const LeaseMetrics& m) {
  struct Family {
    std::string_view name;
    std::string_view type;
    std::string_view help;
    std::atomic<std::int64_t> LeaseCounters::*field;
  };
  static constexpr std::array<Family, 12> kFamilies{{
      {"quota_lease_units_held", "gauge", "Units held in lease grants by this process.",
       &LeaseCounters::units_held},
      {"quota_lease_grants_total", "counter", "Lease grants taken.", &LeaseCounters::grants},
      {"quota_lease_units_granted_total", "counter", "Units brought by lease grants.",
       &LeaseCounters::units_granted},
      {"quota_lease_renewals_total", "counter", "Grant requests answered by the authority.",
       &LeaseCounters::renewals},
      {"quota_lease_renewal_failures_total", "counter", "Grant requests that failed.",
       &LeaseCounters::renewal_failures},
      {"quota_lease_renewal_seconds_total", "counter", "Time spent in grant requests.",
       &LeaseCounters::renewal_ns_total},
      {"quota_lease_units_unused_at_expiry_total", "counter", "Granted units that expired unused.",
       &LeaseCounters::units_unused_at_expiry},
      {"quota_lease_units_dropped_on_rule_change_total", "counter",
       "Granted units dropped because the rule set changed.",
       &LeaseCounters::units_dropped_on_rule_change},
      {"quota_lease_units_revoked_total", "counter",
       "Granted units dropped because the authority revoked their grants.",
       &LeaseCounters::units_revoked},
      {"quota_lease_denials_total", "counter", "Denials answered while leased.",
       &LeaseCounters::denials_while_leased},
      {"quota_lease_record_failures_total", "counter", "Grants the ledger failed to record.",
       &LeaseCounters::record_failures},
      {"quota_lease_denials_while_renewing_total", "counter",
       "Non-blocking: denials while a key's grant request was queued or in flight.",
       &LeaseCounters::denials_while_renewing},
  }};
  std::string out;
  for (const Family& f : kFamilies) {
    absl::StrAppend(&out, "# HELP ", quota::detail::to_absl(f.name), " ",
                    quota::detail::to_absl(f.help), "\n# TYPE ", quota::detail::to_absl(f.name),
                    " ", quota::detail::to_absl(f.type), "\n");
    for (Level l : {Level::kUser, Level::kTenant, Level::kGlobal}) {
      const std::int64_t v = (m.at(l).*f.field).load(std::memory_order_relaxed);
      if (f.field == &LeaseCounters::renewal_ns_total) {
        // Seconds, as Prometheus expects, with nanosecond precision.
        absl::StrAppend(&out, quota::detail::to_absl(f.name), "{level=\"",
                        quota::detail::to_absl(to_string(l)), "\"} ", v / 1'000'000'000, ".",
                        absl::Dec(v % 1'000'000'000, absl::kZeroPad9), "\n");
      } else {
        absl::StrAppend(&out, quota::detail::to_absl(f.name), "{level=\"",
                        quota::detail::to_absl(to_string(l)), "\"} ", v, "\n");
      }
    }
  }
  return out;
}

}  // namespace quota::gateway
