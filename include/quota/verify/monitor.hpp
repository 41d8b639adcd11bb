// quota/verify/monitor.hpp — EnvelopeMonitor: the envelope verifier, online.
//
// An EnvelopeMonitor watches what a limiter admits, key by key, and answers at any time
// "has any key left its envelope, by how much, and where?" — the same exact answer
// verify_token_bucket / verify_window (envelope.hpp) would give on the whole log, without
// keeping the log. For tests, the gateway simulator and shadow deployments.
// Its memory is bounded (MonitorOptions); the verdict is exact when
// MonitorReport::complete().
//
// Thread safety: every method may be called from any thread. One lock guards the state
// (quota::detail::Mutex, a std::mutex: see detail/mutex.hpp for why not absl::Mutex);
// a record holds it for O(1) amortized work.
//
//   auto monitor = quota::verify::EnvelopeMonitor::create(
//       quota::verify::TokenBucketEnvelope{.rate = {100, 1s}, .burst = 20});
//   auto d = (*monitor)->acquire(limiter, "tenant-7:read", 1);  // decides and records
//   quota::verify::MonitorReport r = (*monitor)->report();
//   if (!r.holds()) std::puts(r.summary.c_str());
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "quota/decision.hpp"
#include "quota/detail/mutex.hpp"
#include "quota/units.hpp"
#include "quota/verify/envelope.hpp"

namespace quota::verify {

// The token-bucket envelope A(T) <= rate·T + burst + extra.
struct TokenBucketEnvelope {
  Rate rate;
  std::int64_t burst = 0;
  std::int64_t extra = 0;  // allowance for leases / fail-open budgets, whole units
};

// The window envelope: at most `limit` units in any half-open window of length `window`.
struct WindowEnvelope {
  std::int64_t limit = 0;
  Nanos window{0};
};

using Envelope = std::variant<TokenBucketEnvelope, WindowEnvelope>;

// What it keeps (bounded):
//   - per key, a streaming verifier: O(1) for a token-bucket envelope; for a window
//     envelope the events of the last window (at most `limit` events for a conforming
//     limiter, since every cost is >= 1 unit);
//   - at most MonitorOptions::max_keys keys: events of further keys are counted in
//     `untracked_events` and not verified (the report then says it is incomplete);
//   - a ring of the last MonitorOptions::recent_events admissions (all keys), to show
//     what led up to a violation.
struct MonitorOptions {
  std::size_t max_keys = 100'000;     // keys verified; further keys are untracked
  std::size_t recent_events = 1'024;  // size of the ring of recent admissions
};

// One admission as the monitor saw it.
struct RecordedEvent {
  std::string key;
  std::int64_t time_ns = 0;  // after clamping (see EnvelopeMonitor::record)
  std::int64_t cost = 0;
};

// A snapshot of the monitor.
struct MonitorReport {
  std::size_t events = 0;  // admissions verified
  std::size_t keys = 0;    // keys verified
  std::size_t clamped_times = 0;
  std::size_t untracked_events = 0;  // admissions of keys beyond max_keys
  // The key with the largest excess over its envelope and that excess in micro-units
  // (token bucket: rounded up, see TokenBucketReport::excess_micro; window: units·10^6).
  // Empty key and no report when nothing was recorded.
  std::string worst_key;
  MicroUnits worst_excess_micro = 0;
  std::optional<std::variant<TokenBucketReport, WindowReport>> worst;
  std::string summary;  // one line for humans

  // Every verified key stayed inside its envelope.
  bool holds() const { return worst_excess_micro <= 0; }
  // The verdict covers every admission exactly (no untracked keys, no clamped times).
  bool complete() const { return clamped_times == 0 && untracked_events == 0; }
};

class EnvelopeMonitor {
 public:
  // InvalidArgument if the envelope's parameters are invalid (as verify_token_bucket /
  // verify_window check them).
  static absl::StatusOr<std::unique_ptr<EnvelopeMonitor>> create(Envelope envelope,
                                                                 MonitorOptions options = {}) {
    const absl::Status s = std::visit(
        [](const auto& e) -> absl::Status {
          if constexpr (std::is_same_v<std::decay_t<decltype(e)>, TokenBucketEnvelope>) {
            return TokenBucketVerifier::check_params(e.rate, e.burst, e.extra);
          } else {
            return WindowVerifier::check_params(e.limit, e.window);
          }
        },
        envelope);
    if (!s.ok()) return s;
    return std::unique_ptr<EnvelopeMonitor>(new EnvelopeMonitor(envelope, options));
  }

