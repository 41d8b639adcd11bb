// examples/quota_server/options.hpp — quota-server's command line (abseil flags through
// examples/common/cli.hpp: --help exits 0, an unknown flag or a bad value exits 2).
//
// Options is what main() runs with: where to listen (gRPC and HTTP), the rule file, the
// domain the server answers for, the defaults a descriptor or JSON request may leave out
// (plan, route) and the cap on one request's cost. Every flag is described in kUsage and
// in docs/service.md.
//
// Thread safety: parse_options() sets abseil flags; call it once, from main, first.
//
//   const quota::server::Options o = quota::server::parse_options(argc, argv);
//   // o.rules_path, o.grpc_port, o.http_port, o.domain, ...
#pragma once

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "common/cli.hpp"
#include "quota/units.hpp"

ABSL_FLAG(std::string, rules, "", "the YAML rule file (required unless --rules-from-redis)");
ABSL_FLAG(bool, rules_from_redis, false,
          "decide with the rule set published in Redis (quota-server publish)");
ABSL_FLAG(std::string, rules_key, "quota-rules", "the hash tag of the shared rules' keys");
ABSL_FLAG(std::string, instance_id, "", "this server's id in its heartbeat (default HOST:PID)");
ABSL_FLAG(std::string, rules_format, "auto", "auto, quota or envoy (envoyproxy/ratelimit's YAML)");
ABSL_FLAG(std::string, domain, "quota", "the RLS domain this server answers for");
ABSL_FLAG(std::string, host, "127.0.0.1", "address to listen on (gRPC and HTTP)");
ABSL_FLAG(std::int64_t, grpc_port, 8081, "gRPC port; 0 picks a free one");
ABSL_FLAG(std::int64_t, http_port, 8080, "HTTP port; 0 picks a free one");
ABSL_FLAG(std::string, default_plan, "", "plan of a request that names none");
ABSL_FLAG(std::string, default_route, "", "route class of a request that names none");
ABSL_FLAG(std::int64_t, max_cost, 1'000'000, "the largest cost one request may ask for");
ABSL_FLAG(std::string, redis, "", "HOST:PORT of a Redis holding the budgets (default: in process)");
ABSL_FLAG(std::string, redis_cluster, "", "HOST:PORT of any node of a Redis Cluster instead");
ABSL_FLAG(std::int64_t, redis_deadline_ms, 50,
          "the deadline of one call to Redis: pool wait, connect, send and reply together");
ABSL_FLAG(std::int64_t, redis_connections, 8, "connections to Redis (per node on a cluster)");
ABSL_FLAG(std::string, redis_sentinel, "",
          "HOST:PORT[,HOST:PORT...] of Redis Sentinels naming the primary instead");
ABSL_FLAG(std::string, redis_sentinel_master, "",
          "the name the sentinels monitor the primary under");
ABSL_FLAG(std::string, redis_user, "", "ACL user for Redis AUTH (with --redis-password-file)");
ABSL_FLAG(std::string, redis_password_file, "", "file holding the Redis password (AUTH)");
ABSL_FLAG(std::string, redis_sentinel_password_file, "",
          "file holding the sentinels' password (their requirepass)");
ABSL_FLAG(std::int64_t, redis_breaker_failures, 0,
          "consecutive failures that open a Redis node's circuit breaker; 0: none");
ABSL_FLAG(std::int64_t, redis_breaker_cooldown_ms, 250,
          "how long an open breaker fails calls at once before one probe");
ABSL_FLAG(std::int64_t, redis_max_in_flight, 0, "the most calls to Redis at once; 0: no limit");
ABSL_FLAG(std::int64_t, max_keys, 10'000'000, "the most budget keys kept in memory");

