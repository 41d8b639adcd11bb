// examples/quota_server/stats/server_stats.hpp — quota-server's own counters for /metrics.
//
// Beside the Gateway's per-rule decision counters (quota/gateway/metrics.hpp:
// quota_decisions_total{rule,route,level,outcome}), the server counts every call it
// answers per API (grpc, check, auth, json, settle) and answer (ok, over_limit, invalid_argument,
// not_found, unavailable, error) — a fixed set of labels, never a tenant id — and
// renders them with the rule version in force as Prometheus text. It also counts the rule
// file's loads (the first and every hot reload) by outcome, ok or error, with the Unix
// time of the last refused one, and the checks with an attempt id answered by the
// attempt's recorded decision (quota_attempts_total{outcome="replayed"}) or refused as past
// their deadline ({outcome="expired"}), and the settles of estimates by outcome with the
// units they gave back or found short (quota_settles_total, quota_settle_*_units_total).
// Its `decisions` member (decision_stats.hpp) holds the
// decision-latency histogram, the near-limit counter per rule, the Redis errors by kind
// and the top-K tenants by units; observe() feeds it one decided check.
//
// Thread safety: relaxed atomics; any thread.
//
//   quota::server::ServerStats stats;
//   stats.count(quota::server::Api::kGrpc, quota::server::Answer::kOverLimit);
//   std::string text = stats.render(checker.rule_version());
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "backend/checker.hpp"
#include "quota/clock.hpp"
#include "stats/decision_stats.hpp"

namespace quota::server {

enum class Api : std::uint8_t { kGrpc = 0, kCheck = 1, kAuth = 2, kJson = 3, kSettle = 4 };
enum class Answer : std::uint8_t {
  kOk = 0,
  kOverLimit = 1,
  kInvalidArgument = 2,
  kNotFound = 3,
  kUnavailable = 4,
  kError = 5,
};
inline constexpr std::size_t kApis = 5;
inline constexpr std::size_t kAnswers = 6;

// The answer a failed call counts as.
inline Answer answer_of(const absl::Status& s) {
  switch (s.code()) {
    case absl::StatusCode::kInvalidArgument:
      return Answer::kInvalidArgument;
    case absl::StatusCode::kNotFound:
      return Answer::kNotFound;
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kResourceExhausted:
    case absl::StatusCode::kDeadlineExceeded:
      return Answer::kUnavailable;
    default:
      return Answer::kError;
  }
}

class ServerStats {
 public:
  // A check `req` decided as `c`: near the limit of its deciding rule (capacity: the
  // rule's RateLimit-Policy quota, a bucket's burst or a window's limit) and the tenant's
  // units (its cost, 1 when the rule file's costs apply) in the top-K, denied or not.
  void observe(const CheckRequest& req, const Checked& c) {
    if (c.policy) {
      decisions.observe_decision(c.result.rule, c.result.decision.remaining, c.policy->quota,
                                 c.result.decision.allowed);
    }
    decisions.observe_tenant(req.tenant, req.cost.value_or(req.estimate.value_or(1)),
                             c.result.decision.allowed, c.result.decision.remaining,
                             c.policy ? c.policy->quota : 0);
    if (c.result.replayed) attempts_replayed_.fetch_add(1, std::memory_order_relaxed);
    if (c.result.decision.reason == Reason::kAttemptExpired) {
      attempts_expired_.fetch_add(1, std::memory_order_relaxed);
    }
  }

  // A settle (Checker::settle) by outcome, and the units it gave back or recorded short.
  void count_settle(const absl::StatusOr<gateway::SettleResult>& r) {
    std::size_t o = kSettleError;
    switch (r.status().code()) {
      case absl::StatusCode::kOk:
        o = kSettleApplied;
        surplus_units_.fetch_add(static_cast<std::uint64_t>(r->surplus), std::memory_order_relaxed);
        deficit_units_.fetch_add(static_cast<std::uint64_t>(r->deficit), std::memory_order_relaxed);
        break;
      case absl::StatusCode::kFailedPrecondition:
        o = kSettleAlreadySettled;
        break;
      case absl::StatusCode::kDeadlineExceeded:
        o = kSettleExpired;
        break;
      case absl::StatusCode::kNotFound:
        o = kSettleUnknown;
        break;
      case absl::StatusCode::kInvalidArgument:
        o = kSettleInvalid;
        break;
      default:
        break;
    }
    settles_[o].fetch_add(1, std::memory_order_relaxed);
  }

  void count(Api api, Answer answer) {
    counts_[static_cast<std::size_t>(api) * kAnswers + static_cast<std::size_t>(answer)].fetch_add(
        1, std::memory_order_relaxed);
  }
  std::uint64_t get(Api api, Answer answer) const {
    return counts_[static_cast<std::size_t>(api) * kAnswers + static_cast<std::size_t>(answer)]
        .load(std::memory_order_relaxed);
  }