  // Records one admission of `cost` units (in [0, kMaxUnits]) for `key` at `time`.
  // InvalidArgument for a cost outside that range (nothing recorded).
  //
  // Record each admission with the time the limiter decided at, per key in
  // decision order. A time earlier than the key's previous one (two threads recording in
  // the other order) is counted as that previous time — as the policies themselves treat
  // backwards time — and counted in `clamped_times`; the verdict is exact only when that
  // count is 0. `acquire(limiter, key, cost)` reads the limiter's clock right after the
  // decision: exact with a ManualClock, an approximation (the decision happened slightly
  // earlier) with a real one.
  absl::Status record(std::string_view key, Nanos time, std::int64_t cost) {
    if (cost < 0 || cost > kMaxUnits) {
      return absl::InvalidArgumentError(
          absl::StrFormat("cost must be in [0, %d] units (got %d)", kMaxUnits, cost));
    }
    quota::detail::MutexLock lock(mu_);
    auto it = keys_.find(detail_to_absl(key));
    if (it == keys_.end()) {
      if (keys_.size() >= options_.max_keys) {
        ++untracked_events_;
        return absl::OkStatus();
      }
      it = keys_.try_emplace(std::string(key), make_verifier()).first;
    }
    KeyState& k = it->second;
    std::int64_t t = time.count();
    if (k.recorded > 0 && t < k.last_time) {
      t = k.last_time;
      ++clamped_times_;
    }
    k.last_time = t;
    ++k.recorded;
    const AdmittedEvent e{.time_ns = t, .cost = cost};
    // Cannot fail: the cost was checked and the time clamped to non-decreasing.
    std::visit([&](auto& v) { (void)v.add(e); }, k.verifier);
    ++events_;
    remember(key, t, cost);
    const MicroUnits excess = excess_micro(k.verifier);
    if (!has_worst_) {
      has_worst_ = true;
      worst_key_.assign(key.data(), key.size());
      worst_excess_ = excess;
    } else if (excess > worst_excess_) {
      worst_key_.assign(key.data(), key.size());
      worst_excess_ = excess;
    } else if (worst_key_ == key) {
      // The worst key's excess never decreases (it is a running maximum), so it stays.
      worst_excess_ = excess;
    }
    return absl::OkStatus();
  }

  // Records for the single budget of a monitor that watches one key.
  absl::Status record(Nanos time, std::int64_t cost) { return record("", time, cost); }

  // Asks `limiter` (anything with `acquire(key, cost) -> absl::StatusOr<Decision>` and
  // `clock().now()`), and records the admission if it was one. Returns the limiter's
  // answer unchanged.
  template <class Limiter>
  absl::StatusOr<Decision> acquire(Limiter& limiter, std::string_view key, std::int64_t cost = 1) {
    absl::StatusOr<Decision> d = limiter.acquire(key, cost);
    if (d.ok() && d->allowed) {
      if (auto s = record(key, limiter.clock().now(), cost); !s.ok()) return s;
    }
    return d;
  }

  MonitorReport report() const {
    quota::detail::MutexLock lock(mu_);
    MonitorReport r;
    r.events = events_;
    r.keys = keys_.size();
    r.clamped_times = clamped_times_;
    r.untracked_events = untracked_events_;
    if (has_worst_) {
      const auto it = keys_.find(detail_to_absl(worst_key_));
      r.worst_key = worst_key_;
      r.worst_excess_micro = worst_excess_;
      std::string verdict;
      if (const auto* tb = std::get_if<TokenBucketVerifier>(&it->second.verifier)) {
        const TokenBucketReport k = tb->report();
        verdict = to_string(k);
        r.worst = k;
      } else {
        const WindowReport k = std::get<WindowVerifier>(it->second.verifier).report();
        verdict = to_string(k);
        r.worst = k;
      }
      r.summary =
          absl::StrFormat("%s over %d keys, %d events%s; worst key \"%s\": %s",
                          r.holds() ? "envelope holds" : "ENVELOPE VIOLATED", r.keys, r.events,
                          r.complete() ? "" : " (incomplete)", worst_key_, verdict);
    } else {
      r.summary = "no admissions recorded";
    }
    return r;
  }

