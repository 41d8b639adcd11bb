// examples/quota_server/stats/decision_stats.hpp — what quota-server measures of its decisions.
//
// DecisionStats, served on /metrics (server_stats.hpp renders it):
//   quota_decision_duration_seconds  a Prometheus histogram of the time one call took to
//       decide (parse to answer, every descriptor of a gRPC call), fixed buckets from
//       10 µs to 100 ms (kLatencyBuckets) plus +Inf;
//   quota_near_limit_total{rule}  admitted decisions that left the deciding rule with less
//       than 10 % of its capacity (a token bucket's burst, a window's limit): remaining *
//       10 < capacity. Labels are rule names of the rule file, never tenant ids;
//   quota_redis_errors_total{kind}  calls to Redis that failed, by kind (RedisErrorKind:
//       unavailable, deadline, breaker_open, in_flight, unauthenticated, other,
//       clock_ahead:
//       redis::ErrorKind);
//   quota_top_tenant_units{rank,tenant}  the heaviest tenants by units asked for
//       (heavy_hitters.hpp: at most kTopTenants series, counts over by at most N/K);
//   quota_top_tenant_denied_units{rank,tenant}  of those units, the ones refused since
//       the tenant took its place (its 429 share: denied / units over the same window);
//   quota_top_tenant_budget_used_ratio{rank,tenant}  the share of its budget in use after
//       its last request, 1 - remaining / capacity of the rule that decided it (a daily
//       window's use grows through the day: its rise over ten minutes is what it spent).
//
// The kind of a Redis error is the one the transport marked it with
// (quota/redis/transport/error_kind.hpp redis::error_kind), never read from its message.
//
// Thread safety: atomics and HeavyHitters' mutex; any thread.
//
//   quota::server::DecisionStats d;
//   d.observe_latency(std::chrono::microseconds(42));
//   d.observe_decision("per-tenant", /*remaining=*/3, /*capacity=*/100, /*allowed=*/true);
//   d.count_redis_error(status);
//   std::string text = d.render();
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <string_view>

#include "absl/numeric/int128.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "quota/redis/transport/error_kind.hpp"
#include "stats/heavy_hitters.hpp"