  // A load of the rule file: published (`ok`) or refused, at Unix time `unix_seconds`.
  void count_load(bool ok, std::int64_t unix_seconds) {
    (ok ? loads_ok_ : loads_error_).fetch_add(1, std::memory_order_relaxed);
    if (!ok) last_error_unix_.store(unix_seconds, std::memory_order_relaxed);
  }
  std::uint64_t loads(bool ok) const {
    return (ok ? loads_ok_ : loads_error_).load(std::memory_order_relaxed);
  }

  // With --rules-from-redis (rule_subscriber.hpp): the latest version published in Redis
  // that the server has seen, and whether Redis answered its last call.
  void set_shared_rules(std::uint64_t published, bool redis_up) {
    published_.store(published, std::memory_order_relaxed);
    redis_up_.store(redis_up, std::memory_order_relaxed);
    shared_.store(true, std::memory_order_relaxed);
  }
  std::uint64_t shared_rules_published() const {
    return published_.load(std::memory_order_relaxed);
  }
  // With shared rules: the digests of the rule set in force and of the published one
  // (shared_rules.hpp rules_digest; 0: none), the published version refused as another
  // digest at or below the applied version (0: none), and one more such refusal.
  void set_shared_digests(std::uint64_t applied, std::uint64_t published) {
    applied_digest_.store(applied, std::memory_order_relaxed);
    published_digest_.store(published, std::memory_order_relaxed);
  }
  void set_refused_version(std::uint64_t version) {
    refused_version_.store(version, std::memory_order_relaxed);
  }
  void count_refused() { refused_.fetch_add(1, std::memory_order_relaxed); }

  // quota_server_requests_total{api,answer}, quota_rule_version, quota_config_loads_total
  // {outcome}, quota_config_last_error_timestamp_seconds (0: none), with shared rules
  // quota_rules_published_version, quota_rules_version_lag (published − applied, at
  // least 0), quota_shared_rules_redis_up, quota_rules_refused_total{reason},
  // quota_rules_refused_version and quota_rules_digest_info{rules,digest} (applied, and
  // published unless none is), and the series of `decisions`, Prometheus text.
  std::string render(std::uint64_t rule_version) const {
    static constexpr const char* kApiNames[kApis] = {"grpc", "check", "auth", "json", "settle"};
    static constexpr const char* kAnswerNames[kAnswers] = {
        "ok", "over_limit", "invalid_argument", "not_found", "unavailable", "error"};
    std::string out =
        "# HELP quota_server_requests_total Calls answered, by API and answer.\n"
        "# TYPE quota_server_requests_total counter\n";
    for (std::size_t a = 0; a < kApis; ++a) {
      for (std::size_t b = 0; b < kAnswers; ++b) {
        absl::StrAppend(&out, "quota_server_requests_total{api=\"", kApiNames[a], "\",answer=\"",
                        kAnswerNames[b], "\"} ",
                        counts_[a * kAnswers + b].load(std::memory_order_relaxed), "\n");
      }
    }
    absl::StrAppend(&out,
                    "# HELP quota_rule_version Version of the rule set in force.\n"
                    "# TYPE quota_rule_version gauge\n"
                    "quota_rule_version ",
                    rule_version, "\n");
    absl::StrAppend(
        &out,
        "# HELP quota_config_loads_total Loads of the rule file (start and hot reloads), by "
        "outcome.\n"
        "# TYPE quota_config_loads_total counter\n"
        "quota_config_loads_total{outcome=\"ok\"} ",
        loads_ok_.load(std::memory_order_relaxed), "\nquota_config_loads_total{outcome=\"error\"} ",
        loads_error_.load(std::memory_order_relaxed),
        "\n# HELP quota_config_last_error_timestamp_seconds Unix time of the last refused load "
        "(0: none).\n"
        "# TYPE quota_config_last_error_timestamp_seconds gauge\n"
        "quota_config_last_error_timestamp_seconds ",
        last_error_unix_.load(std::memory_order_relaxed), "\n");
    if (shared_.load(std::memory_order_relaxed)) {
      const std::uint64_t published = published_.load(std::memory_order_relaxed);
      absl::StrAppend(
          &out,
          "# HELP quota_rules_published_version Latest rule version published in Redis that "
          "this server has seen.\n"
          "# TYPE quota_rules_published_version gauge\n"
          "quota_rules_published_version ",
          published,
          "\n# HELP quota_rules_version_lag Published rule version minus the version in "
          "force.\n"
          "# TYPE quota_rules_version_lag gauge\n"
          "quota_rules_version_lag ",
          published > rule_version ? published - rule_version : 0,
          "\n# HELP quota_shared_rules_redis_up 1 when Redis answered the last call for the "
          "shared rules.\n"
          "# TYPE quota_shared_rules_redis_up gauge\n"
          "quota_shared_rules_redis_up ",
          redis_up_.load(std::memory_order_relaxed) ? 1 : 0, "\n");
      absl::StrAppend(
          &out,
          "# HELP quota_rules_refused_total Published rule versions refused, by reason "
          "(digest_mismatch: at or below the version in force, with other rules).\n"
          "# TYPE quota_rules_refused_total counter\n"
          "quota_rules_refused_total{reason=\"digest_mismatch\"} ",
          refused_.load(std::memory_order_relaxed),
          "\n# HELP quota_rules_refused_version The published rule version this server refuses "
          "(0: none).\n"
          "# TYPE quota_rules_refused_version gauge\n"
          "quota_rules_refused_version ",
          refused_version_.load(std::memory_order_relaxed),
          "\n# HELP quota_rules_digest_info Digest of the rule set in force (applied) and of "
          "the published one (FNV-1a 64 of format and text).\n"
          "# TYPE quota_rules_digest_info gauge\n");
      const auto digest_line = [&out](const char* rules, std::uint64_t digest) {
        if (digest == 0) return;
        absl::StrAppend(&out, "quota_rules_digest_info{rules=\"", rules, "\",digest=\"",
                        absl::Hex(digest, absl::kZeroPad16), "\"} 1\n");
      };
      digest_line("applied", applied_digest_.load(std::memory_order_relaxed));
      digest_line("published", published_digest_.load(std::memory_order_relaxed));
    }
    absl::StrAppend(&out,
                    "# HELP quota_attempts_total Checks with an attempt id answered by the "
                    "attempt's recorded decision (replayed) or past their deadline (expired).\n"
                    "# TYPE quota_attempts_total counter\n"
                    "quota_attempts_total{outcome=\"replayed\"} ",
                    attempts_replayed_.load(std::memory_order_relaxed),
                    "\nquota_attempts_total{outcome=\"expired\"} ",
                    attempts_expired_.load(std::memory_order_relaxed), "\n");
    absl::StrAppend(&out,
                    "# HELP quota_settles_total Settles of estimates' tickets, by outcome.\n"
                    "# TYPE quota_settles_total counter\n");
    for (std::size_t o = 0; o < kSettleOutcomes; ++o) {
      absl::StrAppend(&out, "quota_settles_total{outcome=\"", kSettleNames[o], "\"} ",
                      settles_[o].load(std::memory_order_relaxed), "\n");
    }
    absl::StrAppend(&out,
                    "# HELP quota_settle_surplus_units_total Units of estimates given back by "
                    "settles (estimate above the actual).\n"
                    "# TYPE quota_settle_surplus_units_total counter\n"
                    "quota_settle_surplus_units_total ",
                    surplus_units_.load(std::memory_order_relaxed),
                    "\n# HELP quota_settle_deficit_units_total Units by which actuals exceeded "
                    "their estimates.\n"
                    "# TYPE quota_settle_deficit_units_total counter\n"
                    "quota_settle_deficit_units_total ",
                    deficit_units_.load(std::memory_order_relaxed), "\n");
    absl::StrAppend(&out, decisions.render());
    return out;
  }

