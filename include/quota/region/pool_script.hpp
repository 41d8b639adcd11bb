// quota/region/pool_script.hpp — a region's grant pool in the region's own Redis: the Lua
// twin of PoolModel (pool_model.hpp) and the calls that run it.
//
// One hash per global budget key holds the region's record (`<prefix><key>`, in the key's
// hash slot): "g:<grant id>" = "<units left> <expires µs>", "pending" = "<id> <units>
// <claimed µs>", "lock" = "<token> <until µs>", "seq", "unused", "state". The lock is the
// region's refill lock: at most one refill of the key in flight in the region, held for
// the backoff after a failed one, and taken only while the pool holds no more than the
// caller's mark (in the same step: a refill is never started on a pool just refilled).
// Every operation is one script call, atomic on the server, at the server's TIME (µs, exact
// in Lua doubles) — or at a caller's time, for the differential test only. The record is
// never given a TTL: its sequence names the region's grants, and it stays bounded
// (pool_model.hpp).
//
// Guarantees: each operation answers exactly as PoolModel's (tests/redis/
// redis_region_pool_differential_test.cpp); a reply that is not the twin's is kInternal,
// a record that is not the pool's "QUOTA_CORRUPT" (kDataLoss), never a spend.
// Transport failures are kUnavailable (Script).
//
// Thread safety: any thread (as Script).
//
//   quota::region::PoolScript pool(regional_connections, "pool:");
//   auto id = pool.claim("{~global}read", 100, region_id);
//   auto d = pool.deposit("{~global}read", id->id, 1'000'000, 4);   // 1 s, 4 grants
//   auto s = pool.spend("{~global}read", 1);   // s->code 1: allowed
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "quota/detail/keyed_states.hpp"
#include "quota/redis/transport/script.hpp"
#include "quota/region/pool_model.hpp"

