// quota/fair/fair_share_results.hpp — what FairShare (fair_share.hpp) takes and answers.
//
// A tenant's report (TenantReport), the decision on one request (FairShareDecision), what
// one allocation computed (FairShareAllocation) and one tenant's state in a snapshot
// (TenantShare). Plain values: FairShare documents what each field means in its calls.
//
// Thread safety: values.
//
//   quota::fair::FairShareDecision d = *fs.request("acme", 100);
//   if (!d.allowed) log(quota::fair::to_string(d.verdict));
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "quota/fair/fair_share_config.hpp"

namespace quota::fair {

// A tenant's report: its weight (1 ≤ weight ≤ kMaxWeight) and the units it wants to hold
// in a lease period (demand ≥ 0). The demand replaces the estimate from the tenant's
// decayed asks from the next allocate() on, until report() or forget() changes it.
struct TenantReport {
  std::int64_t weight = 1;
  std::int64_t demand = 0;
};

struct FairShareDecision {
  bool allowed = false;
  FairShareVerdict verdict = FairShareVerdict::kOverShare;
  // The tenant's share of the current allocation when shares applied (kWithinShare,
  // kOverShare, kBorrowed); the budget when it is alone; 0 otherwise.
  std::int64_t share = 0;
  std::int64_t used = 0;        // the tenant's units in use after the decision
  std::int64_t total_used = 0;  // all tenants' units in use after the decision
};

// What one allocate() computed.
struct FairShareAllocation {
  std::int64_t capacity = 0;    // budget − reserve: what the shares divide
  std::int64_t demand_sum = 0;  // Σ demand of the tenants in the allocation (saturates at
                                // INT64_MAX)
  std::int64_t share_sum = 0;   // Σ shares, ≤ capacity
  std::size_t tenants = 0;      // tenants with a demand
  std::size_t constrained = 0;  // tenants whose share is below their demand
};

// One tenant's state in a snapshot: the current allocation's view of it.
struct TenantShare {
  std::string tenant;
  std::int64_t weight = 1;
  std::int64_t demand = 0;  // its demand in the current allocation
  std::int64_t used = 0;
  std::int64_t share = 0;
  bool constrained = false;  // share < demand: held to its share
};

}  // namespace quota::fair