  DecisionStats decisions;

 private:
  enum : std::size_t {
    kSettleApplied,
    kSettleAlreadySettled,
    kSettleExpired,
    kSettleUnknown,
    kSettleInvalid,
    kSettleError,
    kSettleOutcomes
  };
  static constexpr const char* kSettleNames[kSettleOutcomes] = {
      "applied", "already_settled", "expired", "unknown", "invalid", "error"};

  std::array<std::atomic<std::uint64_t>, kApis * kAnswers> counts_{};
  std::array<std::atomic<std::uint64_t>, kSettleOutcomes> settles_{};
  std::atomic<std::uint64_t> surplus_units_{0};
  std::atomic<std::uint64_t> deficit_units_{0};
  std::atomic<std::uint64_t> loads_ok_{0};
  std::atomic<std::uint64_t> loads_error_{0};
  std::atomic<std::int64_t> last_error_unix_{0};
  std::atomic<bool> shared_{false};
  std::atomic<std::uint64_t> published_{0};
  std::atomic<bool> redis_up_{false};
  std::atomic<std::uint64_t> applied_digest_{0};
  std::atomic<std::uint64_t> published_digest_{0};
  std::atomic<std::uint64_t> refused_version_{0};
  std::atomic<std::uint64_t> refused_{0};
  std::atomic<std::uint64_t> attempts_replayed_{0};
  std::atomic<std::uint64_t> attempts_expired_{0};
};

// Times one call, from its construction to its destruction, into the decision-latency
// histogram of `stats`.
class TimedCall {
 public:
  explicit TimedCall(ServerStats& stats) : stats_(stats), start_(SteadyClock{}.now()) {}
  TimedCall(const TimedCall&) = delete;
  TimedCall& operator=(const TimedCall&) = delete;
  ~TimedCall() { stats_.decisions.observe_latency(SteadyClock{}.now() - start_); }

 private:
  ServerStats& stats_;
  Nanos start_;
};

}  // namespace quota::server
