// quota/region/pool_model.hpp — the reference model of a region's grant pool: what the
// pool's Lua (pool_script.hpp) does to its record, in C++.
//
// A region's pool of one global budget key holds the unspent units of the regional grants
// the region took from the central authority, each with its expiry, shared by every
// gateway process of the region (regional_pool.hpp). `PoolModel` is the arithmetic of that
// record; the Lua twin keeps the same record in a Redis hash and must answer every
// operation exactly as the model does (tests/redis/redis_region_pool_differential_test.cpp
// runs both on the same random operations, fixed seed). Times are microseconds (the
// server's TIME in the twin: exact in Lua doubles).
//
// Operations (each one atomic step in the twin):
//   - claim(units, region): the id of the next grant: the pending one when it is for the
//     same units (a grant whose reply was lost is asked again with its id), else
//     "<region hex>-<n>" with n from the record's sequence; the claim time is kept.
//   - deposit(id, expiry, max_grants): the pending grant enters the pool with expiry =
//     claim time + expiry (never later than the central record's). Idempotent by id: a
//     grant already in the pool is `kReplayed`, an id not pending `kStale`. A grant
//     expired on arrival, or arriving while `max_grants` grants still hold units, is not
//     added: its units are counted unused.
//   - spend(units): all or nothing from the live grants, earliest expiry first. Grants
//     expired by now are dropped first and what they held is counted unused: expired
//     units are never spent.
//   - give(units): back to the live grant that expires last (none live: counted unused).
//   - take(units): at most `units` (a charge: never denied).
//   - lock(token, ttl, at_most): the region's refill lock, taken only while no live lock
//     is held and the pool holds no more than `at_most` (a refill is due); held until
//     now + ttl. Taking it sets the state 'r' (a refill in flight).
//   - unlock(token): releases the lock when it is `token`'s; a state 'r' becomes 'o'.
//   - fail(code, token, hold): the outcome of a failed refill ('u' unavailable keeps the
//     pending id for its retry; 'd' denied drops it); the lock, when still `token`'s, is
//     held until now + hold (the backoff). A deposit sets 'o'. A lock that expires with
//     the state 'r' (its refiller gone) leaves the state 'o'.
// The record stays bounded: live grants <= max_grants; spent grants are kept (as the ids
// a retried deposit replays) until they expire, at most max_grants of them.
//
// Thread safety: none (a value type; the twin's atomicity is the server's).
//
//   quota::region::PoolModel m;
//   auto id = m.claim(100, 0xeu, now);        // id.id == "e-1"
//   m.deposit(id.id, 1'000'000, 4, now);      // 100 units for 1 s
//   auto r = m.spend(3, now);                 // r.code 1, r.total 97
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "quota/lease/holder.hpp"

namespace quota::region {

// Reply codes of deposit.
enum class DepositCode : int { kDeposited = 0, kReplayed = 1, kExpired = 2, kFull = 3, kStale = 4 };

// The reply every operation gives: code (spend: 1 allowed / 0 denied; take: units taken;
// deposit: a DepositCode; lock: 1 taken / 0 not), units held by live grants, units
// counted unused, the state ('o' last refill deposited, 'r' a refill in flight, 'u' the
// last one unavailable, 'd' the last one denied), the time, and claim's id.
struct PoolReply {
  std::int64_t code = 0;
  std::int64_t total = 0;
  std::int64_t unused = 0;
  char state = 'o';
  std::int64_t now_us = 0;
  std::string id{};
  friend bool operator==(const PoolReply&, const PoolReply&) = default;
};

class PoolModel {
 public:
  struct Grant {
    std::string id;
    std::int64_t left = 0;
    std::int64_t expires_us = 0;
  };

  PoolReply claim(std::int64_t units, std::uint64_t region, std::int64_t now) {
    purge(now);
    if (!pending_ || pending_->units != units) {
      pending_ = Pending{grant_id(region, ++seq_), units, now};
    }
    PoolReply r = reply(0, now);
    r.id = pending_->id;
    return r;
  }

