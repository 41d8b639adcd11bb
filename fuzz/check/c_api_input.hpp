// fuzz/check/c_api_input.hpp — what a hostile host sends the C interface
// (quota/c/quota.h) in c_api_check.hpp's operations, built from the fuzz input: the main
// limiter's rules, values, strings, structs of every size, and the arena they live in
// until their call returns. What the operations send:
//   - handles: an open one, a closed one, 0, any 64-bit value, another slot's or
//     another generation's;
//   - structs: null, the right size, too small (allocated to exactly the size given, as
//     a host built against an older header would pass them), larger (a newer header);
//   - strings (quota_str): names of the rules (so that budgets are shared), empty, null
//     data with a length, up to 511 bytes of the input (NULs inside), a name with a NUL
//     inside its length, names padded to exactly the bound and one past it;
//   - flags (unknown bits too), cost, estimate and now_ns anything, INT64_MIN and
//     INT64_MAX included; tickets issued, settled twice, unknown; actual costs anything;
//   - rule text from the input, the rules with another `version:`, without one, with
//     input bytes spliced in; paths that do not exist or are a directory (never a file
//     that could be read forever); configs with unknown store kinds, opt-out bits and
//     modes, negative bounds.
//   - metrics buffers of exactly the capacity given (0 to 16 KiB), or null.
// A Redis store is only ever asked for with addresses that cannot parse (no ':'): the
// input never makes the library connect anywhere.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <new>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "check/input.hpp"
#include "quota/c/quota.h"

