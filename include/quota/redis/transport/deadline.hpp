// quota/redis/transport/deadline.hpp — one deadline for everything a decision waits on.
//
// A decision against Redis waits in several places: for a pooled connection, for the TCP
// connect, for the socket to take the command, for each reply (and, on a cluster, for
// the slot map, a redirection, a TRYAGAIN backoff). A `Deadline` is the one instant by
// which all of them must be over: it is fixed when the call starts, and every wait is
// given only the time left (`left()`), so the waits never add up past it. A call that
// runs out returns kUnavailable from `error(...)`, which names the deadline and its
// budget, so that a log line says which limit was hit, marked ErrorKind::kDeadline.
//
// Guarantees. `left()` is never negative and never more than the budget; the clock is
// std::chrono::steady_clock (monotonic). The deadline bounds the client's waits, not the
// server's work: a call that timed out may still run on the server.
//
// Thread safety: a Deadline is an immutable value; copy it freely across threads.
//
//   auto d = quota::redis::Deadline::after(std::chrono::milliseconds(3));
//   auto lease = pool->acquire(d);             // waits at most d.left()
//   auto reply = (*lease)->command({"PING"}, d);
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <string_view>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "quota/redis/transport/error_kind.hpp"

namespace quota::redis {

// The default budget of one decision (ConnectionConfig::deadline).
inline constexpr std::chrono::microseconds kDefaultDeadline{3000};

class Deadline {
 public:
  using Clock = std::chrono::steady_clock;

  // The deadline `budget` from now (a budget below 1 us counts as 1 us).
  static Deadline after(std::chrono::microseconds budget) {
    budget = std::max(budget, std::chrono::microseconds(1));
    return Deadline(Clock::now() + budget, budget);
  }

  // The time left, in microseconds, rounded down; zero once passed.
  std::chrono::microseconds left() const {
    const auto d = std::chrono::duration_cast<std::chrono::microseconds>(at_ - Clock::now());
    return std::max(d, std::chrono::microseconds(0));
  }
  bool expired() const { return Clock::now() >= at_; }
  // A part of this call: the same budget (an error still names the call's), ending when
  // 1/`parts` of the time left has passed (or at this deadline, for parts <= 1). For a
  // wait that may be given up for another way, so it cannot use up the call.
  Deadline share(int parts) const {
    if (parts <= 1) return *this;
    return Deadline(Clock::now() + left() / parts, budget_);
  }
  Clock::time_point at() const { return at_; }
  std::chrono::microseconds budget() const { return budget_; }

  // kUnavailable "redis <what> on <where>: the call's deadline of <budget> us passed
  // (<cause>)": the error of a call that ran out of time while `cause`, of kind
  // ErrorKind::kDeadline (error_kind.hpp).
  absl::Status error(std::string_view what, std::string_view where, std::string_view cause) const {
    return with_kind(absl::UnavailableError(
                         absl::StrFormat("redis %s on %s: the call's deadline of %d us passed (%s)",
                                         sv(what), sv(where), budget_.count(), sv(cause))),
                     ErrorKind::kDeadline);
  }

 private:
  // Debian's abseil has its own absl::string_view; StrFormat needs it.
  static absl::string_view sv(std::string_view s) { return absl::string_view(s.data(), s.size()); }

  Deadline(Clock::time_point at, std::chrono::microseconds budget) : at_(at), budget_(budget) {}

  Clock::time_point at_;
  std::chrono::microseconds budget_;
};

}  // namespace quota::redis
