// tests/support/failing_store.hpp — a store that really fails, on demand.
//
// Wraps an in-process store and, while `down` is set, answers every call with
// absl::UnavailableError without touching state: what a gateway sees when its authority
// (Redis) is unreachable. Thread-safe when the wrapped store is.
#pragma once

#include <atomic>
#include <cstdint>
#include <span>
#include <string_view>
#include <type_traits>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "quota/decision.hpp"
#include "quota/detail/keyed_states.hpp"
#include "quota/units.hpp"

namespace quota::testing {

template <class Inner>
class FailingStore {
 public:
  using policy_type = typename Inner::policy_type;
  using State = typename policy_type::State;

  explicit FailingStore(Inner& inner) : inner_(inner) {}

  void set_down(bool down) { down_.store(down, std::memory_order_release); }
  bool down() const { return down_.load(std::memory_order_acquire); }
  std::int64_t failures() const { return failures_.load(std::memory_order_relaxed); }

  absl::StatusOr<Decision> apply(const policy_type& policy, std::string_view key, Nanos now,
                                 std::int64_t cost) {
    if (down()) return fail();
    return inner_.apply(policy, key, now, cost);
  }

  template <class Fn>
  auto update(const policy_type& policy, std::string_view key, Nanos now, Fn&& fn)
      -> absl::StatusOr<std::invoke_result_t<Fn&, State&>> {
    if (down()) return fail();
    return inner_.update(policy, key, now, std::forward<Fn>(fn));
  }

  template <class Fn>
  auto update_all(std::span<const policy_type> policies, std::span<const std::string_view> keys,
                  Nanos now, Fn&& fn)
      -> absl::StatusOr<std::invoke_result_t<Fn&, detail::OpenedStates<policy_type>&>> {
    if (down()) return fail();
    return inner_.update_all(policies, keys, now, std::forward<Fn>(fn));
  }

 private:
  absl::Status fail() {
    failures_.fetch_add(1, std::memory_order_relaxed);
    return absl::UnavailableError("test store: authority unreachable");
  }

  Inner& inner_;
  std::atomic<bool> down_{false};
  std::atomic<std::int64_t> failures_{0};
};

}  // namespace quota::testing
