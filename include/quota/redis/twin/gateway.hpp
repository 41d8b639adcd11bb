// quota/redis/twin/gateway.hpp — the Lua twin of the gateway's KeyState (key_state.hpp).
//
// kGatewayLua runs one of three operations over the keys of ONE tenant (one hash slot),
// bit-identical to the C++ of quota/gateway/key_state.hpp (tests compare them on random
// operation sequences at arbitrary nanosecond times): 'd' decide (KeyPolicy::apply on
// each level in order, each with its own cost, stopping at the first level that denies
// and is not shadow; all or nothing), 'r' refund and 'c' charge (gateway::refund and
// gateway::charge on each key, each with its own units); and 'a', 'd' with an attempt's
// record read and written in the same call (twin/gateway_attempts.hpp). GatewayStore
// (redis/gateway_store.hpp) sends it; twin/gateway_codec.hpp packs its arguments and
// parses its replies; twin/gateway_write.hpp is the end of each level (TTL, write).
//
// Guarantees: for every rule GatewayStore::check admits (kGatewayRange), every value is
// exact (an integer, as a decimal string past 2^53) and every duration exact nanoseconds,
// so both sides decide identically; a key's state is 80 bytes (a sliding log's events
// are a list beside it); its TTL is its idle time plus the margin (none while it holds
// debt); a key that is not a gateway state of ours is QUOTA_CORRUPT, nothing written. Thread
// safety: immutable text; Redis runs each call with nothing interleaved.
//
//   // EVALSHA <sha of kGatewayLua> 1 "quota:gw:{acme}read" <head: server time, 'd',
//   //   margin, version 1, units 1, shadow "0"> <the level's 35-byte policy>
//   // → {time s, time ns, 1, allowed, reason, remaining, retry_after ns, reset_after ns,
//   //    version}
#pragma once

#include <string>
#include <string_view>
#include <utility>

#include "quota/redis/twin/common.hpp"
#include "quota/redis/twin/gateway_attempts.hpp"
#include "quota/redis/twin/gateway_settle.hpp"
#include "quota/redis/twin/gateway_windows.hpp"
#include "quota/redis/twin/gateway_write.hpp"
#include "quota/redis/twin/skeleton.hpp"

