// Provisional parts for tenants new at a holder (fair/holder_split.hpp, newcomer_parts;
// FairShare::allocate_split with a NewcomerPool): a newcomer's weighted fraction of the
// fixed part, taken from the pool ⌊(capacity − Σ shares) / holders⌋ and then from this
// holder's parts of the view; Σ over holders ≤ budget − reserve in a seeded random
// property test (seed printed); the parts enforced by allocate_split; bad newcomers.
#include <algorithm>
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
using quota::fair::Newcomer;
using quota::fair::newcomer_parts;
using quota::fair::split_shares;

TEST_CASE("newcomer parts: at saturation a newcomer's part is cut from this holder's parts",
          "[fair][newcomer]") {
  // 3 holders of 3,000 (capacity 2,700; fixed part 1,000, F = 900). "old" asks 3,000 here
  // only: share 2,700, no slack. "new" asked 600 here last period: ⌊900 · 1 / 2⌋ = 450 of
  // F, all of it cut from old's part here.
  std::vector<HolderDemand> view{{.tenant = "old", .total = 3'000, .local = 3'000}};
  auto split = split_shares(2'700, 3'000, view);
  REQUIRE(split.ok());
  const std::vector<Newcomer> fresh{{.tenant = "new", .weight = 1, .asked = 600}};
  auto np = newcomer_parts(*split, view, 2'700, 3, 900, fresh);
  REQUIRE(np.ok());
  CHECK(np->parts == std::vector<std::int64_t>{450});
  CHECK(np->view_parts == std::vector<std::int64_t>{2'250});
  CHECK(np->from_pool == 0);
  CHECK(np->from_view == 450);
}

TEST_CASE("newcomer parts: with slack a newcomer's part comes from the pool, nobody cut",
          "[fair][newcomer]") {
  // "a" asks 600 here: share 600 of 2,700, slack 2,100, pool 700 per holder. "b" (weight
  // 2) asked 1,000: ⌊900 · 2 / 3⌋ = 600 ≤ 700.
  std::vector<HolderDemand> view{{.tenant = "a", .total = 600, .local = 600}};
  auto split = split_shares(2'700, 3'000, view);
  REQUIRE(split.ok());
  const std::vector<Newcomer> fresh{{.tenant = "b", .weight = 2, .asked = 1'000}};
  auto np = newcomer_parts(*split, view, 2'700, 3, 900, fresh);
  REQUIRE(np.ok());
  CHECK(np->parts == std::vector<std::int64_t>{600});
  CHECK(np->view_parts == std::vector<std::int64_t>{600});
  CHECK(np->from_pool == 600);
  CHECK(np->from_view == 0);
  // Asking less than its fraction: its asks.
  const std::vector<Newcomer> small{{.tenant = "b", .weight = 2, .asked = 40}};
  CHECK(newcomer_parts(*split, view, 2'700, 3, 900, small)->parts == std::vector<std::int64_t>{40});
  // Nothing to take (no slack, no parts here): nothing given.
  std::vector<HolderDemand> elsewhere{{.tenant = "a", .total = 3'000, .local = 0}};
  auto none = split_shares(2'700, 3'000, elsewhere);
  REQUIRE(none.ok());
  CHECK(newcomer_parts(*none, elsewhere, 2'700, 3, 900, fresh)->parts ==
        std::vector<std::int64_t>{0});
}

TEST_CASE("newcomer parts: bad input is refused, naming it", "[fair][newcomer]") {
  std::vector<HolderDemand> view{{.tenant = "a", .total = 10, .local = 10}};
  auto split = split_shares(9, 10, view);
  REQUIRE(split.ok());
  const std::vector<Newcomer> zero{{.tenant = "z", .weight = 0, .asked = 1}};
  CHECK(newcomer_parts(*split, view, 9, 1, 9, zero).status().message().find("\"z\"") !=
        std::string::npos);
  const std::vector<Newcomer> negative{{.tenant = "n", .weight = 1, .asked = -1}};
  CHECK(!newcomer_parts(*split, view, 9, 1, 9, negative).ok());
  CHECK(!newcomer_parts(*split, view, 9, 0, 9, {}).ok());  // no holders
}

TEST_CASE("newcomer parts, random: Σ over holders ≤ capacity, parts ≤ asks, view parts only cut",
          "[fair][newcomer][property]") {
  const std::uint64_t seed = 0x5eed'22'04;
  std::printf("newcomer parts property seed: %#llx\n", static_cast<unsigned long long>(seed));
  std::mt19937_64 rng(seed);
  int cut_rounds = 0, pool_rounds = 0;
  for (int round = 0; round < 500; ++round) {
    const std::int64_t holders = 1 + static_cast<std::int64_t>(rng() % 5);
    const std::size_t tenants = 1 + rng() % 8;
    const std::int64_t budget = 1 + static_cast<std::int64_t>(rng() % 100'000);
    const std::int64_t capacity = budget - static_cast<std::int64_t>(rng() % (budget / 2 + 1));
    const std::int64_t part = budget / holders;
    const std::int64_t fixed = part - static_cast<std::int64_t>(rng() % (part / 2 + 1));
    // asks[holder][tenant] in the view; weights; each holder's newcomers (tenants with no
    // local asks there, some with asks of the last period).
    std::vector<std::vector<std::int64_t>> asks(holders, std::vector<std::int64_t>(tenants));
    for (auto& h : asks)
      for (auto& a : h) a = rng() % 2 == 0 ? 0 : static_cast<std::int64_t>(rng() % (budget + 1));
    std::vector<std::int64_t> weights(tenants);
    for (auto& w : weights) w = 1 + static_cast<std::int64_t>(rng() % 4);
    std::int64_t all = 0;
    for (std::int64_t h = 0; h < holders; ++h) {
      std::vector<HolderDemand> view;
      for (std::size_t t = 0; t < tenants; ++t) {
        HolderDemand d{.tenant = "t" + std::to_string(t), .weight = weights[t]};
        for (const auto& at : asks) d.total += at[t];
        d.local = asks[h][t];
        view.push_back(d);
      }
      std::vector<Newcomer> fresh;
      for (std::size_t t = 0; t < tenants; ++t) {
        if (asks[h][t] == 0 && rng() % 2 == 0) {
          fresh.push_back({.tenant = view[t].tenant,
                           .weight = weights[t],
                           .asked = static_cast<std::int64_t>(rng() % (budget + 1))});
        }
      }
      auto split = split_shares(capacity, budget, view);
      REQUIRE(split.ok());
      auto np = newcomer_parts(*split, view, capacity, holders, fixed, fresh);
      REQUIRE(np.ok());
      INFO("seed " << seed << " round " << round << " holder " << h);
      std::int64_t here = 0;
      for (std::size_t t = 0; t < tenants; ++t) {
        CHECK(np->view_parts[t] >= 0);
        CHECK(np->view_parts[t] <= split->parts[t]);
        here += np->view_parts[t];
      }
      std::int64_t given = 0;
      for (std::size_t i = 0; i < fresh.size(); ++i) {
        CHECK(np->parts[i] >= 0);
        CHECK(np->parts[i] <= fresh[i].asked);
        CHECK(np->parts[i] <= fixed);
        given += np->parts[i];
      }
      CHECK(np->from_pool <= given);
      CHECK(np->from_view >= given - np->from_pool);
      CHECK(np->from_pool <= (capacity - split->share_sum) / holders);
      cut_rounds += np->from_view > 0 ? 1 : 0;
      pool_rounds += np->from_pool > 0 ? 1 : 0;
      all += here + given;
    }
    INFO("seed " << seed << " round " << round);
    CHECK(all <= capacity);  // Σ over holders of every part, provisional or not
  }
  std::printf("%d holder-rounds cut view parts, %d took from the pool\n", cut_rounds, pool_rounds);
  CHECK(cut_rounds > 50);
  CHECK(pool_rounds > 50);
}

TEST_CASE("allocate_split: a newcomer here is held to its provisional part at once",
          "[fair][newcomer]") {
  FairShare fs(*FairShareConfig{.budget = 3'000}.checked());  // capacity 2,700
  std::vector<HolderDemand> view{{.tenant = "old", .total = 3'000, .local = 3'000}};
  const std::vector<Newcomer> fresh{{.tenant = "new", .weight = 1, .asked = 600}};
  auto a = fs.allocate_split(2'700, view, 3'000, true,
                             {.holders = 3, .fixed_capacity = 900, .tenants = fresh});
  REQUIRE(a.ok());
  CHECK(a->share_sum == 2'700);  // 2,250 + 450: never more than budget − reserve
  CHECK(a->constrained == 2);
  auto d = fs.request("new", 450);
  REQUIRE(d.ok());
  CHECK(d->verdict == FairShareVerdict::kWithinShare);
  d = fs.request("new", 1);
  REQUIRE(d.ok());
  CHECK(d->verdict == FairShareVerdict::kOverShare);
  d = fs.request("old", 2'250);
  REQUIRE(d.ok());
  CHECK(d->verdict == FairShareVerdict::kWithinShare);
  d = fs.request("old", 1);  // past its part, and past budget − reserve
  REQUIRE(d.ok());
  CHECK_FALSE(d->allowed);
  // Without the pool, the newcomer has share 0 and old its whole part.
  FairShare plain(*FairShareConfig{.budget = 3'000}.checked());
  REQUIRE(plain.allocate_split(2'700, view, 3'000, true).ok());
  const auto snap = plain.snapshot();
  REQUIRE(snap.size() == 1);
  CHECK(snap[0].share == 2'700);
}