namespace quota::server {

inline constexpr const char* kUsage = R"(usage: quota-server --rules PATH [flags]
       quota-server --rules-from-redis --redis HOST:PORT [flags]
       quota-server publish --rules PATH --redis HOST:PORT [flags]   (publish --help)
       quota-server instances --redis HOST:PORT [flags]              (instances --help)

A rate limit service for gateways, deciding with quota's in-process Gateway from a YAML
rule file (docs/gateway.md "Rule files"; docs/service.md for the service):
  gRPC  envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit (Envoy's RLS v3)
  HTTP  POST /v1/check (JSON), GET /v1/auth (nginx auth_request),
        GET /healthz, /readyz, /metrics (Prometheus)

Flags (--flag VALUE or --flag=VALUE):
  --rules PATH          the YAML rule file (hot reloaded; this or --rules-from-redis)
  --rules-from-redis    decide with the rule set `quota-server publish` put in the Redis
                        of --redis / --redis-cluster / --redis-sentinel, and follow its
                        new versions (within about a second); a heartbeat (instance,
                        version applied) every second, listed by `quota-server instances`
  --rules-key NAME      the hash tag of the shared rules' keys (default quota-rules)
  --instance-id ID      this server's id in its heartbeat (default HOST:PID)
  --rules-format F      quota (docs/gateway.md "Rule files"), envoy (envoyproxy/ratelimit's
                        YAML, docs/service.md) or auto: envoy when the file has a
                        top-level domain or descriptors (default auto)
  --domain NAME         the RLS domain answered; another domain is INVALID_ARGUMENT
                        (default quota; an envoy-format file's own domain instead)
  --host HOST           address to listen on, gRPC and HTTP (default 127.0.0.1)
  --grpc-port N         gRPC port; 0 picks a free one (default 8081)
  --http-port N         HTTP port; 0 picks a free one (default 8080)
  --default-plan NAME   the plan of a request that names none (default: none; then a
                        request must name its plan)
  --default-route NAME  the route class of a request that names none (default: none)
  --max-cost N          the largest cost (hits_addend, "cost") one request may ask for;
                        more is INVALID_ARGUMENT / 400 (default 1000000)
  --max-keys N          the most budget keys kept in memory (default 10000000)
  --redis HOST:PORT     keep the budgets in this Redis, shared by every quota-server
                        on it (default: in process); a Redis that cannot answer gives
                        the route's fail mode (fail closed: UNAVAILABLE / 503)
  --redis-cluster HOST:PORT  the same on a Redis Cluster (any node)
  --redis-deadline-ms N  one call to Redis: pool wait, connect, send and reply (default 50)
  --redis-connections N connections to Redis, per node on a cluster (default 8)
  --redis-sentinel HOST:PORT[,HOST:PORT...]  the same on the primary these Redis
                        Sentinels name (with --redis-sentinel-master), followed across
                        a failover; exactly one of --redis, --redis-cluster and
                        --redis-sentinel
  --redis-sentinel-master NAME  the name the sentinels monitor the primary under
  --redis-user NAME     ACL user for AUTH (default: the default user)
  --redis-password-file PATH  AUTH with the password in this file (one trailing newline
                        dropped); never on the command line. A missing, unreadable or
                        empty file stops the start (exit 2); a rejected AUTH answers
                        UNAVAILABLE / 503 and is logged
  --redis-sentinel-password-file PATH  AUTH on the sentinels (their requirepass) with
                        the password in this file (default: none)
  --redis-breaker-failures N  consecutive failures that open a node's circuit breaker:
                        calls fail at once (the route's fail mode) (default 0: none)
  --redis-breaker-cooldown-ms N  how long an open breaker fails calls before it lets
                        one probe through (default 250)
  --redis-max-in-flight N  the most calls to Redis at once; more fail at once
                        (default 0: no limit)
  --help                this text

Prints "grpc listening on HOST:PORT" and "http listening on HOST:PORT" once serving;
SIGTERM or SIGINT stops it (in-flight calls finish first).
)";

inline constexpr const char* kPublishUsage =
    R"(usage: quota-server publish --rules PATH --redis HOST:PORT [flags]

Validates the rule file whole (the server's parser: an error names file:line:column and
the field, exit 1, nothing published) and stores it in Redis as the next version, which
every quota-server started with --rules-from-redis on that Redis applies within about a
second. Prints "published version N". Flags: --rules, --rules-format, --rules-key and
the server's --redis* flags (--redis, --redis-cluster or --redis-sentinel with
--redis-sentinel-master; AUTH; --redis-deadline-ms). Exit 0 published, 1 refused or
Redis cannot answer, 2 usage error.
)";

inline constexpr const char* kInstancesUsage =
    R"(usage: quota-server instances --redis HOST:PORT [flags]

Lists the servers that follow the shared rules (--rules-from-redis) on this Redis: one
line per heartbeat, "INSTANCE version V age MS ms ADDRESS" after a line "published
version N". A heartbeat is written every second; one older than 60 s is forgotten.
Flags: --rules-key and the server's --redis* flags. Exit 0, 1 when Redis cannot answer,
2 usage error.
)";

// What the command line asks for: serve, or one of the subcommands on the shared rules.
enum class Command { kServe, kPublish, kInstances };

enum class RulesFormat { kAuto, kQuota, kEnvoy };
enum class RedisMode { kNone, kSingle, kCluster, kSentinel };