namespace quota::region {

// KEYS[1]: the record. ARGV[1]: operation (c claim, d deposit,
// s spend, t take, g give, f fail, l lock, u unlock, r read); ARGV[2]: the caller's time
// (µs) or "" for the server's TIME; ARGV[3..]: the operation's. Reply {code, total,
// unused, state, now µs[, id]} (PoolReply).
inline constexpr const char* kPoolBodyLua = R"lua(
local op, h = ARGV[1], KEYS[1]
local now
if ARGV[2] ~= '' then now = ARGV[2] + 0 else
  local t = redis.call('TIME')
  now = (t[1] + 0) * 1000000 + (t[2] + 0)
end
local all = redis.call('HGETALL', h)
local grants, pending, lock, state, unused = {}, nil, nil, 'o', 0
for i = 1, #all, 2 do
  local f, v = all[i], all[i + 1]
  if string.sub(f, 1, 2) == 'g:' then
    local left, exp = string.match(v, '^(%d+) (%d+)$')
    if not left then return redis.error_reply('QUOTA_CORRUPT pool grant ' .. f) end
    grants[#grants + 1] = {string.sub(f, 3), left + 0, exp + 0}
  elseif f == 'pending' then
    local id, u, c = string.match(v, '^(%S+) (%d+) (%d+)$')
    if not id then return redis.error_reply('QUOTA_CORRUPT pool pending') end
    pending = {id, u + 0, c + 0}
  elseif f == 'lock' then
    local tok, untl = string.match(v, '^(%S+) (%d+)$')
    if not tok then return redis.error_reply('QUOTA_CORRUPT pool lock') end
    lock = {tok, untl + 0}
  elseif f == 'state' then state = v
  elseif f == 'unused' then unused = v + 0
  end
end
local function put(g)
  redis.call('HSET', h, 'g:' .. g[1], string.format('%.0f %.0f', g[2], g[3]))
end
local function add_unused(u)
  unused = unused + u
  redis.call('HSET', h, 'unused', string.format('%.0f', unused))
end
local function set_state(c)
  state = c
  redis.call('HSET', h, 'state', c)
end
local function put_lock()
  redis.call('HSET', h, 'lock', string.format('%s %.0f', lock[1], lock[2]))
end
-- The lock goes; a refill still marked in flight is not.
local function release()
  lock = nil
  redis.call('HDEL', h, 'lock')
  if state == 'r' then set_state('o') end
end
-- Expired grants go; what they held is unused, never spent.
local live = {}
for _, g in ipairs(grants) do
  if g[3] <= now then
    redis.call('HDEL', h, 'g:' .. g[1])
    if g[2] > 0 then add_unused(g[2]) end
  else live[#live + 1] = g end
end
if lock and lock[2] <= now then release() end
table.sort(live, function(a, b)
  if a[3] ~= b[3] then return a[3] < b[3] end
  return a[1] < b[1]
end)
local function total()
  local t = 0
  for _, g in ipairs(live) do t = t + g[2] end
  return t
end
local function holding()
  local n = 0
  for _, g in ipairs(live) do if g[2] > 0 then n = n + 1 end end
  return n
end
local function deduct(units)
  for _, g in ipairs(live) do
    if units == 0 then break end
    local t = math.min(g[2], units)
    if t > 0 then g[2] = g[2] - t; units = units - t; put(g) end
  end
end
local function reply(code, id)
  local out = {code, total(), unused, state, now}
  if id then out[6] = id end
  return out
end
if op == 's' then
  local units = ARGV[3] + 0
  if total() < units then return reply(0) end
  deduct(units)
  return reply(1)
elseif op == 't' then
  local taken = math.min(ARGV[3] + 0, total())
  deduct(taken)
  return reply(taken)
elseif op == 'g' then
  local g = live[#live]
  if g then g[2] = g[2] + ARGV[3]; put(g) else add_unused(ARGV[3] + 0) end
  return reply(1)
elseif op == 'c' then
  local units = ARGV[3] + 0
  if not pending or pending[2] ~= units then
    local seq = redis.call('HINCRBY', h, 'seq', 1)
    pending = {ARGV[4] .. '-' .. seq, units, now}
    redis.call('HSET', h, 'pending', string.format('%s %.0f %.0f', pending[1], units, now))
  end
  return reply(0, pending[1])
elseif op == 'd' then
  local id, max = ARGV[3], ARGV[5] + 0
  for _, g in ipairs(live) do
    if g[1] == id then
      set_state('o')
      return reply(1)
    end
  end
  if not pending or pending[1] ~= id then return reply(4) end
  redis.call('HDEL', h, 'pending')
  local exp, code = pending[3] + ARGV[4], 0
  if exp <= now then code = 2; add_unused(pending[2])
  elseif holding() >= max then code = 3; add_unused(pending[2])
  else
    local g = {id, pending[2], exp}
    put(g)
    live[#live + 1] = g
    table.sort(live, function(a, b)
      if a[3] ~= b[3] then return a[3] < b[3] end
      return a[1] < b[1]
    end)
    set_state('o')
  end
  local spent = #live - holding()
  for _, g in ipairs(live) do
    if spent <= max then break end
    if g[2] == 0 then redis.call('HDEL', h, 'g:' .. g[1]); g[2] = -1; spent = spent - 1 end
  end
  local kept = {}
  for _, g in ipairs(live) do if g[2] >= 0 then kept[#kept + 1] = g end end
  live = kept
  return reply(code)
elseif op == 'f' then
  set_state(ARGV[3])
  if state == 'd' then redis.call('HDEL', h, 'pending') end
  if lock and lock[1] == ARGV[4] then lock[2] = now + ARGV[5]; put_lock() end
  return reply(0)
elseif op == 'l' then
  if lock or total() > ARGV[5] + 0 then return reply(0) end
  lock = {ARGV[3], now + ARGV[4]}
  put_lock()
  set_state('r')
  return reply(1)
elseif op == 'u' then
  if lock and lock[1] == ARGV[3] then release() end
  return reply(1)
elseif op == 'r' then
  return reply(holding())
end
return redis.error_reply('QUOTA_POOL unknown operation ' .. tostring(op))
)lua";

// The pool's script. It shares no arithmetic with the budget twins (twin/common.hpp):
// whole units and microseconds, sums and comparisons only, all exact in Lua doubles.
inline std::string pool_lua() { return kPoolBodyLua; }

class PoolScript {
 public:
  // `regional`: connections to the region's Redis; must outlive nothing (shared).
  PoolScript(std::shared_ptr<redis::ConnectionPool> regional, std::string prefix)
      : prefix_(std::move(prefix)), script_(pool_lua(), std::move(regional), nullptr) {}

  // Operations of pool_model.hpp at the server's TIME (`at_us` >= 0: at that time).
  absl::StatusOr<PoolReply> claim(std::string_view key, std::int64_t units, std::uint64_t region,
                                  std::int64_t at_us = -1) {
    return call(key, "c", at_us, {absl::StrCat(units), absl::StrCat(absl::Hex(region))});
  }
  absl::StatusOr<PoolReply> deposit(std::string_view key, std::string_view id,
                                    std::int64_t expiry_us, int max_grants,
                                    std::int64_t at_us = -1) {
    return call(key, "d", at_us,
                {std::string(id), absl::StrCat(expiry_us), absl::StrCat(max_grants)});
  }
  absl::StatusOr<PoolReply> spend(std::string_view key, std::int64_t units,
                                  std::int64_t at_us = -1) {
    return call(key, "s", at_us, {absl::StrCat(units)});
  }
  absl::StatusOr<PoolReply> take(std::string_view key, std::int64_t units,
                                 std::int64_t at_us = -1) {
    return call(key, "t", at_us, {absl::StrCat(units)});
  }
  absl::StatusOr<PoolReply> give(std::string_view key, std::int64_t units,
                                 std::int64_t at_us = -1) {
    return call(key, "g", at_us, {absl::StrCat(units)});
  }
  // A failed refill's outcome; the lock, when still `token`'s, is held `hold_us` from now.
  absl::StatusOr<PoolReply> fail(std::string_view key, char code, std::string_view token,
                                 std::int64_t hold_us, std::int64_t at_us = -1) {
    return call(key, "f", at_us, {std::string(1, code), std::string(token), absl::StrCat(hold_us)});
  }
  // code 1: the refill lock is `token`'s for `ttl_us` (state 'r'); 0: held by another (or a
  // backoff), or the pool holds more than `at_most` (a refill is not due: same step).
  absl::StatusOr<PoolReply> lock(std::string_view key, std::string_view token, std::int64_t ttl_us,
                                 std::int64_t at_most, std::int64_t at_us = -1) {
    return call(key, "l", at_us, {std::string(token), absl::StrCat(ttl_us), absl::StrCat(at_most)});
  }
  absl::StatusOr<PoolReply> unlock(std::string_view key, std::string_view token,
                                   std::int64_t at_us = -1) {
    return call(key, "u", at_us, {std::string(token)});
  }
  // code: the grants that hold units.
  absl::StatusOr<PoolReply> read(std::string_view key, std::int64_t at_us = -1) {
    return call(key, "r", at_us, {});
  }

 private:
  absl::StatusOr<PoolReply> call(std::string_view key, const char* op, std::int64_t at_us,
                                 std::vector<std::string> rest) {
    const std::string record = absl::StrCat(prefix_, quota::detail::to_absl(key));
    std::vector<std::string> args{op, at_us >= 0 ? absl::StrCat(at_us) : std::string()};
    for (std::string& a : rest) args.push_back(std::move(a));
    auto reply = script_.run({record}, args);
    if (!reply.ok()) return reply.status();
    const redisReply& r = **reply;
    if (r.type == REDIS_REPLY_ERROR) {
      const std::string_view text(r.str, r.len);
      if (text.starts_with("QUOTA_CORRUPT"))
        return absl::DataLossError(quota::detail::to_absl(text));
      return absl::InternalError(absl::StrCat("pool: ", quota::detail::to_absl(text)));
    }
    const auto integer = [&](std::size_t i, std::int64_t& out) {
      return r.element[i]->type == REDIS_REPLY_INTEGER && ((out = r.element[i]->integer), true);
    };
    PoolReply out;
    if (r.type != REDIS_REPLY_ARRAY || r.elements < 5 || !integer(0, out.code) ||
        !integer(1, out.total) || !integer(2, out.unused) ||
        r.element[3]->type != REDIS_REPLY_STRING || r.element[3]->len != 1 ||
        !integer(4, out.now_us)) {
      return absl::InternalError("pool: malformed reply");
    }
    out.state = r.element[3]->str[0];
    if (r.elements > 5) {
      if (r.element[5]->type != REDIS_REPLY_STRING) return absl::InternalError("pool: no id");
      out.id.assign(r.element[5]->str, r.element[5]->len);
    }
    return out;
  }

  std::string prefix_;
  redis::Script script_;
};

}  // namespace quota::region
