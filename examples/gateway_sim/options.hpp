// options.hpp — the simulator's scenario (from its flags) and each tenant's contract.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "quota/quota.hpp"
#include "traffic.hpp"

namespace gateway_sim {

using namespace std::chrono_literals;
using quota::TokenBucket;

struct Options {
  TrafficConfig traffic;
  std::int64_t rate = 1000;  // hot tenant's contract, units per second
  std::int64_t burst = 200;
  double load = 1.8;  // hot tenant's offered cost / contract rate
  std::int64_t quiet_rate = 100;
  std::int64_t quiet_burst = 50;
  double quiet_load = 0.4;
  std::int64_t tick_ms = 10;
  std::int64_t verify_burst = -1;
  std::int64_t lease_q = 50;  // leases: the largest grant, units (capped at each burst)       //
                              // the burst the hot tenant is checked against; -1: its own
  std::vector<std::string> strategies;  // empty: the defaults
  std::string redis;                    // HOST:PORT
  std::string svg;  // "": gateway_sim.svg beside the executable (its build directory)
  bool progress = true;
};

// The contract of each tenant and the store keys.
struct Tenants {
  std::vector<TokenBucket> contract;
  std::vector<std::string> keys;  // "{tenant-N}all": one budget per tenant

  explicit Tenants(const Options& o) {
    for (int t = 0; t < o.traffic.tenants; ++t) {
      contract.push_back(
          t == 0 ? TokenBucket{.rate = {.units = o.rate, .per = 1s}, .burst = o.burst}
                 : TokenBucket{.rate = {.units = o.quiet_rate, .per = 1s}, .burst = o.quiet_burst});
      keys.push_back(absl::StrCat("{tenant-", t, "}all"));
    }
  }
};

}  // namespace gateway_sim
