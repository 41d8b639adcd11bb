// quota/region/basic_regional_pool.hpp — a region's global budgets from one grant pool
// shared by every gateway process of the region, over any pool record and central
// authority (regional_pool.hpp: the region's Redis and a central redis::GatewayStore).
//
// `BasicRegionalPool<Ledger, Record, Central>` is a gateway backend (backend.hpp) for the
// levels of the global scope ("{~global}..."): it decides them from the region's pool record
// (`Record`: the operations of pool_model.hpp at the record's own time — PoolScript in the region's
// Redis, or a PoolModel in a simulation), and refills the pool from the central authority
// (`Central`: with attempts, as redis::GatewayStore, a lost grant reply is replayed by the grant
// id; without, a grant is a plain decision). Under a ScopeRouter (scope_router.hpp) with the
// region's own store it is a region's whole backend: tenant levels at the regional store, global
// levels from the pool.
//
// Guarantees:
//   - The region is ONE holder of each global budget, whatever its number of processes:
//     a refill is ONE decision of `units` on the global key at the central store, with
//     the grant id "<region hex>-<n>" (n from the pool's sequence) as its attempt, taken
//     by the one process that holds the pool's refill lock (in the record, at its time:
//     at most one refill of a key in flight in the region), recorded by `Ledger` (RedisGrantLedger
//     on the central store: key, id, region, version, units, expiry), then deposited in the pool
//     (idempotent by id). A lost grant reply keeps the id pending in the pool: the next
//     refill asks again with it and the central store replays it; a lost deposit reply is
//     replayed by id. Never taken twice, never refunded to the central authority.
//   - A refill starts ahead of need: in the request whose spend leaves the pool at or
//     below `low_water` (its answer already decided; the library starts no threads), by
//     the one process that takes the lock. Size `low_water` to the region's rate × the
//     central round trip and the refill completes before the pool runs dry. A deposit
//     expires at its claim time + `expiry` (no later than the central record's); expired
//     units are never spent. Live grants <= `max_grants`.
//   - A request that finds the pool unable to serve its cost refills it (when it gets the
//     lock), else waits for the refill in flight, polling the pool for at most
//     `refill_wait` (the processes share only the record: at most ~refill_wait / 8 ms + 4
//     polls per waiting request): an empty pool during a refill is not a denial. Then:
//     admitted; or kOverLimit (retry_after: backoff_min) when the central authority
//     denied the region's last refill (its budget had no room), or the refills came and
//     the region's other requests spent them first; or the call fails kUnavailable —
//     "central authority is unreachable" when the last refill failed so (a region cut
//     off), "did not complete within refill_wait" when it is still in flight — and the
//     Gateway applies the route's fail mode. Cut off, a region spends only its pool.
//   - A refill whose deposit fails twice (the regional Redis unreachable) leaves its id
//     pending and the lock to expire (`lock_ttl`): the next refill replays the grant by
//     id and deposits it. A failed ledger record is not retried (the grant stands, as in
//     LeasedBackend); the central store's attempt record still holds it.
//   - refund gives units back to the pool (never to the central authority); charge takes
//     what the pool holds and charges the rest at the central store.
//   - Bound: a region's pool holds at most units + max(low_water, c − 1) for requests of
//     cost at most c (one refill at a time, started only on a pool at or below that mark,
//     checked with the lock in one step) while the lock outlives a refill (`lock_ttl`
//     above the central deadline), so every interval of length T admits
//     A(T) <= r·T + B + Σ outstanding regional grants <= r·T + B + R·(units + low_water)
//     over R regions with costs <= low_water + 1 (tests/redis/redis_region_pool_test.cpp).
//   - A level costing more than `units` is denied (kCostExceedsBurst): size grants above
//     the largest cost. A cost below 1 is denied (kInvalidCost), nothing spent.
//
// Thread safety: any thread (as Record and Central); processes of a region share the pool
// through its record.
//
//   quota::region::PoolScript record(eu_redis, "pool:");
//   quota::region::BasicRegionalPool<quota::redis::RedisGrantLedger,
//                                     quota::region::PoolScript, quota::redis::GatewayStore>
//       pool(record, central, ledger, {.region = 0xe1});
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <thread>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "quota/decision.hpp"
#include "quota/detail/keyed_states.hpp"
#include "quota/gateway/backend.hpp"
#include "quota/gateway/leases/lease_grant.hpp"
#include "quota/lease/grant_ledger.hpp"
#include "quota/lease/holder.hpp"
#include "quota/region/pool_model.hpp"
#include "quota/units.hpp"

