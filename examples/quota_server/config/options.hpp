// examples/quota_server/config/options.hpp — quota-server's command line (abseil flags through
// examples/common/cli.hpp: --help exits 0, an unknown flag or a bad value exits 2).
//
// Options is what main() runs with: where to listen (gRPC and HTTP), the rule file, the
// domain the server answers for, the defaults a descriptor or JSON request may leave out
// (plan, route), the cap on one request's cost, this server's id (--instance-id, default
// HOST:PID) and the servers dividing each fair-share budget (--fair-share-holders: above
// 1 only with Redis, where they exchange their asks, fair_exchange.hpp); the --redis*
// flags are RedisOptions (redis_flags.hpp). Every flag is described in --help (kUsageHead,
// kRedisUsage, kUsageTail) and in docs/service.md.
//
// Thread safety: parse_options() sets abseil flags; call it once, from main, first.
//
//   const quota::server::Options o = quota::server::parse_options(argc, argv);
//   // o.rules_path, o.grpc_port, o.http_port, o.domain, ...
#pragma once

#include <cstdint>
#include <string>

#include "api/http/http_listener.hpp"
#include "config/auth_headers.hpp"
#include "config/redis_flags.hpp"

namespace quota::server {

inline constexpr const char* kUsageHead = R"(usage: quota-server --rules PATH [flags]
       quota-server --rules-from-redis --redis HOST:PORT [flags]
       quota-server publish --rules PATH --redis HOST:PORT [flags]   (publish --help)
       quota-server instances --redis HOST:PORT [flags]              (instances --help)

A rate limit service for gateways, deciding with quota's in-process Gateway from a YAML
rule file (docs/gateway/rules.md "Rule files"; docs/service.md for the service):
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
  --instance-id ID      this server's id in its heartbeat and, with
                        --fair-share-holders above 1, in the fair-share asks it
                        exchanges (no '|'; default HOST:PID)
  --rules-format F      quota (docs/gateway/rules.md "Rule files"), envoy (envoyproxy/ratelimit's
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
  --ticket-ttl-s N      seconds an estimate's ticket may be settled; later it is expired
                        (410 / FAILED_PRECONDITION) with its estimate spent (default 600)
  --admin-token-file PATH  the bearer token (one line) of the admin API: POST
                        /v1/admin/reserve releases a fair-share reserve to a tenant
                        (docs/llm-budgets.md). Without it the admin API is off (404)
  --fair-share-holders N  the quota-server processes dividing each fair_share budget
                        (a global rule's `fair_share:`). Above 1 they exchange each
                        tenant's asks through the Redis of --redis / --redis-cluster /
                        --redis-sentinel, which it needs, and share the budget by them
                        (a period whose exchange fails: budget / N here) (default 1:
                        each server divides the budget among its own tenants only)
  --auth-headers LIST   the X-Quota-* request headers GET /v1/auth reads, of tenant,
                        route, plan, user, cost, attempt-id (X-Quota-Attempt-Id); the
                        others are ignored: a header the gateway does not set itself
                        is the client's, and a client must not pick its own plan, cost
                        or attempt (docs/deploying.md) (default tenant,route)
  --fresh-budgets-at-start  in process: start every budget full. Without it a budget
                        first used after the start begins spent at the start and refills
                        from there, so a restart admits nothing the contract would not
                        have admitted over both lives (default off)
  --http-workers N      threads that run HTTP requests; an idle connection holds none
                        (default 16)
  --http-max-connections N  open HTTP connections at most; one more is closed at once
                        (default 512)
  --http-request-timeout-ms N  a request (head and body) must arrive whole within N ms
                        of its first byte, else its connection is closed; a body declared
                        over 8 KiB is answered 400 unread (default 1000)
  --http-idle-timeout-s N  a keep-alive connection idle this long is closed (default 60)
)";

inline constexpr const char* kUsageTail = R"(  --help                this text

Prints "grpc listening on HOST:PORT" and "http listening on HOST:PORT" once serving;
SIGTERM or SIGINT stops it (in-flight calls finish first).
)";

inline constexpr const char* kPublishUsage =
    R"(usage: quota-server publish --rules PATH --redis HOST:PORT [flags]

Validates the rule file whole (the server's parser: an error names file:line:column and
the field, exit 1, nothing published) and stores it in Redis as the next version, which
every quota-server started with --rules-from-redis on that Redis applies within about a
second. Prints "published version N (FORMAT) digest D to KEY". A server refuses a
version at or below the one it applied with another digest (Redis lost its data);
--force-version N publishes as version N, which must be above the published version and
every server's applied one (docs/service.md). Flags: --rules, --rules-format,
--rules-key, --force-version and the server's --redis* flags (--redis, --redis-cluster
or --redis-sentinel with --redis-sentinel-master; AUTH; --redis-deadline-ms). Exit 0
published, 1 refused or Redis cannot answer, 2 usage error.
)";

inline constexpr const char* kInstancesUsage =
    R"(usage: quota-server instances --redis HOST:PORT [flags]

Lists the servers that follow the shared rules (--rules-from-redis) on this Redis: one
line per heartbeat, "INSTANCE version V age MS ms ADDRESS digest D" (and "refused
version P digest D" while it refuses the published version) after a line "published
version N digest D", then how many instances applied the published rules. A heartbeat
is written every second; one older than 60 s is forgotten.
Flags: --rules-key and the server's --redis* flags. Exit 0, 1 when Redis cannot answer,
2 usage error.
)";

// What the command line asks for: serve, or one of the subcommands on the shared rules.
enum class Command { kServe, kPublish, kInstances };

enum class RulesFormat { kAuto, kQuota, kEnvoy };

struct Options : RedisOptions {
  Command command = Command::kServe;
  std::string rules_path;
  bool rules_from_redis = false;
  std::string rules_key = "quota-rules";
  std::uint64_t force_version = 0;  // publish --force-version (0: the next version)
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
  std::int64_t fair_share_holders = 1;
  std::int64_t ticket_ttl_s = 600;
  std::string admin_token;  // --admin-token-file's content; empty: the admin API is off
  AuthHeaders auth_headers{};
  bool fresh_budgets_at_start = false;
  HttpLimits http{};
};

// HOST:PID, the default of --instance-id.
std::string default_instance_id();

// The command line as Options; exits 0 after --help, 2 on a usage error (also when
// --rules is missing). A first argument "publish" or "instances" names a subcommand.
Options parse_options(int argc, char** argv);

}  // namespace quota::server