namespace quota::server {

// Upper bounds of the latency buckets, in microseconds.
inline constexpr std::array<std::int64_t, 13> kLatencyBuckets = {
    10, 25, 50, 100, 250, 500, 1'000, 2'500, 5'000, 10'000, 25'000, 50'000, 100'000};
inline constexpr std::size_t kTopTenants = 20;

// The kinds of quota_redis_errors_total: the transport's (error_kind.hpp).
using RedisErrorKind = redis::ErrorKind;
inline constexpr std::size_t kRedisErrorKinds = redis::kErrorKinds;
inline constexpr const auto& kRedisErrorNames = redis::kErrorKindNames;

// Prometheus label value: backslash, double quote and newline escaped.
inline std::string prometheus_label(std::string_view v) {
  std::string out;
  out.reserve(v.size());
  for (char c : v) {
    if (c == '\\' || c == '"') {
      out += '\\';
      out += c;
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

class DecisionStats {
 public:
  void observe_latency(std::chrono::nanoseconds d) {
    const std::int64_t us_ceil = (d.count() + 999) / 1000;
    std::size_t b = 0;
    while (b < kLatencyBuckets.size() && us_ceil > kLatencyBuckets[b]) ++b;
    buckets_[b].fetch_add(1, std::memory_order_relaxed);
    sum_ns_.fetch_add(static_cast<std::uint64_t>(d.count() < 0 ? 0 : d.count()),
                      std::memory_order_relaxed);
  }

  // A decision of rule `rule`: counted as near the limit when admitted with remaining *
  // 10 < capacity (capacity > 0).
  void observe_decision(std::string_view rule, std::int64_t remaining, std::int64_t capacity,
                        bool allowed) {
    if (!allowed || capacity <= 0 || rule.empty()) return;
    if (remaining >= 0 && remaining > (capacity - 1) / 10) return;  // remaining*10 >= capacity
    std::lock_guard lock(mu_);
    ++near_limit_[std::string(rule)];
  }
  std::uint64_t near_limit(const std::string& rule) const {
    std::lock_guard lock(mu_);
    const auto it = near_limit_.find(rule);
    return it == near_limit_.end() ? 0 : it->second;
  }

  // `units` asked for by `tenant` (the top-K sketch), refused when not `allowed`; with a
  // `capacity` > 0, `remaining` of it left in the deciding rule afterwards (its share in
  // use: 1 - remaining / capacity, in [0, 1]).
  void observe_tenant(std::string_view tenant, std::int64_t units, bool allowed,
                      std::int64_t remaining = 0, std::int64_t capacity = 0) {
    if (tenant.empty() || units <= 0) return;
    const auto u = static_cast<std::uint64_t>(units);
    std::int64_t used_ppm = -1;
    if (capacity > 0) {
      const absl::int128 left = std::clamp<std::int64_t>(remaining, 0, capacity);
      used_ppm = static_cast<std::int64_t>((absl::int128(capacity) - left) * 1'000'000 / capacity);
    }
    top_.add(tenant, u, allowed ? 0 : u, used_ppm);
  }

  void count_redis_error(const absl::Status& s) {
    redis_errors_[static_cast<std::size_t>(redis::error_kind(s))].fetch_add(
        1, std::memory_order_relaxed);
  }
  std::uint64_t redis_errors(RedisErrorKind k) const {
    return redis_errors_[static_cast<std::size_t>(k)].load(std::memory_order_relaxed);
  }

  const HeavyHitters& top_tenants() const { return top_; }

  // The series of the top of this file, Prometheus text.
  std::string render() const {
    std::string out =
        "# HELP quota_decision_duration_seconds Time to answer one check call.\n"
        "# TYPE quota_decision_duration_seconds histogram\n";
    std::uint64_t cumulative = 0;
    for (std::size_t b = 0; b <= kLatencyBuckets.size(); ++b) {
      cumulative += buckets_[b].load(std::memory_order_relaxed);
      const std::string le = b < kLatencyBuckets.size()
                                 ? absl::StrCat(static_cast<double>(kLatencyBuckets[b]) / 1e6)
                                 : std::string("+Inf");
      absl::StrAppend(&out, "quota_decision_duration_seconds_bucket{le=\"", le, "\"} ", cumulative,
                      "\n");
    }
    absl::StrAppend(&out, "quota_decision_duration_seconds_sum ",
                    static_cast<double>(sum_ns_.load(std::memory_order_relaxed)) / 1e9,
                    "\nquota_decision_duration_seconds_count ", cumulative, "\n");
    absl::StrAppend(&out,
                    "# HELP quota_near_limit_total Admitted decisions leaving the deciding rule "
                    "under 10% of its capacity.\n"
                    "# TYPE quota_near_limit_total counter\n");
    {
      std::lock_guard lock(mu_);
      for (const auto& [rule, n] : near_limit_) {
        absl::StrAppend(&out, "quota_near_limit_total{rule=\"", prometheus_label(rule), "\"} ", n,
                        "\n");
      }
    }
    absl::StrAppend(&out,
                    "# HELP quota_redis_errors_total Failed calls to Redis, by kind.\n"
                    "# TYPE quota_redis_errors_total counter\n");
    for (std::size_t k = 0; k < kRedisErrorKinds; ++k) {
      absl::StrAppend(&out, "quota_redis_errors_total{kind=\"", kRedisErrorNames[k], "\"} ",
                      redis_errors_[k].load(std::memory_order_relaxed), "\n");
    }
    // The top-K families: one series per listed tenant, by rank; `value` gives a series'
    // value, or "" for none.
    const std::vector<HeavyHitters::Entry> top = top_.top();
    const auto top_family = [&](const char* name, const char* help, const auto& value) {
      absl::StrAppend(&out, "# HELP ", name, " ", help, "\n# TYPE ", name, " gauge\n");
      int rank = 0;
      for (const HeavyHitters::Entry& e : top) {
        ++rank;
        const std::string v = value(e);
        if (v.empty()) continue;
        absl::StrAppend(&out, name, "{rank=\"", rank, "\",tenant=\"", prometheus_label(e.key),
                        "\"} ", v, "\n");
      }
    };
    top_family("quota_top_tenant_units",
               "Units asked for by the heaviest tenants (Space-Saving sketch: over by at most "
               "total/K).",
               [](const HeavyHitters::Entry& e) { return absl::StrCat(e.count); });
    top_family("quota_top_tenant_denied_units",
               "Units refused to the heaviest tenants, since each took its place in the list.",
               [](const HeavyHitters::Entry& e) { return absl::StrCat(e.denied); });
    top_family("quota_top_tenant_budget_used_ratio",
               "Share of the heaviest tenants' budget in use after their last request (the rule "
               "that decided it).",
               [](const HeavyHitters::Entry& e) {
                 return e.used_ppm < 0 ? std::string()
                                       : absl::StrFormat("%d.%06d", e.used_ppm / 1'000'000,
                                                         e.used_ppm % 1'000'000);
               });
    return out;
  }

 private:
  std::array<std::atomic<std::uint64_t>, kLatencyBuckets.size() + 1> buckets_{};
  std::atomic<std::uint64_t> sum_ns_{0};
  mutable std::mutex mu_;
  std::map<std::string, std::uint64_t> near_limit_;  // guarded by mu_
  std::array<std::atomic<std::uint64_t>, kRedisErrorKinds> redis_errors_{};
  HeavyHitters top_{kTopTenants};
};

}  // namespace quota::server
