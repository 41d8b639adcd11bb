// traffic.hpp — the simulator's request stream: deterministic, seeded, skewed.
//
// One hot tenant (tenant-0) and T−1 quiet ones send Poisson traffic for `seconds` of
// simulated time. Each request is a read (cost 1) or, with probability create_share, a
// create (cost 5). A quiet tenant's requests are spread evenly over the G gateways. The
// hot tenant's are not: a share `hot_share` of them lands on `hot_gateways` of the G
// gateways (sticky clients behind a load balancer), the rest on the others, and every
// `shift_every` the balancer moves the hot set to another random subset.
//
// Everything is drawn from splitmix64 seeded with `seed`, with inverse-transform
// sampling written here (not std::*_distribution, whose output is implementation
// defined), so one seed gives one stream on every machine with IEEE doubles.
// Floating point is fine here: this is the traffic generator, not a decision path.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <vector>

namespace gateway_sim {

struct Request {
  std::int64_t time_ns;
  std::uint32_t tenant;
  std::uint32_t cost;
};

struct TrafficConfig {
  int gateways = 8;
  int tenants = 8;  // tenant 0 is hot
  int hot_gateways = 3;
  double hot_share = 0.8;
  std::int64_t seconds = 60;
  std::int64_t shift_every_s = 10;
  double create_share = 0.1;
  double hot_units_per_s = 1800;  // offered cost per second, hot tenant
  double quiet_units_per_s = 40;  // offered cost per second, each quiet tenant
  std::uint64_t seed = 1;
};

class SplitMix64 {
 public:
  explicit SplitMix64(std::uint64_t seed) : x_(seed) {}
  std::uint64_t next() {
    std::uint64_t z = (x_ += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }
  // Uniform in [0, 1).
  double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }
  // Uniform in [0, n).
  int below(int n) { return static_cast<int>(uniform() * n); }

 private:
  std::uint64_t x_;
};

inline double mean_cost(const TrafficConfig& c) { return 1.0 + 4.0 * c.create_share; }

// The hot set of each balancer epoch: epoch k covers [k·shift_every, (k+1)·shift_every).
inline std::vector<std::vector<int>> hot_sets(const TrafficConfig& c) {
  SplitMix64 rng(c.seed * 0x2545f4914f6cdd1dULL + 17);
  const std::int64_t epochs =
      c.shift_every_s > 0 ? (c.seconds + c.shift_every_s - 1) / c.shift_every_s : 1;
  std::vector<std::vector<int>> sets;
  for (std::int64_t e = 0; e < std::max<std::int64_t>(epochs, 1); ++e) {
    std::vector<int> g(c.gateways);
    std::iota(g.begin(), g.end(), 0);
    for (int i = 0; i < c.hot_gateways; ++i) std::swap(g[i], g[i + rng.below(c.gateways - i)]);
    g.resize(c.hot_gateways);
    std::sort(g.begin(), g.end());
    sets.push_back(std::move(g));
  }
  return sets;
}

// Per gateway, its requests in time order (ties: by tenant, then generation order).
inline std::vector<std::vector<Request>> generate(const TrafficConfig& c) {
  std::vector<std::vector<Request>> per_gateway(c.gateways);
  const auto sets = hot_sets(c);
  const std::int64_t end_ns = c.seconds * 1'000'000'000;
  const double mc = mean_cost(c);
  for (int tenant = 0; tenant < c.tenants; ++tenant) {
    SplitMix64 rng(c.seed * 0x9e3779b97f4a7c15ULL + 0x632be59bd9b4e019ULL * (tenant + 1));
    const double units_per_s = tenant == 0 ? c.hot_units_per_s : c.quiet_units_per_s;
    const double req_per_ns = units_per_s / mc / 1e9;
    if (req_per_ns <= 0) continue;
    double t = 0;
    while (true) {
      t += -std::log1p(-rng.uniform()) / req_per_ns;
      const auto time_ns = static_cast<std::int64_t>(t);
      if (time_ns >= end_ns) break;
      const std::uint32_t cost = rng.uniform() < c.create_share ? 5 : 1;
      int gateway;
      if (tenant != 0 || c.hot_gateways <= 0 || c.hot_gateways >= c.gateways) {
        gateway = rng.below(c.gateways);
      } else {
        const std::int64_t epoch =
            c.shift_every_s > 0 ? time_ns / (c.shift_every_s * 1'000'000'000) : 0;
        const auto& hot = sets[static_cast<std::size_t>(epoch)];
        if (rng.uniform() < c.hot_share) {
          gateway = hot[rng.below(c.hot_gateways)];
        } else {
          // the k-th gateway not in the hot set
          int k = rng.below(c.gateways - c.hot_gateways);
          gateway = 0;
          for (;; ++gateway) {
            if (std::find(hot.begin(), hot.end(), gateway) != hot.end()) continue;
            if (k-- == 0) break;
          }
        }
      }
      per_gateway[gateway].push_back(Request{time_ns, static_cast<std::uint32_t>(tenant), cost});
    }
  }
  for (auto& v : per_gateway) {
    std::stable_sort(v.begin(), v.end(), [](const Request& a, const Request& b) {
      return a.time_ns != b.time_ns ? a.time_ns < b.time_ns : a.tenant < b.tenant;
    });
  }
  return per_gateway;
}

}  // namespace gateway_sim
