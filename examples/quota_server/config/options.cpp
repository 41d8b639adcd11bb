// examples/quota_server/config/options.cpp — the definitions of options.hpp: quota-server's
// flags and parse_options().
#include "config/options.hpp"

#include <unistd.h>

#include <chrono>
#include <limits>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "common/cli.hpp"
#include "quota/units.hpp"

ABSL_FLAG(std::string, rules, "", "the YAML rule file (required unless --rules-from-redis)");
ABSL_FLAG(bool, rules_from_redis, false,
          "decide with the rule set published in Redis (quota-server publish)");
ABSL_FLAG(std::string, rules_key, "quota-rules", "the hash tag of the shared rules' keys");
ABSL_FLAG(std::int64_t, force_version, 0,
          "publish: store the rule set as version N, above every server's (0: the next)");
ABSL_FLAG(std::string, instance_id, "",
          "this server's id in its heartbeat and fair-share asks (default HOST:PID)");
ABSL_FLAG(std::string, rules_format, "auto", "auto, quota or envoy (envoyproxy/ratelimit's YAML)");
ABSL_FLAG(std::string, domain, "quota", "the RLS domain this server answers for");
ABSL_FLAG(std::string, host, "127.0.0.1", "address to listen on (gRPC and HTTP)");
ABSL_FLAG(std::int64_t, grpc_port, 8081, "gRPC port; 0 picks a free one");
ABSL_FLAG(std::int64_t, http_port, 8080, "HTTP port; 0 picks a free one");
ABSL_FLAG(std::string, default_plan, "", "plan of a request that names none");
ABSL_FLAG(std::string, default_route, "", "route class of a request that names none");
ABSL_FLAG(std::int64_t, max_cost, 1'000'000, "the largest cost one request may ask for");
ABSL_FLAG(std::int64_t, max_keys, 10'000'000, "the most budget keys kept in memory");
ABSL_FLAG(std::string, admin_token_file, "",
          "file holding the bearer token of the admin API (POST /v1/admin/reserve); none: off");
ABSL_FLAG(std::int64_t, ticket_ttl_s, 600,
          "seconds an estimate's ticket may be settled (POST /v1/settle, Budget/Settle)");
ABSL_FLAG(std::int64_t, fair_share_holders, 1,
          "quota-server processes dividing each fair_share budget (with --redis*)");
ABSL_FLAG(std::string, auth_headers, "tenant,route",
          "the X-Quota-* headers GET /v1/auth reads: tenant, route, plan, user, cost, attempt-id");
ABSL_FLAG(bool, fresh_budgets_at_start, false,
          "in process: start every budget full (a restart then hands out a fresh burst)");
ABSL_FLAG(std::int64_t, http_workers, 16, "threads that run HTTP requests");
ABSL_FLAG(std::int64_t, http_max_connections, 512, "open HTTP connections at most");
ABSL_FLAG(std::int64_t, http_request_timeout_ms, 1000,
          "an HTTP request must arrive whole within this time of its first byte");
ABSL_FLAG(std::int64_t, http_idle_timeout_s, 60, "an idle keep-alive HTTP connection is closed");

