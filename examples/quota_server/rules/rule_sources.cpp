// examples/quota_server/rules/rule_sources.cpp — the definitions of rule_sources.hpp: the
// rule file, hot reloaded, and the rules published in Redis, followed.
#include "rules/rule_sources.hpp"

#include <utility>

#include "absl/strings/str_cat.h"
#include "rules/failover_safety_rules.hpp"
#include "rules/rule_source.hpp"
#include "rules/rules_admin.hpp"

namespace quota::server {

StoreCheck store_check(const Options& o) {
  if (!o.redis_failover_safety) {
    return [](const LoadedRules&, std::string_view, std::string_view) { return absl::OkStatus(); };
  }
  return check_failover_safety_rules;
}

FileRules::FileRules(const Options& o, gateway::Metrics& metrics, StoreCheck check)
    : path_(o.rules_path), format_(o.rules_format), metrics_(metrics), check_(std::move(check)) {}

absl::StatusOr<StartRules> FileRules::load() {
  auto text = read_rule_text(path_);
  if (!text.ok()) return text.status();
  format_ = resolve_format(format_, *text);
  auto rules = build_server_rules(format_, 0, *text, path_, metrics_);
  if (!rules.ok()) return rules.status();
  text_ = *text;
  return StartRules{.rules = *std::move(rules), .text = *std::move(text), .text_origin = path_};
}

void FileRules::start(Checker& checker, ServerStats& stats, std::string /*address*/) {
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

void FileRules::stop() {
  if (watcher_ != nullptr) watcher_->stop();
}

RedisRules::RedisRules(const Options& o, gateway::Metrics& metrics, StoreCheck check)
    : shared_(make_redis_connections(o, 1, kSharedRulesDeadline), o.rules_key),
      instance_id_(o.instance_id),
      metrics_(metrics),
      check_(std::move(check)) {}

absl::StatusOr<StartRules> RedisRules::load() {
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

void RedisRules::start(Checker& checker, ServerStats& stats, std::string address) {
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

void RedisRules::stop() {
  if (subscriber_ != nullptr) subscriber_->stop();
}

std::unique_ptr<RuleSource> make_rule_source(const Options& o, gateway::Metrics& metrics,
                                             StoreCheck check) {
  if (o.rules_from_redis) return std::make_unique<RedisRules>(o, metrics, std::move(check));
  return std::make_unique<FileRules>(o, metrics, std::move(check));
}

}  // namespace quota::server
