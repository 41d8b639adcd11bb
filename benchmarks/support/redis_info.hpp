// benchmarks/support/redis_info.hpp — what the Redis benchmarks share about their servers:
// how they connect (loopback, generous timeouts) and what they read from INFO.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "quota/redis/transport/connection.hpp"
#include "quota/redis/transport/connection_pool.hpp"

namespace quota::bench {

// A connection to a benchmark's redis-server on 127.0.0.1:`port`.
inline redis::ConnectionConfig loopback(int port) {
  using namespace std::chrono_literals;
  return {.host = "127.0.0.1", .port = port, .deadline = 5s};
}

// The number after `field` (e.g. "used_cpu_sys:") in INFO text; 0 when absent.
inline double info_number(const std::string& info, const std::string& field) {
  const auto at = info.find(field);
  return at == std::string::npos ? 0 : std::atof(info.c_str() + at + field.size());
}

// The server process's user + sys CPU seconds, from INFO cpu (or INFO all) text.
inline double info_cpu_seconds(const std::string& info) {
  return info_number(info, "used_cpu_sys:") + info_number(info, "used_cpu_user:");
}

// The usec spent in script commands (EVALSHA, EVAL), from INFO commandstats (or INFO all)
// text. Commands a script calls are counted again under their own names; the script's
// usec already includes them, so only the script commands are summed.
inline double info_script_usec(const std::string& info) {
  double total = 0;
  for (const char* cmd : {"cmdstat_evalsha:", "cmdstat_eval:"}) {
    const auto at = info.find(cmd);
    if (at != std::string::npos) total += info_number(info.substr(at), "usec=");
  }
  return total;
}

// The calls of script commands (EVALSHA, EVAL), from INFO commandstats (or INFO all) text:
// round trips that ran a script (the commands a script calls are not counted).
inline double info_script_calls(const std::string& info) {
  double total = 0;
  for (const char* cmd : {"cmdstat_evalsha:", "cmdstat_eval:"}) {
    const auto at = info.find(cmd);
    if (at != std::string::npos) total += info_number(info.substr(at), "calls=");
  }
  return total;
}

// The server's count of script calls so far (info_script_calls of INFO commandstats, read
// over a connection of `pool`); -1 when unreadable.
inline std::int64_t script_calls(redis::ConnectionPool& pool) {
  auto lease = pool.acquire();
  if (!lease.ok()) return -1;
  auto reply = (*lease)->command({"INFO", "commandstats"});
  if (!reply.ok() || (*reply)->type != REDIS_REPLY_STRING) return -1;
  return static_cast<std::int64_t>(info_script_calls(std::string((*reply)->str, (*reply)->len)));
}

}  // namespace quota::bench
