// quota/redis/transport/node_watch.hpp — what a client knows about each Redis node it
// decides on: which server it is (failover safety) and how far its TIME may be ahead of
// the client's monotonic clock (the clock-step guard).
//
// `NodeWatch` (one per ConnectionPool: one node, or the primary a SentinelPool follows)
// is fed by the connect handshake (handshake.hpp): the server's run id and replication id
// (`INFO server replication`) and its TIME. When a connect finds another identity than the
// node's previous connect (a replica promoted, a restart: both may have lost acknowledged
// deductions), or a Cluster node first met that was promoted from a replica of a primary
// the client wrote to (ReplicationHistory), the TIME of that connect is the node's
// failover time. `NodeGuards` (the
// stores' `failover_safety` and `clock_guard` options) says what Script (script.hpp) sends
// with every call to the node, as one argument its script reads before any state
// (twin/common.hpp, `@node_guard`):
//   - with failover safety, the failover time: every bucket whose state is older (or
//     missing) is read as spent at that time (the policy's exhausted(at), the Redis
//     counterpart of StoreOptions::assume_spent_at), refilling from there;
//   - with the clock guard, a bound on the server's TIME: the highest (server time −
//     monotonic time) seen in its replies, plus the client's monotonic time now, plus the
//     tolerance. A TIME past it is a forward step: the script refuses (QUOTA_CLOCK_AHEAD,
//     kUnavailable, nothing read or written) until the two clocks agree again.
// Thread safety: NodeWatch is thread-safe (a mutex); NodeGuards is a value.
//
//   quota::RedisStoreOptions options{.pool = pool};
//   options.failover_safety = true;                      // spent at a detected failover
//   options.clock_guard = quota::redis::ClockGuard{};    // TIME may run 1 s ahead at most
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include <hiredis/hiredis.h>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "quota/clock.hpp"
#include "quota/redis/transport/reply.hpp"
#include "quota/units.hpp"

namespace quota::redis {

// The clock-step guard: a node whose TIME runs ahead of the client's monotonic clock by
// more than `tolerance` since the latest reply that agreed is refused.
struct ClockGuard {
  std::chrono::nanoseconds tolerance = std::chrono::seconds(1);
  // The client's monotonic clock (SteadyClock when empty). The test hook: a ManualClock
  // that stands still while real time passes makes the server's TIME look like a step.
  std::function<Nanos()> monotonic = nullptr;
};

// OK unless `guard` is set with a tolerance below 1 ns or on the caller's time
// (`caller_time`: TimeSource::kCaller, where there is no server TIME to guard);
// InvalidArgument naming the option of `options` otherwise.
inline absl::Status check_clock_guard(const std::optional<ClockGuard>& guard, bool caller_time,
                                      const char* options) {
  if (!guard.has_value()) return absl::OkStatus();
  if (guard->tolerance.count() < 1) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: clock_guard.tolerance=%d ns, must be at least 1 ns", options,
                        guard->tolerance.count()));
  }
  if (caller_time) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: clock_guard guards the server's TIME; it cannot be set with TimeSource::kCaller",
        options));
  }
  return absl::OkStatus();
}

// What a Script sends with each call (one argument after the call's own; the script's
// head says so, twin/common.hpp). Set by the stores from their options.
struct NodeGuards {
  bool failover = false;            // send the node's failover time
  std::optional<ClockGuard> clock;  // send the bound on the node's TIME
  int reply_time_at = 1;            // a reply's element of the time's seconds
  bool any() const { return failover || clock.has_value(); }
  Nanos monotonic() const {
    if (clock.has_value() && clock->monotonic) return clock->monotonic();
    return SteadyClock{}.now();
  }
};

// A node's failovers and clock refusals, counted.
struct NodeWatchStats {
  std::uint64_t failovers = 0;       // connects that found another identity
  std::uint64_t clock_refusals = 0;  // calls refused for a TIME past the bound
  std::optional<Nanos> failover_at;  // the latest failover's server time

  // Summed over nodes (the latest failover time of them).
  NodeWatchStats& operator+=(const NodeWatchStats& o) {
    failovers += o.failovers;
    clock_refusals += o.clock_refusals;
    if (o.failover_at && (!failover_at || *failover_at < *o.failover_at)) {
      failover_at = o.failover_at;
    }
    return *this;
  }
};

