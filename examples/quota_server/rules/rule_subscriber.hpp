// examples/quota_server/rules/rule_subscriber.hpp — --rules-from-redis: quota-server follows
// the rule set published in Redis (shared_rules.hpp) and says which version it applied.
//
// A RuleSubscriber polls the published version and digest (every 250 ms by default: one
// small script call that returns the text only when either changed). A version above
// the one applied is built whole by the Loader as that version (its text was validated
// whole when it was published) and made the rules in force with Checker::publish,
// atomically, as a hot reload of a file is (rule_watcher.hpp): a check sees the old set
// or the new one. A text this server cannot use — a format it does not know, the other
// format than the one it started with, a text its parser refuses, a text that does not
// match its digest — changes nothing: the rules in force stay, the error is written to
// stderr once per version and counted (quota_config_loads_total{outcome="error"}).
//
// A version at or below the one applied is what Redis shows after it lost its data and
// publishing started again. With the applied digest it is the same rules and nothing
// happens; with another digest it is refused, loudly: the rules in force stay, stderr
// says so once per published version and digest, /metrics counts it
// (quota_rules_refused_total{reason="digest_mismatch"}) and shows it while it lasts
// (quota_rules_refused_version), and the heartbeat carries it, so `quota-server
// instances` lists it. `quota-server publish --force-version N` (N above every applied
// version) ends it. Nothing published at all (version 0) is written to stderr once.
//
// Every second (and after each version applied or refused) the subscriber writes its
// heartbeat — instance id → applied version and digest, the version refused, Redis's
// time, the HTTP address. A Redis that cannot answer changes nothing either: the rules
// in force stay, the first failure of an outage and the recovery are written to stderr,
// and /metrics says quota_shared_rules_redis_up 0. ServerStats carries the published
// version and both digests, so /metrics has quota_rules_published_version,
// quota_rules_version_lag (published − applied, at least 0) and quota_rules_digest_info.
//
// Thread safety: start() runs the polls on a thread of the subscriber; stop() (or the
// destructor) ends it. poll_once() is for a caller without that thread; not both.
//
//   quota::server::RuleSubscriber sub(shared, checker, started.digest, loader, stats,
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
#include "backend/checker.hpp"
#include "rules/shared_rules.hpp"
#include "stats/server_stats.hpp"

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

  // `checker` decides with the published version checker.rule_version(), whose digest is
  // `applied_digest` (PublishedRules::digest of the text it was built from).
  RuleSubscriber(SharedRules& shared, Checker& checker, std::uint64_t applied_digest, Loader loader,
                 ServerStats& stats, Identity identity,
                 std::chrono::milliseconds period = std::chrono::milliseconds(250),
                 std::chrono::milliseconds heartbeat_period = std::chrono::seconds(1))
      : shared_(shared),
        checker_(checker),
        loader_(std::move(loader)),
        stats_(stats),
        identity_(std::move(identity)),
        period_(period),
        heartbeat_period_(heartbeat_period),
        applied_{.version = checker.rule_version(), .digest = applied_digest},
        seen_(applied_) {
    stats_.set_shared_rules(applied_.version, true);
    stats_.set_shared_digests(applied_.digest, applied_.digest);
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
    auto latest = shared_.fetch(seen_);
    if (!latest.ok()) return unreachable(latest.status());
    reachable();
    stats_.set_shared_rules(latest->version, true);
    stats_.set_shared_digests(applied_.digest, latest->digest);
    const RulesId published{.version = latest->version, .digest = latest->digest};
    if (published != seen_) {
      seen_ = published;
      follow(*latest);
      beat_now = true;
    }
    if (!beat_now) return;
    absl::Status s = shared_.heartbeat({.id = identity_.id,
                                        .applied = applied_.version,
                                        .address = identity_.address,
                                        .digest = applied_.digest,
                                        .refused = refused_});
    if (!s.ok()) return unreachable(s);
    next_beat_ = std::chrono::steady_clock::now() + heartbeat_period_;
  }

 private:
  static std::int64_t unix_seconds() {
    return std::chrono::duration_cast<std::chrono::seconds>(
               std::chrono::system_clock::now().time_since_epoch())
        .count();
  }

  // What the published rules, other than the ones last seen, make of the rules in force:
  // nothing (none published, or the applied rules again), the new version, or a refusal.
  void follow(const PublishedRules& published) {
    if (published.version == 0) {
      set_refused({});
      std::fprintf(stderr,
                   "quota-server: shared rules: nothing is published under %s (version %llu "
                   "stays in force; Redis may have lost its data)\n",
                   shared_.rules_key().c_str(), static_cast<unsigned long long>(applied_.version));
    } else if (published.version > applied_.version) {
      apply(published);
      set_refused({});  // a version this server cannot use is counted as a load error
    } else if (published.digest == applied_.digest) {
      set_refused({});  // the rules in force, whatever their version number
    } else {
      refuse(published);
    }
  }

  // A published version at or below the applied one, with other rules: not applied.
  void refuse(const PublishedRules& published) {
    set_refused({.version = published.version, .digest = published.digest});
    stats_.count_refused();
    std::fprintf(
        stderr,
        "quota-server: shared rules version %llu (digest %s) refused: version %llu "
        "(digest %s) is in force, and a published version at or below it with other "
        "rules means Redis lost the rules published before; publish with "
        "--force-version %llu or above to replace them\n",
        static_cast<unsigned long long>(published.version), digest_hex(published.digest).c_str(),
        static_cast<unsigned long long>(applied_.version), digest_hex(applied_.digest).c_str(),
        static_cast<unsigned long long>(applied_.version + 1));
  }

  void set_refused(RulesId refused) {
    refused_ = refused;
    stats_.set_refused_version(refused.version);
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
                   static_cast<unsigned long long>(applied_.version),
                   std::string(s.message()).c_str());
      return false;
    }
    applied_ = {.version = published.version, .digest = published.digest};
    stats_.count_load(true, unix_seconds());
    stats_.set_shared_digests(applied_.digest, published.digest);
    std::fprintf(stderr, "quota-server: shared rules version %llu (digest %s) applied\n",
                 static_cast<unsigned long long>(applied_.version),
                 digest_hex(applied_.digest).c_str());
    return true;
  }

  void unreachable(const absl::Status& s) {
    stats_.set_shared_rules(stats_.shared_rules_published(), false);
    if (!down_) {
      std::fprintf(stderr,
                   "quota-server: shared rules: redis cannot answer (version %llu stays in "
                   "force): %s\n",
                   static_cast<unsigned long long>(applied_.version),
                   std::string(s.message()).c_str());
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
  RulesId applied_;    // the rules in force
  RulesId seen_;       // the published rules last read (applied, refused or not usable)
  RulesId refused_{};  // the published rules refused while they stay published (0: none)
  bool down_ = false;
  std::chrono::steady_clock::time_point next_beat_{};
  std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace quota::server
