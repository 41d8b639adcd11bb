// examples/quota_server/testing/script_calls.hpp — how many scripts a redis-server ran, for
// tests that show a check decided from a grant (no call) or at Redis (a call).
//
// script_calls(redis) reads INFO commandstats over `redis` and returns the calls of EVALSHA
// and EVAL since the server started or its last CONFIG RESETSTAT (the commands a script
// runs are not counted); -1 when Redis does not answer.
//
// Thread safety: as the Connection (one thread at a time).
//
//   long long before = quota::testing::script_calls(direct);
#pragma once

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <string>

#include "quota/redis/transport/connection.hpp"

namespace quota::testing {

inline long long script_calls(quota::redis::Connection& redis) {
  auto reply = redis.command({"INFO", "commandstats"},
                             quota::redis::Deadline::after(std::chrono::seconds(2)));
  if (!reply.ok() || (*reply)->type != REDIS_REPLY_STRING) return -1;
  std::istringstream in(std::string((*reply)->str, (*reply)->len));
  long long calls = 0;
  for (std::string line; std::getline(in, line);) {
    for (const char* name : {"cmdstat_evalsha:calls=", "cmdstat_eval:calls="}) {
      if (line.rfind(name, 0) == 0) calls += std::atoll(line.c_str() + std::strlen(name));
    }
  }
  return calls;
}

}  // namespace quota::testing
