// The shares of a budget computed over every holder and split where the demand is
// (fair/holder_split.hpp, FairShare::allocate_split): Σ over holders ≤ each share, Σ
// over tenants ≤ budget − reserve, a lone tenant at one holder gets its whole share
// there, a seeded random property test (seed printed), and what allocate_split enforces.
#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "quota/fair/fair_share.hpp"
#include "quota/fair/holder_split.hpp"

using quota::fair::FairShare;
using quota::fair::FairShareConfig;
using quota::fair::FairShareVerdict;
using quota::fair::HolderDemand;
using quota::fair::split_shares;

namespace {

// The view of holder `h` of asks[holder][tenant] (tenants named t00, t01, ...).
std::vector<HolderDemand> view_of(const std::vector<std::vector<std::int64_t>>& asks,
                                  std::size_t h) {
  std::vector<HolderDemand> v;
  for (std::size_t t = 0; t < asks[0].size(); ++t) {
    HolderDemand d{.tenant = (t < 10 ? "t0" : "t") + std::to_string(t)};
    for (const auto& holder : asks) d.total += holder[t];
    d.local = asks[h][t];
    v.push_back(d);
  }
  return v;
}

}  // namespace

TEST_CASE("holder split: the banner's example", "[fair][split]") {
  std::vector<HolderDemand> view{{.tenant = "a", .total = 900, .local = 300},
                                 {.tenant = "b", .total = 100, .local = 0}};
  auto s = split_shares(600, 1'000, view);
  REQUIRE(s.ok());
  CHECK(s->shares == std::vector<std::int64_t>{500, 100});
  CHECK(s->parts == std::vector<std::int64_t>{166, 0});
}

TEST_CASE("holder split: a lone tenant at one holder gets its whole share there", "[fair][split]") {
  // 3 holders; only holder 1 sees "solo", which asks more than the capacity.
  const std::vector<std::vector<std::int64_t>> asks{{0}, {5'000}, {0}};
  std::int64_t sum = 0;
  for (std::size_t h = 0; h < 3; ++h) {
    auto s = split_shares(2'700, 3'000, view_of(asks, h));
    REQUIRE(s.ok());
    CHECK(s->shares[0] == 2'700);
    CHECK(s->parts[0] == (h == 1 ? 2'700 : 0));
    sum += s->parts[0];
  }
  CHECK(sum == 2'700);
}

TEST_CASE("holder split: bad views are refused, naming the tenant", "[fair][split]") {
  std::vector<HolderDemand> unsorted{{.tenant = "b", .total = 1}, {.tenant = "a", .total = 1}};
  CHECK(split_shares(10, 10, unsorted).status().message().find("\"a\"") != std::string::npos);
  std::vector<HolderDemand> over{{.tenant = "a", .total = 1, .local = 2}};
  CHECK(split_shares(10, 10, over).status().message().find("\"a\"") != std::string::npos);
  std::vector<HolderDemand> negative{{.tenant = "a", .total = -1, .local = -1}};
  CHECK(!split_shares(10, 10, negative).ok());
}

TEST_CASE("holder split, random: Σ over holders ≤ share, Σ ≤ capacity, same shares everywhere",
          "[fair][split][property]") {
  const std::uint64_t seed = 0x5eed'22'03;
  std::printf("holder split property seed: %#llx\n", static_cast<unsigned long long>(seed));
  std::mt19937_64 rng(seed);
  for (int round = 0; round < 500; ++round) {
    const std::size_t holders = 1 + rng() % 5, tenants = 1 + rng() % 12;
    const std::int64_t budget = 1 + static_cast<std::int64_t>(rng() % 100'000);
    const std::int64_t capacity = budget - static_cast<std::int64_t>(rng() % (budget / 2 + 1));
    std::vector<std::vector<std::int64_t>> asks(holders, std::vector<std::int64_t>(tenants));
    for (auto& h : asks)
      for (auto& a : h) a = rng() % 3 == 0 ? 0 : static_cast<std::int64_t>(rng() % (budget + 1));
    std::vector<std::int64_t> per_tenant(tenants, 0);
    std::vector<std::int64_t> first_shares;
    std::int64_t all = 0;
    for (std::size_t h = 0; h < holders; ++h) {
      auto s = split_shares(capacity, budget, view_of(asks, h));
      REQUIRE(s.ok());
      if (h == 0) first_shares = s->shares;
      INFO("seed " << seed << " round " << round << " holder " << h);
      CHECK(s->shares == first_shares);
      CHECK(s->share_sum <= capacity);
      for (std::size_t t = 0; t < tenants; ++t) {
        CHECK(s->parts[t] <= s->shares[t]);
        per_tenant[t] += s->parts[t];
      }
      all += s->part_sum;
    }
    INFO("seed " << seed << " round " << round);
    for (std::size_t t = 0; t < tenants; ++t) CHECK(per_tenant[t] <= first_shares[t]);
    CHECK(all <= capacity);
    // A tenant asked for at one holder only gets its whole share there.
    for (std::size_t t = 0; t < tenants; ++t) {
      std::size_t n = 0;
      for (std::size_t h = 0; h < holders; ++h) n += asks[h][t] > 0 ? 1 : 0;
      if (n == 1) CHECK(per_tenant[t] == first_shares[t]);
    }
  }
}

TEST_CASE("allocate_split: a tenant here is held to its part of the share over all holders",
          "[fair][split]") {
  FairShare fs(*FairShareConfig{.budget = 1'000}.checked());  // capacity 900
  // Everywhere: a asks 900 (600 here), b asks 900 (none here): shares 450 / 450; a's part
  // here ⌊450 · 600 / 900⌋ = 300.
  std::vector<HolderDemand> view{{.tenant = "a", .total = 900, .local = 600},
                                 {.tenant = "b", .total = 900, .local = 0}};
  auto a = fs.allocate_split(900, view, 1'000, true);
  REQUIRE(a.ok());
  CHECK(a->share_sum == 300);
  CHECK(a->demand_sum == 1'800);  // Σ of the totals everywhere
  std::int64_t admitted = 0;
  for (int i = 0; i < 10; ++i) {
    auto d = fs.request("a", 50);
    REQUIRE(d.ok());
    if (d->allowed) admitted += 50;
  }
  CHECK(admitted == 300);  // not alone: b is active elsewhere
  CHECK(fs.asked() == std::vector<std::pair<std::string, std::int64_t>>{{"a", 500}});
}

TEST_CASE("allocate_split: alone here and in the view, a tenant may use the whole budget",
          "[fair][split]") {
  FairShare fs(*FairShareConfig{.budget = 1'000}.checked());
  std::vector<HolderDemand> view{{.tenant = "solo", .total = 2'000, .local = 2'000}};
  REQUIRE(fs.allocate_split(900, view, 1'000, true).ok());
  std::int64_t admitted = 0;
  for (int i = 0; i < 30; ++i) {
    auto d = fs.request("solo", 50);
    REQUIRE(d.ok());
    if (d->allowed) admitted += 50;
  }
  CHECK(admitted == 1'000);
  // The fallback: alone, capped at the fixed part; no free regime.
  FairShare part(*FairShareConfig{.budget = 1'000}.checked());
  std::vector<HolderDemand> own{{.tenant = "solo", .total = 500, .local = 500}};
  REQUIRE(part.allocate_split(300, own, 333, false).ok());
  admitted = 0;
  for (int i = 0; i < 30; ++i) {
    auto d = part.request("solo", 50);
    REQUIRE(d.ok());
    if (d->allowed) admitted += 50;
  }
  CHECK(admitted == 300);
}