namespace quota::region {

struct PoolOptions {
  std::uint64_t region = 1;   // the region's id, the same in all its processes (not 0)
  std::int64_t units = 1000;  // per grant
  Nanos expiry = std::chrono::seconds(1);
  std::int64_t low_water = 250;
  int max_grants = 4;
  Nanos lock_ttl = std::chrono::seconds(5);  // above the central store's deadline
  // After a failed refill the key's lock is held (no refill in the region) for a backoff:
  // backoff_min doubled per failure in a row, at most backoff_max, jittered
  // (lease/holder.hpp GrantBackoff, as for every grant holder).
  Nanos backoff_min = std::chrono::milliseconds(1);
  Nanos backoff_max = std::chrono::seconds(1);
  // How long a request that finds the pool empty waits for a refill in flight (another
  // process's, or its own); 0: not at all.
  Nanos refill_wait = std::chrono::milliseconds(100);
  std::string prefix = "pool:";  // the record's keys in the region's Redis (RegionalPool)
};

template <GrantRecorder Ledger, class Record, gateway::GatewayBackend Central>
class BasicRegionalPool : public gateway::Backend {
 public:
  // `record`, `central` and `ledger` must outlive the pool.
  BasicRegionalPool(Record& record, Central& central, Ledger& ledger, PoolOptions options = {})
      : options_(fill(std::move(options))),
        script_(record),
        central_(central),
        ledger_(ledger),
        self_(random_incarnation()),
        token_(absl::StrCat(absl::Hex(self_))),
        backoff_(options_.backoff_min, options_.backoff_max, self_) {}

  absl::StatusOr<gateway::LevelsResult> decide(std::span<const gateway::LevelCheck> levels,
                                               std::uint64_t version, Nanos now) override {
    // A run: one level, spent from its pool record.
    const auto run_end = [](std::size_t begin) { return begin + 1; };
    const auto decide_run =
        [&](std::size_t begin, std::size_t /*end*/, gateway::CheckVector<Decision>& parts,
            gateway::CheckVector<std::size_t>& spent) -> absl::StatusOr<gateway::RunStep> {
      auto d = spend(levels[begin], version, now);
      if (!d.ok()) return d.status();
      parts.push_back(d->first);
      if (d->first.allowed) spent.push_back(begin);
      return gateway::RunStep{.redo = false, .time = d->second};
    };
    return gateway::decide_all_or_nothing<std::size_t>(
        levels, now, run_end, decide_run,
        [&](std::span<const std::size_t> spent) { give_back(levels, spent); });
  }

  absl::StatusOr<MicroUnits> refund(const gateway::RulePolicy&, std::uint64_t,
                                    gateway::LevelKey key, std::int64_t units, Nanos,
                                    Nanos) override {
    auto r = script_.give(key.key, units);
    if (!r.ok()) return r.status();
    return r->total * kMicro;
  }

  absl::StatusOr<MicroUnits> charge(const gateway::RulePolicy& policy, std::uint64_t version,
                                    gateway::LevelKey key, std::int64_t units, Nanos now) override {
    auto r = script_.take(key.key, units);
    if (!r.ok()) return r.status();
    if (r->code == units) return r->total * kMicro;
    return central_.charge(policy, version, key, units - r->code, now);
  }

