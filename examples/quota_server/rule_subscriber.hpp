// examples/quota_server/rule_subscriber.hpp — --rules-from-redis: quota-server follows
// the rule set published in Redis (shared_rules.hpp) and says which version it applied.
//
// A RuleSubscriber polls the published version (every 250 ms by default: one small
// script call that returns the text only when the version changed). A new version is
// built whole by the Loader as that version (its text was validated whole when it was
// published) and made the rules in force with Checker::publish, atomically, as a hot
// reload of a file is (rule_watcher.hpp): a check sees the old set or the new one. A text
// this server cannot use — a format it does not know, the other format than the one it
// started with, a text its parser refuses — changes nothing: the rules in force stay, the
// error is written to stderr once per version and counted
// (quota_config_loads_total{outcome="error"}). Every second (and after each version
// applied) the subscriber writes its heartbeat — instance id → applied version, Redis's
// time, the HTTP address — which `quota-server instances` lists.
//
// A Redis that cannot answer changes nothing either: the rules in force stay, the first
// failure of an outage and the recovery are written to stderr, and /metrics says
// quota_shared_rules_redis_up 0. ServerStats::set_shared_rules carries the latest
// published version seen, so /metrics has quota_rules_published_version and
// quota_rules_version_lag (published − applied; 0 once applied).
//
// Thread safety: start() runs the polls on a thread of the subscriber; stop() (or the
// destructor) ends it. poll_once() is for a caller without that thread; not both.
//
//   quota::server::RuleSubscriber sub(shared, checker, loader, stats,
//                                     {.id = "host:42", .address = "127.0.0.1:8080"});
//   sub.start();   // ... serve ...
//   sub.stop();
#pragma once

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <utility>

#include "absl/status/statusor.h"
#include "checker.hpp"
#include "server_stats.hpp"
#include "shared_rules.hpp"

namespace quota::server {

class RuleSubscriber {
 public:
  // Builds the rule set of `published` (its version, format and text), without
  // publishing it.
  using Loader = std::function<absl::StatusOr<LoadedRules>(const PublishedRules& published)>;

  struct Identity {
    std::string id{};       // --instance-id
    std::string address{};  // where it serves HTTP, for the operator
  };

  RuleSubscriber(SharedRules& shared, Checker& checker, Loader loader, ServerStats& stats,
                 Identity identity,
                 std::chrono::milliseconds period = std::chrono::milliseconds(250),
                 std::chrono::milliseconds heartbeat_period = std::chrono::seconds(1))
      : shared_(shared),
        checker_(checker),
        loader_(std::move(loader)),
        stats_(stats),
        identity_(std::move(identity)),
        period_(period),
        heartbeat_period_(heartbeat_period),
        applied_(checker.rule_version()),
        attempted_(applied_) {
    stats_.set_shared_rules(applied_, true);
  }
  RuleSubscriber(const RuleSubscriber&) = delete;
  RuleSubscriber& operator=(const RuleSubscriber&) = delete;
  ~RuleSubscriber() { stop(); }

  void start() {
    thread_ = std::thread([this] {
      std::unique_lock lock(mu_);
      do {
        lock.unlock();
        poll_once();
        lock.lock();
      } while (!cv_.wait_for(lock, period_, [this] { return stopping_; }));
    });
  }

  void stop() {
    {
      std::lock_guard lock(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }

  // One poll: a new version applied (or refused), the heartbeat when due.
  void poll_once() {
    bool beat_now = std::chrono::steady_clock::now() >= next_beat_;
    auto latest = shared_.fetch(attempted_);
    if (!latest.ok()) return unreachable(latest.status());
    reachable();
    stats_.set_shared_rules(std::max(latest->version, applied_), true);
    if (latest->version > attempted_ && !latest->text.empty()) {
      attempted_ = latest->version;
      beat_now |= apply(*latest);
    }
    if (!beat_now) return;
    absl::Status s =
        shared_.heartbeat({.id = identity_.id, .applied = applied_, .address = identity_.address});
    if (!s.ok()) return unreachable(s);
    next_beat_ = std::chrono::steady_clock::now() + heartbeat_period_;
  }

 private:
  static std::int64_t unix_seconds() {
    return std::chrono::duration_cast<std::chrono::seconds>(
               std::chrono::system_clock::now().time_since_epoch())
        .count();
  }

  // True when `published` became the rules in force.
  bool apply(const PublishedRules& published) {
    auto set = loader_(published);
    absl::Status s = set.ok() ? checker_.publish(*set) : set.status();
    if (!s.ok()) {
      stats_.count_load(false, unix_seconds());
      std::fprintf(stderr,
                   "quota-server: shared rules version %llu not applied (version %llu stays in "
                   "force): %s\n",
                   static_cast<unsigned long long>(published.version),
                   static_cast<unsigned long long>(applied_), std::string(s.message()).c_str());
      return false;
    }
    applied_ = published.version;
    stats_.count_load(true, unix_seconds());
    std::fprintf(stderr, "quota-server: shared rules version %llu applied\n",
                 static_cast<unsigned long long>(applied_));
    return true;
  }

  void unreachable(const absl::Status& s) {
    stats_.set_shared_rules(stats_.shared_rules_published(), false);
    if (!down_) {
      std::fprintf(stderr,
                   "quota-server: shared rules: redis cannot answer (version %llu stays in "
                   "force): %s\n",
                   static_cast<unsigned long long>(applied_), std::string(s.message()).c_str());
    }
    down_ = true;
  }

  void reachable() {
    if (down_) std::fprintf(stderr, "quota-server: shared rules: redis answers again\n");
    down_ = false;
  }

  SharedRules& shared_;
  Checker& checker_;
  Loader loader_;
  ServerStats& stats_;
  const Identity identity_;
  const std::chrono::milliseconds period_;
  const std::chrono::milliseconds heartbeat_period_;
  std::uint64_t applied_;    // the version in force
  std::uint64_t attempted_;  // the last version applied or refused
  bool down_ = false;
  std::chrono::steady_clock::time_point next_beat_{};
  std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace quota::server