namespace quota::fuzz {
namespace detail_c_api {

inline constexpr int kMaxOps = 64;
inline constexpr std::size_t kMaxHandles = 4;
inline constexpr unsigned char kFill = 0xA5;                  // what the library must not overwrite
inline constexpr std::uint64_t kUnknown = ~std::uint64_t{0};  // a version not known

// Every policy, a shared limit paid by estimate, a tenant's own rule beside its plan's,
// a user rule, a rollout, a shadow rule, fair shares of a global budget, per-request caps
// and a route that fails open: the rules the main limiter opens with (version 1).
inline constexpr std::string_view kRulesBody =
    "routes:\n"
    "  - {name: read}\n"
    "  - {name: chat, costs: {tokens: estimate, requests: 1}}\n"
    "  - {name: batch, max_cost: 50}\n"
    "  - {name: search, cost: 2}\n"
    "  - {name: open, fail_mode: open, emergency: {rate: 10/s, burst: 5, max_duration: 30s}}\n"
    "rules:\n"
    "  - {name: free-read, level: tenant, plan: free, route: read,\n"
    "     token_bucket: {rate: 1/s, burst: 3}}\n"
    "  - {name: acme-read, level: tenant, tenant: acme, route: read,\n"
    "     token_bucket: {rate: 5/s, burst: 10}}\n"
    "  - {name: pro-read, level: tenant, plan: pro, route: read,\n"
    "     fixed_window: {limit: 5, window: 10s}, enforce_percent: 50}\n"
    "  - {name: user-read, level: user, plan: free, route: read,\n"
    "     sliding_window_estimate: {limit: 4, window: 1s}}\n"
    "  - {name: global-read, level: global, route: read,\n"
    "     fixed_window: {limit: 20, window: 1min}, shadow: true}\n"
    "  - {name: free-tokens, level: tenant, plan: free, limit: tokens,\n"
    "     token_bucket: {rate: 1000/s, burst: 5000}}\n"
    "  - {name: free-requests, level: tenant, plan: free, limit: requests,\n"
    "     token_bucket: {rate: 10/s, burst: 10}}\n"
    "  - {name: provider, level: global, limit: tokens,\n"
    "     token_bucket: {rate: 4000/s, burst: 8000},\n"
    "     fair_share: {reserve: 20%, shares_above: 50%, pause_above: 85%, period: 1s}}\n"
    "  - {name: free-batch, level: tenant, plan: free, route: batch,\n"
    "     token_bucket: {rate: 20/s, burst: 40}, max_cost: 10}\n"
    "  - {name: free-search, level: tenant, plan: free, route: search,\n"
    "     sliding_log: {limit: 6, window: 1s}}\n"
    "  - {name: free-open, level: tenant, plan: free, route: open,\n"
    "     token_bucket: {rate: 1/s, burst: 2}}\n";

inline std::string rules_text(std::uint64_t version) {
  return absl::StrCat("version: ", version, "\n", std::string(kRulesBody));
}

constexpr const char* kTenants[] = {"acme", "globex", "initech", "t-1", "u@x.y"};
constexpr const char* kPlans[] = {"free", "pro", "team"};
constexpr const char* kRoutes[] = {"read", "chat", "batch", "search", "open", "nope"};
constexpr const char* kUsers[] = {"u1", "u2"};
constexpr const char* kAttempts[] = {"a1", "a2", "a3"};

inline constexpr std::uint32_t kRequestFlags =
    QUOTA_REQUEST_COST | QUOTA_REQUEST_ESTIMATE | QUOTA_REQUEST_NOW | QUOTA_REQUEST_HTTP;
inline constexpr std::uint32_t kOptOuts =
    QUOTA_OPT_OUT_RESTART_SAFETY | QUOTA_OPT_OUT_FAILOVER_SAFETY | QUOTA_OPT_OUT_CLOCK_GUARD |
    QUOTA_OPT_OUT_EVICTION_CHECK | QUOTA_OPT_OUT_BREAKER;

inline bool is_code(std::int32_t c) { return c >= QUOTA_OK && c <= QUOTA_INTERNAL; }

// A signed value for a cost, an estimate, an actual cost or a limit: the ends of int64,
// 0, 1, -1, small, within the rules' budgets, or anything.
inline std::int64_t value(Input& in) {
  switch (in.byte() % 9) {
    case 0:
      return 0;
    case 1:
      return 1;
    case 2:
      return -static_cast<std::int64_t>(in.byte());
    case 3:
      return kMin;
    case 4:
      return kMax;
    case 5:
      return static_cast<std::int64_t>(in.u64());
    case 6:
      return in.in_range(1, 100'000);
    default:
      return 1 + in.byte() % 16;
  }
}

// Buffers that live until the call they were made for has returned, each allocated to
// exactly its length (a sanitizer then sees a read past it).
class Arena {
 public:
  char* bytes(std::size_t n) {
    buffers_.push_back(std::make_unique<char[]>(n));
    return buffers_.back().get();
  }
  quota_str copy(std::string_view s) {
    char* p = bytes(s.size());
    if (!s.empty()) std::memcpy(p, s.data(), s.size());
    return {p, s.size()};
  }

 private:
  std::vector<std::unique_ptr<char[]>> buffers_;
};

// A string argument and whether the library must take its shape: data given for its
// length, at most `max` bytes, no NUL inside (an empty one may still be refused).
struct Field {
  quota_str s{nullptr, 0};
  bool shaped = true;
};

inline Field field(quota_str s, std::size_t max) {
  Field f{.s = s, .shaped = true};
  if (s.data == nullptr) {
    f.shaped = s.len == 0;
  } else {
    f.shaped = s.len <= max && std::memchr(s.data, 0, s.len) == nullptr;
  }
  return f;
}

// A string field of at most `max` bytes: usually one of `words`, else empty (null or
// not), null with a length, input bytes, a word with a NUL inside its length, or a word
// padded to the bound or one past it.
inline Field string_field(Input& in, Arena& a, std::span<const char* const> words,
                          std::size_t max) {
  const std::string_view word = words[in.byte() % words.size()];
  switch (in.byte() % 12) {
    case 0:
      return field({nullptr, 0}, max);
    case 1:
      return field(a.copy(""), max);
    case 2: {
      const std::size_t lens[] = {1, max, max + 1, SIZE_MAX};
      const std::uint8_t i = in.byte() % 5;
      const std::size_t len = i < 4 ? lens[i] : std::max<std::size_t>(1, in.u64());
      return field({nullptr, len}, max);
    }
    case 3: {
      const std::size_t len = in.byte() | (std::size_t{in.byte()} % 2) << 8;
      char* p = a.bytes(len);
      for (std::size_t i = 0; i < len; ++i) p[i] = static_cast<char>(in.byte());
      return field({p, len}, max);
    }
    case 4: {
      std::string s(word);
      s.insert(in.byte() % (s.size() + 1), 1, '\0');
      return field(a.copy(s), max);
    }
    case 5: {
      std::string s(word);
      s.resize(max + in.byte() % 2, 'a');
      return field(a.copy(s), max);
    }
    default:
      return field(a.copy(word), max);
  }
}

// The size each struct had in ABI 1, its first version (the header's contract: a size
// below it is refused). quota_config grew in ABI 2.
template <class T>
inline constexpr std::size_t kFirstBytes = sizeof(T);
template <>
inline constexpr std::size_t kFirstBytes<quota_config> = offsetof(quota_config, redis_replicas);

// How a host passes a struct: `bytes` bytes (0: a null pointer), the bytes past this
// version's struct (when larger) filled with `tail`.
struct Shape {
  std::size_t bytes = 0;
  unsigned char tail = kFill;
};

// A struct as a host built against some version of the header passes it: `bytes` bytes
// (0: a null pointer) with its size field saying so, allocated to exactly that, the
// bytes not set filled with kFill (past this version's struct: the shape's tail). The
// contract: a size below the first version's is refused and nothing of it written; a
// larger input whose tail is not all 0 (a field this library does not know) is refused;
// an input is never written; an output larger than this version's gets its tail zeroed
// by a call that succeeds.
template <class T>
class Sized {
 public:
  explicit Sized(Shape shape)
      : bytes_(shape.bytes == 0 ? 0 : std::max(shape.bytes, sizeof(std::size_t))),
        tail_(shape.tail),
        buf_(bytes_ == 0 ? nullptr : new unsigned char[bytes_]) {
    if (buf_ == nullptr) return;
    std::memset(buf_.get(), kFill, bytes_);
    if (bytes_ > sizeof(T)) std::memset(buf_.get() + sizeof(T), tail_, bytes_ - sizeof(T));
    if (taken()) std::memset(buf_.get(), 0, std::min(bytes_, sizeof(T)));
    std::memcpy(buf_.get(), &bytes_, sizeof bytes_);
  }

  // The struct's shape: null, this version's mostly, else too small, between the first
  // version's and this one's, or larger with a zero tail or another.
  static Shape pick(Input& in) {
    switch (in.byte() % 16) {
      case 0:
        return {};
      case 1:
        return {.bytes = kFirstBytes<T> - 1};
      case 2:
        return {.bytes = sizeof(std::size_t)};
      case 3:
        return {.bytes = sizeof(std::size_t) + in.byte() % (kFirstBytes<T> - sizeof(std::size_t))};
      case 4:
        return {.bytes = sizeof(T) + 1 + in.byte() % 64};
      case 5:
        return {.bytes = sizeof(T) + 1 + in.byte() % 64, .tail = 0};
      case 6:
        return {.bytes = kFirstBytes<T> + in.byte() % (sizeof(T) - kFirstBytes<T> + 1)};
      default:
        return {.bytes = sizeof(T)};
    }
  }

  bool null() const { return buf_ == nullptr; }
  // At least the first version's size: the library reads or fills it.
  bool taken() const { return bytes_ >= kFirstBytes<T>; }
  // Every field of this version present (value() may be read).
  bool full() const { return bytes_ >= sizeof(T); }
  // An input the library must accept: taken, and nothing unknown set past this version's.
  bool accepted_input() const { return taken() && (bytes_ <= sizeof(T) || tail_ == 0); }
  T* get() const { return reinterpret_cast<T*>(buf_.get()); }
  const T& value() const { return *get(); }
  // The struct as the library reads it: the bytes the size covers, later fields 0.
  T as_read() const {
    T t;
    std::memset(&t, 0, sizeof t);
    if (buf_ != nullptr) std::memcpy(&t, buf_.get(), std::min(bytes_, sizeof(T)));
    return t;
  }

  // Copies `t`'s fields in, as far as the struct reaches when taken, keeping the size.
  void set(const T& t) {
    if (!taken()) return;
    std::memcpy(buf_.get(), &t, std::min(bytes_, sizeof(T)));
    std::memcpy(buf_.get(), &bytes_, sizeof bytes_);
  }

  // Whether what the library must not write still holds its fill: all but the size field
  // of a struct below the first version's, the bytes past this version's of a larger one
  // (`zeroed`: an output's after a call that succeeded, which must be 0).
  bool untouched(bool zeroed = false) const {
    if (buf_ == nullptr) return true;
    const std::size_t from = taken() ? std::min(bytes_, sizeof(T)) : sizeof(std::size_t);
    for (std::size_t i = from; i < bytes_; ++i) {
      const unsigned char want = !taken() ? kFill : zeroed ? 0 : tail_;
      if (buf_[i] != want) return false;
    }
    std::size_t size = 0;
    std::memcpy(&size, buf_.get(), sizeof size);
    return size == bytes_;
  }
  // An output after a call that failed: its tail as filled, or zeroed.
  bool untouched_or_zeroed() const { return untouched(false) || untouched(true); }

  std::string str() const { return absl::StrFormat("%d of %d bytes", bytes_, sizeof(T)); }

 private:
  std::size_t bytes_;
  unsigned char tail_;
  std::unique_ptr<unsigned char[]> buf_;
};

}  // namespace detail_c_api
}  // namespace quota::fuzz