namespace quota::redis {

// The script's body (after kLuaMath and kLuaReach of twin/common.hpp and
// gateway_attempt_prelude(); its macros expanded).
//
// KEYS[1..n]  the keys (one hash slot)
// ARGV[1]     the head, '<Bi8I4Bi8i8i8Bi8I4' (51 bytes): the caller's time (1) or the
//             server's TIME (0), plus 2 with the node argument last (twin/common.hpp's
//             kLuaNodeGuard); the time (s, ns in [0, 10^9)); the op ('d', 'r', 'c', 'a'); the
//             TTL margin, ms (>= 1); the caller's rule-set version; units (the cost 'd',
//             to give back 'r', to charge 'c'); 'r': whether the time the units were spent
//             is given (1; 0: the key's own latest time) and that time (s, ns). Then 'd':
//             one shadow flag per level ('1' shadow); then, when the keys' units differ,
//             each key's units ('<i8' each).
// ARGV[1+i]   level i's policy, 35 bytes '<BI5I7I7I7I4I4': kind 1 token bucket (burst, m,
//             p, g, the time to fill as s and ns: LuaTwin<TokenBucket>'s; rate 0: m 0, p 1,
//             g 1, fill 0) | kind 2 fixed window (limit, w, mode: LuaTwin<FixedWindow>'s
//             grid, 0, W as s and ns) | kind 3 sliding log, kind 4 window estimate
//             (twin/gateway_windows.hpp, which the loop calls where it says "windows")
// Reply 'd':  {time s, time ns, levels decided, then per level decided: allowed, reason,
//             remaining, retry_after ns (-1 never), reset_after ns (-1 never), version}
// Reply 'r', 'c': {time s, time ns, then per key: micro-units given back | left as debt}
// 'a': KEYS[n + 1] the attempt key, ARGV[n + 2 ..] its arguments; the reply is 'd's after
//             two fields, or the record's (kGatewayAttemptHead, twin/gateway_attempts.hpp).
// A duration past 2^53 ns, or micro-units past 2^53, is answered as its decimal string.
//
// 'd' migrates each state (key_state.hpp: a NEWER rule-set version's is kept), pays debt,
// applies; on a denial that is not shadow the levels allowed before it are written
// WITHOUT their deduction (what the in-process give-back leaves).
// Exactness (kGatewayRange): capacity <= 10^12 units, spans <= 10^17 ns. Tokens and debt
// are two limbs (units tu, du; micro-units tl, dl in [0, 10^6)): a cost, a refund or a
// charge is whole units, so it touches the units limb; comparisons are of limb pairs.
// Times are two limbs; a refill is the shared @refill_span up to twice the time to fill
// (full past it), the time to reach and the window grid the shared @reach, @window_start,
// @in_window and @to_next, all in limbs (twin/skeleton.hpp).
// State: 80 bytes '<I7i6I3I7i6I4I5I3I4c35' (jemalloc's 96-byte class): the rule-set
// version, tokens' units | the window's count, tokens' micro-units, the carry over p, the
// last time (s, ns + 2^30), the debt's units and micro-units, the expiry as last set (ms
// after the last time's ms; 0 unknown), the policy argument that wrote it (the caller's:
// one string comparison); every field checked on reading. Format version
// (twin/common.hpp): bits 30-31 of the nanoseconds field (< 10^9 < 2^30), version 1 =
// bit 30 set; `lns >= 0 and lns <= 999999999` after subtracting 2^30 rejects any other
// (bits 53-55 of the rule-set version are zero: `ver <= 2^53 - 1`).
// TTL: idle time + margin; none with debt or for a rate-0 bucket not full (a one-off
// budget must not come back). Kept (SETRANGE) while the expiry set last covers it with
// 10 ms to spare; else set, one margin more for a busy key. Caller time: set every write.
inline constexpr const char* kGatewayLuaBody = R"lua(
local M6 = 1000000
local MAXOFF = 4294967295
local sunpack, spack = struct.unpack, struct.pack
local function corrupt(key, why)
  return redis.error_reply('QUOTA_CORRUPT key ' .. key .. ' is not a quota gateway state: ' .. why)
end

-- The head (one struct.unpack where decimal arguments would each cost an argument and a
-- conversion); op is a character code: 100 'd', 114 'r', 99 'c'.
local head = ARGV[1]
local caller, sec, ns, op, margin, version, units, has_spent, ssec, sns =
  sunpack('<Bi8I4Bi8i8i8Bi8I4', head)
local now_ms
if caller % 2 == 0 then
  local now = redis.call('TIME')
  local us = now[2] + 0
  sec, ns = now[1] + 0, us * 1000
  now_ms = sec * 1000 + (us - us % 1000) / 1000
end
@node_guard()
if op ~= 100 and op ~= 114 and op ~= 99 and op ~= 97 then
  return redis.error_reply('QUOTA_BAD_OP ' .. op)
end
-- 'a' (97): 'd' with the attempt's record, KEYS[n + 1], in the same call (attempt_open)
local n, att = #KEYS, nil
if op == 97 then op, n = 100, #KEYS - 1; att = attempt_open(n, now_ms) end
if att and att.reply then return att.reply end
local decide = op == 100
-- Each key's units, when they differ: after the head and ('d') the shadow flags.
local cpos = 52
if decide then cpos = 52 + n end
if #head < cpos then cpos = nil end
-- Several levels' states are read at once (MGET answers nil also for a key of another
-- type, so each nil is looked at again before anything is written).
local raws
if decide and n > 1 then raws = redis.call('MGET', unpack(KEYS, 1, n)) end
local res
-- (sized for up to three levels: a table that grows is rehashed)
if not decide then res = {sec, ns, 0}
elseif n == 1 then res = {sec, ns, 0, 0, 0, 0, 0, 0, 0}
elseif n == 2 then res = {sec, ns, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}
else res = {sec, ns, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0} end
-- 'd' with several levels: the levels decided and not written yet, 4 values each (one
-- flat table, no table or closure per level): the packed state, its TTL (true: kept;
-- ms: set; false: none), the units it deducted and the expiry it had. All are written
-- once the last level is decided, without their deduction when it denied.
local P, LG
-- The caller's policy of the level, unpacked when it differs from the previous level's.
local spol, pkind, pcap, pm, pp, pg, pfs, pfn
for i = 1, n do
  local key = KEYS[i]
  local pol = ARGV[1 + i]
  if cpos then units = sunpack('<i8', head, cpos + 8 * (i - 1)) end
  if pol ~= spol then
    spol = pol
    pkind, pcap, pm, pp, pg, pfs, pfn = sunpack('<BI5I7I7I7I4I4', pol)
  end
  local raw
  if raws then raw = raws[i] end
  if not raw then raw = redis.pcall('GET', key) end
  -- The level's state: the stored one, or a fresh one under the caller's policy. id: the
  -- parameters that wrote it; same: they are the caller's. tu + tl: tokens (units and
  -- micro-units in [0, 10^6)) | the window's count (tl 0); c: the carry over p; (lsec,
  -- lns): the last time; du + dl: the debt; (fs, fn): the time to fill | the window;
  -- expiry: the key's expiry (server ms) as last set, 0 unknown.
  local ver, kind, cap, m, p, g, fs, fn, tu, tl, c, lsec, lns, du, dl, off, id
  local expiry, same = 0, true
  if not raw then
    ver, kind, cap, m, p, g, fs, fn, tl, c, lsec, lns, du, dl = version, pkind, pcap, pm, pp,
      pg, pfs, pfn, 0, 0, sec, ns, 0, 0
    id = pol
    if kind == 1 then tu = cap else tu = 0 end
  else
    local len = #raw
    if len == 80 then
      ver, tu, tl, c, lsec, lns, du, dl, off, id = sunpack('<I7i6I3I7i6I4I5I3I4c35', raw)
      -- format version 1: bit 30 of the nanoseconds field set, bit 31 clear
      lns = lns - 1073741824
      -- (strings are interned: a pointer comparison)
      if id == pol then
        kind, cap, m, p, g, fs, fn = pkind, pcap, pm, pp, pg, pfs, pfn
      else
        same = false
        kind, cap, m, p, g, fs, fn = sunpack('<BI5I7I7I7I4I4', id)
        local ok = cap >= 1 and cap <= 1000000000000 and m <= 9007199254740991 and
          fs <= 100000000 and fn <= 999999999
        if kind == 1 then
          ok = ok and p >= 1 and p <= 9007199254740991 and g >= 1 and g <= 9007199254740991
        elseif kind >= 3 then  -- windows
          ok = ok and windows() and win_policy_ok(kind, m, p, g, fs, fn)
        else
          ok = ok and kind == 2 and m >= 1 and ((p == 1 and fs * 1000000000 + fn == m) or
            (p == 2 and fs == m and fn == 0))
        end
        if not ok then return corrupt(key, 'field out of range') end
      end
      local ok = ver <= 9007199254740991 and lns >= 0 and lns <= 999999999 and tl <= 999999 and
        dl <= 999999 and (du < cap or (du == cap and dl == 0)) and
        ((kind == 1 and tu >= -cap and (tu < cap or (tu == cap and tl == 0)) and c < p) or
          (kind == 2 and tu >= 0 and tu <= cap and tl == 0 and c == 0) or
          (kind >= 3 and windows() and win_state_ok(kind, cap, tu, tl, c)))  -- windows
      if not ok then return corrupt(key, 'field out of range') end
      if off > 0 then expiry = lsec * 1000 + (lns - lns % M6) / M6 + off end
    elseif type(raw) ~= 'string' then
      return corrupt(key, 'wrong type')
    else
      return corrupt(key, len .. ' bytes, expected 80')
    end
  end
  if pkind >= 3 then windows() end  -- windows: the caller's rule is kind 3 or 4
  -- failover safety (kLuaNodeGuard): KeyPolicy::exhausted(failover time), caller's policy
  @if_spent(raw, lsec, lns)
    ver, kind, cap, m, p, g, fs, fn, tl, c, lsec, lns, du, dl, id, same = version, pkind, pcap,
      pm, pp, pg, pfs, pfn, 0, 0, fsec, fns, 0, 0, pol, true
    if kind == 1 then tu = 0 else tu = cap end
  end
  -- Brought to the call's time under its own parameters (every operation first does that:
  -- a conversion observes the old state at max(now, last), debt is paid from it).
  if sec > lsec or (sec == lsec and ns > lns) then
    if kind == 1 then
      if tu < cap and m > 0 then
        -- full past twice the time to fill (also from the deepest debt)
        local f2s, f2n = 2 * fs, 2 * fn
        if f2n >= 1000000000 then f2s = f2s + 1; f2n = f2n - 1000000000 end
        @refill_span(sec - lsec, ns - lns, tu, tl, c, cap, f2s, f2n)
      end
    elseif kind >= 3 then  -- windows (a log's events leave in log_load)
      if kind == 4 then tu, c = est_advance(m, p, g, tu, c, sec, ns, lsec, lns) end
    else
      local w, mode = m, p
      @window_start(local st, sec, ns)
      @in_window(local inw, st, sec, lsec, lns)
      if not inw then tu = 0 end
    end
    lsec, lns = sec, ns
  end
  -- windows: a log's events (twin/gateway_windows.hpp)
  local lg
  if kind == 3 then lg, tu = log_load(key, lsec, lns, m, tu, not raw) end
  local ok, took, denied = 0, 0, false
  if decide then
    -- migrate: a state of a newer version is kept; of the same parameters, versioned;
    -- else converted to the caller's policy (key_state.hpp).
    if ver <= version then
      if same then
        ver = version
      else
        -- what remains, ru + rl micro-units: the tokens, or the window's room
        local ru, rl = tu, tl
        if kind == 2 then
          ru = cap - tu
        elseif kind >= 3 then  -- windows
          ru = win_room(kind, cap, m, p, fs, fn, tu, c, lsec, lns)
        end
        if ru < 0 and pkind ~= 1 then
          @lsub(du, dl, ru, rl)
        end
        ver, kind, cap, m, p, g, fs, fn, c, id = version, pkind, pcap, pm, pp, pg, pfs, pfn, 0,
          pol
        if kind == 1 then
          if ru >= cap then tu, tl = cap, 0 elseif ru < -cap then tu, tl = -cap, 0 else tu, tl = ru, rl end
        else
          -- (ru: floor(remaining / 10^6))
          if ru > cap then ru = cap elseif ru < 0 then ru = 0 end
          tu, tl = cap - ru, 0
          if kind == 3 or lg then lg = log_reset(lg) end  -- windows
        end
        if du > cap or (du == cap and dl > 0) then du, dl = cap, 0 end
      end
    end
    if du > 0 or dl > 0 then
      if kind == 1 then
        -- pays min(max(tokens, 0), debt)
        if tu > 0 or (tu == 0 and tl > 0) then
          if tu > du or (tu == du and tl >= dl) then
            @lsub(tu, tl, du, dl)
            du, dl = 0, 0
          else
            @lsub(du, dl, tu, tl)
            tu, tl = 0, 0
          end
        end
      else
        local wc = cap
        if kind == 4 then wc = tu + win_room(kind, cap, m, p, fs, fn, tu, c, lsec, lns) end
        @window_pay(tu, du, dl, wc)
      end
    end
  end
  -- `wide`: past the gateway's narrow range (GatewayTwin::params), the reach macro forms its time
  -- from limbs
  local wide = cap > 2000000000 or fs > 4000000 or (fs == 4000000 and fn > 0)
  if decide then
    local reason, retry, rem = 1, 0, 0
    if units < 1 then
      reason = 3; retry = -1
    elseif units > cap then
      reason = 2; retry = -1
    elseif kind == 1 then
      -- (tokens >= units·10^6 exactly when the whole units do: tl < 10^6)
      if units <= tu then tu = tu - units; ok = 1; reason = 0; took = units
      else
        local ys, yn
        @reach(ys, yn, tu, tl, c, units)
        @dur(retry, ys, yn)
      end
    elseif kind >= 3 then  -- windows
      ok, tu, retry = win_decide(kind, cap, m, p, fs, fn, tu, c, lsec, lns, units, lg, key)
      if ok == 1 then reason = 0; took = units end
    elseif units <= cap - tu then
      tu = tu + units; ok = 1; reason = 0; took = units
    else
      local w, mode, ys, yn = m, p
      @to_next(ys, yn, lsec, lns)
      @dur(retry, ys, yn)
    end
    if kind == 1 then
      -- tokens / 10^6 toward zero
      rem = tu
      if tu < 0 and tl > 0 then rem = tu + 1 end
    elseif kind == 4 then  -- windows
      rem = win_room(kind, cap, m, p, fs, fn, tu, c, lsec, lns)
    elseif tu < cap then
      rem = cap - tu
    end
    local k = 6 * i - 3
    res[3] = i
    res[k + 1] = ok; res[k + 2] = reason; res[k + 3] = rem; res[k + 4] = retry
    res[k + 6] = ver
    denied = ok == 0 and string.byte(head, 51 + i) ~= 49
  elseif op == 114 then
    --@@ refund
  else
    --@@ charge
  end
  --@@ write
end
return res
)lua";

namespace detail {

// kGatewayLuaBody with twin/gateway_settle.hpp's refund and charge and
// twin/gateway_write.hpp's writes in place, macros expanded.
inline std::string gateway_body() {
  std::string body = kGatewayLuaBody;
  for (const auto& [marker, text] :
       {std::pair<std::string_view, std::string_view>{"    --@@ refund\n", kGatewayRefundLua},
        {"    --@@ charge\n", kGatewayChargeLua},
        {"  --@@ write\n", kGatewayWriteLua}}) {
    body.replace(body.find(marker), marker.size(), text);
  }
  return expand_lua(body);
}

}  // namespace detail

// The whole script.
inline const std::string kGatewayLua = std::string(kLuaMath) + kLuaReach +
                                       kGatewayWindowsFunctions + gateway_attempt_prelude() +
                                       detail::gateway_body();

}  // namespace quota::redis
