// quota/gateway/rules/rule_registry.hpp — the rule set in force, swapped atomically, and the
// global shadow switch.
//
// A RuleRegistry holds one validated RuleSet (rules.hpp). `publish()` swaps in a set
// built beforehand, so decisions never wait for a reload to be built and never see a
// half-built set; versions must increase (they identify the parameters a key's state was
// written under). `set_shadow_all()` turns every rule of every set to shadow and back, at
// once, without a reload. Rule files (quota/rules/rule_file.hpp) reload through it.
// `before_publish` installs a step every publish runs first, with the set in force and
// the next one (revoke_on_publish, lease_revocation.hpp: lease revocations at the
// authority); its error stops the publish.
//
// Thread safety: every member may be called from any thread.
//
//   quota::gateway::RuleRegistry registry(*quota::gateway::RuleSet::create(spec));
//   std::shared_ptr<const quota::gateway::RuleSet> rules = registry.current();
//   registry.set_shadow_all(true);  // log-only, everywhere, now
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "quota/detail/mutex.hpp"
#include "quota/gateway/rules/rules.hpp"

namespace quota::gateway {

// The current rule set, swapped atomically. Thread-safe. `current()` copies a shared_ptr
// under a mutex held only for the copy; `publish()` swaps in a set built beforehand, so
// readers never wait for a reload to be built, and a reader keeps the set it took until
// it drops it: no decision ever sees a half-built set. Versions must increase.
class RuleRegistry {
 public:
  explicit RuleRegistry(std::shared_ptr<const RuleSet> initial) : current_(std::move(initial)) {}

  // The global switch: while on, every rule of every set is in shadow (decided and
  // counted, nothing denied), whatever the sets say; off, the sets' own shadow_all holds.
  void set_shadow_all(bool on) { shadow_all_.store(on, std::memory_order_relaxed); }
  bool shadow_all() const { return shadow_all_.load(std::memory_order_relaxed); }

  // The set in force now. Hold the returned pointer for the whole request.
  std::shared_ptr<const RuleSet> current() const {
    quota::detail::MutexLock lock(mu_);
    return current_;
  }

  // A step run by every publish before the swap (outside the lock), with the set in force
  // and the next; when it fails, the publish fails with its error and nothing changes.
  using BeforePublish = std::function<absl::Status(const RuleSet& from, const RuleSet& to)>;
  void before_publish(BeforePublish step) {
    auto shared = std::make_shared<const BeforePublish>(std::move(step));
    quota::detail::MutexLock lock(mu_);
    before_publish_ = std::move(shared);
  }

  // Makes `next` current. FailedPrecondition unless its version is greater than the
  // current one (versions identify states' parameters: they must not be reused).
  // Publishes run one at a time (the step of each sees the set the one before installed);
  // readers are not held up by them.
  absl::Status publish(std::shared_ptr<const RuleSet> next) {
    if (next == nullptr) return absl::InvalidArgumentError("publish: null rule set");
    quota::detail::MutexLock one_at_a_time(publish_mu_);
    std::shared_ptr<const RuleSet> from;
    std::shared_ptr<const BeforePublish> step;
    {
      quota::detail::MutexLock lock(mu_);
      if (auto s = check_newer(*next); !s.ok()) return s;
      from = current_;
      step = before_publish_;
    }
    if (step != nullptr && *step && from != nullptr) {
      if (auto s = (*step)(*from, *next); !s.ok()) return s;
    }
    std::shared_ptr<const RuleSet> old;  // released outside the lock
    quota::detail::MutexLock lock(mu_);
    old = std::exchange(current_, std::move(next));
    return absl::OkStatus();
  }

 private:
  absl::Status check_newer(const RuleSet& next) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (current_ != nullptr && next.version() <= current_->version()) {
      return absl::FailedPreconditionError(
          absl::StrFormat("publish: version %d is not greater than the current %d", next.version(),
                          current_->version()));
    }
    return absl::OkStatus();
  }

  quota::detail::Mutex publish_mu_;  // held across a whole publish, step included
  mutable quota::detail::Mutex mu_;
  std::shared_ptr<const RuleSet> current_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<const BeforePublish> before_publish_ ABSL_GUARDED_BY(mu_);
  std::atomic<bool> shadow_all_{false};
};

}  // namespace quota::gateway
