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

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/flags/flag.h"
#include "common/cli.hpp"
#include "quota/units.hpp"

ABSL_FLAG(std::string, rules, "", "the YAML rule file (required)");
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
ABSL_FLAG(std::int64_t, max_keys, 10'000'000, "the most budget keys kept in memory");

namespace quota::server {

inline constexpr const char* kUsage = R"(usage: quota-server --rules PATH [flags]

A rate limit service for gateways, deciding with quota's in-process Gateway from a YAML
rule file (docs/gateway.md "Rule files"; docs/service.md for the service):
  gRPC  envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit (Envoy's RLS v3)
  HTTP  POST /v1/check (JSON), GET /v1/auth (nginx auth_request),
        GET /healthz, /readyz, /metrics (Prometheus)

Flags (--flag VALUE or --flag=VALUE):
  --rules PATH          the YAML rule file (required)
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
  --help                this text

Prints "grpc listening on HOST:PORT" and "http listening on HOST:PORT" once serving;
SIGTERM or SIGINT stops it (in-flight calls finish first).
)";

enum class RulesFormat { kAuto, kQuota, kEnvoy };

struct Options {
  std::string rules_path;
  RulesFormat rules_format = RulesFormat::kAuto;
  std::string domain = "quota";
  std::string host = "127.0.0.1";
  int grpc_port = 8081;
  int http_port = 8080;
  std::string default_plan;
  std::string default_route;
  std::int64_t max_cost = 1'000'000;
  std::int64_t max_keys = 10'000'000;
  std::string redis_host;  // empty: in process
  int redis_port = 0;
  bool redis_cluster = false;
  std::int64_t redis_deadline_ms = 50;
  std::int64_t redis_connections = 8;
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

// The command line as Options; exits 0 after --help, 2 on a usage error (also when
// --rules is missing).
inline Options parse_options(int argc, char** argv) {
  using quota::cli::integer;
  const auto non_empty = [](std::string flag) {
    return quota::cli::custom(std::move(flag), "a non-empty value",
                              [](std::string_view v) { return !v.empty(); });
  };
  quota::cli::parse(
      {.name = "quota-server",
       .usage = kUsage,
       .checks = {integer("grpc_port", 0, 65535), integer("http_port", 0, 65535),
                  integer("max_cost", 1, kMaxUnits), integer("max_keys", 1, 1'000'000'000),
                  non_empty("rules"), non_empty("domain"), non_empty("host"),
                  integer("redis_deadline_ms", 1, 60'000), integer("redis_connections", 1, 1024),
                  quota::cli::custom(
                      "redis", "HOST:PORT",
                      [](std::string_view v) { return split_host_port(v, nullptr, nullptr); }),
                  quota::cli::custom(
                      "redis_cluster", "HOST:PORT",
                      [](std::string_view v) { return split_host_port(v, nullptr, nullptr); }),
                  quota::cli::custom("rules_format", "auto, quota or envoy",
                                     [](std::string_view v) {
                                       return v == "auto" || v == "quota" || v == "envoy";
                                     })}},
      argc, argv);
  const std::string format = absl::GetFlag(FLAGS_rules_format);
  Options o{.rules_path = absl::GetFlag(FLAGS_rules),
            .rules_format = format == "quota"   ? RulesFormat::kQuota
                            : format == "envoy" ? RulesFormat::kEnvoy
                                                : RulesFormat::kAuto,
            .domain = absl::GetFlag(FLAGS_domain),
            .host = absl::GetFlag(FLAGS_host),
            .grpc_port = static_cast<int>(absl::GetFlag(FLAGS_grpc_port)),
            .http_port = static_cast<int>(absl::GetFlag(FLAGS_http_port)),
            .default_plan = absl::GetFlag(FLAGS_default_plan),
            .default_route = absl::GetFlag(FLAGS_default_route),
            .max_cost = absl::GetFlag(FLAGS_max_cost),
            .max_keys = absl::GetFlag(FLAGS_max_keys),
            .redis_host = {},
            .redis_port = 0,
            .redis_cluster = false,
            .redis_deadline_ms = absl::GetFlag(FLAGS_redis_deadline_ms),
            .redis_connections = absl::GetFlag(FLAGS_redis_connections)};
  const std::string redis = absl::GetFlag(FLAGS_redis);
  const std::string cluster = absl::GetFlag(FLAGS_redis_cluster);
  if (!redis.empty() && !cluster.empty()) {
    quota::cli::usage_error("quota-server", "--redis and --redis-cluster exclude each other");
  }
  o.redis_cluster = !cluster.empty();
  if (!redis.empty() || !cluster.empty()) {
    split_host_port(o.redis_cluster ? cluster : redis, &o.redis_host, &o.redis_port);
  }
  if (o.rules_path.empty())
    quota::cli::usage_error("quota-server", "--rules PATH is required (see --help)");
  return o;
}

}  // namespace quota::server
