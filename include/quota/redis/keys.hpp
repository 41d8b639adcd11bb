// quota/redis/keys.hpp — how store keys become Redis keys, one hash slot per tenant.
//
// A Redis key is `<prefix>{<tag>}<rest>`. Redis Cluster hashes only the part between
// the first `{` and the next `}` (the hash tag), so every key of one tenant lands in one
// slot and a multi-key script (hierarchy, attempts) stays legal on a cluster.
//
// The store accepts two kinds of keys:
//   - a tenant key built by `tenant_key(tenant, route)`: "{tenant}route" — the tag is
//     the tenant, so all routes of a tenant share a slot;
//   - any other key without `{` or `}` ("tenant-7:read"): the whole key becomes the tag,
//     "{tenant-7:read}" — one slot per key.
// Anything else — a `{` or `}` elsewhere, a control character (newline, NUL), an empty
// part, a key over the bounds — is rejected with InvalidArgument, so a caller cannot
// craft a key that lands in (or collides with) another tenant's slot. Attempt records
// live at `<prefix>a{<tag>}<attempt id>`: never equal to a bucket key, whose prefix is
// followed directly by `{`. The gateway store keeps a scope's limits in one key
// (scope_key): "{tenant}route#limit/user" is record "limit" of "<prefix>{tenant}route/user".
//
// Thread safety: pure functions.
//
//   absl::StatusOr<std::string> k = quota::redis::tenant_key("acme", "read");  // "{acme}read"
//   quota::Limiter<...>::acquire(*k, 1);
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "quota/attempts.hpp"
#include "quota/detail/keyed_states.hpp"
#include "quota/gateway/store_key.hpp"

namespace quota::redis {

inline constexpr std::size_t kMaxTenantBytes = 128;
inline constexpr std::size_t kMaxRouteBytes = 128;
inline constexpr std::size_t kMaxStoreKeyBytes = 256;

// "{tenant}route" for a tenant of 1..kMaxTenantBytes and a route of 0..kMaxRouteBytes
// bytes without braces or control characters.
inline absl::StatusOr<std::string> tenant_key(std::string_view tenant, std::string_view route) {
  if (tenant.empty() || tenant.size() > kMaxTenantBytes) {
    return absl::InvalidArgumentError(absl::StrFormat("tenant is %d bytes; it must be 1..%d bytes",
                                                      tenant.size(), kMaxTenantBytes));
  }
  if (route.size() > kMaxRouteBytes) {
    return absl::InvalidArgumentError(
        absl::StrFormat("route is %d bytes; the bound is %d bytes", route.size(), kMaxRouteBytes));
  }
  if (auto s = quota::detail::check_key_chars(tenant, "tenant"); !s.ok()) return s;
  if (auto s = quota::detail::check_key_chars(route, "route"); !s.ok()) return s;
  return absl::StrCat("{", std::string(tenant), "}", std::string(route));
}

// The parts of a store key: its hash tag and what follows it.
struct KeyParts {
  std::string_view tag;
  std::string_view rest;
};

// Splits a store key as described above; InvalidArgument for anything else.
// OK for a key of 1..kMaxStoreKeyBytes bytes.
inline absl::Status check_key_size(std::string_view key) {
  if (key.empty() || key.size() > kMaxStoreKeyBytes) {
    return absl::InvalidArgumentError(
        absl::StrFormat("key is %d bytes; it must be 1..%d bytes", key.size(), kMaxStoreKeyBytes));
  }
  return absl::OkStatus();
}

inline absl::StatusOr<KeyParts> split_key(std::string_view key) {
  if (auto s = check_key_size(key); !s.ok()) return s;
  if (key.front() == '{') {
    const std::size_t close = key.find('}');
    if (close == std::string_view::npos || close == 1) {
      return absl::InvalidArgumentError(
          "key starts with '{' but is not a tenant key \"{tenant}route\" (see tenant_key)");
    }
    KeyParts parts{key.substr(1, close - 1), key.substr(close + 1)};
    if (auto s = quota::detail::check_key_chars(parts.tag, "tenant"); !s.ok()) return s;
    if (auto s = quota::detail::check_key_chars(parts.rest, "route"); !s.ok()) return s;
    return parts;
  }
  if (auto s = quota::detail::check_key_chars(key, "key"); !s.ok()) return s;
  return KeyParts{key, {}};
}

// `<prefix>{tag}rest` for a store key (see split_key).
inline std::string bucket_key(std::string_view prefix, const KeyParts& parts) {
  return absl::StrCat(std::string(prefix), "{", std::string(parts.tag), "}",
                      std::string(parts.rest));
}

// The layout (gateway/store_key.hpp KeyLayout) of a key given without one — a level
// built by hand, an operator's key — read from the key as split_key() reads it:
// "{tag}part#limit/user" is record "limit" of scope "{tag}"; a key without '#' has no
// record; a key without braces is its own scope. InvalidArgument as split_key, or for a
// limit name over gateway::kMaxNameBytes.
inline absl::StatusOr<gateway::KeyLayout> layout_of(std::string_view key) {
  auto parts = split_key(key);
  if (!parts.ok()) return parts.status();
  if (key.front() != '{') return gateway::KeyLayout{};
  gateway::KeyLayout out{.scope_size = static_cast<std::uint16_t>(parts->tag.size() + 2)};
  const std::size_t hash = parts->rest.find('#');
  if (hash == std::string_view::npos) return out;
  const std::size_t slash = parts->rest.find('/', hash);
  const std::size_t name =
      (slash == std::string_view::npos ? parts->rest.size() : slash) - hash - 1;
  if (name > gateway::kMaxNameBytes) {
    return absl::InvalidArgumentError(
        absl::StrFormat("limit name of key is %d bytes; at most %d", name, gateway::kMaxNameBytes));
  }
  out.record_at = static_cast<std::uint16_t>(out.scope_size + hash + 1);
  out.record_size = static_cast<std::uint16_t>(name);
  return out;
}

// A gateway key's scope key and the name of its record there (twin/gateway.hpp), from its
// layout: "{tag}part#limit/user" is record "limit" of "<prefix>{tag}part/user"; a key
// without a record is record "" of its own; a key without braces is "<prefix>{key}".
inline std::pair<std::string, std::string_view> scope_key(std::string_view prefix,
                                                          std::string_view key,
                                                          const gateway::KeyLayout& layout) {
  if (layout.scope_size == 0) {
    return {absl::StrCat(quota::detail::to_absl(prefix), "{", quota::detail::to_absl(key), "}"),
            std::string_view()};
  }
  const auto [head, tail] = layout.home(key);
  return {absl::StrCat(quota::detail::to_absl(prefix), quota::detail::to_absl(head),
                       quota::detail::to_absl(tail)),
          layout.record(key)};
}

// The same for a key given without its layout (layout_of).
inline absl::StatusOr<std::pair<std::string, std::string_view>> scope_key(std::string_view prefix,
                                                                          std::string_view key) {
  auto layout = layout_of(key);
  if (!layout.ok()) return layout.status();
  return scope_key(prefix, key, *layout);
}

// `<prefix>a{tag}id`: where an attempt's first result is kept.
inline absl::StatusOr<std::string> attempt_key(std::string_view prefix, std::string_view tag,
                                               std::string_view attempt_id) {
  if (auto s = check_attempt_id(attempt_id); !s.ok()) return s;
  return absl::StrCat(std::string(prefix), "a{", std::string(tag), "}", std::string(attempt_id));
}

}  // namespace quota::redis