// The replication ids that the nodes of one client (a ClusterPool's) were seen with. A
// promoted replica keeps its former primary's id as `master_replid2`: a node first met
// with a `master_replid2` in here took over from a primary this client wrote to. Bounded
// (kMaxIds; the oldest forgotten first); thread-safe.
class ReplicationHistory {
 public:
  static constexpr std::size_t kMaxIds = 1024;
  void add(std::string_view replid) {
    std::lock_guard<std::mutex> lock(mu_);
    if (std::find(ids_.begin(), ids_.end(), replid) != ids_.end()) return;
    if (ids_.size() == kMaxIds) ids_.pop_front();
    ids_.emplace_back(replid);
  }
  bool seen(std::string_view replid) const {
    std::lock_guard<std::mutex> lock(mu_);
    return std::find(ids_.begin(), ids_.end(), replid) != ids_.end();
  }

 private:
  mutable std::mutex mu_;        // std::mutex: see ConnectionPool
  std::deque<std::string> ids_;  // guarded by mu_
};

class NodeWatch {
 public:
  // `history`: the replication ids seen by the client's other nodes (a Cluster's), or
  // null (one node, or the primary a SentinelPool follows: its own identity suffices).
  explicit NodeWatch(std::shared_ptr<ReplicationHistory> history = nullptr)
      : history_(std::move(history)) {}

  // A connect's handshake read `run_id`, `replid` and `replid2` (INFO's master_replid and
  // master_replid2; empty: unread) and the server's TIME `server_time`. A failover at
  // `server_time`: another identity than the previous connect's; or, at the first
  // connect, a node promoted from a replica of a primary in `history` (its replid2 is
  // that primary's id). Otherwise the first identity seen is the baseline (a failover
  // before it is not seen).
  void on_connect(std::string_view run_id, std::string_view replid, std::string_view replid2,
                  Nanos server_time) {
    if (run_id.empty() || replid.empty()) return;
    std::lock_guard<std::mutex> lock(mu_);
    const bool changed = !run_id_.empty() && (run_id != run_id_ || replid != replid_);
    const bool took_over = run_id_.empty() && history_ != nullptr && !replid2.empty() &&
                           replid2.find_first_not_of('0') != std::string_view::npos &&
                           history_->seen(replid2);
    if (changed || took_over) {
      ++stats_.failovers;
      if (!stats_.failover_at.has_value() || *stats_.failover_at < server_time) {
        stats_.failover_at = server_time;
      }
    }
    run_id_ = std::string(run_id);
    replid_ = std::string(replid);
    if (history_ != nullptr) history_->add(replid);
  }

  // Records a failover at `at` (server time) by hand: an operator who knows of one, or a
  // test. Never moves the failover time back.
  void record_failover(Nanos at) {
    std::lock_guard<std::mutex> lock(mu_);
    ++stats_.failovers;
    if (!stats_.failover_at.has_value() || *stats_.failover_at < at) stats_.failover_at = at;
  }

  void note_clock_refusal() {
    std::lock_guard<std::mutex> lock(mu_);
    ++stats_.clock_refusals;
  }

  NodeWatchStats stats() const {
    std::lock_guard<std::mutex> lock(mu_);
    return stats_;
  }

 private:
  const std::shared_ptr<ReplicationHistory> history_;
  mutable std::mutex mu_;  // std::mutex: see ConnectionPool
  std::string run_id_;     // guarded by mu_
  std::string replid_;     // guarded by mu_
  NodeWatchStats stats_;   // guarded by mu_
};

namespace detail {
inline std::string node_argument(std::optional<Nanos> failover_at, std::optional<Nanos> bound);
}  // namespace detail

// A Script's guards (script.hpp) and, per node, the highest (server time − monotonic time
// at the write) of a reply that agreed with the bound, from which the next bound is made.
// Thread-safe.
class NodeGuardState {
 public:
  explicit NodeGuardState(NodeGuards guards) : guards_(std::move(guards)) {}
  bool any() const { return guards_.any(); }

  // The node argument of a write to `node` (whose NodeWatch is `watch`) now; `sent`
  // gets the monotonic time of the write.
  std::string argument(const void* node, const NodeWatch& watch, Nanos& sent) {
    sent = guards_.monotonic();
    std::optional<Nanos> failover_at, bound;
    if (guards_.failover) failover_at = watch.stats().failover_at;
    if (guards_.clock.has_value()) {
      std::lock_guard<std::mutex> lock(mu_);
      if (auto it = offsets_.find(node); it != offsets_.end()) {
        bound = Nanos{it->second + sent.count() + guards_.clock->tolerance.count()};
      }
    }
    return detail::node_argument(failover_at, bound);
  }

