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

#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "backend/checker.hpp"
#include "config/options.hpp"
#include "quota/gateway/metrics.hpp"
#include "rules/failover_safety_rules.hpp"
#include "rules/rule_source.hpp"
#include "rules/rule_subscriber.hpp"
#include "rules/rule_watcher.hpp"
#include "rules/rules_admin.hpp"
#include "rules/shared_rules.hpp"
#include "stats/server_stats.hpp"

namespace quota::server {

// Whether the store can decide `rules` (their text `text`, named `origin` in errors).
using StoreCheck = std::function<absl::Status(const LoadedRules& rules, std::string_view text,
                                              std::string_view origin)>;

// The check the options ask for: with --redis-failover-safety no sliding_log rule
// (failover_safety_rules.hpp); otherwise every rule set the Checker takes.
inline StoreCheck store_check(const Options& o) {
  if (!o.redis_failover_safety) {
    return [](const LoadedRules&, std::string_view, std::string_view) { return absl::OkStatus(); };
  }
  return check_failover_safety_rules;
}

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
  FileRules(const Options& o, gateway::Metrics& metrics, StoreCheck check)
      : path_(o.rules_path), format_(o.rules_format), metrics_(metrics), check_(std::move(check)) {}

  absl::StatusOr<StartRules> load() override {
    auto text = read_rule_text(path_);
    if (!text.ok()) return text.status();
    format_ = resolve_format(format_, *text);
    auto rules = build_server_rules(format_, 0, *text, path_, metrics_);
    if (!rules.ok()) return rules.status();
    text_ = *text;
    return StartRules{.rules = *std::move(rules), .text = *std::move(text), .text_origin = path_};
  }
  std::string origin() const override { return path_; }

  void start(Checker& checker, ServerStats& stats, std::string /*address*/) override {
    watcher_ = std::make_unique<RuleWatcher>(
        path_, text_, checker,
        [this](std::uint64_t in_force, std::string_view t,
               const std::string& path) -> absl::StatusOr<LoadedRules> {
          auto loaded = build_server_rules(format_, in_force, t, path, metrics_);
          if (!loaded.ok()) return loaded;
          if (auto s = check_(*loaded, t, path); !s.ok()) return s;
          return loaded;
        },
        stats);
    watcher_->start();
  }
  void stop() override {
    if (watcher_ != nullptr) watcher_->stop();
  }

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
  RedisRules(const Options& o, gateway::Metrics& metrics, StoreCheck check)
      : shared_(make_redis_connections(o, 1, kSharedRulesDeadline), o.rules_key),
        instance_id_(o.instance_id),
        metrics_(metrics),
        check_(std::move(check)) {}

  absl::StatusOr<StartRules> load() override {
    auto latest = shared_.fetch(0);
    if (!latest.ok()) {
      return absl::Status(
          latest.status().code(),
          absl::StrCat("cannot read the shared rules from redis: ", latest.status().message()));
    }
    if (latest->version == 0) {
      return absl::NotFoundError(absl::StrCat("no rules are published under ", shared_.rules_key(),
                                              " (quota-server publish)"));
    }
    auto rules = build_published_rules(shared_, *latest, metrics_);
    if (!rules.ok()) return rules.status();
    digest_ = latest->digest;
    return StartRules{.rules = *std::move(rules),
                      .text = latest->text,
                      .text_origin = published_origin(shared_, latest->version)};
  }
  std::string origin() const override { return shared_.rules_key(); }

  void start(Checker& checker, ServerStats& stats, std::string address) override {
    subscriber_ = std::make_unique<RuleSubscriber>(
        shared_, checker, digest_,
        [this](const PublishedRules& p) -> absl::StatusOr<LoadedRules> {
          auto loaded = build_published_rules(shared_, p, metrics_);
          if (!loaded.ok()) return loaded;
          if (auto s = check_(*loaded, p.text, published_origin(shared_, p.version)); !s.ok()) {
            return s;
          }
          return loaded;
        },
        stats, RuleSubscriber::Identity{.id = instance_id_, .address = std::move(address)});
    subscriber_->start();
  }
  void stop() override {
    if (subscriber_ != nullptr) subscriber_->stop();
  }

 private:
  SharedRules shared_;
  std::string instance_id_;
  gateway::Metrics& metrics_;
  StoreCheck check_;
  std::uint64_t digest_ = 0;  // of the version in force at start
  std::unique_ptr<RuleSubscriber> subscriber_;
};

// The source the options name: Redis with --rules-from-redis, else the file.
inline std::unique_ptr<RuleSource> make_rule_source(const Options& o, gateway::Metrics& metrics,
                                                    StoreCheck check) {
  if (o.rules_from_redis) return std::make_unique<RedisRules>(o, metrics, std::move(check));
  return std::make_unique<FileRules>(o, metrics, std::move(check));
}

}  // namespace quota::server
