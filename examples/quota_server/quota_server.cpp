// quota-server — a rate limit service any gateway can call, on quota's in-process Gateway
// and a YAML rule file (docs/service.md):
//
//   gRPC  envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit (Envoy's RLS v3;
//         the descriptor mapping in descriptors.hpp)
//   HTTP  POST /v1/check (JSON), GET /v1/auth (nginx auth_request), /healthz, /readyz,
//         /metrics (http_api.hpp, on the listener of http_listener.hpp), POST /json
//         (envoyproxy/ratelimit's JSON API: envoy_json.hpp)
//
// main() wires the parts, each in its own header: options.hpp (flags), rule_source.hpp
// (the rule file), rule_watcher.hpp (its hot reload), or with --rules-from-redis
// shared_rules.hpp and rule_subscriber.hpp (the rule set published in Redis, followed),
// rules_admin.hpp (the subcommands publish and instances), checker.hpp (one check on the
// Gateway), descriptors.hpp and grpc_service.hpp (RLS v3), http_api.hpp (HTTP),
// server_stats.hpp and decision_stats.hpp (its counters), redis_backend.hpp (--redis*;
// in the Checker: redis_leases.hpp for leased rules, fair_exchange.hpp for fair-share
// budgets divided among servers, envoy_redis.hpp for envoyproxy/ratelimit budgets).
// It blocks SIGTERM and SIGINT before any thread starts and waits for one of them; then
// stops accepting calls, lets in-flight calls finish (gRPC: at most 5 s) and exits 0. A rule file
// that does not load, or a port that cannot be bound, exits 1 with the reason on stderr; a
// rule set the Redis options cannot decide (failover_safety_rules.hpp) exits 2.
//
// Build and run (one line):
//   cmake --preset dev && cmake --build build/dev --target quota_server
//   ./build/dev/examples/quota_server/quota-server --default-plan free
//       --rules examples/rules/shared-tenant-budget.yaml
#include <httplib.h>
#include <signal.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "checker.hpp"
#include "envoy_json.hpp"
#include "failover_safety_rules.hpp"
#include "grpc_service.hpp"
#include "http_api.hpp"
#include "options.hpp"
#include "redis_backend.hpp"
#include "rule_source.hpp"
#include "rule_subscriber.hpp"
#include "rule_watcher.hpp"
#include "rules_admin.hpp"
#include "server_stats.hpp"
#include "shared_rules.hpp"

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

  // In process, a budget first used from now on starts spent now (restart safety,
  // --fresh-budgets-at-start opts out); with Redis the store's failover safety does this.
  const std::optional<quota::Nanos> start =
      o.fresh_budgets_at_start ? std::nullopt
                               : std::optional<quota::Nanos>(quota::SteadyClock{}.now());
  quota::gateway::Metrics metrics;
  // The rules: the file (hot reloaded) or, with --rules-from-redis, the version
  // published in Redis (followed).
  std::unique_ptr<quota::server::SharedRules> shared;
  absl::StatusOr<std::string> text = std::string();
  absl::StatusOr<quota::server::LoadedRules> rules = absl::UnknownError("no rules");
  quota::server::RulesFormat format = quota::server::RulesFormat::kQuota;
  std::string origin = o.rules_path;
  std::string text_origin = o.rules_path;  // the rules' text as their errors name it
  std::uint64_t published_digest = 0;      // with --rules-from-redis: the rules' digest
  if (o.rules_from_redis) {
    shared = std::make_unique<quota::server::SharedRules>(
        quota::server::make_redis_connections(o, 1, quota::server::kSharedRulesDeadline),
        o.rules_key);
    origin = shared->rules_key();
    auto latest = shared->fetch(0);
    if (!latest.ok()) {
      rules = absl::Status(
          latest.status().code(),
          absl::StrCat("cannot read the shared rules from redis: ", latest.status().message()));
    } else if (latest->version == 0) {
      rules = absl::NotFoundError(absl::StrCat("no rules are published under ", shared->rules_key(),
                                               " (quota-server publish)"));
    } else {
      rules = quota::server::build_published_rules(*shared, *latest, metrics);
      text = latest->text;
      text_origin = quota::server::published_origin(*shared, latest->version);
      published_digest = latest->digest;
    }
  } else {
    text = quota::server::read_rule_text(o.rules_path);
    format = quota::server::resolve_format(o.rules_format, text.ok() ? *text : "");
    rules = text.ok() ? quota::server::build_server_rules(format, 0, *text, o.rules_path, metrics)
                      : absl::StatusOr<quota::server::LoadedRules>(text.status());
  }
  if (!rules.ok()) {
    std::fprintf(stderr, "quota-server: %s\n", std::string(rules.status().message()).c_str());
    return 1;
  }
  // A rule set the store's options cannot decide is refused now (and on every reload
  // below), not per request: a usage error, like a bad flag combination.
  const auto store_takes = [&o](const quota::server::LoadedRules& loaded, std::string_view t,
                                std::string_view from) {
    return o.redis_failover_safety ? quota::server::check_failover_safety_rules(loaded, t, from)
                                   : absl::OkStatus();
  };
  if (auto s = store_takes(*rules, *text, text_origin); !s.ok()) {
    std::fprintf(stderr, "quota-server: %s\n", std::string(s.message()).c_str());
    return 2;
  }
  // --redis / --redis-cluster / --redis-sentinel: the budgets in Redis, shared by every
  // server on it (redis_backend.hpp), its errors counted by kind.
  quota::server::ServerStats stats;
  const std::unique_ptr<quota::redis::GatewayStore> redis_store =
      quota::server::make_redis_store(o);
  std::unique_ptr<quota::server::CountedRedisStore> counted;
  if (redis_store != nullptr) {
    if (rules->envoy) {
      if (auto s = quota::server::check_envoy_for_redis(*rules->envoy); !s.ok()) {
        std::fprintf(stderr, "quota-server: %s: %s\n", origin.c_str(),
                     std::string(s.message()).c_str());
        return 1;
      }
    }
    counted = std::make_unique<quota::server::CountedRedisStore>(*redis_store, stats.decisions);
  }
  quota::server::Checker checker(*rules, {.default_plan = o.default_plan,
                                          .default_route = o.default_route,
                                          .max_cost = o.max_cost,
                                          .max_keys = static_cast<std::size_t>(o.max_keys),
                                          .redis = counted.get(),
                                          .fair_share_holders = o.fair_share_holders,
                                          .instance_id = o.instance_id,
                                          .budgets_spent_at = start});
  stats.count_load(true, 0);
  std::unique_ptr<quota::server::RuleWatcher> watcher;
  if (!o.rules_from_redis) {
    watcher = std::make_unique<quota::server::RuleWatcher>(
        o.rules_path, *text, checker,
        [&metrics, format, &store_takes](
            std::uint64_t in_force, std::string_view t,
            const std::string& path) -> absl::StatusOr<quota::server::LoadedRules> {
          auto loaded = quota::server::build_server_rules(format, in_force, t, path, metrics);
          if (!loaded.ok()) return loaded;
          if (auto s = store_takes(*loaded, t, path); !s.ok()) return s;
          return loaded;
        },
        stats);
  }

  quota::server::RateLimitServiceImpl service(checker, stats, o.domain, o.max_cost);
  grpc::ServerBuilder builder;
  int grpc_port = 0;
  builder.AddListeningPort(absl::StrCat(o.host, ":", o.grpc_port),
                           grpc::InsecureServerCredentials(), &grpc_port);
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> grpc_server = builder.BuildAndStart();
  if (grpc_server == nullptr || grpc_port == 0) {
    std::fprintf(stderr, "quota-server: cannot listen for gRPC on %s:%d\n", o.host.c_str(),
                 o.grpc_port);
    return 1;
  }
  std::printf("grpc listening on %s:%d (domain \"%s\", rules %s version %llu)\n", o.host.c_str(),
              grpc_port, rules->envoy ? rules->envoy->domain.c_str() : o.domain.c_str(),
              origin.c_str(), static_cast<unsigned long long>(checker.rule_version()));
  std::fflush(stdout);

  std::atomic<bool> ready{false};
  // No client can stall the others: idle connections hold no thread, slow requests are
  // cut off, large bodies refused unread (http_listener.hpp).
  quota::server::HttpListener http(o.http);
  quota::server::add_http_api(http, {.checker = &checker,
                                     .stats = &stats,
                                     .metrics = &metrics,
                                     .ready = &ready,
                                     .auth = o.auth_headers,
                                     .listener = &http});
  quota::server::add_envoy_json_api(http, service);  // POST /json, envoyproxy/ratelimit's
  const int http_port = o.http_port == 0                         ? http.bind_to_any_port(o.host)
                        : http.bind_to_port(o.host, o.http_port) ? o.http_port
                                                                 : -1;
  if (http_port <= 0) {
    std::fprintf(stderr, "quota-server: cannot listen for HTTP on %s:%d\n", o.host.c_str(),
                 o.http_port);
    grpc_server->Shutdown();
    return 1;
  }
  std::thread http_thread([&http] { http.listen_after_bind(); });
  std::printf("http listening on %s:%d\n", o.host.c_str(), http_port);
  std::fflush(stdout);
  ready.store(true, std::memory_order_release);
  std::unique_ptr<quota::server::RuleSubscriber> subscriber;
  if (shared != nullptr) {
    subscriber = std::make_unique<quota::server::RuleSubscriber>(
        *shared, checker, published_digest,
        [&metrics, &shared, &store_takes](
            const quota::server::PublishedRules& p) -> absl::StatusOr<quota::server::LoadedRules> {
          auto loaded = quota::server::build_published_rules(*shared, p, metrics);
          if (!loaded.ok()) return loaded;
          const std::string from = quota::server::published_origin(*shared, p.version);
          if (auto s = store_takes(*loaded, p.text, from); !s.ok()) return s;
          return loaded;
        },
        stats,
        quota::server::RuleSubscriber::Identity{.id = o.instance_id,
                                                .address = absl::StrCat(o.host, ":", http_port)});
    subscriber->start();
  }
  if (watcher != nullptr) watcher->start();

  int signal_number = 0;
  sigwait(&stop_signals, &signal_number);
  ready.store(false, std::memory_order_release);
  if (watcher != nullptr) watcher->stop();
  if (subscriber != nullptr) subscriber->stop();
  grpc_server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(5));
  http.stop();
  http_thread.join();
  return 0;
}
