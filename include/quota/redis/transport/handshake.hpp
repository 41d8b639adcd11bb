// quota/redis/transport/handshake.hpp — what a connection checks right after it connects.
//
// Every redis::Connection (connection.hpp) runs a handshake after each TCP connect, in ONE
// pipelined round trip, before its first command:
//   1. AUTH, when ConnectionConfig::password is set: `AUTH <username> <password>` for an
//      ACL user (Redis 6+), `AUTH <password>` for the default user (requirepass). A
//      rejected AUTH (WRONGPASS, an unknown user, a server without a password) is
//      kUnauthenticated naming authentication; so is a server that answers NOAUTH because
//      no password was configured. Never a decision, and never retried in a loop: each
//      later call tries one connect again (a password fixed on the server is picked up).
//   2. ROLE, when the address comes from an AddressResolver (sentinel.hpp): the server
//      must be the primary; otherwise kUnavailable and the resolver is told the address
//      is stale.
//   3. CONFIG GET maxmemory-policy (EvictionPolicyCheck): any policy but `noeviction`
//      may evict buckets, which come back full and hand out a fresh burst. By default the
//      connection is refused (kFailedPrecondition naming the policy); kAllow counts and
//      warns once; where CONFIG cannot be read (renamed away, as managed services do, or
//      not permitted to the ACL user) the handshake warns once and goes on: refusing
//      would make such servers unusable, and their operators choose the policy.
//      A policy can change on a live server (`CONFIG SET maxmemory-policy`), so with
//      kRefuse a connection reads it again before a call once
//      ConnectionConfig::eviction_recheck (1 s) has passed since the pool's last read, one
//      connection for the pool, in one round trip of its own before the call. An evicting
//      policy found then refuses that call and makes every connection of the pool connect
//      again, so each call after it is refused by its handshake until the policy is
//      `noeviction` again: no call that starts later than eviction_recheck after the
//      change is decided over the evicting server, except those already past their check
//      while the reading connection's round trip is in flight (at most one call's
//      deadline).
// Any failure drops the connection, so nothing is sent over a connection that did not
// pass. Warnings go to stderr, once per pool (HandshakeStats).
//
// Thread safety: HandshakeStats is thread-safe (atomics); an AddressResolver must be.
//
//   quota::redis::ConnectionConfig cfg{.host = "10.0.0.5", .port = 6379};
//   cfg.username = "quota";          // an ACL user; empty: the default user
//   cfg.password = "s3cret";
//   auto pool = std::make_shared<quota::redis::ConnectionPool>(cfg, 8);
//   // pool->handshake_stats().evicting: connects to an evicting server (with kAllow)
#pragma once

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

namespace quota::redis {

// The handshake's reading of `maxmemory-policy` (CONFIG GET, on every connect). Every
// quota key has a TTL, so the volatile-* policies evict buckets as readily as allkeys-*;
// an evicted bucket comes back full and hands out a fresh burst.
enum class EvictionPolicyCheck : std::uint8_t {
  // Any policy but noeviction: the connection is refused with kFailedPrecondition naming
  // the policy (no decision is made over it). The default.
  kRefuse = 0,
  // Any policy is accepted; a connection to an evicting server is counted
  // (HandshakeStats::evicting) and warned about once per pool, on stderr.
  kAllow = 1,
  // Not read (sentinel connections, which hold no quota keys).
  kSkip = 2,
};

// A server address.
struct Endpoint {
  std::string host;
  int port = 0;
  bool operator==(const Endpoint&) const = default;
};

// Where a connection goes when the address can change (a Sentinel-managed primary:
// sentinel.hpp). Thread-safe: the connections of a pool call it from many threads.
class AddressResolver {
 public:
  virtual ~AddressResolver() = default;
  // The address to connect to now (cached or asked afresh); kUnavailable when unknown.
  virtual absl::StatusOr<Endpoint> resolve() = 0;
  // A connection to `at` failed, timed out, or found a server that is not the primary:
  // the next resolve() asks afresh (unless another thread already did).
  virtual void stale(const Endpoint& at) = 0;
};

// What the connect handshakes of one pool saw: connects made, connections accepted to a
// server with an evicting policy (EvictionPolicyCheck::kAllow), connects where the
// policy could not be read (CONFIG disabled or not permitted). Each warning is printed
// once per pool.
struct HandshakeStats {
  std::atomic<std::uint64_t> connects{0};
  std::atomic<std::uint64_t> evicting{0};
  std::atomic<std::uint64_t> policy_unread{0};
  std::atomic<bool> warned_evicting{false};
  std::atomic<bool> warned_unread{false};
  // The policy read again on a live connection (ConnectionConfig::eviction_recheck), and
  // how many of those reads found an evicting policy (kRefuse).
  std::atomic<std::uint64_t> rechecks{0};
  std::atomic<std::uint64_t> recheck_refusals{0};
};

// When one node's maxmemory-policy was last read, shared by the connections of its pool
// (ConnectionPool gives each pool its own, also on a Cluster).
struct PolicyRecheck {
  // The last read (steady clock, ns since its epoch): a live connection reads the policy
  // again once ConnectionConfig::eviction_recheck has passed since, one for the pool.
  std::atomic<std::int64_t> read_at{0};
  // Raised when a read finds an evicting policy (kRefuse): a connection opened under an
  // older epoch connects again, so its handshake reads the policy (and refuses).
  std::atomic<std::uint64_t> epoch{0};
};

namespace detail {

// The verdict on a server's maxmemory-policy: `policy` as CONFIG GET read it, or nullopt
// when it could not be read (`unread_cause`: the server's error). `where`: "host:port".
inline absl::Status eviction_policy_status(std::optional<std::string_view> policy,
                                           std::string_view unread_cause, EvictionPolicyCheck check,
                                           HandshakeStats& stats, const std::string& where) {
  if (!policy.has_value()) {
    stats.policy_unread.fetch_add(1, std::memory_order_relaxed);
    if (!stats.warned_unread.exchange(true)) {
      std::fprintf(stderr,
                   "quota: warning: cannot read maxmemory-policy of redis at %s (%s): CONFIG "
                   "is disabled or not permitted, so quota decides without knowing whether "
                   "the server evicts buckets; make sure it runs with noeviction\n",
                   where.c_str(), std::string(unread_cause).c_str());
    }
    return absl::OkStatus();
  }
  if (*policy == "noeviction") return absl::OkStatus();
  const absl::string_view name(policy->data(), policy->size());
  if (check == EvictionPolicyCheck::kAllow) {
    stats.evicting.fetch_add(1, std::memory_order_relaxed);
    if (!stats.warned_evicting.exchange(true)) {
      std::fprintf(stderr,
                   "quota: warning: redis at %s runs with maxmemory-policy %s, which may evict "
                   "buckets (an evicted bucket comes back full); allowed by "
                   "EvictionPolicyCheck::kAllow\n",
                   where.c_str(), std::string(*policy).c_str());
    }
    return absl::OkStatus();
  }
  return absl::FailedPreconditionError(absl::StrCat(
      "redis at ", where, " runs with maxmemory-policy ", name,
      ", which evicts keys under memory pressure (every quota key has a TTL, so volatile-* "
      "evicts them too) and an evicted bucket comes back full: no decision is made over it; "
      "set maxmemory-policy noeviction, or accept the risk with "
      "ConnectionConfig::eviction_check = EvictionPolicyCheck::kAllow"));
}

}  // namespace detail
}  // namespace quota::redis
