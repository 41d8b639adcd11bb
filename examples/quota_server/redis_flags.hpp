// examples/quota_server/redis_flags.hpp — quota-server's --redis* flags: where the budgets
// are (one server, a Redis Cluster or a primary named by Redis Sentinel), how each call
// reaches it (AUTH, deadline, connections, breaker, in-flight guard) and the production
// options of redis::GatewayStore (quota/redis/gateway_store_options.hpp): failover safety,
// the clock-step guard, durability (WAIT), coalescing, and accepting an evicting server.
//
// RedisOptions is what redis_backend.hpp builds the store from. redis_flag_checks() are
// the per-value checks handed to quota::cli::parse (options.hpp); read_redis_flags(),
// called after it, checks the combinations and reads the password files. Every error is
// a usage error: the message on stderr, exit 2, nothing started. kRedisUsage is the
// flags' part of --help; docs/service.md lists them too.
//
// Thread safety: read_redis_flags() reads abseil flags; call it once, from main, after
// quota::cli::parse.
//
//   quota::cli::parse({.name = name, .usage = usage, .checks = redis_flag_checks()}, argc, argv);
//   const quota::server::RedisOptions r = quota::server::read_redis_flags(name);
//   // r.redis_mode, r.redis_failover_safety, r.redis_replicas, ...
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
#include "quota/redis/gateway_store.hpp"

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
ABSL_FLAG(bool, redis_failover_safety, false,
          "read every bucket as spent at a detected failover (no fresh burst)");
ABSL_FLAG(std::int64_t, redis_clock_guard_ms, 0,
          "refuse a node whose TIME runs ahead of this host's clock by more; 0: off");
ABSL_FLAG(std::int64_t, redis_replicas, 0,
          "replicas that must acknowledge every write (WAIT); 0: none");
ABSL_FLAG(std::int64_t, redis_replica_timeout_ms, 2, "how long WAIT waits for the replicas");
ABSL_FLAG(std::int64_t, redis_coalesce, 0,
          "the most script calls one pipelined round trip takes; 0: no coalescing");
ABSL_FLAG(std::int64_t, redis_coalesce_calls, 2,
          "coalesced round trips in flight at once (with --redis-coalesce)");
ABSL_FLAG(bool, redis_allow_evicting, false,
          "accept a Redis whose maxmemory-policy evicts keys (an evicted bucket comes back full)");

namespace quota::server {

inline constexpr const char* kRedisUsage =
    R"(  --redis HOST:PORT     keep the budgets in this Redis, shared by every quota-server
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
  --redis-failover-safety  after a detected failover (a replica promoted, a restart),
                        read every bucket older than it as spent then: no key admits a
                        fresh burst; costs false denials for one time to full (rules
                        with a sliding_log are refused: exit 2) (default off)
  --redis-clock-guard-ms N  refuse a node whose TIME runs more than N ms ahead of this
                        host's monotonic clock (UNAVAILABLE / 503, nothing written)
                        until they agree (default 0: off)
  --redis-replicas N    every write waits (WAIT) for N replicas; fewer acknowledging in
                        --redis-replica-timeout-ms answers UNAVAILABLE / 503 (default 0)
  --redis-replica-timeout-ms N  WAIT's timeout, below --redis-deadline-ms (default 2)
  --redis-coalesce N    while --redis-coalesce-calls round trips are in flight, further
                        calls go together, up to N in one pipelined write; each is
                        still its own atomic script call (default 0: off)
  --redis-coalesce-calls N  round trips in flight before calls coalesce; at most
                        --redis-connections (default 2)
  --redis-allow-evicting  accept a Redis whose maxmemory-policy evicts keys (warned
                        once on stderr); without it such a Redis answers every call
                        UNAVAILABLE / 503 (an evicted bucket comes back full)
)";

enum class RedisMode { kNone, kSingle, kCluster, kSentinel };

