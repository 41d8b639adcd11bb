// examples/quota_server/rules/rules_admin.cpp — the definitions of rules_admin.hpp: the
// subcommands publish and instances, and the published rules' Loader.
#include "rules/rules_admin.hpp"

#include <algorithm>
#include <cstdio>
#include <limits>

#include "backend/redis_backend.hpp"
#include "rules/rule_source.hpp"

namespace quota::server {

absl::StatusOr<LoadedRules> build_published_rules(const SharedRules& shared,
                                                  const PublishedRules& p,
                                                  gateway::Metrics& metrics) {
  const std::string origin = published_origin(shared, p.version);
  if (p.format != "quota" && p.format != "envoy") {
    return absl::InvalidArgumentError(
        absl::StrCat(origin, ": format \"", p.format, "\" is not one this server reads"));
  }
  if (p.version == 0) return absl::DataLossError(absl::StrCat(origin, ": version 0"));
  if (rules_digest(p.format, p.text) != p.digest) {
    return absl::DataLossError(
        absl::StrCat(origin, ": the text does not match its digest ", digest_hex(p.digest)));
  }
  auto rules = build_server_rules(p.format == "envoy" ? RulesFormat::kEnvoy : RulesFormat::kQuota,
                                  p.version - 1, p.text, origin, metrics);
  if (rules.ok() && rules->version() != p.version) {
    return absl::DataLossError(absl::StrCat(origin, ": the text says version ", rules->version()));
  }
  return rules;
}

absl::Status check_forced_version(SharedRules& shared, std::uint64_t forced,
                                  std::uint64_t published) {
  if (forced <= published) {
    return absl::FailedPreconditionError(absl::StrCat(
        "--force-version ", forced, " is not above the published version ", published));
  }
  auto list = shared.instances();
  if (!list.ok()) return list.status();
  for (const InstanceEntry& e : list->instances) {
    if (e.beat.applied >= forced) {
      return absl::FailedPreconditionError(absl::StrCat("--force-version ", forced,
                                                        " is not above version ", e.beat.applied,
                                                        ", which ", e.beat.id, " has applied"));
    }
  }
  return absl::OkStatus();
}

void warn_of_refusals(SharedRules& shared, RulesId published) {
  auto list = shared.instances();
  if (!list.ok()) return;
  std::uint64_t highest = 0;
  for (const InstanceEntry& e : list->instances) highest = std::max(highest, e.beat.applied);
  for (const InstanceEntry& e : list->instances) {
    if (e.beat.applied < published.version || e.beat.digest == published.digest) continue;
    std::fprintf(stderr,
                 "quota-server publish: warning: %s has applied version %llu (digest %s) and "
                 "refuses version %llu with other rules (did Redis lose the rules published "
                 "before?); publish with --force-version %llu to replace them\n",
                 e.beat.id.c_str(), static_cast<unsigned long long>(e.beat.applied),
                 digest_hex(e.beat.digest).c_str(),
                 static_cast<unsigned long long>(published.version),
                 static_cast<unsigned long long>(highest + 1));
  }
}

int run_publish(const Options& o) {
  auto text = read_rule_text(o.rules_path);
  const RulesFormat format = resolve_format(o.rules_format, text.ok() ? *text : "");
  gateway::Metrics metrics;
  absl::Status refused = text.status();
  // The whole file first, before Redis (0 in force: any `version:` passes here; it is
  // checked against the published one below).
  if (refused.ok()) {
    auto built = build_server_rules(format, 0, *text, o.rules_path, metrics);
    refused = built.status();
    // The servers keep the budgets in Redis: every limit must be one Redis can keep.
    if (built.ok() && built->envoy != nullptr) {
      if (auto s = check_envoy_for_redis(*built->envoy); !s.ok()) {
        refused = absl::InvalidArgumentError(absl::StrCat(o.rules_path, ": ", s.message()));
      }
    }
  }
  if (!refused.ok()) {
    std::fprintf(stderr, "quota-server publish: not published: %s\n",
                 std::string(refused.message()).c_str());
    return 1;
  }
  SharedRules shared(make_redis_connections(o, 1, kSharedRulesDeadline), o.rules_key);
  const std::uint64_t digest = rules_digest(format_name(format), *text);
  absl::Status last;
  for (int attempt = 0; attempt < kPublishAttempts; ++attempt) {
    auto current = shared.fetch(std::numeric_limits<std::uint64_t>::max());
    if (!current.ok()) {
      last = current.status();
      break;
    }
    std::uint64_t in_force = current->version;
    if (o.force_version != 0) {
      last = check_forced_version(shared, o.force_version, current->version);
      if (!last.ok()) break;
      in_force = o.force_version - 1;
    }
    auto next = build_server_rules(format, in_force, *text, o.rules_path, metrics);
    if (!next.ok()) {
      last = next.status();
      break;
    }
    if (o.force_version != 0 && next->version() != o.force_version) {
      last = absl::InvalidArgumentError(absl::StrCat(o.rules_path, ": the file says version ",
                                                     next->version(), ", not --force-version ",
                                                     o.force_version));
      break;
    }
    last = shared.publish(current->version, next->version(), format_name(format), *text);
    if (last.ok()) {
      std::printf("published version %llu (%s) digest %s to %s\n",
                  static_cast<unsigned long long>(next->version()), format_name(format),
                  digest_hex(digest).c_str(), shared.rules_key().c_str());
      std::fflush(stdout);
      warn_of_refusals(shared, {.version = next->version(), .digest = digest});
      return 0;
    }
    if (last.code() != absl::StatusCode::kAborted) break;
  }
  std::fprintf(stderr, "quota-server publish: not published: %s\n",
               std::string(last.message()).c_str());
  return 1;
}

int run_instances(const Options& o) {
  SharedRules shared(make_redis_connections(o, 1, kSharedRulesDeadline), o.rules_key);
  auto list = shared.instances();
  if (!list.ok()) {
    std::fprintf(stderr, "quota-server instances: %s\n",
                 std::string(list.status().message()).c_str());
    return 1;
  }
  std::sort(list->instances.begin(), list->instances.end(),
            [](const InstanceEntry& a, const InstanceEntry& b) { return a.beat.id < b.beat.id; });
  std::printf("published version %llu digest %s\n",
              static_cast<unsigned long long>(list->published),
              digest_hex(list->published_digest).c_str());
  std::size_t agree = 0;
  for (const InstanceEntry& e : list->instances) {
    std::string refused;
    if (e.beat.refused.version != 0) {
      refused = absl::StrCat(" refused version ", e.beat.refused.version, " digest ",
                             digest_hex(e.beat.refused.digest));
    }
    std::printf("%s version %llu age %lld ms %s digest %s%s\n", e.beat.id.c_str(),
                static_cast<unsigned long long>(e.beat.applied), static_cast<long long>(e.age_ms),
                e.beat.address.c_str(), digest_hex(e.beat.digest).c_str(), refused.c_str());
    if (e.beat.applied == list->published && e.beat.digest == list->published_digest) ++agree;
  }
  std::printf("%zu of %zu instances applied the published rules\n", agree, list->instances.size());
  return 0;
}

}  // namespace quota::server
