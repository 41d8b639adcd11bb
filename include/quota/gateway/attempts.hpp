// quota/gateway/attempts.hpp — idempotent attempts, in process.
//
// A gateway that retries a decision (a timeout between it and its caller, a replayed
// request) passes the same attempt id; the first decision for that id is kept for `ttl`
// and replayed, so the retry spends nothing. The semantics match RedisStore::acquire
// with an attempt id: ids are 1..128 bytes without control characters or braces; the
// same id with another request (key or cost) is InvalidArgument and changes nothing;
// a replay is marked `replayed`. The decision is kept with the attempt's deadline
// (Request::deadline of the call that decided it): the Gateway answers a replay past it
// as Reason::kAttemptExpired, the units it spent staying spent.
//
// In process only: two gateway processes do not share this cache (use the Redis store's
// attempts for that). While the first decision for an id is still being made, a
// concurrent duplicate gets Aborted ("in progress; retry") rather than a second
// decision. Only a decision the store made is kept: a store error, and the route's
// fail-mode answer to one (Gateway: kUnavailable, kFailOpen), are forgotten (abandon())
// so that the retry decides.
//
// Bounded: at most `max_entries` ids; when full, expired ids are swept first, and if none
// has expired a new id gets ResourceExhausted (nothing decided).
//
// Thread-safe (one mutex around a hash map; held for lookups, never during a decision).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_format.h"
#include "quota/decision.hpp"
#include "quota/detail/keyed_states.hpp"
#include "quota/detail/mutex.hpp"
#include "quota/gateway/request.hpp"
#include "quota/units.hpp"

namespace quota::gateway {

inline constexpr std::size_t kMaxAttemptIdBytes = 128;

class AttemptCache {
 public:
  AttemptCache(Nanos ttl, std::size_t max_entries) : ttl_(ttl), max_entries_(max_entries) {}

  // The outcome of begin(): either a stored decision to replay, or a fresh attempt the
  // caller must decide and then finish() or abandon().
  struct Begin {
    std::optional<Decision> replay;
    std::optional<Nanos> deadline;  // with a replay: the deadline kept with it
  };

  // `fingerprint` identifies the request (keys and cost).
  absl::StatusOr<Begin> begin(std::string_view id, std::string_view fingerprint, Nanos now) {
    if (id.empty() || id.size() > kMaxAttemptIdBytes) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "attempt id is %d bytes; it must be 1..%d bytes", id.size(), kMaxAttemptIdBytes));
    }
    for (char ch : id) {
      const auto u = static_cast<unsigned char>(ch);
      if (ch == '{' || ch == '}' || u < 0x20 || u == 0x7f) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "attempt id contains a forbidden byte 0x%02x ('{', '}' and control characters)", u));
      }
    }
    quota::detail::MutexLock lock(mu_);
    auto it = map_.find(quota::detail::to_absl(id));
    if (it != map_.end() && it->second.expires_at <= now.count()) {
      map_.erase(it);
      it = map_.end();
    }
    if (it != map_.end()) {
      if (it->second.fingerprint != fingerprint) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "attempt id \"%s\" was first used for another request (key or cost differ)",
            quota::detail::to_absl(id)));
      }
      if (!it->second.done) {
        return absl::AbortedError(absl::StrFormat(
            "attempt \"%s\" is being decided by another call; retry", quota::detail::to_absl(id)));
      }
      return Begin{.replay = it->second.decision, .deadline = it->second.deadline};
    }
    if (map_.size() >= max_entries_) {
      for (auto e = map_.begin(); e != map_.end();) {
        if (e->second.expires_at <= now.count()) {
          map_.erase(e++);
        } else {
          ++e;
        }
      }
      if (map_.size() >= max_entries_) {
        return absl::ResourceExhaustedError(
            absl::StrFormat("attempt cache full: %d attempts kept, none expired", map_.size()));
      }
    }
    const std::int64_t expires = detail_saturating_add(now.count(), ttl_.count());
    map_.emplace(std::string(id), Entry{.fingerprint = std::string(fingerprint),
                                        .decision = {},
                                        .deadline = std::nullopt,
                                        .expires_at = expires,
                                        .done = false});
    return Begin{.replay = std::nullopt, .deadline = std::nullopt};
  }

  // Stores the decision made for a fresh attempt, and the attempt's deadline.
  void finish(std::string_view id, const Decision& d,
              std::optional<Nanos> deadline = std::nullopt) {
    quota::detail::MutexLock lock(mu_);
    if (auto it = map_.find(quota::detail::to_absl(id)); it != map_.end()) {
      it->second.decision = d;
      it->second.deadline = deadline;
      it->second.done = true;
    }
  }

  // Forgets a fresh attempt whose decision failed, so that a retry decides.
  void abandon(std::string_view id) {
    quota::detail::MutexLock lock(mu_);
    map_.erase(quota::detail::to_absl(id));
  }

  std::size_t size() const {
    quota::detail::MutexLock lock(mu_);
    return map_.size();
  }

 private:
  struct Entry {
    std::string fingerprint;
    Decision decision;
    std::optional<Nanos> deadline;
    std::int64_t expires_at = 0;
    bool done = false;
  };

  static std::int64_t detail_saturating_add(std::int64_t a, std::int64_t b) {
    std::int64_t r;
    return __builtin_add_overflow(a, b, &r) ? Nanos::max().count() : r;
  }

  Nanos ttl_;
  std::size_t max_entries_;
  mutable quota::detail::Mutex mu_;
  absl::flat_hash_map<std::string, Entry> map_ ABSL_GUARDED_BY(mu_);
};

// The answer past a deadline (Reason::kAttemptExpired): nothing decided; with the
// attempt's recorded decision `d`, its remaining and reset as of that decision.
inline Result expired_attempt(const Decision* d, std::uint64_t version, std::string rule) {
  const Decision out{.allowed = false,
                     .remaining = d != nullptr ? d->remaining : 0,
                     .retry_after = kNever,
                     .reset_after = d != nullptr ? d->reset_after : Nanos{0},
                     .version = version,
                     .reason = Reason::kAttemptExpired};
  return Result{.decision = out, .rule = std::move(rule), .replayed = false};
}

// An attempt's recorded decision `d` replayed at `now`, or kAttemptExpired past the
// deadline recorded with it (replayed either way: the record was read).
inline Result replay_attempt(const Decision& d, std::optional<Nanos> deadline, std::string rule,
                             Nanos now) {
  if (deadline.has_value() && now > *deadline) {
    Result out = expired_attempt(&d, d.version, std::move(rule));
    out.replayed = true;
    return out;
  }
  return Result{.decision = d, .rule = std::move(rule), .replayed = true};
}

}  // namespace quota::gateway
