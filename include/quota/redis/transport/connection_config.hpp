// quota/redis/transport/connection_config.hpp — where a Connection (connection.hpp)
// connects and what it does on every connect: the host and port (or an AddressResolver,
// asked on every connect: sentinel.hpp), the budget of a call made without a Deadline,
// the node's circuit breaker (breaker.hpp), and the connect handshake (handshake.hpp):
// AUTH, ROLE with a resolver, the maxmemory-policy check, and with a NodeWatch the node's
// identity and TIME (node_watch.hpp).
//
// A plain value. The shared parts (handshake_stats, node_watch) are filled in by the
// ConnectionPool when null (policy_recheck always), so that the connections of one pool count and
// watch together. Thread safety: a value; what its shared pointers point to is thread-safe.
//
//   quota::redis::ConnectionConfig config{.host = "10.0.0.5", .port = 6380};
//   config.password = "secret";  // AUTH on every connect
//   auto pool = std::make_shared<quota::redis::ConnectionPool>(config, 8);
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "quota/redis/transport/breaker.hpp"
#include "quota/redis/transport/deadline.hpp"
#include "quota/redis/transport/handshake.hpp"
#include "quota/redis/transport/node_watch.hpp"

namespace quota::redis {

struct ConnectionConfig {
  std::string host = "127.0.0.1";
  int port = 6379;
  // The budget of a call made without a Deadline: the pool wait, the connect, the write
  // and the reads, together. The stores use it unless their options set their own.
  std::chrono::microseconds deadline = kDefaultDeadline;
  // The node's circuit breaker (breaker.hpp): 5 consecutive failures open it for 250 ms;
  // `breaker.failures` 0 turns it off.
  BreakerConfig breaker{};

  // -- The connect handshake (one pipelined round trip after every connect). --
  // AUTH: with a non-empty `password`, every connection authenticates before its first
  // command: `AUTH username password` for an ACL user (Redis 6+), `AUTH password` for the
  // default user (requirepass) when `username` is empty. A rejected AUTH, or a server that
  // answers NOAUTH, is kUnauthenticated naming authentication (connection dropped).
  std::string username = {};
  std::string password = {};
  // What to do when the server's maxmemory-policy evicts keys (anything but
  // `noeviction`): see EvictionPolicyCheck.
  EvictionPolicyCheck eviction_check = EvictionPolicyCheck::kRefuse;
  // With kRefuse, how long a live pool goes without reading maxmemory-policy again
  // (handshake.hpp): one CONFIG GET per pool per interval, on the connection whose call
  // finds it due, before that call. 0: read at connect only.
  std::chrono::microseconds eviction_recheck = std::chrono::seconds(1);
  // When set, the address is asked of it on every connect instead of host/port, the
  // server must say ROLE master, and a failed connection, a timeout or a READONLY reply
  // tells it that the address is stale (sentinel.hpp). host/port then only name the
  // configuration in messages until the first connect.
  std::shared_ptr<AddressResolver> resolver = nullptr;
  // Counters and once-only warnings of the handshake, shared by the connections of one
  // ConnectionPool (the pool creates it when null).
  std::shared_ptr<HandshakeStats> handshake_stats = nullptr;
  // The node's identity and failover time (node_watch.hpp), shared by the connections of
  // one ConnectionPool (the pool creates it when null): with it, the handshake also reads
  // `INFO server replication` and TIME. Null: not read.
  std::shared_ptr<NodeWatch> node_watch = nullptr;
  // When the node's maxmemory-policy was last read (eviction_recheck), shared by the
  // connections of one ConnectionPool: the pool always gives them its own.
  std::shared_ptr<PolicyRecheck> policy_recheck = nullptr;
};

}  // namespace quota::redis
