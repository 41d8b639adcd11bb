// examples/quota_server/config/redis_flags.hpp — quota-server's --redis* flags: where the budgets
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
// Safe by default: failover safety, the clock-step guard (1 s), the circuit breaker (5
// failures, 250 ms) and the in-flight guard (4 calls per connection) are on, and each
// flag's off value turns its guard off by name (kRedisUsage).
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
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/cli.hpp"
#include "quota/redis/gateway_store.hpp"

ABSL_FLAG(std::string, redis, "", "HOST:PORT of a Redis holding the budgets (default: in process)");
ABSL_FLAG(std::string, redis_cluster, "",
          "HOST:PORT[,HOST:PORT...] of nodes of a Redis Cluster instead (seeds)");
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
ABSL_FLAG(std::int64_t, redis_breaker_failures, 5,
          "consecutive failures that open a Redis node's circuit breaker; 0: none");
ABSL_FLAG(std::int64_t, redis_breaker_cooldown_ms, 250,
          "how long an open breaker fails calls at once before one probe");
ABSL_FLAG(std::string, redis_max_in_flight, "auto",
          "the most calls to Redis at once; auto: 4 x --redis-connections; 0: no limit");
ABSL_FLAG(bool, redis_failover_safety, true,
          "read every bucket as spent at a detected failover (no fresh burst); =false: off");
ABSL_FLAG(std::int64_t, redis_clock_guard_ms, 1000,
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
  --redis-cluster HOST:PORT[,HOST:PORT...]  the same on a Redis Cluster: any of its
                        nodes as seeds, each asked for the slot map until one answers
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
                        calls fail at once (the route's fail mode) (default 5; 0: no
                        breaker)
  --redis-breaker-cooldown-ms N  how long an open breaker fails calls before it lets
                        one probe through (default 250)
  --redis-max-in-flight auto|N  the most calls to Redis at once; more fail at once
                        (default auto: 4 x --redis-connections; 0: no limit)
  --redis-failover-safety[=false]  after a detected failover (a replica promoted, a
                        restart), read every bucket older than it as spent then: no key
                        admits a fresh burst; costs false denials for one time to full
                        (rules with a sliding_log are refused: exit 2) (default on;
                        --redis-failover-safety=false: off)
  --redis-clock-guard-ms N  refuse a node whose TIME runs more than N ms ahead of this
                        host's monotonic clock (UNAVAILABLE / 503, nothing written)
                        until they agree (default 1000; 0: off)
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
                        UNAVAILABLE / 503 (an evicted bucket comes back full), also
                        when the policy is changed on a live server: it is read again
                        every second
  Every guard is on by default; its flag's off value turns it off, by name:
  --redis-failover-safety=false, --redis-clock-guard-ms=0, --redis-breaker-failures=0,
  --redis-max-in-flight=0.
)";

enum class RedisMode { kNone, kSingle, kCluster, kSentinel };

// The guards' defaults (docs/service.md "Production options" says why each).
// Breaker: a healthy Redis does not fail 5 calls in a row (a lost packet or one slow reply
// fails one); while it is down each call would wait its whole deadline, so after 5 the
// node's calls fail at once, and a probe every 250 ms (5 default deadlines) finds it back.
inline constexpr std::int64_t kRedisBreakerFailures = 5;
// Clock guard: hosts kept by NTP agree within milliseconds, and a call's round trip is
// below its deadline (50 ms), so 1 s refuses no honest clock; a step it lets through
// refills a bucket by at most 1 s of its rate.
inline constexpr std::int64_t kRedisClockGuardMs = 1000;
// In-flight guard: 4 calls per connection. The pool serves --redis-connections calls at
// once; beyond 4 per connection a call would queue behind three full rounds of the pool,
// and while Redis stalls every one of them waits out its deadline, holding a thread.
inline constexpr std::int64_t kRedisInFlightPerConnection = 4;

// What the --redis* flags ask for.
struct RedisOptions {
  RedisMode redis_mode = RedisMode::kNone;  // kNone: in process
  std::string redis_host;                   // --redis / --redis-cluster
  int redis_port = 0;
  std::vector<std::pair<std::string, int>> redis_sentinels;  // --redis-sentinel
  // --redis-cluster's seeds after the first (redis_host, redis_port): every one is asked
  // for the slot map, so a dead first seed does not keep the server from the cluster.
  std::vector<std::pair<std::string, int>> redis_cluster_seeds;
  std::string redis_sentinel_master;
  std::string redis_user;
  std::string redis_password;           // read from --redis-password-file
  std::string redis_sentinel_password;  // read from --redis-sentinel-password-file
  std::int64_t redis_deadline_ms = 50;
  std::int64_t redis_connections = 8;
  std::int64_t redis_breaker_failures = kRedisBreakerFailures;  // 0: no breaker
  std::int64_t redis_breaker_cooldown_ms = 250;
  std::int64_t redis_max_in_flight = kRedisInFlightPerConnection * 8;  // 8: the connections
  bool redis_failover_safety = true;
  std::int64_t redis_clock_guard_ms = kRedisClockGuardMs;  // 0: no clock-step guard
  std::int64_t redis_replicas = 0;
  std::int64_t redis_replica_timeout_ms = 2;
  std::int64_t redis_coalesce = 0;
  std::int64_t redis_coalesce_calls = 2;
  bool redis_allow_evicting = false;
};

