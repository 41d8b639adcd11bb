// examples/quota_server/stats/heavy_hitters.hpp — the heaviest tenants by units, in bounded memory.
//
// HeavyHitters is the weighted Space-Saving sketch (Metwally, Agrawal, El Abbadi 2005)
// with K counters: add(tenant, units) raises the tenant's counter when it has one; else it
// takes a free counter; else it takes over the counter with the smallest count c, whose
// count becomes c + units and whose error becomes c. The counts always sum to N, the units
// added in all, so the smallest count is at most N/K. Hence, for every tenant:
//   - a tenant with more than N/K of the units holds a counter (it is in top());
//   - a listed tenant's count overestimates its true units by at most its error <= N/K
//     (and never underestimates them).
// Each counter also counts the units marked denied since its key took it, so a listed
// tenant's denied share is known (over the span it has held its counter), and keeps the
// share of the key's budget in use that its last add() reported. Memory is K
// keys and counts whatever the number of tenants; /metrics shows at most K series of each
// (quota_top_tenant_units and quota_top_tenant_denied_units{rank,tenant}:
// decision_stats.hpp).
//
// Thread safety: add() and top() lock one mutex; any thread. add() scans the K counters
// only when a tenant without one arrives and all are taken (K = 20 by default).
//
//   quota::server::HeavyHitters top(20);
//   top.add("acme", 5);
//   top.add("acme", 2, /*denied=*/2);
//   for (const auto& e : top.top()) { /* e.key, e.count, e.error, largest count first */ }
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/string_view.h"

namespace quota::server {

class HeavyHitters {
 public:
  struct Entry {
    std::string key;
    std::uint64_t count = 0;  // true units <= count <= true units + error
    std::uint64_t error = 0;  // the count the counter had when this key took it over
    // Of the units added since this key took the counter, those marked denied: exact
    // for that span (never more than the key's true denied units).
    std::uint64_t denied = 0;
    // What add() last said of the key's budget: the share of it in use, in millionths
    // (-1: nothing said since the key took the counter).
    std::int64_t used_ppm = -1;
  };

  // `k` >= 1 counters.
  explicit HeavyHitters(std::size_t k) : k_(std::max<std::size_t>(k, 1)) {
    entries_.reserve(k_);
    index_.reserve(k_);
  }

  std::size_t capacity() const { return k_; }

  // `units` of `key`, of them `denied` units refused (0 <= denied <= units); `used_ppm`,
  // when >= 0, the share of the key's budget in use after them, in millionths.
  void add(std::string_view key, std::uint64_t units, std::uint64_t denied = 0,
           std::int64_t used_ppm = -1) {
    if (units == 0) return;
    denied = std::min(denied, units);
    std::lock_guard lock(mu_);
    total_ += units;
    // Debian's abseil has its own absl::string_view; the map looks it up without a copy.
    if (const auto it = index_.find(absl::string_view(key.data(), key.size()));
        it != index_.end()) {
      Entry& e = entries_[it->second];
      e.count += units;
      e.denied += denied;
      if (used_ppm >= 0) e.used_ppm = used_ppm;
      return;
    }
    if (entries_.size() < k_) {
      index_.emplace(std::string(key), entries_.size());
      entries_.push_back({.key = std::string(key),
                          .count = units,
                          .error = 0,
                          .denied = denied,
                          .used_ppm = used_ppm});
      return;
    }
    std::size_t min = 0;
    for (std::size_t i = 1; i < entries_.size(); ++i) {
      if (entries_[i].count < entries_[min].count) min = i;
    }
    Entry& e = entries_[min];
    index_.erase(e.key);
    e.key = std::string(key);
    e.error = e.count;
    e.count += units;
    e.denied = denied;
    e.used_ppm = used_ppm;
    index_.emplace(e.key, min);
  }

  // The counters, largest count first (ties: by key), at most K.
  std::vector<Entry> top() const {
    std::vector<Entry> out;
    {
      std::lock_guard lock(mu_);
      out = entries_;
    }
    std::sort(out.begin(), out.end(), [](const Entry& a, const Entry& b) {
      return a.count != b.count ? a.count > b.count : a.key < b.key;
    });
    return out;
  }

  // N: every unit added.
  std::uint64_t total() const {
    std::lock_guard lock(mu_);
    return total_;
  }

 private:
  const std::size_t k_;
  mutable std::mutex mu_;
  std::vector<Entry> entries_;                           // guarded by mu_
  absl::flat_hash_map<std::string, std::size_t> index_;  // key → entries_ index; mu_
  std::uint64_t total_ = 0;                              // mu_
};

}  // namespace quota::server
