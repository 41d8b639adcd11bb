// quota/gateway/settle.hpp — estimate, then settle (costs known only afterwards).
//
// For an LLM call the cost (tokens) is known only when the call ends. The gateway
// deducts an estimate (prompt tokens + max output) with Gateway::acquire_estimate and
// hands out a ticket; Gateway::settle(ticket, actual) then
//   - refunds the surplus (estimate − actual) to every budget level the estimate was
//     deducted from, each capped at that level's capacity (burst or limit), outstanding
//     debt paid first (key_state.hpp: refund);
//   - records a deficit (actual − estimate) and, with `charge_deficit`, charges it: what
//     the budget holds is taken at once, the rest becomes debt paid from later refills
//     (capped at the capacity);
//   - exactly once: the ticket is marked settled under the book's lock before the store
//     is touched, so two racing settles of one ticket apply one refund. A second settle
//     is FailedPrecondition, a settle after the ticket's expiry DeadlineExceeded, an
//     unknown (or long-forgotten) ticket NotFound — and all three change nothing.
//     A settle whose store update fails puts the ticket back (still open) and returns
//     the store's error.
// The refund is exact for a token bucket (micro-units, capped). A window policy takes
// back units only while the window the estimate was counted in is still current: a later
// window already started from zero, so refunding into it would create budget.
//
// TicketBook is the bookkeeping: tickets kept until `ttl` after issue, then kept as
// "expired" tombstones for another ttl (so a late settle gets a clear DeadlineExceeded
// rather than NotFound), then forgotten. At most `max_tickets`; when full, forgotten
// tickets are swept, and if none can be, acquire_estimate gets ResourceExhausted.
//
// Thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_format.h"
#include "quota/detail/mutex.hpp"
#include "quota/gateway/key_state.hpp"
#include "quota/units.hpp"

namespace quota::gateway {

using TicketId = std::uint64_t;

// One budget level an estimate was deducted from.
struct TicketLevel {
  std::string key{};
  RulePolicy policy{};  // the rule's policy at acquire (used if the key must be recreated)
  std::uint64_t version = 0;
};

struct SettleResult {
  std::int64_t estimate = 0;
  std::int64_t actual = 0;
  std::int64_t surplus = 0;  // max(0, estimate − actual), whole units
  std::int64_t deficit = 0;  // max(0, actual − estimate), whole units
  // Per level, in the ticket's order: micro-units given back (after the cap) and
  // micro-units of the deficit left as debt.
  std::vector<MicroUnits> refunded{};
  std::vector<MicroUnits> debt{};
};

class TicketBook {
 public:
  struct Ticket {
    std::vector<TicketLevel> levels{};
    std::int64_t estimate = 0;
    Nanos acquired_at{0};  // the caller's time of the acquire
    Nanos spent_at{0};     // the backend's time of the deduction (a Redis server's clock)
    Nanos expires_at{0};
  };

  TicketBook(Nanos ttl, std::size_t max_tickets) : ttl_(ttl), max_tickets_(max_tickets) {}

  Nanos ttl() const { return ttl_; }

  absl::StatusOr<TicketId> issue(Ticket t, Nanos now) {
    quota::detail::MutexLock lock(mu_);
    if (map_.size() >= max_tickets_) sweep(now);
    if (map_.size() >= max_tickets_) {
      return absl::ResourceExhaustedError(
          absl::StrFormat("ticket book full: %d tickets open or recently closed", map_.size()));
    }
    const TicketId id = ++last_id_;
    map_.emplace(id, Entry{.ticket = std::move(t), .status = Status::kOpen});
    return id;
  }

  // Takes the ticket for settling: exactly one caller gets it. The caller must then
  // call done() (applied) or put_back() (store failed).
  absl::StatusOr<Ticket> take(TicketId id, Nanos now) {
    quota::detail::MutexLock lock(mu_);
    auto it = map_.find(id);
    if (it == map_.end()) {
      return absl::NotFoundError(absl::StrFormat("ticket %d: unknown (or long expired)", id));
    }
    Entry& e = it->second;
    if (e.status == Status::kOpen && now > e.ticket.expires_at) e.status = Status::kExpired;
    switch (e.status) {
      case Status::kSettled:
      case Status::kSettling:
        return absl::FailedPreconditionError(absl::StrFormat("ticket %d: already settled", id));
      case Status::kExpired:
        return absl::DeadlineExceededError(
            absl::StrFormat("ticket %d: expired at %d ns (now %d ns); the estimate stays spent", id,
                            e.ticket.expires_at.count(), now.count()));
      case Status::kOpen:
        break;
    }
    e.status = Status::kSettling;
    return e.ticket;
  }

  void done(TicketId id) { set(id, Status::kSettled); }
  void put_back(TicketId id) { set(id, Status::kOpen); }

  std::size_t size() const {
    quota::detail::MutexLock lock(mu_);
    return map_.size();
  }

 private:
  enum class Status : std::uint8_t { kOpen, kSettling, kSettled, kExpired };
  struct Entry {
    Ticket ticket;
    Status status = Status::kOpen;
  };

  void set(TicketId id, Status s) {
    quota::detail::MutexLock lock(mu_);
    if (auto it = map_.find(id); it != map_.end()) it->second.status = s;
  }

  // Forgets tickets more than one ttl past their expiry (tombstones included).
  void sweep(Nanos now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (auto it = map_.begin(); it != map_.end();) {
      const Entry& e = it->second;
      const bool forgettable = e.status != Status::kSettling && now - e.ticket.expires_at > ttl_;
      if (forgettable) {
        map_.erase(it++);
      } else {
        ++it;
      }
    }
  }

  Nanos ttl_;
  std::size_t max_tickets_;
  mutable quota::detail::Mutex mu_;
  TicketId last_id_ ABSL_GUARDED_BY(mu_) = 0;
  absl::flat_hash_map<TicketId, Entry> map_ ABSL_GUARDED_BY(mu_);
};

}  // namespace quota::gateway