// "HOST:PORT" split; false when it is not that (a port in [1, 65535]; a host without
// '/', so that a redis:// or rediss:// URL is refused rather than taken for a host name).
inline bool split_host_port(std::string_view v, std::string* host, int* port) {
  const std::size_t colon = v.rfind(':');
  if (colon == std::string_view::npos || colon == 0) return false;
  if (v.substr(0, colon).find('/') != std::string_view::npos) return false;
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

// The secret in the file at `path` (the value of `flag`): its content without one
// trailing "\n" (or "\r\n"). An error names the flag, the file and the reason (missing,
// unreadable, empty, more than one line).
inline absl::StatusOr<std::string> read_secret_file(std::string_view flag,
                                                    const std::string& path) {
  const auto error = [&](std::string_view why) {
    return absl::InvalidArgumentError(
        absl::StrCat(std::string(flag), " ", path, ": ", std::string(why)));
  };
  std::ifstream in(path, std::ios::binary);
  if (!in) return error(absl::StrCat("cannot read: ", std::strerror(errno)));
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) return error(absl::StrCat("cannot read: ", std::strerror(errno)));
  if (!text.empty() && text.back() == '\n') text.pop_back();
  if (!text.empty() && text.back() == '\r') text.pop_back();
  if (text.empty()) return error("the file is empty");
  if (text.find('\n') != std::string::npos) return error("more than one line");
  return text;
}

// The value of --redis-max-in-flight: "auto" (-1) or N in [0, 1000000]; nullopt when it
// is neither.
inline std::optional<std::int64_t> max_in_flight_value(std::string_view v) {
  if (v == "auto") return -1;
  std::int64_t n = 0;
  if (!absl::SimpleAtoi(absl::string_view(v.data(), v.size()), &n) || n < 0 || n > 1'000'000) {
    return std::nullopt;
  }
  return n;
}

// The checks of each --redis* value on its own (quota::cli::parse).
inline std::vector<quota::cli::Check> redis_flag_checks() {
  using quota::cli::integer;
  const auto host_port = [](std::string flag) {
    return quota::cli::custom(
        std::move(flag), "HOST:PORT (not a redis:// URL)",
        [](std::string_view v) { return split_host_port(v, nullptr, nullptr); });
  };
  return {integer("redis_deadline_ms", 1, 60'000),
          integer("redis_connections", 1, 1024),
          host_port("redis"),
          quota::cli::custom("redis_cluster", "HOST:PORT[,HOST:PORT...] (not a redis:// URL)",
                             [](std::string_view v) { return split_host_ports(v, nullptr); }),
          quota::cli::custom("redis_sentinel", "HOST:PORT[,HOST:PORT...]",
                             [](std::string_view v) { return split_host_ports(v, nullptr); }),
          integer("redis_breaker_failures", 0, 1'000'000),
          integer("redis_breaker_cooldown_ms", 1, 3'600'000),
          quota::cli::custom("redis_max_in_flight", "auto or an integer in [0, 1000000]",
                             [](std::string_view v) { return max_in_flight_value(v).has_value(); }),
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
  const std::int64_t in_flight =
      max_in_flight_value(absl::GetFlag(FLAGS_redis_max_in_flight)).value_or(-1);
  o.redis_max_in_flight =
      in_flight < 0 ? kRedisInFlightPerConnection * o.redis_connections : in_flight;
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
    // A guard on by default is an error here when set to anything but its default.
    const std::pair<const char*, bool> needs_redis[] = {
        {"--redis-user", !user.empty()},
        {"--redis-password-file", !password_file.empty()},
        {"--redis-breaker-failures", o.redis_breaker_failures != kRedisBreakerFailures},
        {"--redis-max-in-flight", in_flight >= 0},
        {"--redis-failover-safety", !o.redis_failover_safety},
        {"--redis-clock-guard-ms", o.redis_clock_guard_ms != kRedisClockGuardMs},
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
  if (o.redis_mode == RedisMode::kSingle) {
    split_host_port(redis, &o.redis_host, &o.redis_port);
  } else if (o.redis_mode == RedisMode::kCluster) {
    std::vector<std::pair<std::string, int>> seeds;
    split_host_ports(cluster, &seeds);
    o.redis_host = seeds.front().first;
    o.redis_port = seeds.front().second;
    o.redis_cluster_seeds.assign(seeds.begin() + 1, seeds.end());
  } else if (o.redis_mode == RedisMode::kSentinel) {
    split_host_ports(sentinel, &o.redis_sentinels);
    o.redis_sentinel_master = master;
  }
  o.redis_user = user;
  if (!password_file.empty()) {
    auto password = read_secret_file("--redis-password-file", password_file);
    if (!password.ok()) {
      quota::cli::usage_error(name, std::string(password.status().message()));
    }
    o.redis_password = *std::move(password);
  }
  if (!sentinel_password_file.empty()) {
    auto password = read_secret_file("--redis-sentinel-password-file", sentinel_password_file);
    if (!password.ok()) {
      quota::cli::usage_error(
          name, absl::StrCat("--redis-sentinel-password-file: ", password.status().message()));
    }
    o.redis_sentinel_password = *std::move(password);
  }
  return o;
}

}  // namespace quota::server