struct Options {
  Command command = Command::kServe;
  std::string rules_path;
  bool rules_from_redis = false;
  std::string rules_key = "quota-rules";
  std::string instance_id;
  RulesFormat rules_format = RulesFormat::kAuto;
  std::string domain = "quota";
  std::string host = "127.0.0.1";
  int grpc_port = 8081;
  int http_port = 8080;
  std::string default_plan;
  std::string default_route;
  std::int64_t max_cost = 1'000'000;
  std::int64_t max_keys = 10'000'000;
  RedisMode redis_mode = RedisMode::kNone;  // kNone: in process
  std::string redis_host;                   // --redis / --redis-cluster
  int redis_port = 0;
  std::vector<std::pair<std::string, int>> redis_sentinels;  // --redis-sentinel
  std::string redis_sentinel_master;
  std::string redis_user;
  std::string redis_password;           // read from --redis-password-file
  std::string redis_sentinel_password;  // read from --redis-sentinel-password-file
  std::int64_t redis_deadline_ms = 50;
  std::int64_t redis_connections = 8;
  std::int64_t redis_breaker_failures = 0;
  std::int64_t redis_breaker_cooldown_ms = 250;
  std::int64_t redis_max_in_flight = 0;
};

// "HOST:PORT" split; false when it is not that (a port in [1, 65535]).
inline bool split_host_port(std::string_view v, std::string* host, int* port) {
  const std::size_t colon = v.rfind(':');
  if (colon == std::string_view::npos || colon == 0) return false;
  int p = 0;
  const std::string_view digits = v.substr(colon + 1);
  if (digits.empty() || digits.size() > 5) return false;
  for (char c : digits) {
    if (c < '0' || c > '9') return false;
    p = p * 10 + (c - '0');
  }
  if (p < 1 || p > 65535) return false;
  if (host != nullptr) *host = std::string(v.substr(0, colon));
  if (port != nullptr) *port = p;
  return true;
}

// "HOST:PORT[,HOST:PORT...]" split; false when an item is not HOST:PORT.
inline bool split_host_ports(std::string_view v, std::vector<std::pair<std::string, int>>* out) {
  if (v.empty()) return false;
  while (true) {
    const std::size_t comma = v.find(',');
    std::pair<std::string, int> hp;
    if (!split_host_port(v.substr(0, comma), &hp.first, &hp.second)) return false;
    if (out != nullptr) out->push_back(std::move(hp));
    if (comma == std::string_view::npos) return true;
    v.remove_prefix(comma + 1);
  }
}

// The password in the file at `path`: its content without one trailing "\n" (or
// "\r\n"). An error names the file and the reason (missing, unreadable, empty).
inline absl::StatusOr<std::string> read_password_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::InvalidArgumentError(
        absl::StrCat("--redis-password-file ", path, ": cannot read: ", std::strerror(errno)));
  }
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--redis-password-file ", path, ": cannot read: ", std::strerror(errno)));
  }
  if (!text.empty() && text.back() == '\n') text.pop_back();
  if (!text.empty() && text.back() == '\r') text.pop_back();
  if (text.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--redis-password-file ", path, ": the file is empty"));
  }
  if (text.find('\n') != std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("--redis-password-file ", path, ": more than one line"));
  }
  return text;
}

