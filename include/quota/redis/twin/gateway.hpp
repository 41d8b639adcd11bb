// quota/redis/twin/gateway.hpp — the Lua twin of the gateway's KeyState (key_state.hpp).
//
// kGatewayLua runs one of three operations over the limits of ONE tenant (one hash slot),
// bit-identical to the C++ of quota/gateway/key_state.hpp (tests compare them on random
// operation sequences at arbitrary nanosecond times): 'd' decide (KeyPolicy::apply on
// each level in order, each with its own cost, stopping at the first level that denies
// and is not shadow; all or nothing), 'r' refund and 'c' charge (gateway::refund and
// gateway::charge on one level, its own units); and 'a', 'd' with an attempt's record
// read and written in the same call (twin/gateway_attempts.hpp). A scope's limits share
// ONE key: gateway key "{acme}#tpm" is record "tpm" of key "quota:gw:{acme}"
// (redis/keys.hpp's scope_key). GatewayStore (redis/gateway_store.hpp) sends it;
// twin/gateway_codec.hpp packs its arguments and parses its replies; a call of narrow
// token buckets takes twin/gateway_quick.hpp's quick path, any other this general one;
// twin/gateway_write.hpp reads the keys, ends each level and writes them.
//
// Guarantees: for every rule GatewayStore::check admits (kGatewayRange), every value is
// exact (an integer, as a decimal string past 2^53) and every duration exact nanoseconds,
// so both sides decide identically; a record is 34 bytes (a sliding log's events are a
// list beside its key); a key's TTL is the longest idle time of its records plus the
// margin (none while one holds debt); a key that is not a gateway scope of ours is
// QUOTA_CORRUPT, nothing written. Thread safety: immutable text; Redis runs each call with
// nothing interleaved.
//
//   // EVALSHA <sha of kGatewayLua> 1 "quota:gw:{acme}" <head: server time, 'd', margin,
//   //   version 1, units 1, 1 level, 1 key, shadow "0"> <the level's 35-byte policy> "\1"
//   //   <the key's layout: "\3tpm" version policy>
//   // → {time s, time ns, -1, allowed, tokens (micro-units), carry}  (the quick path)
#pragma once

#include <string>
#include <string_view>
#include <utility>

#include "quota/redis/twin/common.hpp"
#include "quota/redis/twin/gateway_attempts.hpp"
#include "quota/redis/twin/gateway_quick.hpp"
#include "quota/redis/twin/gateway_settle.hpp"
#include "quota/redis/twin/gateway_windows.hpp"
#include "quota/redis/twin/gateway_write.hpp"
#include "quota/redis/twin/skeleton.hpp"

