// Tests for the non-blocking mode of quota/gateway/leases/leased_backend.hpp
// (LeasedBackendOptions::renewals, quota/lease/renewal_thread.hpp): deciding threads never
// call the authority, a request finding too little held is denied at once while its
// grant is under way, and several threads spend a leased budget to exactly its size.
#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "quota/gateway/leases/leased_backend.hpp"
#include "quota/lease/renewal_thread.hpp"
#include "quota/store/sharded_store.hpp"
#include "support/lease_rules.hpp"

using namespace std::chrono_literals;
using quota::Nanos;
using quota::gateway::KeyPolicy;
using quota::gateway::Level;
using quota::gateway::StoreBackend;
using quota::testing::build;
using quota::testing::lease_levels_spec;
using quota::testing::lease_on;

namespace {

using Store = quota::ShardedStore<KeyPolicy>;

thread_local bool deciding = false;  // set on the threads that call Gateway::decide

// The authority, counting the calls made on a deciding thread (none may be).
class WatchedAuthority final : public quota::gateway::Backend {
 public:
  explicit WatchedAuthority(Store& store) : inner_(store) {}
  absl::StatusOr<quota::gateway::LevelsResult> decide(
      std::span<const quota::gateway::LevelCheck> levels, std::uint64_t version,
      Nanos now) override {
    (deciding ? on_deciding_thread : elsewhere).fetch_add(1);
    return inner_.decide(levels, version, now);
  }
  absl::StatusOr<quota::MicroUnits> refund(const quota::gateway::RulePolicy& p, std::uint64_t v,
                                           quota::gateway::LevelKey key, std::int64_t units,
                                           Nanos spent_at, Nanos now) override {
    (deciding ? on_deciding_thread : elsewhere).fetch_add(1);
    return inner_.refund(p, v, key, units, spent_at, now);
  }
  absl::StatusOr<quota::MicroUnits> charge(const quota::gateway::RulePolicy& p, std::uint64_t v,
                                           quota::gateway::LevelKey key, std::int64_t units,
                                           Nanos now) override {
    (deciding ? on_deciding_thread : elsewhere).fetch_add(1);
    return inner_.charge(p, v, key, units, now);
  }
  std::atomic<std::int64_t> on_deciding_thread{0}, elsewhere{0};

 private:
  StoreBackend<Store> inner_;
};

// A holder of leased tenant (10 units a grant, renewed at 3) and global budgets.
struct NonBlockingHolder {
  NonBlockingHolder(WatchedAuthority& authority, quota::GrantLedger& ledger)
      : registry(build(
            lease_levels_spec(1, {.rate = {1, 1000s}, .burst = 100}, lease_on(10, 3, 60s),
                              {.rate = {1, 1000s}, .burst = 100'000}, lease_on(50, 10, 60s)))),
        backend(authority, ledger,
                {.incarnation = 0x77, .metrics = &metrics, .renewals = &renewals}),
        gateway(backend, registry) {}
  ~NonBlockingHolder() { renewals.stop(); }  // before the backend goes

  quota::gateway::LeaseMetrics metrics;
  quota::detail::RenewalThread renewals;
  quota::gateway::RuleRegistry registry;
  quota::gateway::LeasedBackend<WatchedAuthority> backend;
  quota::gateway::Gateway gateway;
};

quota::gateway::Request read(const std::string& tenant) {
  return {.who = {.tenant = tenant, .plan = "free"}, .route = "read"};
}

bool renewing(const quota::Decision& d) {
  return !d.allowed && d.reason == quota::Reason::kOverLimit &&
         d.retry_after == quota::gateway::LeasedBackend<WatchedAuthority>::kWhileRenewing;
}

}  // namespace

TEST_CASE("non-blocking: a key's first request is denied at once, its grant taken elsewhere") {
  Store store;
  WatchedAuthority authority(store);
  quota::GrantLedger ledger;
  NonBlockingHolder h(authority, ledger);
  deciding = true;
  auto first = h.gateway.decide(read("acme"), Nanos{0});
  REQUIRE(first.ok());
  CHECK(renewing(first->decision));
  // Bounded wait for the renewal thread's grants (tenant and global).
  bool admitted = false;
  for (int i = 0; i < 2000 && !admitted; ++i) {
    auto r = h.gateway.decide(read("acme"), Nanos{0});
    REQUIRE(r.ok());
    admitted = r->decision.allowed;
    if (!admitted) {
      CHECK(renewing(r->decision));
      std::this_thread::sleep_for(1ms);
    }
  }
  deciding = false;
  CHECK(admitted);
  CHECK(authority.on_deciding_thread.load() == 0);
  CHECK(authority.elsewhere.load() >= 2);
  CHECK(h.metrics.at(Level::kTenant).denials_while_renewing.load() >= 1);
  // A request with an attempt id is not sent to the authority either: the Gateway's own.
  CHECK_FALSE(h.backend.shares_attempts());
}

TEST_CASE("non-blocking: threads spend a leased budget to exactly its size") {
  Store store;
  WatchedAuthority authority(store);
  quota::GrantLedger ledger;
  NonBlockingHolder h(authority, ledger);
  std::atomic<std::int64_t> admitted{0}, errors{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      deciding = true;
      // Bounded: until a denial that is not "renewing" (the budget is spent).
      for (int i = 0; i < 20'000; ++i) {
        auto r = h.gateway.decide(read("acme"), Nanos{0});
        if (!r.ok()) {
          errors.fetch_add(1);
          return;
        }
        if (r->decision.allowed) {
          admitted.fetch_add(1);
        } else if (renewing(r->decision)) {
          std::this_thread::yield();
        } else {
          return;
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  CHECK(errors.load() == 0);
  // The tenant's budget of 100, in grants of 10, all spent at time 0; never more.
  CHECK(admitted.load() == 100);
  CHECK(authority.on_deciding_thread.load() == 0);
  CHECK(h.metrics.at(Level::kTenant).grants.load() == 10);
}
