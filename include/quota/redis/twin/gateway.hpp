// quota/redis/twin/gateway.hpp — the Lua twin of the gateway's KeyState (key_state.hpp).
//
// kGatewayLua runs one of three operations over the keys of ONE tenant (one hash slot),
// bit-identical to the C++ of quota/gateway/key_state.hpp (tests compare them on random
// operation sequences at arbitrary nanosecond times): 'd' decide (KeyPolicy::apply on
// each level in order, each with its own cost, stopping at the first level that denies
// and is not shadow; all or nothing), 'r' refund and 'c' charge (gateway::refund and
// gateway::charge on each key, each with its own units). GatewayStore
// (redis/gateway_store.hpp) sends it; twin/gateway_codec.hpp packs its arguments and
// parses its replies; twin/gateway_attempts.hpp is the attempts script.
//
// Guarantees: for every rule GatewayStore::check admits (kGatewayRange), every value is
// an exact integer below 2^53 and every duration exact nanoseconds, so both sides decide
// identically; a key's state is 75 bytes; its TTL is its idle time plus the margin (none
// while it holds debt); a key that is not a gateway state of ours is QUOTA_CORRUPT,
// nothing written. Thread safety: immutable text; Redis runs each call with nothing
// interleaved.
//
//   // EVALSHA <sha of kGatewayLua> 1 "quota:gw:{acme}read" <head: server time, 'd',
//   //   margin, version 1, units 1, shadow "0"> <the level's 33-byte policy>
//   // → {time s, time ns, 1, allowed, reason, remaining, retry_after ns, reset_after ns,
//   //    version}
#pragma once

#include <string>

#include "quota/redis/twin/common.hpp"
#include "quota/redis/twin/skeleton.hpp"