namespace quota::redis {

// The script's body, its `--@@` lines replaced (detail::gateway_body) in the order a call
// meets them: the attempt prelude (only a call with op 'a' makes its functions), the
// one-level and the quick paths (twin/gateway_quick.hpp), then the general path's
// functions (kLuaMath, kLuaReach, the windows'), its reading, writing and settling steps;
// its macros expanded.
//
// KEYS[1..nk] the scope keys (one hash slot), then 'a': the attempt key
// ARGV[1]     the head, kGatewayHead (twin/gateway_layout.hpp, 53 bytes): the caller's
//             time (1) or the server's TIME (0), plus 2 with the node argument last
//             (twin/common.hpp's kLuaNodeGuard); the time (s, ns in [0, 10^9)); the op ('d', 'r',
//             'c', 'a'); the TTL margin, ms (>= 1); the caller's rule-set version; units (the cost
//             'd', to give back 'r', to charge 'c'); 'r': whether the time the units were spent is
//             given (1; 0: the record's own latest time) and that time (s, ns); n, the levels; nk,
//             the keys. Then 'd': one shadow flag per level ('1' shadow); then, when the levels'
//             units differ, each level's units ('<i8' each).
// ARGV[1+i]   level i's policy, 35 bytes, kGatewayPolicy: kind 1 token bucket (burst, m,
//             p, g, the time to fill as s and ns: LuaTwin<TokenBucket>'s; rate 0: m 0, p 1,
//             g 1, fill 0) | kind 2 fixed window (limit, w, mode: LuaTwin<FixedWindow>'s
//             grid, 0, W as s and ns) | kind 3 sliding log, kind 4 window estimate
//             (twin/gateway_windows.hpp, which the loop calls where it says "windows")
// ARGV[2+n]   n bytes: level i's key, KEYS[byte i]
// ARGV[2+n+k] key k's layout: its levels' entries, in their order (below)
// Reply 'd':  {time s, time ns, levels decided, then per level decided: allowed, reason,
//             remaining, retry_after ns (-1 never), reset_after ns (-1 never), version},
//             or the quick path's compact form (twin/gateway_quick.hpp)
// Reply 'r', 'c': {time s, time ns, micro-units given back | left as debt}
// 'a': ARGV[3+n+nk ..] the attempt's arguments; the reply is 'd's after two fields, or
//             the record's (kGatewayAttemptHead, twin/gateway_attempts.hpp).
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
// @in_window and @to_next, all in limbs (twin/lua_macros.hpp).
// A scope key's value: a header, kGatewayScopeHeader (10 bytes: format 113, the records,
// the entries' bytes, the expiry as last set in server ms, 0 none or unknown); the records,
// 34 bytes each, kGatewayRecord: tokens' units | the window's count, tokens'
// micro-units, the carry over p, the last time (s, ns), the debt's units and micro-units;
// then one entry per record: its name's length (1 byte), its name (the limit's, at most
// 64 bytes), the rule-set version '<I7' and the policy argument that wrote it (35 bytes).
// When the stored entries start with the call's layout (one string.find), the levels'
// records are the first ones, under the caller's policy and version; else the entries
// are parsed and each level's record found by name (a new one appended), and records no
// level of the call has are kept as they are. Every field is checked on reading.
// TTL: the longest of its records' idle times + margin; none with debt or for a rate-0
// bucket not full (a one-off budget must not come back). Kept (SETRANGE, SET KEEPTTL)
// while the expiry set last covers it with 10 ms to spare; else set, one margin more for a
// busy key, never below the expiry as last set (it covers the records not decided now).
// Caller time: set every write, over every record.
inline constexpr const char* kGatewayLuaBody = R"lua(
local M6 = 1000000
local sunpack, spack = struct.unpack, struct.pack
-- A record: tokens' units | the count, tokens' micro-units, the carry, the last time (s,
-- ns), the debt's units and micro-units (34 bytes).
local RF = @record_format()

-- The head (one struct.unpack where decimal arguments would each cost an argument and a
-- conversion); op is a character code: 100 'd', 114 'r', 99 'c'.
local head = ARGV[1]
local caller, sec, ns, op, margin, version, units, has_spent, ssec, sns, n, nk =
  sunpack(@head_format(), head)
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
--@@ attempts
-- 'a' (97): 'd' with the attempt's record, KEYS[nk + 1], in the same call (attempt_open)
local att
if op == 97 then op = 100; att = attempt_open(nk, 3 + n + nk, now_ms) end
if att and att.reply then return att.reply end
local decide = op == 100
-- Each level's units, when they differ: after the head and ('d') the shadow flags.
local cpos = 54
if decide then cpos = 54 + n end
if #head < cpos then cpos = nil end
-- level i's scope key: KEYS[string.byte(kmap, i)]
local kmap = ARGV[2 + n]

-- The scope keys, read at once (MGET answers nil also for a key of another type, so each
-- nil is looked at again by the general path, kGatewayReadLua).
local raws, raw1
if nk > 1 then raws = redis.call('MGET', unpack(KEYS, 1, nk)) else raw1 = redis.pcall('GET', KEYS[1]) end
--@@ quick_one
if not raws then raws = {raw1} end
local res
-- (sized for up to three levels: a table that grows is rehashed)
if not decide then res = {sec, ns, 0}
elseif n == 1 then res = {sec, ns, 0, 0, 0, 0, 0, 0, 0}
elseif n == 2 then res = {sec, ns, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}
else res = {sec, ns, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0} end
--@@ quick
-- The general path's functions (kLuaMath's idiv, kLuaReach, the windows' maker): made
-- only here, after the quick path, so that a call it answers makes no closure (each is
-- an object for the collector, with one more for each local it captures).
--@@ functions
local function corrupt(key, why)
  return redis.error_reply('QUOTA_CORRUPT key ' .. key .. ' is not a quota gateway state: ' .. why)
end
--@@ read

-- P: each level decided, 9 values (one flat table): its scope, the packed record, the TTL
-- it needs (ms from now; false: none), the units it deducted, its log (false: none), its
-- rule-set version, its policy, its name (false: not known, the fast path), its record key.
-- The records are written once the last level is decided, without their deduction when
-- it denied (what the in-process give-back leaves).
local P
if n == 1 then P = {false, false, false, false, false, false, false, false, false}
else
  P = {false, false, false, false, false, false, false, false, false, false, false, false, false,
    false, false, false, false, false, false, false, false, false, false, false, false, false, false}
end
local last, denied = 0, false
-- The caller's policy of the level, unpacked when it differs from the previous level's.
local spol, pkind, pcap, pm, pp, pg, pfs, pfn
for i = 1, n do
  local s = S[string.byte(kmap, i)]
  local j = s.j + 1
  s.j = j
  local pol = ARGV[1 + i]
  if cpos then units = sunpack('<i8', head, cpos + 8 * (i - 1)) end
  if pol ~= spol then
    spol = pol
    pkind, pcap, pm, pp, pg, pfs, pfn = sunpack(@policy_format(), pol)
  end
  -- The level's record: the stored one at place j when the stored entries start with the
  -- call's (then its version and policy are the caller's); else found by name (ri nil:
  -- none, a new record after the stored ones).
  local key, ri, name, ver, id, raw = s.key, j, false, version, pol, true
  if s.ents then
    name = (s.cn or lay_names(s))[j]
    ri = s.map[name]
    if ri then
      local e = s.ents[ri]
      ver, id = e[2], e[3]
    else
      raw = false
      s.ncnt = s.ncnt + 1
      ri = s.ncnt
      s.map[name] = ri
    end
  end
  s.lv[ri] = i
  -- The level's state: the stored one, or a fresh one under the caller's policy. same:
  -- its parameters are the caller's. tu + tl: tokens (units and micro-units in [0, 10^6))
  -- | the window's count (tl 0); c: the carry over p; (lsec, lns): the last time; du +
  -- dl: the debt; (fs, fn): the time to fill | the window.
  local kind, cap, m, p, g, fs, fn, tu, tl, c, lsec, lns, du, dl
  local same = true
  if not raw then
    kind, cap, m, p, g, fs, fn, tl, c, lsec, lns, du, dl = pkind, pcap, pm, pp, pg, pfs, pfn, 0,
      0, sec, ns, 0, 0
    if kind == 1 then tu = cap else tu = 0 end
  else
    tu, tl, c, lsec, lns, du, dl = sunpack(RF, s.raw, 11 + 34 * (ri - 1))
    -- (strings are interned: a pointer comparison)
    if id == pol then
      kind, cap, m, p, g, fs, fn = pkind, pcap, pm, pp, pg, pfs, pfn
    else
      same = false
      kind, cap, m, p, g, fs, fn = sunpack(@policy_format(), id)
      --@@ policy_check
    end
    --@@ state_check
  end
  if pkind >= 3 then windows() end  -- windows: the caller's rule is kind 3 or 4
  -- a log's events: a list beside the scope key, named after the level's record
  if kind == 3 or pkind == 3 then key = s.key .. '#' .. (name or (s.cn or lay_names(s))[j]) end
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
  local ok, took = 0, 0
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
  local wide = @wide(cap, fs, fn)
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
    denied = ok == 0 and string.byte(head, 53 + i) ~= 49
  elseif op == 114 then
    --@@ refund
  else
    --@@ charge
  end
  --@@ write
  if denied then break end
