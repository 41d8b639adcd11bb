// The regional grant pool's Lua twin (quota/region/pool_script.hpp) against its C++
// reference model (quota/region/pool_model.hpp): the same random operations — claims,
// deposits (some retried, some stale, some expired on arrival, some beyond the bound),
// spends, takes, give-backs, failed refills, the refill lock taken, released and
// expiring — at the same caller times, on the test's redis-server; every reply must be
// equal. Fixed, printed seeds. Then the lock: one holder at a time, held through a failed
// refill's backoff, its state 'r' while a refill is in flight.
#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "quota/region/pool_model.hpp"
#include "quota/region/pool_script.hpp"
#include "support/redis_server.hpp"
#include "support/seed.hpp"

using quota::region::DepositCode;
using quota::region::PoolModel;
using quota::region::PoolReply;
using quota::region::PoolScript;

namespace {

std::string show(const PoolReply& r) {
  return "{code " + std::to_string(r.code) + ", total " + std::to_string(r.total) + ", unused " +
         std::to_string(r.unused) + ", state " + std::string(1, r.state) + ", now " +
         std::to_string(r.now_us) + ", id '" + r.id + "'}";
}

void same(const absl::StatusOr<PoolReply>& lua, const PoolReply& model, const std::string& what) {
  INFO(what);
  REQUIRE(lua.ok());
  INFO("lua " << show(*lua) << " model " << show(model));
  CHECK(*lua == model);
}

}  // namespace

