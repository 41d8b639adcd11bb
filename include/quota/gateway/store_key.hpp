// quota/gateway/store_key.hpp — the store keys a gateway builds, and the ids they are made of.
//
// Keys come from authenticated identity only: `Identity{tenant, plan, user}` supplied by
// the caller's authentication layer, plus a whitelisted route class. Tenant and user ids
// are 1..128 bytes of [A-Za-z0-9._@-]; plan, route and rule names 1..64 bytes of
// [a-z0-9_.-]; check_id() and check_name() reject anything else with InvalidArgument.
// The store keys are those of quota/redis/keys.hpp (one hash slot per tenant):
// "{tenant}route" (tenant level), "{tenant}route/user" (user level) and "{~global}route"
// (global level; '~' is not allowed in tenant ids, so no collision). A named limit
// (RuleSpec::limit) adds "#limit" after the route, which is empty for a limit shared by
// route classes: "{tenant}#units", "{tenant}#requests/u-1", "{~global}#tokens". No id or
// name contains '{', '}', '#' or '/', so no two budgets share a key. A StoreKey holds one
// inline, so building it allocates nothing, with its KeyLayout: where its scope and its
// record are, so that no backend parses a key the gateway built.
//
// Thread safety: values and pure functions.
//
//   quota::gateway::Identity who{.tenant = "acme", .plan = "free", .user = "u-1"};
//   auto k = quota::gateway::StoreKey::level(who.tenant, "read", "", who.user);
//   // k.view() == "{acme}read/u-1" == quota::gateway::user_key("acme", "read", "u-1")
//   // k.layout().scope(k) == "{acme}"
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"

namespace quota::gateway {

inline constexpr std::size_t kMaxIdBytes = 128;   // tenant and user ids
inline constexpr std::size_t kMaxNameBytes = 64;  // plan, route and rule names

// The caller's authenticated identity. Never fill it from client-supplied headers.
struct Identity {
  std::string_view tenant{};
  std::string_view plan{};
  std::string_view user = {};  // optional: enables user-level rules
};

// The longest store key: a user key of a named limit, "{" tenant "}" route "#" limit "/" user.
inline constexpr std::size_t kMaxLevelKeyBytes =
    1 + kMaxIdBytes + 1 + kMaxNameBytes + 1 + kMaxNameBytes + 1 + kMaxIdBytes;

// Where the parts of a level's key are: typed where the key is built (StoreKey::level),
// carried with the key to the backends (LevelCheck::layout), never parsed back. The scope
// "{tag}" is the key's first `scope_size` bytes (0: a key without braces, its own scope);
// the record — a named limit, after '#' — is `record_size` bytes at `record_at` (record_at
// 0: no '#'; a '#' with nothing after it is record "" of the scope, as no '#' is).
struct KeyLayout {
  std::uint16_t scope_size = 0;
  std::uint16_t record_at = 0;
  std::uint16_t record_size = 0;

  // "{acme}" of "{acme}read#tpm/u-1"; the whole key when it has no scope.
  std::string_view scope(std::string_view key) const {
    return scope_size == 0 ? key : key.substr(0, scope_size);
  }
  // "acme": the Redis hash tag (the whole key when it has no scope).
  std::string_view tag(std::string_view key) const {
    return scope_size == 0 ? key : key.substr(1, scope_size - 2);
  }
  // "tpm": the named limit ("" when none).
  std::string_view record(std::string_view key) const { return key.substr(record_at, record_size); }
  // The key without "#record", in two parts ("{acme}read", "/u-1"): the key of the scope
  // record that holds this limit beside the scope's other limits.
  std::pair<std::string_view, std::string_view> home(std::string_view key) const {
    if (record_at == 0) return {key, std::string_view()};
    return {key.substr(0, record_at - 1), key.substr(record_at + record_size)};
  }
};

// A level's key as a backend is given it outside a decision (refund, charge): the key
// and, when the gateway built it, its layout. A key given by hand (a test, an operator)
// converts implicitly, without a layout: a backend that needs one reads it from the key
// (redis::layout_of).
struct LevelKey {
  std::string_view key{};
  std::optional<KeyLayout> layout{};

  LevelKey(std::string_view k, std::optional<KeyLayout> l = std::nullopt) : key(k), layout(l) {}
  LevelKey(const std::string& k) : key(k) {}
  LevelKey(const char* k) : key(k) {}
};

// A store key held inline (no allocation), at most kMaxLevelKeyBytes, built by level()
// from checked parts with its layout. Reads as a std::string_view.
class StoreKey {
 public:
  StoreKey() = default;

