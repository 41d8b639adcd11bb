// quota/redis/gateway_lua.hpp — the Lua twin of the gateway's KeyState (key_state.hpp).
//
// One script, three operations, each atomic on the server over the keys of ONE tenant
// (one hash slot), bit-identical to the C++ functions of quota/gateway/key_state.hpp
// (tests/redis/redis_gateway_test.cpp compares them on random operation sequences):
//
//   'd' decide  KeyPolicy::apply on each level in order — convert a state written under
//               other parameters (migrate: refill with the old ones up to now, clamp to
//               the new capacity; a state of a NEWER version is kept), pay debt, apply —
//               stopping at the first level that denies and is not shadow. All or
//               nothing: on such a denial the levels allowed before it are written
//               WITHOUT their deduction (exactly what the in-process give-back leaves).
//   'r' refund  gateway::refund on each key (give-back or a settle's surplus).
//   'c' charge  gateway::charge on each key (a settle's deficit).
//
// Time is microseconds on the server's clock (TIME), or the caller's in a test mode; the
// C++ side keeps nanoseconds, and every duration returned is exact nanoseconds, so with
// times that are whole microseconds both sides decide identically.
//
// Exactness (Lua numbers are doubles, exact below 2^53). The C++ side
// (GatewayStore::check) admits only rules that keep every value below 2^53: capacity
// (burst or limit) at most 2·10^9 units, so micro-units with debt and refunds stay below
// 6·10^15; a token bucket's rate m/p micro-units per ns (reduced by g) with
// (m+2)(p+1) <= 2^53 and a time to fill of at most 4·10^15 ns (~46 days), so a refill
// from the deepest debt (2 fills) is formed exactly; a window of whole microseconds, at
// most 4·10^15 ns. Refill and time-to-reach are split as in token_bucket_lua.hpp.
//
// State: one string of 13 struct-packed doubles (104 bytes) per key: version, kind
// (1 token bucket, 2 fixed window), the parameters that wrote it (units|limit,
// per|window ns, burst|0, m|window µs, p, g, fill ns), the policy state (tokens|count,
// carry over rate.per, last µs) and debt (micro-units). TTL: the key's idle time (when
// its state equals a fresh one) plus a margin; none while it holds debt, or for a rate-0
// bucket that is not full (a one-off budget must not come back).
//
// KEYS[1..n]       the keys (one hash slot)
// ARGV[1]          time in µs, or '' for the server's TIME
// ARGV[2]          op: 'd', 'r' or 'c'
// ARGV[3]          TTL margin, ms (>= 1)
// ARGV[4]          n
// ARGV[5]          the caller's rule-set version
// ARGV[6]          units: the cost ('d'), units to give back ('r') or to charge ('c')
// ARGV[7]          'r': the time the units were spent, µs; '' = the key's own latest time
// ARGV[8+9(i-1)..] per key, the caller's policy: kind, units|limit, per|window ns,
//                  burst|0, m|window µs, p|0, g|0, fill|0, shadow (1/0)
// Reply 'd':       {time µs, levels decided, then per level decided: allowed, reason,
//                   remaining, retry_after ns (-1 never), reset_after ns (-1 never),
//                   version used}
// Reply 'r', 'c':  {time µs, then per key: micro-units given back | left as debt}
// Errors:          "QUOTA_CORRUPT ..." (a key's value is not a gateway state of ours).
#pragma once

#include <string>

#include "quota/redis/lua_common.hpp"

