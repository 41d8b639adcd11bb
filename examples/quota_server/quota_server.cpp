// quota-server — a rate limit service any gateway can call, on quota's in-process Gateway
// and a YAML rule file (docs/service.md):
//
//   gRPC  envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit (Envoy's RLS v3;
//         the descriptor mapping in descriptors.hpp)
//   HTTP  POST /v1/check (JSON), GET /v1/auth (nginx auth_request), /healthz, /readyz,
//         /metrics (http_api.hpp, on the listener of http_listener.hpp), POST /json
//         (envoyproxy/ratelimit's JSON API: envoy_json.hpp)
//
// main() wires the parts of the service (the library quota_server_service), each declared
// in its own header and defined in the .cpp beside it: options.hpp (flags), rules_admin.hpp
// (the subcommands publish and instances), rule_sources.hpp (the rules: the file, hot
// reloaded, or with --rules-from-redis the version published in Redis, followed),
// redis_backend.hpp (--redis*: the budgets in Redis, errors counted by kind),
// checker.hpp (one check on the Gateway), listeners.hpp (gRPC and HTTP, with
// server_stats.hpp's counters on /metrics).
// It blocks SIGTERM and SIGINT before any thread starts and waits for one of them; then
// stops accepting calls, lets in-flight calls finish (gRPC: at most 5 s) and exits 0. A rule file
// that does not load, or a port that cannot be bound, exits 1 with the reason on stderr; a
// rule set the Redis options cannot decide (failover_safety_rules.hpp) exits 2.
//
// Build and run (one line):
//   cmake --preset dev && cmake --build build/dev --target quota_server
//   ./build/dev/examples/quota_server/quota-server --default-plan free
//       --rules examples/rules/shared-tenant-budget.yaml
#include <signal.h>

#include <cstdio>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "backend/checker.hpp"
#include "backend/redis_backend.hpp"
#include "config/options.hpp"
#include "listeners.hpp"
#include "rules/rule_sources.hpp"
#include "rules/rules_admin.hpp"
#include "stats/server_stats.hpp"

// The reason on stderr, and the exit code.
static int fail(const absl::Status& s, int code) {
  std::fprintf(stderr, "quota-server: %s\n", std::string(s.message()).c_str());
  return code;
}

int main(int argc, char** argv) {
  const quota::server::Options o = quota::server::parse_options(argc, argv);
  if (o.command == quota::server::Command::kPublish) return quota::server::run_publish(o);
  if (o.command == quota::server::Command::kInstances) return quota::server::run_instances(o);

  // Every thread started from here on inherits the mask: the signals reach sigwait only.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  signal(SIGPIPE, SIG_IGN);

  // The rules: the file (hot reloaded) or, with --rules-from-redis, the version published
  // in Redis (followed). A rule set the store's options cannot decide is refused at start
  // (exit 2, a usage error like a bad flag combination) and at every later version.
  quota::gateway::Metrics metrics;
  const quota::server::StoreCheck store_takes = quota::server::store_check(o);
  const auto source = quota::server::make_rule_source(o, metrics, store_takes);
  const auto start = source->load();
  if (!start.ok()) return fail(start.status(), 1);
  if (auto s = store_takes(start->rules, start->text, start->text_origin); !s.ok())
    return fail(s, 2);
  const quota::server::LoadedRules& rules = start->rules;

  // --redis*: the budgets in Redis, shared by every server on it, errors counted by kind.
  quota::server::ServerStats stats;
  auto redis =
      quota::server::make_redis_budgets(o, rules.envoy.get(), source->origin(), stats.decisions);
  if (!redis.ok()) return fail(redis.status(), 1);
  // In process, a budget first used from now on starts spent now (restart safety,
  // --fresh-budgets-at-start opts out); with Redis the store's failover safety does this.
  quota::server::Checker checker(
      rules, {.default_plan = o.default_plan,
              .default_route = o.default_route,
              .max_cost = o.max_cost,
              .max_keys = static_cast<std::size_t>(o.max_keys),
              .redis = redis->counted.get(),
              .fair_share_holders = o.fair_share_holders,
              .instance_id = o.instance_id,
              .ticket_ttl = std::chrono::seconds(o.ticket_ttl_s),
              .budgets_spent_at = o.fresh_budgets_at_start
                                      ? std::nullopt
                                      : std::optional<quota::Nanos>(quota::SteadyClock{}.now())});
  stats.count_load(true, 0);

  quota::server::Listeners listeners(o, checker, stats, metrics);
  const std::string& domain = rules.envoy ? rules.envoy->domain : o.domain;
  if (auto s = listeners.start(source->origin(), domain); !s.ok()) return fail(s, 1);
  source->start(checker, stats, listeners.http_address());

  int signal_number = 0;
  sigwait(&stop_signals, &signal_number);
  listeners.stop();  // /readyz answers 503 from here
  source->stop();
  return 0;
}