  // A level's key, "{tag}route#limit/user" ('#limit' and '/user' only when not empty),
  // with its layout. Precondition: checked parts (RuleSet::plan() checks the ids first).
  static StoreKey level(std::string_view tag, std::string_view route, std::string_view limit,
                        std::string_view user) {
    StoreKey k;
    k.append("{", tag, "}");
    k.layout_.scope_size = static_cast<std::uint16_t>(k.size_);
    k.append(route);
    if (!limit.empty()) {
      k.append("#");
      k.layout_.record_at = static_cast<std::uint16_t>(k.size_);
      k.append(limit);
      k.layout_.record_size = static_cast<std::uint16_t>(k.size_ - k.layout_.record_at);
    }
    if (!user.empty()) k.append("/", user);
    return k;
  }

  // Copies only the bytes in use (the rest of the buffer is never written).
  StoreKey(const StoreKey& o) : size_(o.size_), layout_(o.layout_) {
    std::copy_n(o.bytes_.begin(), size_, bytes_.begin());
  }
  StoreKey& operator=(const StoreKey& o) {
    size_ = o.size_;
    layout_ = o.layout_;
    std::copy_n(o.bytes_.begin(), size_, bytes_.begin());
    return *this;
  }

  std::string_view view() const { return {bytes_.data(), size_}; }
  operator std::string_view() const { return view(); }  // NOLINT: reads as a string
  friend bool operator==(const StoreKey& a, std::string_view b) { return a.view() == b; }
  // The layout of a key built by level(); all zero for one built from parts.
  const KeyLayout& layout() const { return layout_; }

 private:
  template <class... Parts>
  void append(Parts... parts) {
    for (std::string_view part : {std::string_view(parts)...}) {
      part = part.substr(0, bytes_.size() - size_);  // never past the buffer
      std::copy(part.begin(), part.end(), bytes_.begin() + size_);
      size_ += part.size();
    }
  }

  std::array<char, kMaxLevelKeyBytes> bytes_;  // only [0, size_) is ever read
  std::size_t size_ = 0;
  KeyLayout layout_{};
};

namespace detail {

inline absl::Status check_token(std::string_view s, std::size_t max, bool id, const char* what) {
  if (s.empty() || s.size() > max) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s is %d bytes; it must be 1..%d bytes", what, s.size(), max));
  }
  for (char ch : s) {
    const bool ok = (ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9') || ch == '_' ||
                    ch == '.' || ch == '-' || (id && ((ch >= 'A' && ch <= 'Z') || ch == '@'));
    if (!ok) {
      return absl::InvalidArgumentError(absl::StrFormat("%s contains byte 0x%02x; allowed: %s",
                                                        what, static_cast<unsigned char>(ch),
                                                        id ? "[A-Za-z0-9._@-]" : "[a-z0-9_.-]"));
    }
  }
  return absl::OkStatus();
}

}  // namespace detail

inline absl::Status check_id(std::string_view s, const char* what) {
  return detail::check_token(s, kMaxIdBytes, true, what);
}
inline absl::Status check_name(std::string_view s, const char* what) {
  return detail::check_token(s, kMaxNameBytes, false, what);
}

// The scope of a key given without its layout (a LevelCheck built by hand): its "{tenant}"
// or "{~global}" prefix (the Redis hash tag); a key without one is its own scope. The
// budgets of one scope are decided in one atomic step (backend.hpp).
inline std::string_view scope_of(std::string_view key) {
  if (key.empty() || key.front() != '{') return key;
  const std::size_t close = key.find('}');
  return close == std::string_view::npos ? key : key.substr(0, close + 1);
}

// Store keys (see the header comment), as RuleSet::plan() builds them. Arguments must already be
// checked.
inline std::string tenant_key(std::string_view tenant, std::string_view route) {
  return std::string(StoreKey::level(tenant, route, "", "").view());
}
inline std::string user_key(std::string_view tenant, std::string_view route,
                            std::string_view user) {
  return std::string(StoreKey::level(tenant, route, "", user).view());
}
inline std::string global_key(std::string_view route) {
  return std::string(StoreKey::level("~global", route, "", "").view());
}

}  // namespace quota::gateway
