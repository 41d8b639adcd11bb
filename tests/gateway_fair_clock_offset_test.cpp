// Fair-share holders on clocks that count from different origins (two hosts' steady
// clocks, booted at different times) meet only through GatewayOptions::
// fair_share_clock_offset (gateway/fair_share/fair_asks_exchange.hpp): with each holder's offset to
// a common clock, both number and start every allocation period alike, so each reads a view that
// holds the other's tenant and no report is late; without, their period labels never match and each
// sees only itself. The exchange is in process, sealing like redis::RedisFairAsksExchange's script:
// the first read of a period seals it, a report into a sealed period is late and dropped.
#include <algorithm>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "quota/gateway/gateway.hpp"
#include "quota/store/local_store.hpp"
#include "support/gateway_rules.hpp"

using namespace std::chrono_literals;
using quota::Nanos;
using quota::TokenBucket;
using quota::gateway::FairAsksView;
using quota::gateway::FairShareSpec;
using quota::gateway::Level;
using quota::gateway::RuleSetSpec;

namespace {

// The shared record: per period label, whether it is sealed and each (holder, tenant)'s
// asks.
struct SharedAsks {
  struct Period {
    bool sealed = false;
    std::map<std::string, std::map<std::string, std::int64_t>> asks;  // tenant → holder → units
  };
  std::map<std::int64_t, Period> periods;
};

// One holder's exchange; `views` keeps the tenants of every view it read.
struct HolderExchange final : quota::gateway::FairAsksExchange {
  HolderExchange(SharedAsks& shared, std::string name) : shared(shared), name(std::move(name)) {}
  absl::StatusOr<FairAsksView> exchange(std::string_view, Nanos, std::int64_t reported,
                                        std::span<const std::pair<std::string, std::int64_t>> asks,
                                        std::int64_t read) override {
    FairAsksView view;
    if (!asks.empty()) {
      auto& p = shared.periods[reported];
      if (p.sealed) {
        view.late = true;
      } else {
        for (const auto& [tenant, units] : asks) p.asks[tenant][name] = units;
      }
    }
    auto& r = shared.periods[read];
    r.sealed = true;
    std::vector<std::string> seen;
    for (const auto& [tenant, by_holder] : r.asks) {
      quota::fair::HolderDemand d{.tenant = tenant};
      for (const auto& [holder, units] : by_holder) {
        d.total += units;
        if (holder == name) d.local = units;
      }
      view.tenants.push_back(d);
      seen.push_back(tenant);
    }
    views.push_back(std::move(seen));
    return view;
  }
  SharedAsks& shared;
  const std::string name;
  std::vector<std::vector<std::string>> views;
};

RuleSetSpec fair_spec() {
  return quota::testing::fair_share_spec(
      "global", FairShareSpec{.enabled = true, .period = 1s, .budget = 1'000});
}

using Store = quota::LocalStore<quota::gateway::KeyPolicy>;

// A holder: its own rules, store, exchange and gateway, its clock `origin` ahead of the
// common one (`offset` = common − its own, as steady_to_wall_offset() gives).
struct Holder {
  Holder(SharedAsks& shared, const std::string& name, Nanos offset)
      : registry(quota::testing::build(fair_spec())),
        exchange(std::make_shared<HolderExchange>(shared, name)),
        gateway(store, registry,
                {.fair_share_holders = 2,
                 .fair_share_exchange = exchange,
                 .fair_share_clock_offset = offset}) {}
  quota::gateway::RuleRegistry registry;
  Store store;
  std::shared_ptr<HolderExchange> exchange;
  quota::gateway::Gateway gateway;
};

struct Run {
  std::int64_t late_a = 0, late_b = 0;
  int views_a_with_b = 0, views_b_with_a = 0, views_a = 0;
};

// Six seconds of the common clock, a request of 10 units every 10 ms at each holder (tenant
// "a" at A, "b" at B); A's clock reads common + origin_a, B's common + origin_b.
Run run(Nanos origin_a, Nanos origin_b, bool offsets) {
  SharedAsks shared;
  Holder a(shared, "A", offsets ? -origin_a : Nanos{0});
  Holder b(shared, "B", offsets ? -origin_b : Nanos{0});
  for (Nanos t{0}; t < 6s; t += 10ms) {
    for (auto [h, tenant, origin] :
         {std::tuple{&a, "a", origin_a}, std::tuple{&b, "b", origin_b}}) {
      auto r = h->gateway.decide(
          {.who = {.tenant = tenant, .plan = "free"}, .route = "call", .cost = 10}, t + origin);
      REQUIRE(r.ok());
    }
  }
  Run out;
  out.late_a = a.gateway.fair_shares().at(0).late_reports;
  out.late_b = b.gateway.fair_shares().at(0).late_reports;
  const auto has = [](const std::vector<std::string>& v, const std::string& t) {
    return std::find(v.begin(), v.end(), t) != v.end();
  };
  for (const auto& v : a.exchange->views) out.views_a_with_b += has(v, "b") ? 1 : 0;
  for (const auto& v : b.exchange->views) out.views_b_with_a += has(v, "a") ? 1 : 0;
  out.views_a = static_cast<int>(a.exchange->views.size());
  return out;
}

}  // namespace

TEST_CASE("holders on clocks 12,345.9 periods apart meet through the clock offset") {
  const Nanos origin_a = 3'600s + 250ms;  // A's host booted an hour ago, B's ~3.4 h ago
  const Nanos origin_b = 3'600s + 250ms + 12'345s + 900ms;
  const Run with = run(origin_a, origin_b, /*offsets=*/true);
  INFO("A read " << with.views_a << " views, " << with.views_a_with_b << " with b; B "
                 << with.views_b_with_a << " with a; late " << with.late_a << "/" << with.late_b);
  CHECK(with.late_a == 0);
  CHECK(with.late_b == 0);
  // Periods 0..5 of the common clock: the views of periods 2..5 hold both tenants (the
  // view is of period n − 2; periods 0 and 1 see nothing yet).
  CHECK(with.views_a == 6);
  CHECK(with.views_a_with_b == 4);
  CHECK(with.views_b_with_a == 4);

  const Run without = run(origin_a, origin_b, /*offsets=*/false);
  CHECK(without.views_a_with_b == 0);
  CHECK(without.views_b_with_a == 0);
}

TEST_CASE("steady_to_wall_offset is the wall clock minus the steady clock") {
  const Nanos offset = quota::gateway::steady_to_wall_offset();
  const auto wall =
      std::chrono::duration_cast<Nanos>(std::chrono::system_clock::now().time_since_epoch());
  const auto steady =
      std::chrono::duration_cast<Nanos>(std::chrono::steady_clock::now().time_since_epoch());
  // Read just after: the two differ only by the time between the reads.
  CHECK(std::chrono::abs(wall - steady - offset) < 1s);
  CHECK(offset > Nanos{0});  // the wall clock counts from 1970, the steady clock from boot
}