TEST_CASE("the pool's Lua answers every operation as its model does", "[redis][region][pool]") {
  PoolScript pool(quota::testing::redis_pool(2), quota::testing::unique_prefix("pool-diff"));
  const std::uint64_t seed = quota::testing::test_seed(2211);
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  std::mt19937_64 rng(seed);
  std::vector<int> codes(5, 0);  // deposits by DepositCode, and spends allowed / denied
  int allowed = 0, denied = 0;
  std::vector<int> states(128, 0);  // replies by state
  int locked = 0, refused = 0, waited_out = 0;
  for (int key = 0; key < 8; ++key) {
    const std::string k = "{~global}k" + std::to_string(key);
    PoolModel model;
    std::int64_t now = 1'700'000'000'000'000 + key;  // µs
    std::string last_id;
    const int max_grants = 1 + static_cast<int>(rng() % 4);
    for (int step = 0; step < 400; ++step) {
      now += static_cast<std::int64_t>(rng() % 300);
      const std::int64_t units = 1 + static_cast<std::int64_t>(rng() % 40);
      const std::string what = k + " step " + std::to_string(step);
      const std::string token = "p" + std::to_string(rng() % 3);
      switch (rng() % 11) {
        case 0:
        case 1: {
          const std::uint64_t region = 0xe0 + key;
          auto r = pool.claim(k, units % 3 == 0 ? 50 : 20, region, now);
          same(r, model.claim(units % 3 == 0 ? 50 : 20, region, now), what + " claim");
          if (r.ok()) last_id = r->id;
          break;
        }
        case 2:
        case 3: {
          // Mostly the pending id; sometimes one already deposited (a retry) or unknown.
          const std::string id = rng() % 5 == 0 ? "x-" + std::to_string(step) : last_id;
          const std::int64_t expiry =
              rng() % 6 == 0 ? 0 : 200 + static_cast<std::int64_t>(rng() % 2000);
          const PoolReply m = model.deposit(id, expiry, max_grants, now);
          same(pool.deposit(k, id, expiry, max_grants, now), m, what + " deposit " + id);
          ++codes.at(static_cast<std::size_t>(m.code));
          break;
        }
        case 4:
        case 5: {
          const PoolReply m = model.spend(units, now);
          same(pool.spend(k, units, now), m, what + " spend");
          ++(m.code == 1 ? allowed : denied);
        } break;
        case 6:
          same(pool.take(k, units, now), model.take(units, now), what + " take");
          break;
        case 7:
          same(pool.give(k, units % 5 + 1, now), model.give(units % 5 + 1, now), what + " give");
          break;
        case 8: {
          // Lock times around the steps' spacing: some locks expire, some are refused.
          const std::int64_t ttl = 100 + static_cast<std::int64_t>(rng() % 1500);
          const std::int64_t mark = static_cast<std::int64_t>(rng() % 60);
          const PoolReply m = model.lock(token, ttl, mark, now);
          same(pool.lock(k, token, ttl, mark, now), m, what + " lock " + token);
          ++(m.code == 1 ? locked : refused);
          break;
        }
        case 9:
          same(pool.unlock(k, token, now), model.unlock(token, now), what + " unlock " + token);
          break;
        default: {
          const char code = rng() % 2 == 0 ? 'u' : 'd';
          const std::int64_t hold = static_cast<std::int64_t>(rng() % 800);
          same(pool.fail(k, code, token, hold, now), model.fail(code, token, hold, now),
               what + " fail " + token);
          break;
        }
      }
    }
    const PoolReply last = model.read(now);
    same(pool.read(k, now), last, k + " read");
    ++states.at(static_cast<std::size_t>(last.state));
    // Past every lock's end: a refill left marked in flight is not ('r' becomes 'o').
    const PoolReply late = model.read(now + 10'000);
    same(pool.read(k, now + 10'000), late, k + " read after the locks");
    if (last.state == 'r') ++waited_out;
    CHECK(late.state != 'r');
    CHECK(model.grants().size() <= static_cast<std::size_t>(2 * max_grants));
  }
  std::printf(
      "deposits: %d deposited, %d replayed, %d expired, %d full, %d stale; spends: "
      "%d allowed, %d denied; locks: %d taken, %d refused; %d keys left in flight\n",
      codes[0], codes[1], codes[2], codes[3], codes[4], allowed, denied, locked, refused,
      waited_out);
  for (int c : codes) CHECK(c > 0);  // every path was taken
  CHECK(allowed > 0);
  CHECK(denied > 0);
  CHECK(locked > 0);
  CHECK(refused > 0);
}

TEST_CASE("a pool deposit is idempotent by grant id, and an expired one is never spent",
          "[redis][region][pool]") {
  PoolScript pool(quota::testing::redis_pool(2), quota::testing::unique_prefix("pool-once"));
  const std::string k = "{~global}read";
  const std::int64_t t0 = 1'800'000'000'000'000;
  auto id = pool.claim(k, 10, 0xab, t0);
  REQUIRE(id.ok());
  CHECK(id->id == "ab-1");
  auto again = pool.claim(k, 10, 0xab, t0 + 5);  // a lost grant reply: asked again by its id
  REQUIRE(again.ok());
  CHECK(again->id == "ab-1");
  auto d = pool.deposit(k, "ab-1", 1000, 4, t0 + 10);
  REQUIRE(d.ok());
  CHECK(d->code == static_cast<int>(DepositCode::kDeposited));
  CHECK(d->total == 10);
  auto replay = pool.deposit(k, "ab-1", 1000, 4, t0 + 20);  // a lost deposit reply
  REQUIRE(replay.ok());
  CHECK(replay->code == static_cast<int>(DepositCode::kReplayed));
  CHECK(replay->total == 10);
  CHECK(pool.spend(k, 4, t0 + 30)->code == 1);
  // At its expiry (claim time + 1000 µs) the 6 units left are unused, never spent.
  auto late = pool.spend(k, 1, t0 + 1000);
  REQUIRE(late.ok());
  CHECK(late->code == 0);
  CHECK(late->total == 0);
  CHECK(late->unused == 6);
  // A grant expired on arrival is not deposited: counted unused.
  auto id2 = pool.claim(k, 10, 0xab, t0 + 2000);
  REQUIRE(id2.ok());
  CHECK(id2->id == "ab-2");
  auto stale = pool.deposit(k, "ab-2", 500, 4, t0 + 2600);
  REQUIRE(stale.ok());
  CHECK(stale->code == static_cast<int>(DepositCode::kExpired));
  CHECK(stale->unused == 16);
  CHECK(pool.spend(k, 1, t0 + 2600)->code == 0);
}

TEST_CASE(
    "the refill lock has one holder, is kept for a failed refill's backoff, and is taken only when "
    "due",
    "[redis][region][pool]") {
  PoolScript pool(quota::testing::redis_pool(2), quota::testing::unique_prefix("pool-lock"));
  const std::string k = "{~global}read";
  const std::int64_t t0 = 1'900'000'000'000'000;  // µs
  auto a = pool.lock(k, "a", 60'000, 0, t0);
  REQUIRE(a.ok());
  CHECK(a->code == 1);
  CHECK(a->state == 'r');  // a refill in flight
  CHECK(pool.lock(k, "b", 60'000, 0, t0 + 1)->code == 0);
  CHECK(pool.unlock(k, "b", t0 + 2).ok());  // not b's: still a's
  CHECK(pool.lock(k, "b", 60'000, 0, t0 + 3)->code == 0);
  auto failed = pool.fail(k, 'u', "a", 60'000, t0 + 4);
  REQUIRE(failed.ok());
  CHECK(failed->state == 'u');
  CHECK(pool.lock(k, "b", 60'000, 0, t0 + 60'003)->code == 0);  // backing off
  CHECK(pool.lock(k, "b", 60'000, 0, t0 + 60'004)->code == 1);  // the backoff is over
  // Its refiller gone, the lock expires: the refill is no longer in flight.
  CHECK(pool.read(k, t0 + 120'003)->state == 'r');
  CHECK(pool.read(k, t0 + 120'004)->state == 'o');
  // Not due: a pool holding more than the mark is not refilled, lock free or not.
  REQUIRE(pool.claim(k, 10, 0xcd, t0 + 120'005).ok());
  auto got = pool.claim(k, 10, 0xcd, t0 + 120'006);
  REQUIRE(got.ok());
  REQUIRE(pool.deposit(k, got->id, 60'000'000, 4, t0 + 120'007)->code == 0);
  CHECK(pool.lock(k, "c", 60'000, 9, t0 + 120'008)->code == 0);
  CHECK(pool.lock(k, "c", 60'000, 10, t0 + 120'009)->code == 1);
  auto done = pool.unlock(k, "c", t0 + 120'010);
  REQUIRE(done.ok());
  CHECK(done->state == 'o');
  auto bad = pool.read("");  // the empty key is still a key: a read of an empty record
  REQUIRE(bad.ok());
  CHECK(bad->total == 0);
}
