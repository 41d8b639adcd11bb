// regions_pool.hpp — a region's grant pool for the regions scenario (regions.hpp): the
// record of quota/region/pool_model.hpp (the C++ model the pool's Lua is proven equal to,
// tests/redis/redis_region_pool_differential_test.cpp) behind the operations
// quota::region::BasicRegionalPool calls on its record, at the simulation's time.
//
// One PoolRecord per region, shared by every gateway of the region (each its own
// BasicRegionalPool object, as each process of a region holds its own in production): one
// holder of the global budget per region, whatever its number of gateways. Operations
// never fail (a value in memory); the time is the one the scenario set last (set_now).
//
// Thread safety: none (the scenario runs on one thread).
//
//   gateway_sim::regions::PoolRecord record;
//   record.set_now(t);
//   quota::region::BasicRegionalPool<quota::GrantLedger, PoolRecord, Path> pool(
//       record, central_path, ledger, {.region = 0x10, .refill_wait = quota::Nanos{0}});
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "quota/region/pool_model.hpp"
#include "quota/units.hpp"

namespace gateway_sim::regions {

class PoolRecord {
 public:
  using Reply = absl::StatusOr<quota::region::PoolReply>;

  void set_now(quota::Nanos now) { now_us_ = now.count() / 1000; }

  Reply claim(std::string_view key, std::int64_t units, std::uint64_t region) {
    return at(key).claim(units, region, now_us_);
  }
  Reply deposit(std::string_view key, std::string_view id, std::int64_t expiry_us, int max_grants) {
    return at(key).deposit(std::string(id), expiry_us, max_grants, now_us_);
  }
  Reply spend(std::string_view key, std::int64_t units) { return at(key).spend(units, now_us_); }
  Reply take(std::string_view key, std::int64_t units) { return at(key).take(units, now_us_); }
  Reply give(std::string_view key, std::int64_t units) { return at(key).give(units, now_us_); }
  Reply fail(std::string_view key, char code, std::string_view token, std::int64_t hold_us) {
    return at(key).fail(code, std::string(token), hold_us, now_us_);
  }
  Reply lock(std::string_view key, std::string_view token, std::int64_t ttl_us,
             std::int64_t at_most) {
    return at(key).lock(std::string(token), ttl_us, at_most, now_us_);
  }
  Reply unlock(std::string_view key, std::string_view token) {
    return at(key).unlock(std::string(token), now_us_);
  }
  Reply read(std::string_view key) { return at(key).read(now_us_); }

 private:
  quota::region::PoolModel& at(std::string_view key) { return pools_[std::string(key)]; }

  std::map<std::string, quota::region::PoolModel> pools_;
  std::int64_t now_us_ = 0;
};

}  // namespace gateway_sim::regions