namespace quota::redis {

inline constexpr const char* kGatewayLuaBody = R"lua(
local M6 = 1000000
-- C++ '/' (toward zero) for b > 0
local function tdiv(a, b)
  if a >= 0 then return (idiv(a, b)) end
  return -(idiv(-a, b))
end
-- A level L: 1 version, 2 kind, 3 units|limit, 4 per|window, 5 burst|0, 6 m|wu, 7 p,
-- 8 g, 9 fill, 10 tokens|count, 11 carry over p (reduced), 12 last µs, 13 debt, 14 cap.
local function capacity(L)
  if L[2] == 1 then return L[5] end
  return L[3]
end
local function tb_reach(L, need)
  return reach(L[10], L[11], need, L[6], L[7])
end
local function tb_refill(L, t)
  if t <= L[12] then return end
  local dt = t - L[12]
  L[12] = t
  local cap, tokens, m, p = L[14], L[10], L[6], L[7]
  if tokens >= cap or m == 0 then return end
  if dt > idiv(2 * L[9], 1000) then L[10] = cap; L[11] = 0; return end
  local q, r = idiv(dt * 1000, p)
  local w, c2 = idiv(m * r + L[11], p)
  local whole = m * q + w
  if whole >= cap - tokens then L[10] = cap; L[11] = 0 else L[10] = tokens + whole; L[11] = c2 end
end
local function fw_next(L)
  local wu = L[6]
  return ((idiv(L[12], wu) + 1) * wu - L[12]) * 1000
end
local function fw_advance(L, t)
  if t <= L[12] then return end
  local wu = L[6]
  if idiv(t, wu) ~= idiv(L[12], wu) then L[10] = 0 end
  L[12] = t
end
local function observe(L, t)
  if L[2] == 1 then tb_refill(L, t); return L[10] end
  fw_advance(L, t)
  return (L[3] - L[10]) * M6
end
local function pay_debt(L)
  local debt = L[13]
  if debt <= 0 then return end
  if L[2] == 1 then
    local pay = math.min(math.max(L[10], 0), debt)
    L[10] = L[10] - pay; L[13] = debt - pay
    return
  end
  local pay = math.min(L[3] - L[10], idiv(debt + M6 - 1, M6))
  L[10] = L[10] + pay
  L[13] = math.max(0, debt - pay * M6)
end
-- Sets L's parameters from the caller's (ARGV from o) and its state to hold `remaining`
-- micro-units at time t.
local function with_remaining(L, o, t, remaining)
  for k = 2, 9 do L[k] = (ARGV[o + k - 2] + 0) end
  if L[2] == 1 then
    local cap = L[5] * M6
    L[14] = cap
    L[10] = math.max(-cap, math.min(remaining, cap)); L[11] = 0
  else
    L[14] = L[3] * M6
    L[10] = L[3] - math.max(0, math.min(idiv(remaining, M6), L[3])); L[11] = 0
  end
  L[12] = t
end
local function same_params(L, o)
  return L[2] == (ARGV[o] + 0) and L[3] == (ARGV[o + 1] + 0) and
    L[4] == (ARGV[o + 2] + 0) and L[5] == (ARGV[o + 3] + 0)
end
local function corrupt(key, why)
  return redis.error_reply('QUOTA_CORRUPT key ' .. key .. ' is not a quota gateway state: ' .. why)
end
-- Reads key i: the stored level, or a fresh one under the caller's parameters.
local function load(i, o, version, t)
  local key = KEYS[i]
  local raw = redis.pcall('GET', key)
  if type(raw) == 'table' then return nil, corrupt(key, 'wrong type') end
  local L = {}
  if not raw then
    L[1] = version; L[13] = 0
    with_remaining(L, o, t, 0)
    if L[2] == 1 then L[10] = L[14] else L[10] = 0 end
    return L
  end
  if #raw ~= 104 then return nil, corrupt(key, #raw .. ' bytes, expected 104') end
  local v = {struct.unpack('<ddddddddddddd', raw)}
  for k = 1, 13 do
    if not int_in(v[k], -9007199254740991, 9007199254740991) then
      return nil, corrupt(key, 'field ' .. k .. ' is not an exact integer')
    end
    L[k] = v[k]
  end
  local ok
  if L[2] == 1 then
    L[14] = L[5] * M6
    ok = L[5] >= 1 and L[6] >= 0 and L[7] >= 1 and L[8] >= 1 and L[10] >= -L[14] and
      L[10] <= L[14] and L[11] >= 0 and L[11] < L[4]
    L[11] = idiv(L[11], L[8])
  else
    L[14] = L[3] * M6
    ok = L[2] == 2 and L[3] >= 1 and L[6] >= 1 and L[10] >= 0 and L[10] <= L[3]
  end
  if not ok or L[13] < 0 or L[13] > L[14] then return nil, corrupt(key, 'field out of range') end
  return L
end
local function migrate(L, o, version, t)
  if L[1] > version then return end
  if same_params(L, o) then L[1] = version; return end
  local tt = math.max(t, L[12])
  local remaining = observe(L, tt)
  if remaining < 0 and (ARGV[o] + 0) == 2 then L[13] = L[13] - remaining end
  with_remaining(L, o, tt, remaining)
  L[1] = version
  L[13] = math.min(L[13], L[14])
end
local function store(key, L, t, margin)
  local carry = L[11]
  if L[2] == 1 then carry = carry * L[8] end
  local v = struct.pack('<ddddddddddddd', L[1], L[2], L[3], L[4], L[5], L[6], L[7], L[8], L[9],
    L[10], carry, L[12], L[13])
  -- Time from t until the state equals a fresh one, ns (L[12] >= t here); nil: never.
  local d = nil
  if L[13] <= 0 then
    if L[2] == 1 then
      local r = tb_reach(L, L[14])
      if r >= 0 then d = (L[12] - t) * 1000 + r end
    elseif L[10] == 0 then
      d = (L[12] - t) * 1000
    else
      d = (L[12] - t) * 1000 + fw_next(L)
    end
  end
  if d == nil then
    redis.call('SET', key, v)
  else
    redis.call('SET', key, v, 'PX', idiv(d + 999999, M6) + margin)
  end
end

local t
if ARGV[1] == '' then
  local now = redis.call('TIME')
  t = (now[1] + 0) * M6 + (now[2] + 0)
else
  t = ARGV[1] + 0
end
local op = ARGV[2]
local margin = ARGV[3] + 0
local n = ARGV[4] + 0
local version = ARGV[5] + 0
local units = ARGV[6] + 0

if op == 'd' then
  local levels, res = {}, {t, 0}
  local stop, denied = n, false
  for i = 1, n do
    local o = 8 + 9 * (i - 1)
    local L, err = load(i, o, version, t)
    if err then return err end
    migrate(L, o, version, t)
    if L[13] > 0 then observe(L, math.max(t, L[12])); pay_debt(L) end
    local ok, reason, retry, took = 0, 1, 0, 0
    if L[2] == 1 then
      tb_refill(L, t)
      if units < 1 then reason = 3; retry = -1
      elseif units > L[5] then reason = 2; retry = -1
      else
        local need = units * M6
        if need <= L[10] then L[10] = L[10] - need; ok = 1; reason = 0; took = need
        else retry = tb_reach(L, need) end
      end
    else
      fw_advance(L, t)
      if units < 1 then reason = 3; retry = -1
      elseif units > L[3] then reason = 2; retry = -1
      elseif units <= L[3] - L[10] then L[10] = L[10] + units; ok = 1; reason = 0; took = units
      else retry = fw_next(L) end
    end
    local rem, reset
    if L[2] == 1 then
      rem = tdiv(L[10], M6); reset = tb_reach(L, L[14])
    else
      rem = math.max(0, L[3] - L[10])
      if L[10] == 0 then reset = 0 else reset = fw_next(L) end
    end
    local k = 2 + 6 * (i - 1)
    res[k + 1] = ok; res[k + 2] = reason; res[k + 3] = rem; res[k + 4] = retry
    res[k + 5] = reset; res[k + 6] = L[1]
    res[2] = i
    levels[i] = {L, ok, took}
    if ok == 0 and ARGV[o + 8] ~= '1' then denied = true; stop = i; break end
  end
  for i = 1, stop do
    local L, ok, took = levels[i][1], levels[i][2], levels[i][3]
    if denied and i < stop and ok == 1 then L[10] = L[10] + (L[2] == 1 and took or -took) end
    store(KEYS[i], L, t, margin)
  end
  return res
end

local spent = ARGV[7]
local out = {t}
for i = 1, n do
  local o = 8 + 9 * (i - 1)
  local L, err = load(i, o, version, t)
  if err then return err end
  local tt = math.max(t, L[12])
  observe(L, tt)
  local cap, cu = L[14], capacity(L)
  local value = 0
  if op == 'r' then
    local give = math.min(units, 3 * cu + 2) * M6
    local to_debt = math.min(L[13], give)
    L[13] = L[13] - to_debt; give = give - to_debt
    local given = 0
    if L[2] == 1 then
      given = math.min(give, cap - L[10])
      L[10] = L[10] + given
      if L[10] == cap then L[11] = 0 end
    else
      local s = tt
      if spent ~= '' then s = (spent + 0) end
      if idiv(s, L[6]) == idiv(L[12], L[6]) then
        local back = math.min(idiv(give, M6), L[10])
        L[10] = L[10] - back
        given = back * M6
      end
    end
    value = given + to_debt
  elseif op == 'c' then
    local u = math.min(units, 2 * cu + 1) * M6
    if L[2] == 1 then
      local before = math.max(0, -L[10])
      local after = math.max(L[10] - u, -cap)
      L[10] = after
      if after >= cap then L[11] = 0 end
      value = math.max(0, -after) - before
    else
      local before = L[13]
      L[13] = before + u
      pay_debt(L)
      L[13] = math.min(cap, L[13])
      value = L[13] - math.min(before, L[13])
    end
  else
    return redis.error_reply('QUOTA_BAD_OP ' .. tostring(op))
  end
  out[i + 1] = value
  store(KEYS[i], L, t, margin)
end
return out
)lua";

