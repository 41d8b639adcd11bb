// quota/gateway/metrics.hpp — decision counters per rule, a callback, Prometheus text.
//
// The gateway counts every decision under the labels (rule, route, level): the rule's
// configured name (e.g. "free", "pro"), the whitelisted route class and the budget level
// ("user", "tenant", "global"). Those come from configuration only, never from a tenant
// id, user id, attempt id or URL, so the number of series is bounded by the rule set
// (and hard-capped by Metrics::kMaxSeries). Outcomes:
//
//   allowed            the request was admitted by the store's decision
//   denied             over limit, cost exceeds burst, invalid cost (HTTP 429/400)
//   unavailable        the store failed and the route fails closed (HTTP 503), or the
//                      fail-open emergency bucket was empty or past its maximum duration
//   fail_open_allowed  admitted by the local emergency bucket during an outage
//   shadow_would_deny  the rule is in shadow mode and would have denied; admitted
//
// Counters are relaxed atomics: cheap on the hot path, each value exact once traffic
// stops, and a snapshot taken during traffic may mix slightly different instants.
// A `MetricsSink` (optional) is called synchronously on every counted outcome, from the
// deciding thread: keep it cheap and thread-safe.
//
//   quota::gateway::Metrics metrics;                   // shared by rule sets and gateway
//   std::string text = quota::gateway::render_prometheus(metrics);
//   // # TYPE quota_decisions_total counter
//   // quota_decisions_total{rule="free",route="read",level="tenant",outcome="allowed"} 3
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "quota/detail/keyed_states.hpp"
#include "quota/detail/mutex.hpp"

namespace quota::gateway {

enum class Outcome : std::uint8_t {
  kAllowed = 0,
  kDenied = 1,
  kUnavailable = 2,
  kFailOpenAllowed = 3,
  kShadowWouldDeny = 4,
};
inline constexpr std::size_t kOutcomeCount = 5;

constexpr std::string_view to_string(Outcome o) {
  switch (o) {
    case Outcome::kAllowed:
      return "allowed";
    case Outcome::kDenied:
      return "denied";
    case Outcome::kUnavailable:
      return "unavailable";
    case Outcome::kFailOpenAllowed:
      return "fail_open_allowed";
    case Outcome::kShadowWouldDeny:
      return "shadow_would_deny";
  }
  return "unknown";
}

struct RuleLabels {
  std::string rule{};
  std::string route{};
  std::string level{};

  friend bool operator==(const RuleLabels&, const RuleLabels&) = default;
};

// Users' metric systems implement this to see every counted outcome.
class MetricsSink {
 public:
  virtual ~MetricsSink() = default;
  // `cost` is the request's cost in whole units. Called on the deciding thread.
  virtual void on_outcome(const RuleLabels& labels, Outcome outcome, std::int64_t cost) = 0;
};

// The counters of one (rule, route, level). Rule sets hold a shared_ptr to it, so a
// reload that keeps a rule keeps counting into the same series.
class RuleCounters {
 public:
  explicit RuleCounters(RuleLabels labels, MetricsSink* sink)
      : labels_(std::move(labels)), sink_(sink) {}

  void record(Outcome o, std::int64_t cost) {
    counts_[static_cast<std::size_t>(o)].fetch_add(1, std::memory_order_relaxed);
    if (sink_ != nullptr) sink_->on_outcome(labels_, o, cost);
  }
  std::uint64_t count(Outcome o) const {
    return counts_[static_cast<std::size_t>(o)].load(std::memory_order_relaxed);
  }
  const RuleLabels& labels() const { return labels_; }

 private:
  RuleLabels labels_;
  MetricsSink* sink_;
  std::array<std::atomic<std::uint64_t>, kOutcomeCount> counts_{};
};

// The registry of series. Thread-safe. The sink, if any, must outlive the Metrics.
class Metrics {
 public:
  // A hard cap on series: a misconfiguration cannot grow memory without bound.
  static constexpr std::size_t kMaxSeries = 10'000;

  explicit Metrics(MetricsSink* sink = nullptr) : sink_(sink) {}

  // The counters of (rule, route, level), created on first use. Called when a rule set
  // is built, not per decision. ResourceExhausted past kMaxSeries.
  absl::StatusOr<std::shared_ptr<RuleCounters>> counters(const RuleLabels& labels) {
    quota::detail::MutexLock lock(mu_);
    auto key = std::make_tuple(labels.rule, labels.route, labels.level);
    if (auto it = series_.find(key); it != series_.end()) return it->second;
    if (series_.size() >= kMaxSeries) {
      return absl::ResourceExhaustedError(absl::StrFormat(
          "metrics: more than %d series (rule, route, level); rule names must be few", kMaxSeries));
    }
    auto c = std::make_shared<RuleCounters>(labels, sink_);
    series_.emplace(std::move(key), c);
    return c;
  }

  // Every series, sorted by labels (a stable order for rendering).
  std::vector<std::shared_ptr<const RuleCounters>> snapshot() const {
    std::vector<std::shared_ptr<const RuleCounters>> out;
    {
      quota::detail::MutexLock lock(mu_);
      out.reserve(series_.size());
      for (const auto& [k, v] : series_) out.push_back(v);
    }
    std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) {
      return std::tie(a->labels().rule, a->labels().route, a->labels().level) <
             std::tie(b->labels().rule, b->labels().route, b->labels().level);
    });
    return out;
  }

 private:
  MetricsSink* sink_;
  mutable quota::detail::Mutex mu_;
  absl::flat_hash_map<std::tuple<std::string, std::string, std::string>,
                      std::shared_ptr<RuleCounters>>
      series_ ABSL_GUARDED_BY(mu_);
};

namespace detail {

// Label values are escaped as the text format requires: \ " and newline.
inline std::string prom_escape(std::string_view s) {
  std::string out{};
  for (char ch : s) {
    if (ch == '\\' || ch == '"') {
      out.push_back('\\');
      out.push_back(ch);
    } else if (ch == '\n') {
      out += "\\n";
    } else {
      out.push_back(ch);
    }
  }
  return out;
}

}  // namespace detail

// The Prometheus text exposition format (version 0.0.4): one counter family,
// `quota_decisions_total`, one sample per series and outcome, in a stable order.
inline std::string render_prometheus(const Metrics& metrics) {
  std::string out =
      "# HELP quota_decisions_total Rate-limit decisions by rule, route class, budget level and "
      "outcome.\n"
      "# TYPE quota_decisions_total counter\n";
  for (const auto& c : metrics.snapshot()) {
    for (std::size_t i = 0; i < kOutcomeCount; ++i) {
      const auto o = static_cast<Outcome>(i);
      absl::StrAppend(&out, "quota_decisions_total{rule=\"", detail::prom_escape(c->labels().rule),
                      "\",route=\"", detail::prom_escape(c->labels().route), "\",level=\"",
                      detail::prom_escape(c->labels().level), "\",outcome=\"",
                      quota::detail::to_absl(to_string(o)), "\"} ", c->count(o), "\n");
    }
  }
  return out;
}

}  // namespace quota::gateway
