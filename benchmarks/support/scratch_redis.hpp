// benchmarks/support/scratch_redis.hpp — the redis-server a single-server Redis benchmark
// talks to: the one at 127.0.0.1:$QUOTA_REDIS_PORT when that is set, otherwise a
// throw-away one of its own, started on first use on a free loopback port
// (quota::testing::ScratchServer, tests/redis/support/redis_server.hpp: cmake/redis_server.sh)
// and stopped when the process exits.
//
// Guarantees: one server per process, started at most once; a server that cannot be
// started ends the process with exit code 2 and a message on stderr naming the way out
// (QUOTA_REDIS_PORT), never a benchmark against nothing. Thread safety: the first call
// starts the server under the C++ static-initialization lock; later calls from any
// thread return the same port.
//
//   const int port = quota::bench::redis_port("quota-bench-redis");
//   auto pool = std::make_shared<quota::redis::ConnectionPool>(
//       quota::redis::ConnectionConfig{.host = "127.0.0.1", .port = port}, 8);
#pragma once

#include <cstdio>
#include <cstdlib>

#include "redis/support/redis_server.hpp"

namespace quota::bench {

// The benchmark's server port. `scratch_name` names the throw-away server's directory
// (/tmp/<scratch_name>-<pid>, quota::testing::scratch_dir); only the first call's is used.
inline int redis_port(const char* scratch_name) {
  static const int port = [scratch_name] {
    if (const char* p = std::getenv("QUOTA_REDIS_PORT"); p != nullptr && *p != '\0') {
      return std::atoi(p);
    }
    static quota::testing::ScratchServer scratch(quota::testing::scratch_dir(scratch_name));
    if (!scratch.started()) {
      std::fprintf(stderr, "could not start redis-server (set QUOTA_REDIS_PORT to use one)\n");
      std::exit(2);
    }
    return scratch.port();
  }();
  return port;
}

}  // namespace quota::bench
