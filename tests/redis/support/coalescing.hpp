// tests/redis/support/coalescing.hpp — what the coalescing tests share.
#pragma once

#include <chrono>
#include <cstdint>
#include <thread>

namespace quota::testing {

// Waits (up to 1 s) until `n` calls of `store` (anything with coalesce_stats()) wait in
// its coalescer; true if they did.
template <class Store>
bool wait_for_waiting(const Store& store, std::uint64_t n) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(1);
  while (store.coalesce_stats().waiting < n) {
    if (std::chrono::steady_clock::now() > until) return false;
    std::this_thread::yield();
  }
  return true;
}

}  // namespace quota::testing