namespace quota::server {

std::string default_instance_id() {
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  return absl::StrCat(host, ":", getpid());
}

Options parse_options(int argc, char** argv) {
  Command command = Command::kServe;
  const char* name = "quota-server";
  static const std::string serve_usage = absl::StrCat(kUsageHead, kRedisUsage, kUsageTail);
  const char* usage = serve_usage.c_str();
  if (argc > 1 && std::string_view(argv[1]) == "publish") {
    command = Command::kPublish;
    name = "quota-server publish";
    usage = kPublishUsage;
  } else if (argc > 1 && std::string_view(argv[1]) == "instances") {
    command = Command::kInstances;
    name = "quota-server instances";
    usage = kInstancesUsage;
  }
  if (command != Command::kServe) {
    // The subcommand's name stands in for the program's: its flags follow.
    argv[1] = argv[0];
    --argc;
    ++argv;
  }
  using quota::cli::integer;
  const auto non_empty = [](std::string flag) {
    return quota::cli::custom(std::move(flag), "a non-empty value",
                              [](std::string_view v) { return !v.empty(); });
  };
  std::vector<quota::cli::Check> checks = {
      integer("grpc_port", 0, 65535),
      integer("http_port", 0, 65535),
      integer("max_cost", 1, kMaxUnits),
      integer("max_keys", 1, 1'000'000'000),
      integer("fair_share_holders", 1, 100'000),
      integer("ticket_ttl_s", 1, 86'400),
      integer("force_version", 0, std::numeric_limits<std::int64_t>::max()),
      integer("http_workers", 1, 4096),
      integer("http_max_connections", 1, 1'000'000),
      integer("http_request_timeout_ms", 1, 3'600'000),
      integer("http_idle_timeout_s", 1, 86'400),
      quota::cli::custom("auth_headers",
                         "a comma-separated list of tenant, route, plan, user, cost, "
                         "attempt-id that names tenant",
                         [](std::string_view v) { return auth_headers_of(v).ok(); }),
      non_empty("rules"),
      non_empty("rules_key"),
      non_empty("domain"),
      non_empty("host"),
      quota::cli::custom("rules_format", "auto, quota or envoy", [](std::string_view v) {
        return v == "auto" || v == "quota" || v == "envoy";
      })};
  for (quota::cli::Check& c : redis_flag_checks()) checks.push_back(std::move(c));
  quota::cli::parse({.name = name, .usage = usage, .checks = std::move(checks)}, argc, argv);
  const std::string format = absl::GetFlag(FLAGS_rules_format);
  Options o;
  o.command = command;
  o.rules_path = absl::GetFlag(FLAGS_rules);
  o.rules_from_redis = absl::GetFlag(FLAGS_rules_from_redis);
  o.rules_key = absl::GetFlag(FLAGS_rules_key);
  o.force_version = static_cast<std::uint64_t>(absl::GetFlag(FLAGS_force_version));
  o.instance_id = absl::GetFlag(FLAGS_instance_id);
  if (o.instance_id.empty()) o.instance_id = default_instance_id();
  o.rules_format = format == "quota"   ? RulesFormat::kQuota
                   : format == "envoy" ? RulesFormat::kEnvoy
                                       : RulesFormat::kAuto;
  o.domain = absl::GetFlag(FLAGS_domain);
  o.host = absl::GetFlag(FLAGS_host);
  o.grpc_port = static_cast<int>(absl::GetFlag(FLAGS_grpc_port));
  o.http_port = static_cast<int>(absl::GetFlag(FLAGS_http_port));
  o.default_plan = absl::GetFlag(FLAGS_default_plan);
  o.default_route = absl::GetFlag(FLAGS_default_route);
  o.max_cost = absl::GetFlag(FLAGS_max_cost);
  o.max_keys = absl::GetFlag(FLAGS_max_keys);
  o.fair_share_holders = absl::GetFlag(FLAGS_fair_share_holders);
  o.ticket_ttl_s = absl::GetFlag(FLAGS_ticket_ttl_s);
  if (const std::string file = absl::GetFlag(FLAGS_admin_token_file); !file.empty()) {
    auto token = read_secret_file("--admin-token-file", file);
    if (!token.ok()) quota::cli::usage_error(name, std::string(token.status().message()));
    o.admin_token = *std::move(token);
  }
  o.auth_headers = *auth_headers_of(absl::GetFlag(FLAGS_auth_headers));
  o.fresh_budgets_at_start = absl::GetFlag(FLAGS_fresh_budgets_at_start);
  o.http.workers = static_cast<int>(absl::GetFlag(FLAGS_http_workers));
  o.http.max_connections = static_cast<int>(absl::GetFlag(FLAGS_http_max_connections));
  o.http.request_timeout = std::chrono::milliseconds(absl::GetFlag(FLAGS_http_request_timeout_ms));
  o.http.idle_timeout = std::chrono::seconds(absl::GetFlag(FLAGS_http_idle_timeout_s));
  static_cast<RedisOptions&>(o) = read_redis_flags(name);
  if (command != Command::kPublish && o.force_version != 0) {
    quota::cli::usage_error(name, "--force-version is a flag of quota-server publish");
  }
  if (command == Command::kServe && o.rules_from_redis && !o.rules_path.empty()) {
    quota::cli::usage_error(name, "--rules and --rules-from-redis exclude each other");
  }
  const bool needs_rules_file =
      command == Command::kPublish || (command == Command::kServe && !o.rules_from_redis);
  if (needs_rules_file && o.rules_path.empty()) {
    quota::cli::usage_error(name, command == Command::kPublish
                                      ? "--rules PATH is required (see --help)"
                                      : "--rules PATH or --rules-from-redis is required "
                                        "(see --help)");
  }
  const bool needs_redis = command != Command::kServe || o.rules_from_redis;
  if (needs_redis && o.redis_mode == RedisMode::kNone) {
    quota::cli::usage_error(
        name, absl::StrCat(command == Command::kServe ? "--rules-from-redis" : "the subcommand",
                           " needs --redis, --redis-cluster or "
                           "--redis-sentinel"));
  }
  if (command == Command::kServe && o.fair_share_holders > 1) {
    // In process each server's budgets are its own: nothing is divided between servers,
    // and ⌊budget / N⌋ would only cut each server's allocator short of its own store.
    if (o.redis_mode == RedisMode::kNone) {
      quota::cli::usage_error(
          name, absl::StrCat("--fair-share-holders ", o.fair_share_holders,
                             " needs --redis, --redis-cluster or --redis-sentinel (in process "
                             "each server's budgets are its own: nothing to divide)"));
    }
    if (o.instance_id.find('|') != std::string::npos) {
      quota::cli::usage_error(name, absl::StrCat("--instance-id \"", o.instance_id,
                                                 "\" names this server in the fair-share "
                                                 "asks: it must not contain '|'"));
    }
  }
  return o;
}

}  // namespace quota::server