end
--@@ scopes
if att then attempt_close(att, res, att.last == 1 or denied, now_ms) end
return res
)lua";

namespace detail {

// kLuaMath without its first line, `local floor = math.floor` (the script declares that
// first: the attempt prelude's functions use it), then kLuaReach and the windows' maker.
inline std::string gateway_functions() {
  const std::string_view math = kLuaMath;
  const std::string_view floor = "\nlocal floor = math.floor\n";
  if (math.substr(0, floor.size()) != floor) lua_fail("kLuaMath does not start with floor");
  return std::string(math.substr(floor.size())) + kLuaReach + kGatewayWindowsFunctions;
}

// kGatewayLuaBody with the Lua of twin/gateway_settle.hpp and twin/gateway_write.hpp in
// place of its `--@@ name` lines (each line replaced, every one of a shared snippet),
// macros expanded.
inline std::string gateway_body() {
  std::string body = kGatewayLuaBody;
  const std::string functions = gateway_functions();
  const std::string attempts = gateway_attempt_prelude();
  for (const auto& [marker, text] :
       {std::pair<std::string_view, std::string_view>{"--@@ refund\n", kGatewayRefundLua},
        {"--@@ charge\n", kGatewayChargeLua},
        {"--@@ write\n", kGatewayWriteLua},
        {"--@@ scopes\n", kGatewayScopesLua},
        {"--@@ quick\n", kGatewayQuickLua},
        {"--@@ quick_one\n", kGatewayQuickOneLua},
        {"--@@ functions\n", functions},
        {"--@@ attempts\n", attempts},
        {"--@@ read\n", kGatewayReadLua}}) {
    body.replace(body.find(marker), marker.size(), text);
  }
  for (const auto& [marker, text] :
       {std::pair<std::string_view, std::string_view>{"--@@ reset\n", kGatewayResetLua},
        {"--@@ policy_check\n", kGatewayPolicyCheckLua},
        {"--@@ state_check\n", kGatewayStateCheckLua}}) {
    for (std::size_t at = body.find(marker); at != std::string::npos; at = body.find(marker)) {
      body.replace(at, marker.size(), text.substr(1));
    }
  }
  return expand_lua(body);
}

}  // namespace detail

// The whole script.
inline const std::string kGatewayLua = "local floor = math.floor\n" + detail::gateway_body();

}  // namespace quota::redis
