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

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "common/cli.hpp"

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
bool split_host_port(std::string_view v, std::string* host, int* port);

// "HOST:PORT[,HOST:PORT...]" split; false when an item is not HOST:PORT.
bool split_host_ports(std::string_view v, std::vector<std::pair<std::string, int>>* out);

// The secret in the file at `path` (the value of `flag`): its content without one
// trailing "\n" (or "\r\n"). An error names the flag, the file and the reason (missing,
// unreadable, empty, more than one line).
absl::StatusOr<std::string> read_secret_file(std::string_view flag, const std::string& path);

// The value of --redis-max-in-flight: "auto" (-1) or N in [0, 1000000]; nullopt when it
// is neither.
std::optional<std::int64_t> max_in_flight_value(std::string_view v);

// The checks of each --redis* value on its own (quota::cli::parse).
std::vector<quota::cli::Check> redis_flag_checks();

// The --redis* flags as RedisOptions, after quota::cli::parse; a bad combination, or a
// password file that cannot be read, is a usage error of `name` (exit 2).
RedisOptions read_redis_flags(const char* name);

}  // namespace quota::server
