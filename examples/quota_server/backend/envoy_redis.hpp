// examples/quota_server/backend/envoy_redis.hpp — envoyproxy/ratelimit budgets kept in Redis.
//
// With --redis* an envoyproxy/ratelimit rule file (envoy_rules.hpp) keeps each
// descriptor's budget in Redis: the Checker (checker.hpp check_envoy) decides it as ONE
// level of redis::GatewayStore on redis_envoy_key() of its budget key (the domain and
// the descriptor's entries, length-prefixed), so every server on that Redis shares it.
//   - redis_envoy_key(): a GatewayStore key (quota/redis/keys.hpp) has no braces or control
//     bytes and, without a tenant tag, is its own hash tag; '%', '{', '}' and bytes below
//     0x20 or equal to 0x7f are percent-encoded ("%7B"), so distinct budget keys stay
//     distinct Redis keys. A key over the store's bound is the store's InvalidArgument.
//   - check_envoy_for_redis(): every limit of a file that keeps a budget (not unlimited,
//     requests_per_unit above 0) must be one the Redis twin can keep (GatewayStore::check);
//     the error names the limit. Checked at start, on a reload and
//     before `quota-server publish` stores a file.
//
// Thread safety: pure functions.
//
//   std::string key = quota::server::redis_envoy_key("rls:4:edge|6:tenant4:a{b}");
//   // "rls:4:edge|6:tenant4:a%7Bb%7D"
//   if (auto s = quota::server::check_envoy_for_redis(*rules.envoy); !s.ok()) { ... }
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "backend/counted_redis_store.hpp"
#include "rules/envoy_rules.hpp"

namespace quota::server {

inline std::string redis_envoy_key(std::string_view key) {
  std::string out;
  out.reserve(key.size());
  for (const char ch : key) {
    const auto b = static_cast<unsigned char>(ch);
    if (ch == '%' || ch == '{' || ch == '}' || b < 0x20 || b == 0x7f) {
      absl::StrAppend(&out, "%", absl::Hex(b, absl::kZeroPad2));
    } else {
      out.push_back(ch);
    }
  }
  return out;
}

inline absl::Status check_envoy_for_redis(const EnvoyRules& rules) {
  absl::Status out = absl::OkStatus();
  const auto walk = [&out](const auto& self, const std::vector<EnvoyNode>& nodes) -> void {
    for (const EnvoyNode& n : nodes) {
      if (!out.ok()) return;
      if (n.limit != nullptr && !n.limit->unlimited && !n.limit->blocks()) {
        if (auto s = CountedRedisStore::check(n.limit->policy); !s.ok()) {
          out = absl::InvalidArgumentError(
              absl::StrCat("limit \"", n.limit->name, "\" cannot be kept in redis: ", s.message()));
          return;
        }
      }
      self(self, n.children);
    }
  };
  walk(walk, rules.descriptors);
  return out;
}

}  // namespace quota::server
