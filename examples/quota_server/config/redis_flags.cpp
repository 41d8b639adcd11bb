// examples/quota_server/config/redis_flags.cpp — the definitions of redis_flags.hpp:
// quota-server's --redis* flags, their checks and their reading.
#include "config/redis_flags.hpp"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <iterator>

#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "quota/redis/gateway_store.hpp"
#include "quota/redis/gateway_store_setup.hpp"

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

bool split_host_port(std::string_view v, std::string* host, int* port) {
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

bool split_host_ports(std::string_view v, std::vector<std::pair<std::string, int>>* out) {
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

absl::StatusOr<std::string> read_secret_file(std::string_view flag, const std::string& path) {
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

std::optional<std::int64_t> max_in_flight_value(std::string_view v) {
  if (v == "auto") return -1;
  std::int64_t n = 0;
  if (!absl::SimpleAtoi(absl::string_view(v.data(), v.size()), &n) || n < 0 || n > 1'000'000) {
    return std::nullopt;
  }
  return n;
}

std::vector<quota::cli::Check> redis_flag_checks() {
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
          integer("redis_replicas", 0, redis::kMaxReplicas),
          integer("redis_replica_timeout_ms", 1, redis::kMaxReplicaTimeout.count()),
          integer("redis_coalesce", 0, redis::kGatewayMaxCoalesce),
          integer("redis_coalesce_calls", 1, redis::kMaxCoalesceCalls)};
}

RedisOptions read_redis_flags(const char* name) {
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
