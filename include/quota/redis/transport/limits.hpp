// quota/redis/transport/limits.hpp — what bounds one script call: its deadline, the
// process's in-flight guard, and the durability it waits for.
//
// `CallLimits` is what the stores take from their options (`limits`): the one deadline
// of each call (deadline.hpp; the connections' ConnectionConfig::deadline, 3 ms, unless
// set) and the in-flight guard shared by the process (breaker.hpp). `Durability` is the
// WAIT a call's write ends with (script.hpp), which must answer within that deadline;
// `check_durability` says when it cannot, naming the option, and `durable_status` reads
// a write's WAIT reply.
//
// Thread safety: plain values and pure functions.
//
//   quota::RedisStoreOptions options{.pool = pool};
//   options.limits.deadline = std::chrono::milliseconds(3);
//   options.limits.in_flight = std::make_shared<quota::redis::InFlightGuard>(64);
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "quota/redis/transport/breaker.hpp"
#include "quota/redis/transport/connection.hpp"
#include "quota/redis/transport/reply.hpp"

namespace quota::redis {

// What bounds each call of a Script; the stores take it from their options (`limits`).
struct CallLimits {
  // The budget of one call, all its waits together. 0: the connections'
  // ConnectionConfig::deadline (3 ms unless configured).
  std::chrono::microseconds deadline{0};
  // The process's guard on calls in flight to the authority (breaker.hpp), shared by
  // every store of the process; a call beyond its maximum fails at once, kUnavailable
  // naming the guard. Null: no guard (the default: its size comes from the process's
  // threads and connections, which only the process knows; quota-server's is 4 calls per
  // connection).
  std::shared_ptr<InFlightGuard> in_flight = nullptr;
};

// How many replicas must acknowledge a script call's write (WAIT), and how long the
// server waits for them. 0 replicas: no WAIT. The timeout must be below the call's
// deadline (the reply to WAIT comes after it).
struct Durability {
  int replicas = 0;
  std::chrono::milliseconds timeout{2};
};

// The deadline of a call under `limits` over connections configured as `c`.
inline std::chrono::microseconds call_deadline(const CallLimits& limits,
                                               const ConnectionConfig& c) {
  return limits.deadline.count() > 0 ? limits.deadline : c.deadline;
}

// OK when `d` can be kept within calls of `deadline`; else InvalidArgument naming the
// option (`options`: the options struct that holds `replicas` and `replica_timeout`).
inline absl::Status check_durability(const Durability& d, std::chrono::microseconds deadline,
                                     const char* options) {
  if (d.replicas < 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: replicas=%d, must be at least 0", options, d.replicas));
  }
  if (d.replicas == 0) return absl::OkStatus();
  if (d.timeout.count() < 1 || d.timeout >= deadline) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: replica_timeout=%d ms must be at least 1 ms and below the call's deadline "
        "(%d us): WAIT answers only after it",
        options, d.timeout.count(), deadline.count()));
  }
  return absl::OkStatus();
}

// OK unless the write whose `replies` (from the server `server` names) ended with `WAIT`
// was acknowledged by fewer than `d.replicas` replicas (or the WAIT failed): then
// kUnavailable naming the count. OK without durability (0 replicas: no WAIT was sent).
inline absl::Status durable_status(const Durability& d, const std::vector<Reply>& replies,
                                   const ConnectionConfig& server) {
  if (d.replicas <= 0) return absl::OkStatus();
  const redisReply* w = replies.empty() ? nullptr : replies.back().get();
  if (w != nullptr && w->type == REDIS_REPLY_INTEGER && w->integer >= d.replicas) {
    return absl::OkStatus();
  }
  const std::string where = absl::StrFormat("%s:%d", server.host, server.port);
  if (w == nullptr || w->type != REDIS_REPLY_INTEGER) {
    std::string cause = "malformed reply";
    if (w != nullptr && w->type == REDIS_REPLY_ERROR) cause = std::string(reply_string(*w));
    return absl::UnavailableError(
        absl::StrCat("redis ", where, ": WAIT for replicas failed: ", cause));
  }
  return absl::UnavailableError(absl::StrFormat(
      "redis %s: the write was acknowledged by %d of the %d replicas required within %d ms; "
      "a failover could lose it, so the decision is not given",
      where, w->integer, d.replicas, d.timeout.count()));
}

}  // namespace quota::redis
