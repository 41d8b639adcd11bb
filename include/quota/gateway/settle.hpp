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
// rather than NotFound), then forgotten. At most `max_tickets`, without scans: tickets
// are numbered in issue order and kept in that order, and each issue() forgets at most
// two tickets from the oldest end that are forgettable (one ttl past their expiry, not
// being settled), so an issue costs O(1) whatever the book holds; when none can be,
// acquire_estimate gets ResourceExhausted. The Gateway gives every ticket the same ttl,
// so the oldest ticket is also the first to expire; a ticket being settled (a store call
// in flight) holds the ones behind it until its settle ends.
//
// Thread-safe (one mutex, never held during a store call).
//
//   auto est = gw.acquire_estimate(req, /*estimate=*/4096, now);  // est->ticket
//   auto s = gw.settle(*est->ticket, /*actual=*/1234, later);      // s->refunded, per level
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/numeric/int128.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_format.h"
#include "quota/detail/mutex.hpp"
#include "quota/gateway/key_state.hpp"
#include "quota/gateway/store_key.hpp"
#include "quota/units.hpp"

namespace quota::gateway {

using TicketId = std::uint64_t;

// One budget level an estimate was deducted from.
struct TicketLevel {
  std::string key{};
  KeyLayout layout{};   // where the key's scope and record are (store_key.hpp)
  RulePolicy policy{};  // the rule's policy at acquire (used if the key must be recreated)
  std::uint64_t version = 0;

  LevelKey level_key() const { return {key, layout}; }
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
    forget_old(now);
    if (tickets_.size() >= max_tickets_) {
      return absl::ResourceExhaustedError(
          absl::StrFormat("ticket book full: %d tickets open or recently closed", tickets_.size()));
    }
    tickets_.push_back(Entry{.ticket = std::move(t), .status = Status::kOpen});
    return first_id_ + tickets_.size() - 1;
  }

  // Takes the ticket for settling: exactly one caller gets it. The caller must then
  // call done() (applied) or put_back() (store failed).
  absl::StatusOr<Ticket> take(TicketId id, Nanos now) {
    quota::detail::MutexLock lock(mu_);
    Entry* found = find(id);
    if (found == nullptr) {
      return absl::NotFoundError(absl::StrFormat("ticket %d: unknown (or long expired)", id));
    }
    Entry& e = *found;
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

  // Tickets kept: open, being settled, settled or expired but not yet forgotten.
  std::size_t size() const {
    quota::detail::MutexLock lock(mu_);
    return tickets_.size();
  }

 private:
  // Forgotten per issue(): more than the one ticket it adds, so tickets left behind by a
  // quiet spell drain while new ones arrive, and few enough that an issue stays O(1).
  static constexpr int kForgottenPerIssue = 2;

  enum class Status : std::uint8_t { kOpen, kSettling, kSettled, kExpired };
  struct Entry {
    Ticket ticket;
    Status status = Status::kOpen;
  };

  // The ticket numbered `id`, or null (never issued, or forgotten).
  Entry* find(TicketId id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (id < first_id_ || id - first_id_ >= tickets_.size()) return nullptr;
    return &tickets_[id - first_id_];
  }

  void set(TicketId id, Status s) {
    quota::detail::MutexLock lock(mu_);
    if (Entry* e = find(id)) e->status = s;
  }

  // Forgets, from the oldest, tickets more than one ttl past their expiry (tombstones
  // included), up to kForgottenPerIssue.
  void forget_old(Nanos now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (int i = 0; i < kForgottenPerIssue && !tickets_.empty(); ++i) {
      const Entry& oldest = tickets_.front();
      // In 128 bits: `now` and an expiry may be any times (the caller's clock).
      if (oldest.status == Status::kSettling ||
          absl::int128(now.count()) - oldest.ticket.expires_at.count() <= ttl_.count()) {
        return;
      }
      tickets_.pop_front();
      ++first_id_;
    }
  }

  Nanos ttl_;
  std::size_t max_tickets_;
  mutable quota::detail::Mutex mu_;
  // The tickets kept, in issue order: tickets_[i] is ticket first_id_ + i. Ids start at 1.
  std::deque<Entry> tickets_ ABSL_GUARDED_BY(mu_);
  TicketId first_id_ ABSL_GUARDED_BY(mu_) = 1;
};

}  // namespace quota::gateway