// What the --redis* flags ask for.
struct RedisOptions {
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
  bool redis_failover_safety = false;
  std::int64_t redis_clock_guard_ms = 0;  // 0: no clock-step guard
  std::int64_t redis_replicas = 0;
  std::int64_t redis_replica_timeout_ms = 2;
  std::int64_t redis_coalesce = 0;
  std::int64_t redis_coalesce_calls = 2;
  bool redis_allow_evicting = false;
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

// The checks of each --redis* value on its own (quota::cli::parse).
inline std::vector<quota::cli::Check> redis_flag_checks() {
  using quota::cli::integer;
  const auto host_port = [](std::string flag) {
    return quota::cli::custom(std::move(flag), "HOST:PORT", [](std::string_view v) {
      return split_host_port(v, nullptr, nullptr);
    });
  };
  return {integer("redis_deadline_ms", 1, 60'000),
          integer("redis_connections", 1, 1024),
          host_port("redis"),
          host_port("redis_cluster"),
          quota::cli::custom("redis_sentinel", "HOST:PORT[,HOST:PORT...]",
                             [](std::string_view v) { return split_host_ports(v, nullptr); }),
          integer("redis_breaker_failures", 0, 1'000'000),
          integer("redis_breaker_cooldown_ms", 1, 3'600'000),
          integer("redis_max_in_flight", 0, 1'000'000),
          integer("redis_clock_guard_ms", 0, 3'600'000),
          integer("redis_replicas", 0, 64),
          integer("redis_replica_timeout_ms", 1, 60'000),
          integer("redis_coalesce", 0, redis::kGatewayMaxCoalesce),
          integer("redis_coalesce_calls", 1, 1024)};
}

// The --redis* flags as RedisOptions, after quota::cli::parse; a bad combination, or a
// password file that cannot be read, is a usage error of `name` (exit 2).
inline RedisOptions read_redis_flags(const char* name) {
  RedisOptions o;
  o.redis_deadline_ms = absl::GetFlag(FLAGS_redis_deadline_ms);
  o.redis_connections = absl::GetFlag(FLAGS_redis_connections);
  o.redis_breaker_failures = absl::GetFlag(FLAGS_redis_breaker_failures);
  o.redis_breaker_cooldown_ms = absl::GetFlag(FLAGS_redis_breaker_cooldown_ms);
  o.redis_max_in_flight = absl::GetFlag(FLAGS_redis_max_in_flight);
  o.redis_failover_safety = absl::GetFlag(FLAGS_redis_failover_safety);
  o.redis_clock_guard_ms = absl::GetFlag(FLAGS_redis_clock_guard_ms);
  o.redis_replicas = absl::GetFlag(FLAGS_redis_replicas);
  o.redis_replica_timeout_ms = absl::GetFlag(FLAGS_redis_replica_timeout_ms);
  o.redis_coalesce = absl::GetFlag(FLAGS_redis_coalesce);
  o.redis_coalesce_calls = absl::GetFlag(FLAGS_redis_coalesce_calls);
  o.redis_allow_evicting = absl::GetFlag(FLAGS_redis_allow_evicting);
  const std::string redis = absl::GetFlag(FLAGS_redis);
  const std::string cluster = absl::GetFlag(FLAGS_redis_cluster);
  const std::string sentinel = absl::GetFlag(FLAGS_redis_sentinel);
  const std::string master = absl::GetFlag(FLAGS_redis_sentinel_master);
  const std::string user = absl::GetFlag(FLAGS_redis_user);
  const std::string password_file = absl::GetFlag(FLAGS_redis_password_file);
  const std::string sentinel_password_file = absl::GetFlag(FLAGS_redis_sentinel_password_file);
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
        {"--redis-max-in-flight", o.redis_max_in_flight > 0},
        {"--redis-failover-safety", o.redis_failover_safety},
        {"--redis-clock-guard-ms", o.redis_clock_guard_ms > 0},
        {"--redis-replicas", o.redis_replicas > 0},
        {"--redis-coalesce", o.redis_coalesce > 0},
        {"--redis-allow-evicting", o.redis_allow_evicting}};
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
  if (o.redis_replicas > 0 && o.redis_replica_timeout_ms >= o.redis_deadline_ms) {
    quota::cli::usage_error(name,
                            absl::StrCat("--redis-replica-timeout-ms ", o.redis_replica_timeout_ms,
                                         " must be below --redis-deadline-ms ", o.redis_deadline_ms,
                                         " (WAIT runs inside the call's deadline)"));
  }
  if (o.redis_replicas == 0 && o.redis_replica_timeout_ms != 2) {
    quota::cli::usage_error(name, "--redis-replica-timeout-ms needs --redis-replicas");
  }
  if (o.redis_coalesce == 1) {
    quota::cli::usage_error(name,
                            "--redis-coalesce 1 coalesces nothing; give 0 (off) or at least 2");
  }
  if (o.redis_coalesce == 0 && o.redis_coalesce_calls != 2) {
    quota::cli::usage_error(name, "--redis-coalesce-calls needs --redis-coalesce");
  }
  if (o.redis_coalesce > 1 && o.redis_coalesce_calls > o.redis_connections) {
    quota::cli::usage_error(
        name, absl::StrCat("--redis-coalesce-calls ", o.redis_coalesce_calls,
                           " needs as many connections: --redis-connections is ",
                           o.redis_connections, " (each round trip in flight holds one)"));
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
  return o;
}

}  // namespace quota::server
