// examples/quota_server/rules/rule_sources.hpp — where quota-server's rules come from, and how
// it follows them while it runs: one interface, two sources.
//
// A RuleSource loads the rules a server starts with and, once started, installs each
// later version in the Checker until stopped:
//   - FileRules (--rules PATH): the file, read and built by rule_source.hpp, hot
//     reloaded by rule_watcher.hpp;
//   - RedisRules (--rules-from-redis): the version published in Redis
//     (shared_rules.hpp; built by rules_admin.hpp), followed by rule_subscriber.hpp, which
//     also announces the server in the instances list.
// Every version, the first and each later one, must pass the store's check
// (store_check(): with --redis-failover-safety, failover_safety_rules.hpp). At start a
// failure of load() or of the check stops the server (main() exits 1 or 2); later, the
// version is refused and the rules in force stay (counted on /metrics).
//
// Thread safety: load() and start() once, from one thread; stop() from the thread that
// started it. The followers run on threads of their own (rule_watcher.hpp,
// rule_subscriber.hpp).
//
//   auto source = quota::server::make_rule_source(options, metrics, store_check(options));
//   auto rules = source->load();                 // the rules at start, or why not
//   quota::server::Checker checker(rules->rules, {...});
//   source->start(checker, stats, "127.0.0.1:8080");
//   ...
//   source->stop();
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "backend/checker.hpp"
#include "config/options.hpp"
#include "quota/gateway/metrics.hpp"
#include "rules/rule_subscriber.hpp"
#include "rules/rule_watcher.hpp"
#include "rules/shared_rules.hpp"
#include "stats/server_stats.hpp"

namespace quota::server {

// Whether the store can decide `rules` (their text `text`, named `origin` in errors).
using StoreCheck = std::function<absl::Status(const LoadedRules& rules, std::string_view text,
                                              std::string_view origin)>;

// The check the options ask for: with --redis-failover-safety no sliding_log rule
// (failover_safety_rules.hpp); otherwise every rule set the Checker takes.
StoreCheck store_check(const Options& o);

// The rules a server starts with, and the text and name their errors quote.
struct StartRules {
  LoadedRules rules;
  std::string text;
  std::string text_origin;
};

class RuleSource {
 public:
  virtual ~RuleSource() = default;
  // The rules in force at start; an error names the file (line, column, field) or the
  // published version. The store's check is the caller's (its exit code differs).
  virtual absl::StatusOr<StartRules> load() = 0;
  // Where the rules come from: the file's path, or the Redis key they are published under.
  virtual std::string origin() const = 0;
  // Installs each later version in `checker` until stop(). `address`: where this server
  // serves HTTP (announced with the published rules).
  virtual void start(Checker& checker, ServerStats& stats, std::string address) = 0;
  virtual void stop() = 0;
};

// --rules PATH, hot reloaded (rule_watcher.hpp).
class FileRules final : public RuleSource {
 public:
  FileRules(const Options& o, gateway::Metrics& metrics, StoreCheck check);

  absl::StatusOr<StartRules> load() override;
  std::string origin() const override { return path_; }

  void start(Checker& checker, ServerStats& stats, std::string address) override;
  void stop() override;

 private:
  std::string path_;
  RulesFormat format_;  // --rules-format; auto is decided by the file at load()
  gateway::Metrics& metrics_;
  StoreCheck check_;
  std::string text_;  // the text the rules in force at start were built from
  std::unique_ptr<RuleWatcher> watcher_;
};

// --rules-from-redis: the version published in Redis, followed (rule_subscriber.hpp).
class RedisRules final : public RuleSource {
 public:
  RedisRules(const Options& o, gateway::Metrics& metrics, StoreCheck check);

  absl::StatusOr<StartRules> load() override;
  std::string origin() const override { return shared_.rules_key(); }

  void start(Checker& checker, ServerStats& stats, std::string address) override;
  void stop() override;

 private:
  SharedRules shared_;
  std::string instance_id_;
  gateway::Metrics& metrics_;
  StoreCheck check_;
  std::uint64_t digest_ = 0;  // of the version in force at start
  std::unique_ptr<RuleSubscriber> subscriber_;
};

// The source the options name: Redis with --rules-from-redis, else the file.
std::unique_ptr<RuleSource> make_rule_source(const Options& o, gateway::Metrics& metrics,
                                             StoreCheck check);

}  // namespace quota::server