  PoolReply deposit(const std::string& id, std::int64_t expiry_us, int max_grants,
                    std::int64_t now) {
    purge(now);
    for (const Grant& g : grants_) {
      if (g.id == id) {
        state_ = 'o';
        return reply(static_cast<int>(DepositCode::kReplayed), now);
      }
    }
    if (!pending_ || pending_->id != id) return reply(static_cast<int>(DepositCode::kStale), now);
    const Pending p = *pending_;
    pending_.reset();
    const std::int64_t expires = p.claimed_us + expiry_us;
    DepositCode code = DepositCode::kDeposited;
    if (expires <= now) {
      code = DepositCode::kExpired;
      unused_ += p.units;
    } else if (holding() >= max_grants) {
      code = DepositCode::kFull;
      unused_ += p.units;
    } else {
      grants_.push_back({id, p.units, expires});
      sort();
      state_ = 'o';
    }
    trim(max_grants);
    return reply(static_cast<int>(code), now);
  }

  PoolReply spend(std::int64_t units, std::int64_t now) {
    purge(now);
    if (total() < units) return reply(0, now);
    deduct(units);
    return reply(1, now);
  }

  PoolReply take(std::int64_t units, std::int64_t now) {
    purge(now);
    const std::int64_t taken = std::min(units, total());
    deduct(taken);
    return reply(taken, now);
  }

  PoolReply give(std::int64_t units, std::int64_t now) {
    purge(now);
    if (grants_.empty()) {
      unused_ += units;
    } else {
      grants_.back().left += units;
    }
    return reply(1, now);
  }

  PoolReply fail(char code, const std::string& token, std::int64_t hold_us, std::int64_t now) {
    purge(now);
    state_ = code;
    if (code == 'd') pending_.reset();
    if (lock_ && lock_->token == token) lock_->until_us = now + hold_us;
    return reply(0, now);
  }

  PoolReply lock(const std::string& token, std::int64_t ttl_us, std::int64_t at_most,
                 std::int64_t now) {
    purge(now);
    if (lock_ || total() > at_most) return reply(0, now);
    lock_ = Lock{token, now + ttl_us};
    state_ = 'r';
    return reply(1, now);
  }

  PoolReply unlock(const std::string& token, std::int64_t now) {
    purge(now);
    if (lock_ && lock_->token == token) release();
    return reply(1, now);
  }

  PoolReply read(std::int64_t now) {
    purge(now);
    return reply(holding(), now);
  }

  const std::vector<Grant>& grants() const { return grants_; }

 private:
  struct Pending {
    std::string id;
    std::int64_t units = 0;
    std::int64_t claimed_us = 0;
  };
  struct Lock {
    std::string token;
    std::int64_t until_us = 0;
  };

  std::int64_t total() const {
    std::int64_t t = 0;
    for (const Grant& g : grants_) t += g.left;
    return t;
  }
  int holding() const {
    return static_cast<int>(
        std::count_if(grants_.begin(), grants_.end(), [](const Grant& g) { return g.left > 0; }));
  }
  void sort() {
    std::sort(grants_.begin(), grants_.end(), [](const Grant& a, const Grant& b) {
      return a.expires_us != b.expires_us ? a.expires_us < b.expires_us : a.id < b.id;
    });
  }
  void purge(std::int64_t now) {
    std::erase_if(grants_, [&](const Grant& g) {
      if (g.expires_us > now) return false;
      unused_ += g.left;
      return true;
    });
    if (lock_ && lock_->until_us <= now) release();
  }
  void release() {
    lock_.reset();
    if (state_ == 'r') state_ = 'o';
  }
  void deduct(std::int64_t units) {
    for (Grant& g : grants_) {
      const std::int64_t t = std::min(g.left, units);
      g.left -= t;
      units -= t;
    }
  }
  // Spent grants beyond max_grants go, earliest expiry first.
  void trim(int max_grants) {
    int spent = static_cast<int>(grants_.size()) - holding();
    for (auto it = grants_.begin(); it != grants_.end() && spent > max_grants;) {
      if (it->left == 0) {
        it = grants_.erase(it);
        --spent;
      } else {
        ++it;
      }
    }
  }
  PoolReply reply(std::int64_t code, std::int64_t now) const {
    return {.code = code, .total = total(), .unused = unused_, .state = state_, .now_us = now};
  }

  std::vector<Grant> grants_;  // live (not expired as of the last operation), sorted
  std::optional<Pending> pending_;
  std::optional<Lock> lock_;
  std::int64_t seq_ = 0;
  std::int64_t unused_ = 0;
  char state_ = 'o';
};

}  // namespace quota::region
