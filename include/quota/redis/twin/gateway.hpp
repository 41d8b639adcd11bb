// quota/redis/twin/gateway.hpp — the Lua twin of the gateway's KeyState (key_state.hpp).
//
// kGatewayLua runs one of three operations over the keys of ONE tenant (one hash slot),
// bit-identical to the C++ functions of quota/gateway/key_state.hpp (tests compare them
// on random operation sequences): 'd' decide (KeyPolicy::apply on each level in order,
// stopping at the first level that denies and is not shadow; all or nothing), 'r' refund
// (gateway::refund on each key) and 'c' charge (gateway::charge on each key).
// kGatewayAttemptLua keeps the attempts GatewayStore shares between processes.
// GatewayStore (redis/gateway_store.hpp) builds the arguments and parses the replies.
//
// Guarantees: for every rule GatewayStore::check admits, every value is an exact integer
// below 2^53 and every duration returned is exact nanoseconds, so with times of whole
// microseconds both sides decide identically; a key's state is 72 bytes; its TTL is its
// idle time plus the margin (none while it holds debt); a key that is not a gateway state
// of ours is QUOTA_CORRUPT, nothing written. Thread safety: the constants are immutable
// text; Redis runs each script call with nothing interleaved.
//
//   // GatewayStore sends, for one level of a token bucket, rule-set version 1, cost 1:
//   // EVALSHA <sha of kGatewayLua> 1 "quota:{acme}read" <head: server time, 'd', margin,
//   //   version 1, units 1, shadow "0"> <the level's 33-byte policy>
//   // and reads {time µs, 1, allowed, reason, remaining, retry_after ns, reset_after ns,
//   //            version}.
#pragma once

#include <string>

#include "quota/redis/twin/common.hpp"
#include "quota/redis/twin/range.hpp"
#include "quota/redis/twin/skeleton.hpp"