  // Grant requests this process sent to the central authority.
  std::int64_t grant_requests() const { return grant_requests_.load(); }
  // Of those, the ones the central authority denied (its budget had no room).
  std::int64_t grant_denials() const { return grant_denials_.load(); }
  // Requests of this process that found the pool empty and waited for a refill.
  std::int64_t refill_waits() const { return refill_waits_.load(); }
  // The pool of `key` now: code = grants holding units, total held, unused, last state.
  absl::StatusOr<PoolReply> read(std::string_view key) { return script_.read(key); }
  const PoolOptions& options() const { return options_; }

 private:
  static constexpr MicroUnits kMicro = 1'000'000;

  static PoolOptions fill(PoolOptions o) {
    o.units = std::max<std::int64_t>(o.units, 1);
    o.low_water = std::clamp<std::int64_t>(o.low_water, 0, o.units - 1);
    o.max_grants = std::max(o.max_grants, 2);
    o.backoff_min = std::max(o.backoff_min, Nanos{1'000'000});
    o.backoff_max = std::max(o.backoff_max, o.backoff_min);
    o.refill_wait = std::max(o.refill_wait, Nanos{0});
    return o;
  }

  // One level from the pool: spend, and refill when the spend leaves the pool at or below
  // low water (this request's answer is already decided). A pool that cannot serve the
  // cost is waited for (wait_for_refill).
  absl::StatusOr<std::pair<Decision, Nanos>> spend(const gateway::LevelCheck& l,
                                                   std::uint64_t version, Nanos now) {
    if (l.cost < 1 || l.cost > options_.units) {
      return std::pair{
          Decision{.allowed = false,
                   .retry_after = kNever,
                   .version = version,
                   .reason = l.cost < 1 ? Reason::kInvalidCost : Reason::kCostExceedsBurst},
          now};
    }
    auto r = script_.spend(l.key, l.cost);
    if (!r.ok()) return r.status();
    if (r->code == 0) {
      r = wait_for_refill(l, version, now);
      if (!r.ok()) return r.status();
    } else if (r->total <= options_.low_water) {
      (void)refill(l, version, now);
    }
    const Nanos time{r->now_us * 1000};
    if (r->code == 1) {
      return std::pair{Decision{.allowed = true,
                                .remaining = r->total,
                                .version = version,
                                .reason = Reason::kAllowed},
                       time};
    }
    // 'd': the central authority denied the region's last refill; 'o': the refills came
    // and were spent by the region's other requests before this one.
    if (r->state != 'u' && r->state != 'r') {
      return std::pair{Decision{.allowed = false,
                                .remaining = r->total,
                                .retry_after = options_.backoff_min,
                                .version = version,
                                .reason = Reason::kOverLimit},
                       time};
    }
    if (r->state == 'u') {
      return absl::UnavailableError(
          "regional pool: spent, and the central authority is unreachable");
    }
    return absl::UnavailableError(absl::StrCat(
        "regional pool: spent, and the region's refill from the central authority did not "
        "complete within refill_wait (",
        options_.refill_wait.count() / 1'000'000, " ms)"));
  }

  // The pool cannot serve `l.cost`: refill it (when this process gets the lock), else wait
  // for the refill in flight, polling the pool (1, 2, 4, 8, 8 ... ms) until it serves
  // the cost, the refill fails ('u' / 'd'), or `refill_wait` has passed.
  absl::StatusOr<PoolReply> wait_for_refill(const gateway::LevelCheck& l, std::uint64_t version,
                                            Nanos now) {
    const auto deadline = std::chrono::steady_clock::now() + options_.refill_wait;
    Nanos pause = std::chrono::milliseconds(1);
    bool waited = false, ran = false;
    for (;;) {
      // One refill per request at most: a deposit that was not added (kFull, kExpired)
      // is not chased with more central units.
      const bool refilled = !ran && refill(l, version, now);
      ran = ran || refilled;
      auto r = script_.spend(l.key, l.cost);
      if (!r.ok() || r->code == 1 || r->state == 'u' || r->state == 'd') return r;
      const auto left = deadline - std::chrono::steady_clock::now();
      if (left <= Nanos{0}) return r;
      if (!refilled) {  // another refill is in flight, or this one was drained
        if (!waited) refill_waits_.fetch_add(1, std::memory_order_relaxed);
        waited = true;
        std::this_thread::sleep_for(std::min<Nanos>(pause, left));
        pause = std::min<Nanos>(2 * pause, std::chrono::milliseconds(8));
      }
    }
  }

