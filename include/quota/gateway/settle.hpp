// quota/gateway/settle.hpp — estimate, then settle (costs known only afterwards).
//
// For an LLM call the cost (tokens) is known only when the call ends. The gateway
// deducts an estimate (prompt tokens + max output) with Gateway::acquire_estimate and
// hands out a ticket; Gateway::settle(tenant, ticket, actual) then
//   - refunds the surplus (estimate − actual) to every budget level the estimate was
//     deducted from, each capped at that level's capacity (burst or limit), outstanding
//     debt paid first (key_state.hpp: refund);
//   - records a deficit (actual − estimate) and, with `charge_deficit`, charges it: what
//     the budget holds is taken at once, the rest becomes debt paid from later refills
//     (capped at the capacity);
//   - exactly once: the ticket is marked taken in its TicketStore before the budgets are
//     touched, so two racing settles of one ticket apply one refund. A second settle is
//     FailedPrecondition, a settle after the ticket's expiry DeadlineExceeded, a ticket
//     the tenant does not have (unknown, long forgotten, or another tenant's: not told
//     apart) NotFound — and all three change nothing. A settle whose first budget update fails puts
//     the ticket back (still open) and returns the store's error.
// The refund is exact for a token bucket (micro-units, capped). A window policy takes
// back units only while the window the estimate was counted in is still current: a later
// window already started from zero, so refunding into it would create budget.
//
// Where tickets are kept is a TicketStore: TicketBook below keeps them in this process
// (the Gateway's own, by default); redis::RedisTickets (redis/tickets.hpp) keeps them in
// Redis beside the tenant's budgets, so any process settles any ticket, once.
// TicketBook keeps tickets until `ttl` after issue, then as "expired" tombstones for
// another ttl (so a late settle gets a clear DeadlineExceeded rather than NotFound), then
// forgets them. At most `max_tickets`, without scans: tickets are numbered in issue order
// and kept in that order, and each issue() forgets at most two tickets from the oldest
// end that are forgettable (one ttl past their expiry, not being settled), so an issue
// costs O(1) whatever the book holds; when none can be, acquire_estimate gets
// ResourceExhausted. A ticket being settled holds the ones behind it until its settle ends.
//
// Thread-safe (TicketBook: one mutex, never held during a store call).
//
//   auto est = gw.acquire_estimate(req, /*estimate=*/4096, now);     // est->ticket
//   auto s = gw.settle("acme", *est->ticket, /*actual=*/1234, later);  // s->refunded
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <string>
#include <string_view>
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

// One estimate's ticket: whose it is, what was deducted, and until when it settles.
struct Ticket {
  std::string tenant{};  // the identity's tenant: only it settles the ticket
  std::vector<TicketLevel> levels{};
  std::int64_t estimate = 0;
  Nanos acquired_at{0};  // the caller's time of the acquire
  Nanos spent_at{0};     // the backend's time of the deduction (a Redis server's clock)
  Nanos expires_at{0};   // the caller's clock (a store with a clock of its own: ignored)
};

// Where tickets are kept (see the top of this file). take() gives a ticket to exactly one
// caller, which then calls done() (applied) or put_back() (nothing applied: open again).
class TicketStore {
 public:
  virtual ~TicketStore() = default;
  virtual Nanos ttl() const = 0;
  virtual absl::StatusOr<TicketId> issue(Ticket t, Nanos now) = 0;
  virtual absl::StatusOr<Ticket> take(std::string_view tenant, TicketId id, Nanos now) = 0;
  virtual void done(std::string_view tenant, TicketId id) = 0;
  virtual void put_back(std::string_view tenant, TicketId id) = 0;
};

// The error of a ticket `tenant` does not have — never issued, long forgotten, or another
// tenant's (not told apart: a tenant learns nothing of others' tickets). Every
// TicketStore's words.
inline absl::Status unknown_ticket(TicketId id, std::string_view tenant) {
  return absl::NotFoundError(absl::StrFormat(
      "ticket %d: no such ticket of tenant \"%s\" (never issued to it, or long expired); "
      "nothing settled",
      id, tenant));
}

// Tickets kept in this process (see the top of this file).
class TicketBook final : public TicketStore {
 public:
  TicketBook(Nanos ttl, std::size_t max_tickets) : ttl_(ttl), max_tickets_(max_tickets) {}

  Nanos ttl() const override { return ttl_; }

  absl::StatusOr<TicketId> issue(Ticket t, Nanos now) override {
    quota::detail::MutexLock lock(mu_);
    forget_old(now);
    if (tickets_.size() >= max_tickets_) {
      return absl::ResourceExhaustedError(
          absl::StrFormat("ticket book full: %d tickets open or recently closed", tickets_.size()));
    }
    tickets_.push_back(Entry{.ticket = std::move(t), .status = Status::kOpen});
    return first_id_ + tickets_.size() - 1;
  }

  absl::StatusOr<Ticket> take(std::string_view tenant, TicketId id, Nanos now) override {
    quota::detail::MutexLock lock(mu_);
    Entry* found = find(id);
    if (found == nullptr || found->ticket.tenant != tenant) return unknown_ticket(id, tenant);
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

  void done(std::string_view /*tenant*/, TicketId id) override { set(id, Status::kSettled); }
  void put_back(std::string_view /*tenant*/, TicketId id) override { set(id, Status::kOpen); }

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
