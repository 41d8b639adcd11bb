// quota/lease/lease_counters.hpp — what a lease holder counts: grants, renewals, units.
//
// A lease holder counts what its leases do in a LeaseCounters: the units it holds now,
// the grants it took and the units they brought, its grant requests (renewals) with their
// latency and failures, and the units its grants lost (unused at expiry, dropped by a
// rule change, revoked). A LeasedLimiter (leased_limiter.hpp) counts its grants and
// renewals in one; a LeasedBackend all of them, per budget level
// (gateway/leases/lease_metrics.hpp, which also renders them
// for Prometheus). Counters are relaxed atomics: exact once traffic stops.
//
// Thread safety: any thread.
//
//   quota::LeaseCounters c;
//   c.grants.fetch_add(1, std::memory_order_relaxed);
//   c.add_renewal_latency(1'500'000);  // ns
#pragma once

#include <atomic>
#include <cstdint>

namespace quota {

struct LeaseCounters {
  std::atomic<std::int64_t> units_held{0};        // gauge: held by this process now
  std::atomic<std::int64_t> grants{0};            // grants taken
  std::atomic<std::int64_t> units_granted{0};     // units they brought
  std::atomic<std::int64_t> renewals{0};          // grant requests answered by the authority
  std::atomic<std::int64_t> renewal_failures{0};  // grant requests answered by an error
  std::atomic<std::int64_t> renewal_ns_total{0};  // wall time of the grant requests
  std::atomic<std::int64_t> renewal_ns_max{0};
  std::atomic<std::int64_t> units_unused_at_expiry{0};
  std::atomic<std::int64_t> units_dropped_on_rule_change{0};
  std::atomic<std::int64_t> units_revoked{
      0};  // dropped on a revocation (gateway/leases/lease_revocation.hpp)
  std::atomic<std::int64_t> denials_while_leased{0};
  // Non-blocking (RenewalThread): denials while the key held too little and its grant
  // request was posted or in flight (false denials when the authority would have granted).
  std::atomic<std::int64_t> denials_while_renewing{0};
  std::atomic<std::int64_t> record_failures{0};  // grants the ledger failed to record

  void add_renewal_latency(std::int64_t ns) {
    renewal_ns_total.fetch_add(ns, std::memory_order_relaxed);
    std::int64_t max = renewal_ns_max.load(std::memory_order_relaxed);
    while (ns > max && !renewal_ns_max.compare_exchange_weak(max, ns, std::memory_order_relaxed)) {
    }
  }
};

}  // namespace quota