  // A refill by this process, if it gets the region's lock for the key (true: it ran one).
  // Errors stay in the pool's record (its state, the lock held for the backoff).
  bool refill(const gateway::LevelCheck& l, std::uint64_t version, Nanos now) {
    const std::string token = absl::StrCat(token_, "-", ++refills_);
    const std::int64_t lock_us = options_.lock_ttl.count() / 1000 + 1;
    const std::int64_t mark = std::max(options_.low_water, l.cost - 1);
    auto locked = script_.lock(l.key, token, lock_us, mark);
    if (!locked.ok() || locked->code != 1) return false;
    auto id = script_.claim(l.key, options_.units, options_.region);
    if (!id.ok()) {  // the pool's record did not answer: marked unavailable for the backoff
      (void)script_.fail(l.key, 'u', token, to_us(backoff_.after(++failures_)));
      return true;  // if that fails too, the lock expires
    }
    grant_requests_.fetch_add(1, std::memory_order_relaxed);
    auto got = gateway::detail::decide_grant(central_, l, options_.units, id->id, version, now,
                                             2 * options_.expiry);
    if (!got.ok()) {
      // Unknown outcome: the id stays pending for the next refill, after the backoff.
      (void)script_.fail(l.key, 'u', token, to_us(backoff_.after(++failures_)));
      return true;
    }
    failures_ = 0;
    const Decision& d = got->decision;
    if (!d.allowed) {
      grant_denials_.fetch_add(1, std::memory_order_relaxed);
      const Nanos wait = std::clamp(d.retry_after, options_.backoff_min, options_.expiry);
      (void)script_.fail(l.key, 'd', token, to_us(wait));
      return true;
    }
    // Recorded again on a replay: the same field of the central record.
    (void)ledger_.record({.key = std::string(l.key),
                          .grant_id = id->id,
                          .incarnation = options_.region,
                          .version = std::max(version, d.version),
                          .units = options_.units,
                          .granted_at = got->time,
                          .expires_at = quota::detail::saturating_add(got->time, options_.expiry)});
    const std::int64_t expiry_us = options_.expiry.count() / 1000;
    for (int i = 0; i < 2; ++i) {  // a lost deposit reply: the retry is replayed by id
      if (script_.deposit(l.key, id->id, expiry_us, options_.max_grants).ok()) {
        (void)script_.unlock(l.key, token);
        return true;
      }
    }
    return true;
  }

  void give_back(std::span<const gateway::LevelCheck> levels, std::span<const std::size_t> spent) {
    // An error here cannot over-admit: the pool keeps the units spent.
    for (std::size_t i : spent) (void)script_.give(levels[i].key, levels[i].cost);
  }

  static std::int64_t to_us(Nanos n) { return std::max<std::int64_t>(1, n.count() / 1000); }

  PoolOptions options_;
  Record& script_;
  Central& central_;
  Ledger& ledger_;
  const std::uint64_t self_;  // this process, drawn once (lease/holder.hpp)
  std::string token_;         // this process's lock tokens: token_-<n>
  GrantBackoff backoff_;      // after a failed refill: jittered, seeded with self_
  std::atomic<std::uint64_t> refills_{0};
  std::atomic<int> failures_{0};
  std::atomic<std::int64_t> grant_requests_{0};
  std::atomic<std::int64_t> grant_denials_{0};
  std::atomic<std::int64_t> refill_waits_{0};
};

}  // namespace quota::region