  // A reply from `node` to a write at monotonic `sent`: its time (element
  // reply_time_at, seconds, then nanoseconds) raises the node's offset when it agrees
  // with the bound; the first sets it. A QUOTA_CLOCK_AHEAD refusal is counted in `watch`.
  void observe(const void* node, NodeWatch& watch, const redisReply& r, Nanos sent) {
    if (r.type == REDIS_REPLY_ERROR) {
      if (is_error(r, "QUOTA_CLOCK_AHEAD")) watch.note_clock_refusal();
      return;
    }
    if (!guards_.clock.has_value() || r.type != REDIS_REPLY_ARRAY) return;
    const auto at = static_cast<std::size_t>(guards_.reply_time_at);
    if (r.elements < at + 2 || r.element[at]->type != REDIS_REPLY_INTEGER ||
        r.element[at + 1]->type != REDIS_REPLY_INTEGER || r.element[at]->integer <= 0) {
      return;
    }
    const std::int64_t d =
        r.element[at]->integer * 1'000'000'000 + r.element[at + 1]->integer - sent.count();
    std::lock_guard<std::mutex> lock(mu_);
    auto [it, fresh] = offsets_.try_emplace(node, d);
    if (!fresh && d > it->second && d <= it->second + guards_.clock->tolerance.count()) {
      it->second = d;
    }
  }

 private:
  const NodeGuards guards_;
  std::mutex mu_;                                // std::mutex: see ConnectionPool
  std::map<const void*, std::int64_t> offsets_;  // guarded by mu_
};

namespace detail {

// The value of `field` in an INFO reply ("field:value\r\n" lines), or empty.
inline std::string_view info_field(std::string_view info, std::string_view field) {
  std::size_t at = 0;
  while (at < info.size()) {
    std::size_t end = info.find('\n', at);
    if (end == std::string_view::npos) end = info.size();
    std::string_view line = info.substr(at, end - at);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.size() > field.size() && line.substr(0, field.size()) == field &&
        line[field.size()] == ':') {
      return line.substr(field.size() + 1);
    }
    at = end + 1;
  }
  return {};
}

// The handshake's INFO server replication and TIME replies (connection.hpp), to `watch`:
// the node's identity (run_id, master_replid, master_replid2) and its time. A server that
// does not answer them (INFO or TIME not permitted, Redis before 7) is not watched.
inline void watch_node(NodeWatch& watch, const redisReply& info, const redisReply& time) {
  if (info.type != REDIS_REPLY_STRING && info.type != REDIS_REPLY_STATUS) return;
  if (time.type != REDIS_REPLY_ARRAY || time.elements != 2) return;
  std::int64_t s = 0, us = 0;
  if (!absl::SimpleAtoi(av(reply_string(*time.element[0])), &s) ||
      !absl::SimpleAtoi(av(reply_string(*time.element[1])), &us)) {
    return;
  }
  const std::string_view text = reply_string(info);
  watch.on_connect(info_field(text, "run_id"), info_field(text, "master_replid"),
                   info_field(text, "master_replid2"), Nanos{s * 1'000'000'000 + us * 1'000});
}

// The node argument, '<i8I4i8I4': the failover time (s, ns; -1 s: none), the bound on
// TIME (s, ns; -1 s: none).
inline std::string node_argument(std::optional<Nanos> failover_at, std::optional<Nanos> bound) {
  std::string out;
  auto put = [&out](std::optional<Nanos> t) {
    std::int64_t s = -1, n = 0;
    if (t.has_value()) {
      s = t->count() / 1'000'000'000;
      n = t->count() % 1'000'000'000;
      if (n < 0) n += 1'000'000'000, --s;
    }
    for (int i = 0; i < 8; ++i)
      out.push_back(static_cast<char>((static_cast<std::uint64_t>(s) >> (8 * i)) & 0xff));
    for (int i = 0; i < 4; ++i)
      out.push_back(static_cast<char>((static_cast<std::uint64_t>(n) >> (8 * i)) & 0xff));
  };
  put(failover_at);
  put(bound);
  return out;
}

}  // namespace detail
}  // namespace quota::redis