// The command line as Options; exits 0 after --help, 2 on a usage error (also when
// --rules is missing). A first argument "publish" or "instances" names a subcommand.
inline Options parse_options(int argc, char** argv) {
  Command command = Command::kServe;
  const char* name = "quota-server";
  const char* usage = kUsage;
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
  quota::cli::parse(
      {.name = name,
       .usage = usage,
       .checks = {integer("grpc_port", 0, 65535), integer("http_port", 0, 65535),
                  integer("max_cost", 1, kMaxUnits), integer("max_keys", 1, 1'000'000'000),
                  non_empty("rules"), non_empty("rules_key"), non_empty("domain"),
                  non_empty("host"), integer("redis_deadline_ms", 1, 60'000),
                  integer("redis_connections", 1, 1024),
                  quota::cli::custom(
                      "redis", "HOST:PORT",
                      [](std::string_view v) { return split_host_port(v, nullptr, nullptr); }),
                  quota::cli::custom(
                      "redis_cluster", "HOST:PORT",
                      [](std::string_view v) { return split_host_port(v, nullptr, nullptr); }),
                  quota::cli::custom(
                      "redis_sentinel", "HOST:PORT[,HOST:PORT...]",
                      [](std::string_view v) { return split_host_ports(v, nullptr); }),
                  integer("redis_breaker_failures", 0, 1'000'000),
                  integer("redis_breaker_cooldown_ms", 1, 3'600'000),
                  integer("redis_max_in_flight", 0, 1'000'000),
                  quota::cli::custom("rules_format", "auto, quota or envoy",
                                     [](std::string_view v) {
                                       return v == "auto" || v == "quota" || v == "envoy";
                                     })}},
      argc, argv);
  const std::string format = absl::GetFlag(FLAGS_rules_format);
  Options o;
  o.command = command;
  o.rules_path = absl::GetFlag(FLAGS_rules);
  o.rules_from_redis = absl::GetFlag(FLAGS_rules_from_redis);
  o.rules_key = absl::GetFlag(FLAGS_rules_key);
  o.instance_id = absl::GetFlag(FLAGS_instance_id);
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
  o.redis_deadline_ms = absl::GetFlag(FLAGS_redis_deadline_ms);
  o.redis_connections = absl::GetFlag(FLAGS_redis_connections);
  o.redis_breaker_failures = absl::GetFlag(FLAGS_redis_breaker_failures);
  o.redis_breaker_cooldown_ms = absl::GetFlag(FLAGS_redis_breaker_cooldown_ms);
  o.redis_max_in_flight = absl::GetFlag(FLAGS_redis_max_in_flight);
  const std::string redis = absl::GetFlag(FLAGS_redis);
  const std::string cluster = absl::GetFlag(FLAGS_redis_cluster);
  const std::string sentinel = absl::GetFlag(FLAGS_redis_sentinel);
  const std::string master = absl::GetFlag(FLAGS_redis_sentinel_master);
  const std::string user = absl::GetFlag(FLAGS_redis_user);
  const std::string password_file = absl::GetFlag(FLAGS_redis_password_file);
  const int stores = !redis.empty() + !cluster.empty() + !sentinel.empty();
  if (stores > 1) {
    quota::cli::usage_error(name,
                            "--redis, --redis-cluster and --redis-sentinel exclude each other; "
                            "give exactly one");
  }
  if (!sentinel.empty() && master.empty()) {
    quota::cli::usage_error(name,
                            "--redis-sentinel needs --redis-sentinel-master NAME (the name the "
                            "sentinels monitor the primary under)");
  }
  const std::string sentinel_password_file = absl::GetFlag(FLAGS_redis_sentinel_password_file);
  if (sentinel.empty() && !master.empty()) {
    quota::cli::usage_error(name, "--redis-sentinel-master needs --redis-sentinel");
  }
  if (sentinel.empty() && !sentinel_password_file.empty()) {
    quota::cli::usage_error(name, "--redis-sentinel-password-file needs --redis-sentinel");
  }
  if (stores == 0) {
    const std::pair<const char*, bool> needs_redis[] = {
        {"--redis-user", !user.empty()},
        {"--redis-password-file", !password_file.empty()},
        {"--redis-breaker-failures", o.redis_breaker_failures > 0},
        {"--redis-max-in-flight", o.redis_max_in_flight > 0}};
    for (const auto& [flag, set] : needs_redis) {
      if (set) {
        quota::cli::usage_error(
            name, absl::StrCat(flag, " needs --redis, --redis-cluster or --redis-sentinel"));
      }
    }
  }
  if (!user.empty() && password_file.empty()) {
    quota::cli::usage_error(name, "--redis-user needs --redis-password-file");
  }
  o.redis_mode = !redis.empty()      ? RedisMode::kSingle
                 : !cluster.empty()  ? RedisMode::kCluster
                 : !sentinel.empty() ? RedisMode::kSentinel
                                     : RedisMode::kNone;
  if (o.redis_mode == RedisMode::kSingle || o.redis_mode == RedisMode::kCluster) {
    split_host_port(o.redis_mode == RedisMode::kCluster ? cluster : redis, &o.redis_host,
                    &o.redis_port);
  } else if (o.redis_mode == RedisMode::kSentinel) {
    split_host_ports(sentinel, &o.redis_sentinels);
    o.redis_sentinel_master = master;
  }
  o.redis_user = user;
  if (!password_file.empty()) {
    auto password = read_password_file(password_file);
    if (!password.ok()) {
      quota::cli::usage_error(name, std::string(password.status().message()));
    }
    o.redis_password = *std::move(password);
  }
  if (!sentinel_password_file.empty()) {
    auto password = read_password_file(sentinel_password_file);
    if (!password.ok()) {
      quota::cli::usage_error(
          name, absl::StrCat("--redis-sentinel-password-file: ", password.status().message()));
    }
    o.redis_sentinel_password = *std::move(password);
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
  return o;
}

}  // namespace quota::server
