// quota/gateway/request.hpp — what a Gateway is asked, what it answers, and its options.
//
// The values Gateway (gateway.hpp) takes and returns: a Request (who, which route,
// an optional cost, an optional attempt id), a Result (the combined Decision and the rule that
// decided), an EstimateResult (with the ticket to settle), GatewayOptions, and is_unavailable(),
// the test that sends a store error to the route's fail mode.
//
// Thread safety: plain values and a pure function.
//
//   quota::gateway::Request req{.who = {.tenant = "acme", .plan = "free"}, .route = "read"};
//   absl::StatusOr<quota::gateway::Result> r = gw.decide(req, clock.now());
//   if (r.ok() && !r->decision.allowed) { /* 429 or 503, see quota/http.hpp */ }
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "quota/decision.hpp"
#include "quota/gateway/fair_share/fair_asks_exchange.hpp"
#include "quota/gateway/settle.hpp"
#include "quota/gateway/store_key.hpp"
#include "quota/store/store.hpp"
#include "quota/units.hpp"

namespace quota::gateway {

class FairLimits;  // fair_limits.hpp

struct GatewayOptions {
  // How long an attempt's first decision is kept and replayed (in this process's
  // AttemptCache, and over Redis as the record's TTL), and how many attempts this process
  // keeps. A retry of an attempt comes while its caller still waits, so the window to
  // cover is the longest a caller waits for one request: 60 s is the longest of the
  // common proxy timeouts (nginx's proxy_read_timeout; Envoy's route timeout is 15 s).
  // A longer ttl only holds memory: records live ttl each, so a steady rate R of
  // attempts keeps R × ttl of them, at most max_attempts (about 180 bytes each in
  // process with a 24-byte id, benchmarks/gateway_attempts_bench.cpp); past that a new
  // id gets ResourceExhausted.
  Nanos attempt_ttl{std::chrono::seconds(60)};
  std::size_t max_attempts = 1'000'000;
  // Estimates' tickets (settle.hpp): kept in this process, ticket_ttl each, at most
  // max_tickets; or, with `tickets` set, in that store (redis::RedisTickets: shared by
  // every process on one Redis; its own ttl, ticket_ttl and max_tickets unused).
  Nanos ticket_ttl{std::chrono::minutes(10)};
  std::size_t max_tickets = 1'000'000;
  std::shared_ptr<TicketStore> tickets = nullptr;
  // Charge a settle's deficit to the budget (as debt where it exceeds what is left).
  bool charge_deficit = false;
  // Capacity of the per-process emergency buckets (fail-open routes).
  StoreOptions emergency_store{.max_keys = 1'000'000, .shards = 16};
  // The gateway processes sharing each fair_share budget. Without an exchange each one's
  // allocator divides ⌊budget / fair_share_holders⌋; with one (e.g.
  // redis::RedisFairAsksExchange) the shares are computed over every holder's asks and
  // split where the demand is, ⌊budget / fair_share_holders⌋ being the fallback when the
  // exchange fails (fair_limits.hpp).
  std::int64_t fair_share_holders = 1;
  std::shared_ptr<FairAsksExchange> fair_share_exchange = nullptr;
  // Added to decide()'s `now` to number the fair-share allocation periods (their
  // boundaries and the exchange's period labels). Holders on several hosts must start
  // each period together for their reports to meet: with a per-host clock such as
  // SteadyClock, give each process the wall clock minus that clock, measured once at
  // start (steady_to_wall_offset(), fair_asks_exchange.hpp).
  Nanos fair_share_clock_offset{0};
  // The fair-share allocators to use, shared with other Gateways of this process that
  // decide the same budgets (a service that switches backends with its rule set keeps
  // one fair-share state); null: the Gateway's own, made from fair_share_holders and
  // fair_share_exchange (which are then ignored when this is set).
  std::shared_ptr<FairLimits> fair_limits = nullptr;
};

struct Request {
  Identity who{};
  std::string_view route{};
  // Optional: what this request costs, whole units in [1, kMaxUnits], paid by every
  // budget the route pays by estimate (RouteCost::estimate, or the route's default cost)
  // instead of the rule file's cost; budgets with a fixed cost entry pay that entry.
  // Gateway::decide deducts it as acquire_estimate deducts an estimate, with nothing
  // left to settle. Outside the range: InvalidArgument naming `cost`, nothing deducted.
  // (acquire_estimate takes its estimate as an argument and ignores this field.)
  std::optional<std::int64_t> cost = std::nullopt;
  // Optional: idempotent retries (attempts.hpp). With an attempt id the first decision
  // is replayed for GatewayOptions::attempt_ttl; the same id with another key or cost is
  // InvalidArgument; another tenant's same id is another attempt. Kept in this process's
  // AttemptCache, or — over Redis — in Redis, shared by every gateway process
  // (redis/gateway_store.hpp).
  std::string_view attempt_id = {};
  // Optional: the caller's deadline, a time of the Clock that gives `now` (the gateway
  // processes sharing attempts need one clock, e.g. the system clock). A call after it
  // decides nothing and is answered Reason::kAttemptExpired. With an attempt id the
  // deadline is kept with the decision: a retry after the deadline of the call that
  // decided is answered kAttemptExpired instead of the decision (replayed = true), and
  // the units it spent stay spent.
  std::optional<Nanos> deadline = std::nullopt;
};

// The combined decision over the levels decided (quota::combine_all, decision.hpp):
// allowed iff every enforcing level allows; remaining the least, reset_after the largest
// over the levels decided; retry_after, reason and rule those of the level that denies
// (the backend stops there). The version is the highest any level used (a key already
// converted by a newer rule set is decided by that rule).
struct Result {
  Decision decision{};
  std::string rule{};     // the rule that decided (first denier, else the tenant rule)
  bool replayed = false;  // an attempt's stored first decision
  // kRequestTooLarge: the cap the request exceeded, whole units (for the 413's body).
  std::int64_t request_cap = 0;
};

// Estimate, then settle (settle.hpp): acquire_estimate deducts an estimate and returns a
// ticket; settle refunds the surplus or charges the deficit, once.
struct EstimateResult {
  Decision decision{};
  std::string rule{};
  // Set when the estimate was deducted from the store (allowed, not fail-open).
  std::optional<TicketId> ticket{};
  std::int64_t request_cap = 0;  // as Result::request_cap
};

// True for the store errors that mean "the authority cannot answer now" (Unavailable,
// DeadlineExceeded, ResourceExhausted). They go to the route's fail mode:
//   - fail_closed → a Decision with reason kUnavailable (HTTP 503, never 429);
//   - fail_open   → the route's local emergency bucket (per process, per tenant key):
//     kFailOpen when it admits, kUnavailable when it is empty or when the outage (since
//     the first failure after the last success, per Gateway) has lasted max_duration.
//     The emergency bucket is a token bucket on the same clock, never reset by an
//     outage, so during outages the extra admitted for one key by one process is at most
//       EmergencyBucket::outage_allowance() = burst_e + ceil(rate_e · max_duration)
//     units per outage (and, across any interval T, at most rate_e·T + burst_e);
//     with N processes, N times that. gateway_fail_mode_test checks it with the envelope
//     verifier.
// Other store errors (InvalidArgument, DataLoss, ...) are returned to the caller as is.
inline bool is_unavailable(const absl::Status& s) {
  return s.code() == absl::StatusCode::kUnavailable ||
         s.code() == absl::StatusCode::kDeadlineExceeded ||
         s.code() == absl::StatusCode::kResourceExhausted;
}

}  // namespace quota::gateway