  // The verdict on one key; NotFound if it was never recorded (or is untracked).
  absl::StatusOr<std::variant<TokenBucketReport, WindowReport>> key_report(
      std::string_view key) const {
    quota::detail::MutexLock lock(mu_);
    const auto it = keys_.find(detail_to_absl(key));
    if (it == keys_.end()) {
      return absl::NotFoundError(absl::StrFormat("key \"%s\" has no recorded admissions", key));
    }
    return std::visit(
        [](const auto& v) -> std::variant<TokenBucketReport, WindowReport> { return v.report(); },
        it->second.verifier);
  }

  // The last MonitorOptions::recent_events admissions, oldest first.
  std::vector<RecordedEvent> recent() const {
    quota::detail::MutexLock lock(mu_);
    std::vector<RecordedEvent> out;
    out.reserve(ring_.size());
    for (std::size_t i = 0; i < ring_.size(); ++i) {
      out.push_back(ring_[(ring_next_ + i) % ring_.size()]);
    }
    return out;
  }

 private:
  using Verifier = std::variant<TokenBucketVerifier, WindowVerifier>;

  struct KeyState {
    Verifier verifier;
    std::int64_t last_time = 0;
    std::size_t recorded = 0;
  };

  EnvelopeMonitor(Envelope envelope, MonitorOptions options)
      : envelope_(envelope), options_(options) {}

  static absl::string_view detail_to_absl(std::string_view s) {
    return absl::string_view(s.data(), s.size());
  }

  KeyState make_verifier() const {
    if (const auto* tb = std::get_if<TokenBucketEnvelope>(&envelope_)) {
      return KeyState{.verifier = TokenBucketVerifier(tb->rate, tb->burst, tb->extra)};
    }
    const auto& w = std::get<WindowEnvelope>(envelope_);
    return KeyState{.verifier = WindowVerifier(w.limit, w.window)};
  }

  static MicroUnits excess_micro(const Verifier& v) {
    if (const auto* tb = std::get_if<TokenBucketVerifier>(&v)) return tb->report().excess_micro();
    const absl::int128 excess = std::get<WindowVerifier>(v).report().excess;
    return detail::clamp_to_int64(excess * kMicrosPerUnit);
  }

  void remember(std::string_view key, std::int64_t t, std::int64_t cost)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (options_.recent_events == 0) return;
    RecordedEvent e{.key = std::string(key), .time_ns = t, .cost = cost};
    if (ring_.size() < options_.recent_events) {
      ring_.push_back(std::move(e));
      return;
    }
    ring_[ring_next_] = std::move(e);
    ring_next_ = (ring_next_ + 1) % ring_.size();
  }

  const Envelope envelope_;
  const MonitorOptions options_;
  mutable quota::detail::Mutex mu_;
  absl::flat_hash_map<std::string, KeyState> keys_ ABSL_GUARDED_BY(mu_);
  std::size_t events_ ABSL_GUARDED_BY(mu_) = 0;
  std::size_t clamped_times_ ABSL_GUARDED_BY(mu_) = 0;
  std::size_t untracked_events_ ABSL_GUARDED_BY(mu_) = 0;
  bool has_worst_ ABSL_GUARDED_BY(mu_) = false;
  std::string worst_key_ ABSL_GUARDED_BY(mu_);
  MicroUnits worst_excess_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<RecordedEvent> ring_ ABSL_GUARDED_BY(mu_);
  std::size_t ring_next_ ABSL_GUARDED_BY(mu_) = 0;  // oldest slot once the ring is full
};

}  // namespace quota::verify
