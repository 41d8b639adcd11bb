// examples/quota_server/backend/redis_memory.hpp — how full the budget store's Redis is,
// for /metrics: each primary's used_memory and maxmemory (INFO memory), read when
// Prometheus scrapes.
//
// A budget store that reaches its maxmemory refuses writes (with the noeviction policy
// quota-server requires: redis/gateway_store_setup.hpp), so every decision then fails;
// the alert QuotaRedisMemoryNearLimit (examples/alerts/) warns before. One node: the
// pool's (or the primary a sentinel follows); a Cluster: each primary of the last slot
// map, over a connection of its own for this one call. A node that does not answer within
// the connections' deadline is left out (its errors are quota_redis_errors_total's
// business, not this reader's).
//
// Thread safety: any thread (the pools are thread-safe; a Cluster node's connection is
// the call's own).
//
//   for (const auto& m : quota::server::redis_memory(store)) ...  // m.node, m.used, m.max
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "quota/redis/gateway_store.hpp"
#include "quota/redis/transport/connection.hpp"
#include "quota/redis/transport/reply.hpp"

namespace quota::server {

struct RedisMemory {
  std::string node;       // host:port
  std::int64_t used = 0;  // used_memory, bytes
  std::int64_t max = 0;   // maxmemory, bytes (0: no limit)
};

namespace detail {

// The integer after "`field`:" in INFO text; 0 when absent or malformed.
inline std::int64_t info_integer(std::string_view info, std::string_view field) {
  const std::string key = absl::StrCat("\n", redis::detail::av(field), ":");
  const std::size_t at = absl::string_view(info.data(), info.size()).find(key);
  if (at == std::string_view::npos) return 0;
  const std::size_t begin = at + key.size();
  const std::size_t end = info.find_first_of("\r\n", begin);
  std::int64_t v = 0;
  return absl::SimpleAtoi(redis::detail::av(info.substr(begin, end - begin)), &v) ? v : 0;
}

inline bool read_memory(redis::Connection& c, RedisMemory& out) {
  auto r = c.command({"INFO", "memory"});
  if (!r.ok() || (*r)->type != REDIS_REPLY_STRING) return false;
  // (INFO's text starts with "# Memory\r\n": every field follows a newline)
  const std::string_view text = redis::reply_string(**r);
  out.used = info_integer(text, "used_memory");
  out.max = info_integer(text, "maxmemory");
  return true;
}

}  // namespace detail

inline std::vector<RedisMemory> redis_memory(const redis::GatewayStore& store) {
  std::vector<RedisMemory> out;
  const redis::GatewayStoreOptions& o = store.options();
  if (const std::shared_ptr<redis::ConnectionPool> pool = redis::pool_of(o)) {
    auto lease = pool->acquire();
    RedisMemory m;
    m.node = absl::StrCat(pool->config().host, ":", pool->config().port);
    if (lease.ok() && detail::read_memory(**lease, m)) out.push_back(std::move(m));
    return out;
  }
  if (o.cluster == nullptr) return out;
  for (const redis::ConnectionConfig& node : o.cluster->node_configs()) {
    redis::Connection c(node);
    RedisMemory m;
    m.node = absl::StrCat(node.host, ":", node.port);
    if (detail::read_memory(c, m)) out.push_back(std::move(m));
  }
  return out;
}

}  // namespace quota::server
