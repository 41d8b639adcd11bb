// examples/quota_server/rules/rule_watcher.hpp — hot reload: quota-server watches its rule file
// and publishes every valid change.
//
// A RuleWatcher polls the rule file's content (every 200 ms by default; no inotify). A
// content that differs from the last one it loaded — and that read the same at two polls
// in a row, so a file still being written is not taken — is loaded whole by the Loader
// (parsed and validated as the successor of the version in force: in quota's format the
// file's `version:`, which must be greater, else — and always in envoyproxy/ratelimit's —
// the version in force + 1) and published with
// Checker::publish, atomically: a check sees the old set or the new one, never a mix.
// An invalid file (or one that cannot be read) changes nothing: the rules in force stay,
// the error (file:line:column and field) is written to stderr once per change, and the
// refusal is counted (ServerStats::count_load → quota_config_loads_total{outcome="error"},
// quota_config_last_error_timestamp_seconds). A file put back to the content in force is
// not reloaded. Write rule files by renaming a complete file into place.
//
// Thread safety: start() runs the polls on a thread of the watcher; stop() (or the
// destructor) ends it. poll_once() is for a caller without that thread; not both.
//
//   quota::server::RuleWatcher watcher(path, initial_text, checker, loader, stats);
//   watcher.start();   // ... serve ...
//   watcher.stop();
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <utility>

#include "absl/status/statusor.h"
#include "backend/checker.hpp"
#include "quota/gateway/rules/rules.hpp"
#include "quota/rules/rule_file.hpp"
#include "stats/server_stats.hpp"

namespace quota::server {

class RuleWatcher {
 public:
  // Builds the rule set of `text` (the file at `path`) as the successor of version
  // `in_force`, without publishing it.
  using Loader = std::function<absl::StatusOr<LoadedRules>(
      std::uint64_t in_force, std::string_view text, const std::string& path)>;

  // `loaded_text` is the content the rules in force were loaded from.
  RuleWatcher(std::string path, std::string loaded_text, Checker& checker, Loader loader,
              ServerStats& stats, std::chrono::milliseconds period = std::chrono::milliseconds(200))
      : path_(std::move(path)),
        loaded_(std::move(loaded_text)),
        attempted_(loaded_),
        previous_(loaded_),
        checker_(checker),
        loader_(std::move(loader)),
        stats_(stats),
        period_(period) {}
  RuleWatcher(const RuleWatcher&) = delete;
  RuleWatcher& operator=(const RuleWatcher&) = delete;
  ~RuleWatcher() { stop(); }

  void start() {
    thread_ = std::thread([this] {
      std::unique_lock lock(mu_);
      while (!cv_.wait_for(lock, period_, [this] { return stopping_; })) {
        lock.unlock();
        poll_once();
        lock.lock();
      }
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

  // Reads the file once and acts on it (see the top of this file).
  void poll_once() {
    auto text = quota::rules::detail::read_file(path_);
    std::string now_text = text.ok() ? *std::move(text) : std::string();
    const bool stable = text.ok() && now_text == previous_;
    previous_ = now_text;
    if (!text.ok()) {
      // A missing or unreadable file is reported once, then waited out.
      if (!unreadable_) refuse(text.status());
      unreadable_ = true;
      return;
    }
    unreadable_ = false;
    if (!stable || now_text == attempted_) return;
    attempted_ = now_text;
    if (now_text == loaded_) return;  // put back to the rules in force
    auto set = loader_(checker_.rule_version(), now_text, path_);
    absl::Status published = set.ok() ? checker_.publish(*set) : set.status();
    if (!published.ok()) return refuse(published);
    loaded_ = std::move(now_text);
    stats_.count_load(true, unix_seconds());
    std::fprintf(stderr, "quota-server: rules reloaded from %s: version %llu\n", path_.c_str(),
                 static_cast<unsigned long long>(set->version()));
  }

 private:
  static std::int64_t unix_seconds() {
    return std::chrono::duration_cast<std::chrono::seconds>(
               std::chrono::system_clock::now().time_since_epoch())
        .count();
  }

  void refuse(const absl::Status& s) {
    stats_.count_load(false, unix_seconds());
    std::fprintf(stderr, "quota-server: rule file not reloaded (version %llu stays in force): %s\n",
                 static_cast<unsigned long long>(checker_.rule_version()),
                 std::string(s.message()).c_str());
  }

  const std::string path_;
  std::string loaded_;     // the content of the rules in force
  std::string attempted_;  // the last content loaded or refused
  std::string previous_;   // the content read at the previous poll
  bool unreadable_ = false;
  Checker& checker_;
  Loader loader_;
  ServerStats& stats_;
  const std::chrono::milliseconds period_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace quota::server
