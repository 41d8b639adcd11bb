// examples/quota_server/rules/rules_admin.hpp — the subcommands on the shared rules:
// `quota-server publish` and `quota-server instances` (options.hpp kPublishUsage,
// kInstancesUsage), and the Loader a --rules-from-redis server builds a published text
// with.
//
// publish(): the rule file is read and validated whole with the server's own parser
// (rule_source.hpp build_server_rules) before Redis is asked anything, so an invalid file
// is refused with the server's error (file:line:column: field) and nothing is stored (an
// envoyproxy/ratelimit file also when a limit is outside what Redis keeps).
// Then it is validated again as the successor of the version published (a `version:` in
// the file must be greater, as on a hot reload; without one it gets the published + 1)
// and stored, with its digest, with a compare-and-set on that version
// (SharedRules::publish); when another publish got in between, the validation and the
// store are tried again (at most kPublishAttempts times). The version stored is the rule
// set's own version, so a server that applies it reports the same number everywhere.
// Published, it is compared with the heartbeats: a server that applied this version or a
// later one with other rules will refuse it (Redis lost what was published before), and
// publish says so on stderr, naming the --force-version that replaces them.
//
// publish --force-version N: the recovery. The rule set is stored as version N (a
// `version:` in the file must be N), which must be above the published version and above
// every heartbeat's applied version, so every server applies it.
//
// instances(): the published version and digest, the heartbeats, one line each, sorted
// by instance id, and how many of them applied the published rules (that version and
// digest).
//
// Thread safety: run once, from main.
//
//   const Options o = parse_options(argc, argv);   // "publish --rules r.yaml --redis ..."
//   return quota::server::run_publish(o);          // exit code
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "backend/checker.hpp"
#include "config/options.hpp"
#include "quota/gateway/metrics.hpp"
#include "rules/shared_rules.hpp"

namespace quota::server {

inline constexpr int kPublishAttempts = 5;

// The deadline of one call on the shared rules (a rule text is larger than a decision's
// arguments, and no request waits on it).
inline constexpr std::chrono::milliseconds kSharedRulesDeadline{1000};

inline const char* format_name(RulesFormat f) {
  return f == RulesFormat::kEnvoy ? "envoy" : "quota";
}

// Where a published text came from, as its errors name it.
inline std::string published_origin(const SharedRules& shared, std::uint64_t version) {
  return absl::StrCat("redis ", shared.rules_key(), " version ", version);
}

// The rules of `p` as version p.version (the Loader of RuleSubscriber), counting into
// `metrics`: an unknown format, a text the parser refuses or another version is an error.
absl::StatusOr<LoadedRules> build_published_rules(const SharedRules& shared,
                                                  const PublishedRules& p,
                                                  gateway::Metrics& metrics);

// --force-version `forced`: above the `published` version and every heartbeat's applied
// one; else kFailedPrecondition naming the version it is not above.
absl::Status check_forced_version(SharedRules& shared, std::uint64_t forced,
                                  std::uint64_t published);

// After `published` was stored: a warning on stderr for each server that will refuse it
// (it applied that version or a later one, with other rules), naming the --force-version
// that replaces them. A Redis that cannot list the heartbeats now is not a failure of
// the publish: nothing is written.
void warn_of_refusals(SharedRules& shared, RulesId published);

// `quota-server publish` and `quota-server instances` (see the top of this file): the
// process's exit code.
int run_publish(const Options& o);
int run_instances(const Options& o);

}  // namespace quota::server