// The whole script.
inline const std::string kGatewayLua = std::string(kLuaMath) + kLuaReach + kGatewayLuaBody;

// Attempts shared by every gateway process (GatewayStore::begin_attempt and friends).
// KEYS[1]: the attempt key (the tenant's slot). ARGV[1]: op 'b' begin, 'f' finish, 'a'
// abandon; ARGV[2]: the request's fingerprint (no control characters); ARGV[3]: TTL, ms;
// ARGV[4]: 'f': the decision, six integers separated by spaces.
// A record is "P" (pending) or "D" (decided), then \x1f and the fingerprint, then for
// "D" \x1f and the decision.
// Reply 'b': {0} when this call began the attempt (pending written), {1, record} when a
//            record exists; 'f', 'a': {0}.
inline constexpr const char* kGatewayAttemptLua = R"lua(
local op, fp, ttl = ARGV[1], ARGV[2], ARGV[3]
if op == 'b' then
  local v = redis.call('GET', KEYS[1])
  if v then return {1, v} end
  redis.call('SET', KEYS[1], 'P\31' .. fp, 'PX', ttl)
  return {0}
elseif op == 'f' then
  redis.call('SET', KEYS[1], 'D\31' .. fp .. '\31' .. ARGV[4], 'PX', ttl)
  return {0}
elseif op == 'a' then
  local v = redis.call('GET', KEYS[1])
  if v and string.sub(v, 1, 1) == 'P' then redis.call('DEL', KEYS[1]) end
  return {0}
end
return redis.error_reply('QUOTA_BAD_OP ' .. tostring(op))
)lua";

}  // namespace quota::redis