namespace quota::redis {

// The script's body (after kLuaMath and kLuaReach of twin/common.hpp; its macros expanded).
//
// KEYS[1..n]  the keys (one hash slot)
// ARGV[1]     the head, struct-packed '<Bi8Bi8i8i8Bi8' and then one byte per level: the
//             caller's time (1) or the server's TIME (0); the time, µs; the op ('d', 'r'
//             or 'c'); the TTL margin, ms (>= 1); the caller's rule-set version; units
//             (the cost 'd', units to give back 'r' or to charge 'c'); for 'r', whether
//             the time the units were spent is given (1; 0: the key's own latest time)
//             and that time, µs; then 'd': the levels' shadow flags ('1' shadow, '0' not);
//             then, when the keys' units differ, each key's units ('<i8' each)
// ARGV[1+i]   level i's policy, 33 bytes '<BI4I7I7I7I7': kind, burst|limit, m|window
//             µs, p|0, g|0, fill ns|0 (a bucket of rate 0: m 0, p 1, g 1, fill 0)
// Reply 'd':       {time µs, levels decided, then per level decided: allowed, reason,
//                   remaining, retry_after ns (-1 never), reset_after ns (-1 never),
//                   version used}
// Reply 'r', 'c':  {time µs, then per key: micro-units given back | left as debt}
// Errors:          "QUOTA_CORRUPT ..." (a key's value is not a gateway state of ours).
//
// 'd' converts a state written under other parameters (migrate: refill with the old
// ones up to now, clamp to the new capacity; a state of a NEWER rule-set version is
// kept), pays debt, applies. On a denial that is not shadow the levels allowed before it
// are written WITHOUT their deduction (exactly what the in-process give-back leaves).
//
// Time is microseconds on the server's clock (TIME), or the caller's in a test mode; the
// C++ side keeps nanoseconds.
//
// Exactness. GatewayStore::check admits only rules that keep every value below 2^53:
// capacity (burst or limit) at most 2·10^9 units, so micro-units with debt and refunds
// stay below 6·10^15; a token bucket's rate m/p micro-units per ns (reduced by g) with
// (m+2)(p+1) <= 2^53 and a time to fill of at most 4·10^15 ns (~46 days), so a refill
// from the deepest debt (2 fills) is formed exactly; a window of whole microseconds, at
// most 4·10^15 ns. Refill and time-to-reach are split as in kTokenBucketLuaBody.
//
// State: 72 bytes per key, '<I7i7I7i7I7I4c33': the rule-set version; tokens
// (micro-units) | the window's count, the carried remainder over p, the last time µs;
// the debt (micro-units); the key's expiry as last set, ms after the last time (0:
// unknown); then the parameters that wrote it, exactly as the policy argument that
// carried them ('<BI4I7I7I7I7': kind 1 token bucket | 2 fixed window, capacity, m|window
// µs, p|0, g|0, fill ns|0 — identifying the rate exactly, as rate.units and rate.per
// do). A state written under the caller's policy ends with the caller's argument: one
// string comparison (Lua interns strings), and only the six fields are unpacked. Every
// value is checked on reading (out of range: QUOTA_CORRUPT). 72 bytes keep the value in
// jemalloc's 80-byte class. Format version (twin/common.hpp): bits 53-55 of the first
// field (the rule-set version, < 2^53), version 0 = zero; the check `ver <=
// 9007199254740991` rejects any other.
//
// TTL: the key's idle time (until its state equals a fresh one) plus the margin; none
// while it holds debt, or for a rate-0 bucket that is not full (a one-off budget must not
// come back). A later write keeps the key's TTL while the expiry set last still covers
// idle time + margin with 10 ms to spare, overwriting the state in place (SETRANGE key
// 0); else it sets idle time + margin, one margin more when the expiry fell short by less
// than a margin (a busy key, re-armed about once per margin). In caller-time mode every
// write sets the TTL.
//
// Each level's policy is one packed argument, unpacked only when it differs from the
// previous level's; several levels' states are read with one MGET; no table or closure
// per level (the levels not yet written wait in one flat table).
inline constexpr const char* kGatewayLuaBody = R"lua(
local M6 = 1000000
local MAXOFF = 4294967295
local sunpack, spack = struct.unpack, struct.pack
-- floor(a / b) of exact integers, b > 0: a % b is a - floor(a / b) * b, off by at most b
-- (a rounded quotient), corrected in one step; then (a - r) / b is an exact quotient.
local function fdiv(a, b)
  @mod(local r, a, b)
  return (a - r) / b
end
-- A window's count `tok` (of capacity `cap`) pays its debt (micro-units) in whole units,
-- as far as the window has room (key_state.hpp's pay_debt); returns the new count and debt.
local function window_pay(tok, debt, cap)
  local pay = cap - tok
  local owed = fdiv(debt + M6 - 1, M6)
  if owed < pay then pay = owed end
  debt = debt - pay * M6
  if debt < 0 then debt = 0 end
  return tok + pay, debt
end
local function corrupt(key, why)
  return redis.error_reply('QUOTA_CORRUPT key ' .. key .. ' is not a quota gateway state: ' .. why)
end

-- The head (ARGV[1], one struct.unpack where decimal arguments would each cost an
-- argument and a conversion); op is a character code: 100 'd', 114 'r', 99 'c'.
local caller, t, op, margin, version, units, has_spent, spent =
  struct.unpack('<Bi8Bi8i8i8Bi8', ARGV[1])
local now_ms
if caller == 0 then
  local now = redis.call('TIME')
  local sec, us = now[1] + 0, now[2] + 0
  t = sec * M6 + us
  now_ms = sec * 1000 + (us - us % 1000) / 1000
end
if op ~= 100 and op ~= 114 and op ~= 99 then
  return redis.error_reply('QUOTA_BAD_OP ' .. op)
end
local decide = op == 100
local n = #KEYS
-- Costs per key: after the 43 bytes of the head and ('d') the shadow flags, n costs
-- ('<i8' each) when they differ between the keys; else `units` is every key's.
local cpos = 44
if decide then cpos = 44 + n end
if #ARGV[1] < cpos then cpos = nil end
-- Several levels' states are read at once (MGET answers nil also for a key of another
-- type, so each nil is looked at again before anything is written).
local raws
if decide and n > 1 then raws = redis.call('MGET', unpack(KEYS)) end
local res
-- (sized for one or two levels: a table that grows is rehashed)
if not decide then
  res = {t, 0}
elseif n == 1 then
  res = {t, 0, 0, 0, 0, 0, 0, 0}
else
  res = {t, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}
end
-- 'd' with several levels: the levels decided and not written yet, 15 values each. All
-- are written once the last level is decided, without their deduction when it denied.
local W
-- The caller's policy of the level (ARGV[1+i]), unpacked when it differs from the
-- previous level's.
local spol, pkind, pcap, pm, pp, pg, pfill
for i = 1, n do
  local key = KEYS[i]
  local pol = ARGV[1 + i]
  if cpos then units = sunpack('<i8', ARGV[1], cpos + 8 * (i - 1)) end
  if pol ~= spol then
    spol = pol
    pkind, pcap, pm, pp, pg, pfill = sunpack('<BI4I7I7I7I7', pol)
  end
  local raw
  if raws then raw = raws[i] end
  if not raw then raw = redis.pcall('GET', key) end
  -- The level's state: the stored one, or a fresh one under the caller's policy. id: the
  -- parameters that wrote it, packed as a policy argument; same: they are the caller's.
  -- capM: capacity in micro-units; tok: tokens (micro-units) | the window's count; c: the
  -- carried remainder over p; expiry: the key's expiry (server ms) as last set, 0 unknown.
  local ver, kind, cap, m, p, g, fill, tok, c, last, debt, off, id
  local capM, expiry, same = 0, 0, true
  if not raw then
    ver, kind, cap, m, p, g, fill, c, last, debt = version, pkind, pcap, pm, pp, pg, pfill, 0, t, 0
    id = pol
    capM = cap * M6
    if kind == 1 then tok = capM else tok = 0 end
  else
    local len = #raw
    if len == 72 then
      ver, tok, c, last, debt, off, id = sunpack('<I7i7I7i7I7I4c33', raw)
      -- (strings are interned: a pointer comparison)
      if id == pol then
        kind, cap, m, p, g, fill = pkind, pcap, pm, pp, pg, pfill
        capM = cap * M6
      else
        same = false
        kind, cap, m, p, g, fill = sunpack('<BI4I7I7I7I7', id)
        capM = cap * M6
        local ok = cap >= 1 and cap <= 2000000000 and m <= 9007199254740991
        if kind == 1 then
          ok = ok and p >= 1 and p <= 9007199254740991 and g >= 1 and g <= 9007199254740991 and
            fill <= 9007199254740991
        else
          ok = ok and kind == 2 and m >= 1
        end
        if not ok then return corrupt(key, 'field out of range') end
      end
      local ok = ver <= 9007199254740991 and last >= -9007199254740991 and
        last <= 9007199254740991 and debt <= capM
      if kind == 1 then
        ok = ok and tok >= -capM and tok <= capM and c < p
      else
        ok = ok and tok >= 0 and tok <= cap and c == 0
      end
      if not ok then return corrupt(key, 'field out of range') end
      if off > 0 then expiry = fdiv(last, 1000) + off end
    elseif type(raw) ~= 'string' then
      return corrupt(key, 'wrong type')
    else
      return corrupt(key, len .. ' bytes, expected 72')
    end
  end
  -- Brought to t under its own parameters (every operation first does that: a conversion
  -- observes the old state at max(t, last), debt is paid from the budget present then).
  if t > last then
    if kind == 1 then
      if tok < capM and m > 0 then
        local x = (t - last) * 1000
        -- past twice the time to fill, full (also from the deepest debt); x may be
        -- rounded there, never below 2 * fill
        if x > 2 * fill then
          tok = capM; c = 0
        else
          @refill(x, tok, c, capM)
        end
      end
    elseif fdiv(t, m) ~= fdiv(last, m) then
      tok = 0
    end
    last = t
  end
  local ok, took, denied = 0, 0, false
  if decide then
    -- migrate: a state of a newer version is kept; of the same parameters, versioned;
    -- else converted to the caller's policy (key_state.hpp).
    if ver <= version then
      if same then
        ver = version
      else
        local remaining = tok
        if kind == 2 then remaining = (cap - tok) * M6 end
        if remaining < 0 and pkind == 2 then debt = debt - remaining end
        ver, kind, cap, m, p, g, fill, c, id = version, pkind, pcap, pm, pp, pg, pfill, 0, pol
        capM = cap * M6
        if kind == 1 then
          if remaining > capM then tok = capM elseif remaining < -capM then tok = -capM else tok = remaining end
        else
          local u = fdiv(remaining, M6)
          if u > cap then u = cap elseif u < 0 then u = 0 end
          tok = cap - u
        end
        if debt > capM then debt = capM end
      end
    end
    if debt > 0 then
      if kind == 1 then
        local pay = tok
        if pay < 0 then pay = 0 end
        if pay > debt then pay = debt end
        tok = tok - pay
        debt = debt - pay
      else
        tok, debt = window_pay(tok, debt, cap)
      end
    end
    local reason, retry, rem = 1, 0, 0
    if units < 1 then
      reason = 3; retry = -1
    elseif units > cap then
      reason = 2; retry = -1
    elseif kind == 1 then
      local need = units * M6
      if need <= tok then tok = tok - need; ok = 1; reason = 0; took = need
      else retry = reach(tok, c, need, m, p) end
    elseif units <= cap - tok then
      tok = tok + units; ok = 1; reason = 0; took = units
    else
      retry = ((fdiv(last, m) + 1) * m - last) * 1000
    end
    if kind == 1 then
      -- tokens / 10^6 toward zero
      local a = tok
      if a < 0 then a = -a end
      @mod(local r, a, M6)
      rem = (a - r) / M6
      if tok < 0 then rem = -rem end
    elseif tok < cap then
      rem = cap - tok
    end
    local k = 6 * i - 4
    res[2] = i
    res[k + 1] = ok; res[k + 2] = reason; res[k + 3] = rem; res[k + 4] = retry
    res[k + 6] = ver
    denied = ok == 0 and string.byte(ARGV[1], 43 + i) ~= 49
  elseif op == 114 then
    local give = units
    if give > 3 * cap + 2 then give = 3 * cap + 2 end
    give = give * M6
    local to_debt = debt
    if to_debt > give then to_debt = give end
    debt = debt - to_debt
    give = give - to_debt
    local given = 0
    if kind == 1 then
      given = capM - tok
      if given > give then given = give end
      tok = tok + given
      if tok == capM then c = 0 end
    else
      local s = last
      if has_spent == 1 then s = spent end
      if fdiv(s, m) == fdiv(last, m) then
        local back = fdiv(give, M6)
        if back > tok then back = tok end
        tok = tok - back
        given = back * M6
      end
    end
    res[i + 1] = given + to_debt
  else
    local u = units
    if u > 2 * cap + 1 then u = 2 * cap + 1 end
    u = u * M6
    local value = 0
    if kind == 1 then
      local before = -tok
      if before < 0 then before = 0 end
      local after = tok - u
      if after < -capM then after = -capM end
      tok = after
      if after >= capM then c = 0 end
      -- (after >= 0 only when nothing was owed before)
      if after < 0 then value = -after - before end
    else
      local before = debt
      tok, debt = window_pay(tok, before + u, cap)
      if debt > capM then debt = capM end
      if before < debt then value = debt - before end
    end
    res[i + 1] = value
  end
  -- Time from `last` until the state equals a fresh one, ns (-1: never): reset_after.
  local reset = 0
  if kind == 1 then
    if tok < capM then reset = reach(tok, c, capM, m, p) end
  elseif tok ~= 0 then
    reset = ((fdiv(last, m) + 1) * m - last) * 1000
  end
  if decide then res[6 * i + 1] = reset end
  if decide and i < n and not denied then
    if i == 1 then
      W = {ver, kind, cap, m, p, g, fill, tok, c, last, debt, expiry, took, reset, id}
    else
      local b = 15 * (i - 1)
      W[b + 1], W[b + 2], W[b + 3], W[b + 4], W[b + 5], W[b + 6], W[b + 7], W[b + 8] =
        ver, kind, cap, m, p, g, fill, tok
      W[b + 9], W[b + 10], W[b + 11], W[b + 12], W[b + 13], W[b + 14], W[b + 15] =
        c, last, debt, expiry, took, reset, id
    end
  else
    -- Writes this level, then ('d') the ones decided before it.
    local lo = i
    if decide then lo = 1 end
    for j = i, lo, -1 do
      if j < i then
        local b = 15 * (j - 1)
        ver, kind, cap, m, p, g, fill, tok = W[b + 1], W[b + 2], W[b + 3], W[b + 4], W[b + 5],
          W[b + 6], W[b + 7], W[b + 8]
        c, last, debt, expiry, took, reset, id = W[b + 9], W[b + 10], W[b + 11], W[b + 12],
          W[b + 13], W[b + 14], W[b + 15]
        capM = cap * M6
        if denied and took > 0 then
          if kind == 1 then
            tok = tok + took
            reset = 0
            if tok < capM then reset = reach(tok, c, capM, m, p) end
          else
            tok = tok - took
            reset = 0
            if tok ~= 0 then reset = ((fdiv(last, m) + 1) * m - last) * 1000 end
          end
        end
      end
      -- The TTL: none while the state holds debt or never becomes fresh (reset -1); else
      -- the one set earlier while it still covers idle time + margin with 10 ms to spare
      -- (kept: SETRANGE); else (PX) idle time + margin, one margin more for a key whose expiry
      -- fell short by less than a margin (busy). `o`: the expiry as stored, ms after last.
      local px, keep, o = nil, false, 0
      if debt <= 0 and reset >= 0 then
        @ceil_ms(local ttl, (last - t) * 1000 + reset)
        ttl = ttl + margin
        if now_ms then
          local base = fdiv(last, 1000)
          if expiry >= now_ms + ttl + 10 then
            o = expiry - base
            keep = o >= 1 and o <= MAXOFF
          end
          if not keep then
            px = ttl
            if expiry >= now_ms + ttl - margin then px = ttl + margin end
            o = now_ms + px - base
            if o < 1 or o > MAXOFF then o = 0 end
          end
        else
          px = ttl
        end
      end
      local v = spack('<I7i7I7i7I7I4c33', ver, tok, c, last, debt, o, id)
      if keep then
        -- the key holds a 72-byte state (its expiry was read from it): overwritten in
        -- place, TTL kept
        redis.call('SETRANGE', KEYS[j], '0', v)
      elseif px then
        redis.call('SET', KEYS[j], v, 'PX', px)
      else
        redis.call('SET', KEYS[j], v)
      end
    end
    if decide then
      for k = 6 * i + 3, 6 * n + 2 do res[k] = nil end
      return res
    end
  end
end
return res
)lua";

// The whole script.
inline const std::string kGatewayLua =
    std::string(kLuaMath) + kLuaReach + detail::expand_lua(kGatewayLuaBody);

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
