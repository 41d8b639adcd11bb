// src/c/struct_size.hpp — the structs of the C interface as callers of any version pass
// them: each starts with its `size`, the sizeof the caller compiled, and versions only add
// fields at the end (quota/c/quota.h).
//
// kFirstSize<T> is T's size in ABI 1, its first version: the least a caller may pass.
// read_struct() gives the struct as this library reads it: the caller's own when its size
// is this version's (no copy), else a copy of the bytes its size covers with the later
// fields 0 (their defaults). It refuses a null pointer, a size below kFirstSize, and a
// caller's struct larger than this version's with a nonzero byte past it: a field this
// library does not know, which a host built with a newer header set and would otherwise
// see silently ignored. OutStruct fills the caller's struct the same way: in place at this
// version's size, else in a local copy whose bytes the caller's size covers are copied
// back when it is destroyed (the `size` field kept; a longer struct's unknown tail zeroed).
//
// Thread safety: the caller's struct is read or written by the one call it was passed to.
//
//   quota_config local;
//   auto c = read_struct(config, local, "config");
//   if (!c.ok()) return fail(error, c.status());
//   Limiter::open(**c);                  // fields past the caller's size read as 0
//   if (auto s = size_ok(out, "out"); !s.ok()) return fail(error, s);
//   OutStruct<quota_decision> d(out);
//   limiter->decide(request, d.get());   // copied back when d leaves scope
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_format.h"
#include "quota/c/quota.h"

namespace quota::c_api {

template <class T>
inline constexpr std::size_t kFirstSize = sizeof(T);
// ABI 2 added redis_replicas ... redis_coalesce_calls.
template <>
inline constexpr std::size_t kFirstSize<quota_config> = offsetof(quota_config, redis_replicas);

// Null, or a size below the first version's: why, naming `what`; else OK.
template <class T>
absl::Status size_ok(const T* p, std::string_view what) {
  if (p == nullptr) return absl::InvalidArgumentError(absl::StrFormat("%s: a null pointer", what));
  if (p->size < kFirstSize<T>) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: size %d is below %d, the struct's first version (set it to sizeof the struct)", what,
        p->size, kFirstSize<T>));
  }
  return absl::OkStatus();
}

// The caller's input struct `p` as this version reads it (see the top of this file);
// `local` holds the copy when one is made and must outlive the result.
template <class T>
absl::StatusOr<const T*> read_struct(const T* p, T& local, std::string_view what) {
  if (auto s = size_ok(p, what); !s.ok()) return s;
  if (p->size == sizeof(T)) return p;
  const auto* bytes = reinterpret_cast<const unsigned char*>(p);
  for (std::size_t i = sizeof(T); i < p->size; ++i) {
    if (bytes[i] != 0) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s: byte %d of %d is set, past the %d bytes of this library's struct (ABI %d): a "
          "field it does not have",
          what, i, p->size, sizeof(T), QUOTA_ABI_VERSION));
    }
  }
  std::memset(&local, 0, sizeof(T));
  std::memcpy(&local, p, std::min(p->size, sizeof(T)));
  return &local;
}

// The caller's output struct (checked with size_ok first), filled through get().
template <class T>
class OutStruct {
 public:
  explicit OutStruct(T* to) : to_(to) {
    if (to_->size != sizeof(T)) std::memset(&local_, 0, sizeof(T));
  }
  OutStruct(const OutStruct&) = delete;
  OutStruct& operator=(const OutStruct&) = delete;
  ~OutStruct() {
    const std::size_t size = to_->size;
    if (size == sizeof(T)) return;
    local_.size = size;
    std::memcpy(to_, &local_, std::min(size, sizeof(T)));
    if (size > sizeof(T))
      std::memset(reinterpret_cast<unsigned char*>(to_) + sizeof(T), 0, size - sizeof(T));
  }
  T& get() { return to_->size == sizeof(T) ? *to_ : local_; }

 private:
  T* to_;
  T local_;
};

}  // namespace quota::c_api
