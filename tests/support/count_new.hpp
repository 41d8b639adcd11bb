// tests/support/count_new.hpp — counts heap allocations, for tests and benchmarks that
// assert or report "no allocation per decision".
//
// It replaces every global operator new and delete of the executable (over malloc/free)
// and counts the allocations made on the calling thread while a counting window is open
// (allocations_in). Every form is replaced, so whatever a library allocates with one form
// and frees with another stays malloc/free underneath: AddressSanitizer checks that
// pairing (alloc-dealloc-mismatch). The replacement is allowed under AddressSanitizer and
// ThreadSanitizer: they intercept the malloc/free underneath, so heap checking stays on.
//
// Include it in exactly ONE translation unit of an executable: it defines the replaceable
// global operators, which may not be inline.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <new>

namespace quota::testing {

inline thread_local bool t_counting_new = false;
inline thread_local std::int64_t t_allocations = 0;

// Runs fn() and returns how many allocations it made on this thread.
template <class Fn>
std::int64_t allocations_in(Fn&& fn) {
  t_allocations = 0;
  t_counting_new = true;
  fn();
  t_counting_new = false;
  return t_allocations;
}

namespace detail {
inline void* counted_alloc(std::size_t n) {
  if (t_counting_new) ++t_allocations;
  if (void* p = std::malloc(n == 0 ? 1 : n)) return p;
  throw std::bad_alloc();
}
inline void* counted_aligned_alloc(std::size_t n, std::align_val_t al) {
  if (t_counting_new) ++t_allocations;
  const auto a = static_cast<std::size_t>(al);
  // aligned_alloc wants a nonzero size that is a multiple of the alignment.
  const std::size_t size = std::max<std::size_t>((n + a - 1) / a * a, a);
  if (void* p = std::aligned_alloc(a, size)) return p;
  throw std::bad_alloc();
}
template <class Alloc>
void* no_throw(Alloc alloc) noexcept {
  try {
    return alloc();
  } catch (const std::bad_alloc&) {
    return nullptr;
  }
}
}  // namespace detail

}  // namespace quota::testing

void* operator new(std::size_t n) { return quota::testing::detail::counted_alloc(n); }
void* operator new[](std::size_t n) { return quota::testing::detail::counted_alloc(n); }
void* operator new(std::size_t n, const std::nothrow_t&) noexcept {
  return quota::testing::detail::no_throw([n] { return quota::testing::detail::counted_alloc(n); });
}
void* operator new[](std::size_t n, const std::nothrow_t&) noexcept {
  return quota::testing::detail::no_throw([n] { return quota::testing::detail::counted_alloc(n); });
}
void* operator new(std::size_t n, std::align_val_t al) {
  return quota::testing::detail::counted_aligned_alloc(n, al);
}
void* operator new[](std::size_t n, std::align_val_t al) {
  return quota::testing::detail::counted_aligned_alloc(n, al);
}
void* operator new(std::size_t n, std::align_val_t al, const std::nothrow_t&) noexcept {
  return quota::testing::detail::no_throw(
      [n, al] { return quota::testing::detail::counted_aligned_alloc(n, al); });
}
void* operator new[](std::size_t n, std::align_val_t al, const std::nothrow_t&) noexcept {
  return quota::testing::detail::no_throw(
      [n, al] { return quota::testing::detail::counted_aligned_alloc(n, al); });
}
// GCC, inlining one of these into code whose pointer came from `new`, takes the free()
// for a mismatched deallocation (-Wmismatched-new-delete, at -O1); new and delete here
// are both over malloc/free, so the pairing is right.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p, std::align_val_t, const std::nothrow_t&) noexcept { std::free(p); }
#pragma GCC diagnostic pop
