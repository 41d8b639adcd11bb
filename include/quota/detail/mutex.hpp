// quota/detail/mutex.hpp — the lock quota's in-process stores take on every decision.
//
// A std::mutex with abseil's thread-safety annotations (so ABSL_GUARDED_BY members are
// checked by clang's -Wthread-safety), used instead of absl::Mutex on the hot path.
// Why: Debian 12's libabsl is built without NDEBUG, so absl::Mutex runs its deadlock
// detector — a process-wide graph under a global lock — on every Lock(): several times
// the cost of std::mutex uncontended, and no scaling across threads
// (benchmarks/store_bench.cpp measures both; docs/benchmarks.md). Lock-order checking is
// still available in tests through TSan.
//
//   quota::detail::Mutex mu;
//   int n ABSL_GUARDED_BY(mu) = 0;
//   { quota::detail::MutexLock lock(mu); ++n; }
#pragma once

#include <mutex>

#include "absl/base/thread_annotations.h"

namespace quota::detail {

class ABSL_LOCKABLE Mutex {
 public:
  void lock() ABSL_EXCLUSIVE_LOCK_FUNCTION() { mu_.lock(); }
  void unlock() ABSL_UNLOCK_FUNCTION() { mu_.unlock(); }

 private:
  std::mutex mu_;
};

class ABSL_SCOPED_LOCKABLE MutexLock {
 public:
  explicit MutexLock(Mutex& mu) ABSL_EXCLUSIVE_LOCK_FUNCTION(mu) : mu_(mu) { mu_.lock(); }
  ~MutexLock() ABSL_UNLOCK_FUNCTION() { mu_.unlock(); }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

 private:
  Mutex& mu_;
};

}  // namespace quota::detail