namespace quota::redis {

// The script's body (after kLuaMath and kLuaReach of twin/common.hpp; its macros expanded).
//
// KEYS[1..n]  the keys (one hash slot)
// ARGV[1]     the head, '<Bi8I4Bi8i8i8Bi8I4' (51 bytes): the caller's time (1) or the
//             server's TIME (0); the time (s, ns in [0, 10^9)); the op ('d', 'r', 'c'); the
//             TTL margin, ms (>= 1); the caller's rule-set version; units (the cost 'd',
//             to give back 'r', to charge 'c'); 'r': whether the time the units were spent
//             is given (1; 0: the key's own latest time) and that time (s, ns). Then 'd':
//             one shadow flag per level ('1' shadow); then, when the keys' units differ,
//             each key's units ('<i8' each).
// ARGV[1+i]   level i's policy, 33 bytes '<BI4I7I7I7I7': kind 1 token bucket (burst, m, p,
//             g, fill ns: LuaTwin<TokenBucket>'s; rate 0: m 0, p 1, g 1, fill 0) | kind 2
//             fixed window (limit, w, mode: LuaTwin<FixedWindow>'s grid, 0, W ns)
// Reply 'd':  {time s, time ns, levels decided, then per level decided: allowed, reason,
//             remaining, retry_after ns (-1 never), reset_after ns (-1 never), version}
// Reply 'r', 'c': {time s, time ns, then per key: micro-units given back | left as debt}
//
// 'd' migrates each state (key_state.hpp: a NEWER rule-set version's is kept), pays debt,
// applies; on a denial that is not shadow the levels allowed before it are written
// WITHOUT their deduction (what the in-process give-back leaves).
// Exactness (kGatewayRange): capacity <= 2·10^9 units (micro-units with debt and refunds
// below 6·10^15); an elapsed time is formed only below 9·10^6 s + 1 s and refills only up
// to twice a time to fill (<= 8·10^15 ns); refill, time to reach and the window grid are
// the shared @refill, kLuaReach, @window_start, @in_window and @to_next.
// State: 75 bytes '<I7i7I7i6I4I7I4c33' (jemalloc's 80-byte class): the rule-set version,
// tokens (micro-units) | the window's count, the carry over p, the last time (s, ns), the
// debt (micro-units), the expiry as last set (ms after the last time's ms; 0 unknown),
// the policy argument that wrote it (the caller's: one string comparison); every field
// checked on reading. Format version (twin/common.hpp): bits 53-55 of the rule-set
// version, 0; `ver <= 9007199254740991` rejects any other.
// TTL: idle time + margin; none with debt or for a rate-0 bucket not full (a one-off
// budget must not come back). Kept (SETRANGE) while the expiry set last covers it with
// 10 ms to spare; else set, one margin more for a busy key. Caller time: set every write.
inline constexpr const char* kGatewayLuaBody = R"lua(
local M6 = 1000000
local MAXOFF = 4294967295
local sunpack, spack = struct.unpack, struct.pack
-- A window's count `tok` (of capacity `cap`) pays its debt (micro-units) in whole units,
-- as far as the window has room (key_state.hpp's pay_debt); returns the new count and debt.
local function window_pay(tok, debt, cap)
  local pay = cap - tok
  local owed = idiv(debt + M6 - 1, M6)
  if owed < pay then pay = owed end
  debt = debt - pay * M6
  if debt < 0 then debt = 0 end
  return tok + pay, debt
end
local function corrupt(key, why)
  return redis.error_reply('QUOTA_CORRUPT key ' .. key .. ' is not a quota gateway state: ' .. why)
end

-- The head (one struct.unpack where decimal arguments would each cost an argument and a
-- conversion); op is a character code: 100 'd', 114 'r', 99 'c'.
local head = ARGV[1]
local caller, sec, ns, op, margin, version, units, has_spent, ssec, sns =
  sunpack('<Bi8I4Bi8i8i8Bi8I4', head)
local now_ms
if caller == 0 then
  local now = redis.call('TIME')
  local us = now[2] + 0
  sec, ns = now[1] + 0, us * 1000
  now_ms = sec * 1000 + (us - us % 1000) / 1000
end
if op ~= 100 and op ~= 114 and op ~= 99 then
  return redis.error_reply('QUOTA_BAD_OP ' .. op)
end
local decide = op == 100
local n = #KEYS
-- Each key's units, when they differ: after the head and ('d') the shadow flags.
local cpos = 52
if decide then cpos = 52 + n end
if #head < cpos then cpos = nil end
-- Several levels' states are read at once (MGET answers nil also for a key of another
-- type, so each nil is looked at again before anything is written).
local raws
if decide and n > 1 then raws = redis.call('MGET', unpack(KEYS)) end
local res
-- (sized for one or two levels: a table that grows is rehashed)
if not decide then res = {sec, ns, 0}
elseif n == 1 then res = {sec, ns, 0, 0, 0, 0, 0, 0, 0}
else res = {sec, ns, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0} end
-- 'd' with several levels: the levels decided and not written yet, 15 values each (one
-- flat table, no table or closure per level). All are written once the last level is
-- decided, without their deduction when it denied.
local H
-- The caller's policy of the level, unpacked when it differs from the previous level's.
local spol, pkind, pcap, pm, pp, pg, pfill
for i = 1, n do
  local key = KEYS[i]
  local pol = ARGV[1 + i]
  if cpos then units = sunpack('<i8', head, cpos + 8 * (i - 1)) end
  if pol ~= spol then
    spol = pol
    pkind, pcap, pm, pp, pg, pfill = sunpack('<BI4I7I7I7I7', pol)
  end
  local raw
  if raws then raw = raws[i] end
  if not raw then raw = redis.pcall('GET', key) end
  -- The level's state: the stored one, or a fresh one under the caller's policy. id: the
  -- parameters that wrote it; same: they are the caller's. capM: capacity in micro-units;
  -- tok: tokens (micro-units) | the window's count; c: the carry over p; (lsec, lns): the
  -- last time; expiry: the key's expiry (server ms) as last set, 0 unknown.
  local ver, kind, cap, m, p, g, fill, tok, c, lsec, lns, debt, off, id
  local capM, expiry, same = 0, 0, true
  if not raw then
    ver, kind, cap, m, p, g, fill, c, lsec, lns, debt = version, pkind, pcap, pm, pp, pg, pfill,
      0, sec, ns, 0
    id = pol
    capM = cap * M6
    if kind == 1 then tok = capM else tok = 0 end
  else
    local len = #raw
    if len == 75 then
      ver, tok, c, lsec, lns, debt, off, id = sunpack('<I7i7I7i6I4I7I4c33', raw)
      -- (strings are interned: a pointer comparison)
      if id == pol then
        kind, cap, m, p, g, fill = pkind, pcap, pm, pp, pg, pfill
      else
        same = false
        kind, cap, m, p, g, fill = sunpack('<BI4I7I7I7I7', id)
        local ok = cap >= 1 and cap <= 2000000000 and m <= 9007199254740991 and
          fill <= 9007199254740991
        if kind == 1 then
          ok = ok and p >= 1 and p <= 9007199254740991 and g >= 1 and g <= 9007199254740991
        else
          ok = ok and kind == 2 and m >= 1 and ((p == 1 and fill == m) or
            (p == 2 and fill == m * 1000000000))
        end
        if not ok then return corrupt(key, 'field out of range') end
      end
      capM = cap * M6
      local ok = ver <= 9007199254740991 and lns <= 999999999 and debt <= capM and
        ((kind == 1 and tok >= -capM and tok <= capM and c < p) or
          (kind == 2 and tok >= 0 and tok <= cap and c == 0))
      if not ok then return corrupt(key, 'field out of range') end
      if off > 0 then expiry = lsec * 1000 + (lns - lns % M6) / M6 + off end
    elseif type(raw) ~= 'string' then
      return corrupt(key, 'wrong type')
    else
      return corrupt(key, len .. ' bytes, expected 75')
    end
  end
  -- Brought to the call's time under its own parameters (every operation first does that:
  -- a conversion observes the old state at max(now, last), debt is paid from it).
  if sec > lsec or (sec == lsec and ns > lns) then
    if kind == 1 then
      if tok < capM and m > 0 then
        -- an elapsed time is formed only up to 9·10^6 s; past twice the time to fill the
        -- bucket is full (also from the deepest debt)
        local dsec, x = sec - lsec, 2 * fill + 1
        if dsec <= 9000000 then x = dsec * 1000000000 + (ns - lns) end
        if x > 2 * fill then
          tok = capM; c = 0
        else
          -- (the shared refill takes tokens as units and micro-units)
          @mod(local tl, tok, M6)
          local tu = (tok - tl) / M6
          @refill(x, tu, tl, c, cap)
          tok = tu * M6 + tl
        end
      end
    else
      local w, mode = m, p
      @window_start(local st, sec, ns)
      @in_window(local inw, st, sec, lsec, lns)
      if not inw then tok = 0 end
    end
    lsec, lns = sec, ns
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
          local u = idiv(remaining, M6)
          if u > cap then u = cap elseif u < 0 then u = 0 end
          tok = cap - u
        end
        if debt > capM then debt = capM end
      end
    end
    if debt > 0 then
      if kind == 1 then
        local pay = tok
        if pay < 0 then pay = 0 elseif pay > debt then pay = debt end
        tok, debt = tok - pay, debt - pay
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
      local w, mode, ts, tn = m, p
      @to_next(ts, tn, lsec, lns)
      retry = ts * 1000000000 + tn
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
    local k = 6 * i - 3
    res[3] = i
    res[k + 1] = ok; res[k + 2] = reason; res[k + 3] = rem; res[k + 4] = retry
    res[k + 6] = ver
    denied = ok == 0 and string.byte(head, 51 + i) ~= 49
  elseif op == 114 then
    local give = units
    if give > 3 * cap + 2 then give = 3 * cap + 2 end
    give = give * M6
    local to_debt = debt
    if to_debt > give then to_debt = give end
    debt, give = debt - to_debt, give - to_debt
    local given = 0
    if kind == 1 then
      given = capM - tok
      if given > give then given = give end
      tok = tok + given
      if tok == capM then c = 0 end
    else
      -- only units spent in the current window come back
      local inw = has_spent ~= 1
      if not inw then
        local w, mode = m, p
        @window_start(local st, lsec, lns)
        @in_window(inw, st, lsec, ssec, sns)
      end
      if inw then
        local back = idiv(give, M6)
        if back > tok then back = tok end
        tok = tok - back
        given = back * M6
      end
    end
    res[i + 2] = given + to_debt
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
    res[i + 2] = value
  end
  -- Time from the last time until the state equals a fresh one, ns (-1: never): reset_after
  -- (again below for a level given back).
  local reset = 0
  if kind == 1 then
    if tok < capM then reset = reach(tok, c, capM, m, p) end
  elseif tok ~= 0 then
    local w, mode, ts, tn = m, p
    @to_next(ts, tn, lsec, lns)
    reset = ts * 1000000000 + tn
  end
  if decide then res[6 * i + 2] = reset end
  if decide and i < n and not denied then
    if i == 1 then
      H = {ver, kind, cap, m, p, g, fill, tok, c, lsec, lns, debt, expiry, took, id}
    else
      local b = 15 * (i - 1)
      H[b + 1], H[b + 2], H[b + 3], H[b + 4], H[b + 5], H[b + 6], H[b + 7], H[b + 8] =
        ver, kind, cap, m, p, g, fill, tok
      H[b + 9], H[b + 10], H[b + 11], H[b + 12], H[b + 13], H[b + 14], H[b + 15] =
        c, lsec, lns, debt, expiry, took, id
    end
  else
    -- Writes this level, then ('d') the ones decided before it.
    local lo = i
    if decide then lo = 1 end
    for j = i, lo, -1 do
      if j < i then
        local b = 15 * (j - 1)
        ver, kind, cap, m, p, g, fill, tok = H[b + 1], H[b + 2], H[b + 3], H[b + 4], H[b + 5],
          H[b + 6], H[b + 7], H[b + 8]
        c, lsec, lns, debt, expiry, took, id = H[b + 9], H[b + 10], H[b + 11], H[b + 12],
          H[b + 13], H[b + 14], H[b + 15]
        capM = cap * M6
        reset = res[6 * j + 2]
        if denied and took > 0 then
          -- given back: the state as before the deduction
          reset = 0
          if kind == 1 then
            tok = tok + took
            if tok < capM then reset = reach(tok, c, capM, m, p) end
          else
            tok = tok - took
            if tok ~= 0 then
              local w, mode, ts, tn = m, p
              @to_next(ts, tn, lsec, lns)
              reset = ts * 1000000000 + tn
            end
          end
        end
      end
      -- The TTL (see above): none with debt or when never fresh (reset -1); else `keep`
      -- the one set earlier, or set `px`. `o`: the expiry as stored.
      local px, keep, o = nil, false, 0
      if debt <= 0 and reset >= 0 then
        @ceil_ms(local ttl, (lsec - sec) * 1000000000 + (lns - ns) + reset)
        ttl = ttl + margin
        if now_ms then
          local base = lsec * 1000 + (lns - lns % M6) / M6
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
      local v = spack('<I7i7I7i6I4I7I4c33', ver, tok, c, lsec, lns, debt, o, id)
      if keep then
        -- (a 75-byte state, its expiry read from it) overwritten in place, TTL kept
        redis.call('SETRANGE', KEYS[j], '0', v)
      elseif px then
        redis.call('SET', KEYS[j], v, 'PX', px)
      else
        redis.call('SET', KEYS[j], v)
      end
    end
    if decide then
      for k = 6 * i + 4, 6 * n + 3 do res[k] = nil end
      return res
    end
  end
end
return res
)lua";

// The whole script.
inline const std::string kGatewayLua =
    std::string(kLuaMath) + kLuaReach + detail::expand_lua(kGatewayLuaBody);

}  // namespace quota::redis
