// quota/redis/twin/gateway_windows.hpp — the sliding log and the window estimate as
// gateway rules in Redis: their part of the gateway twin (twin/gateway.hpp).
//
// kGatewayWindowsLua holds, as functions of the state fields and the policy, what the
// two kinds do to a level: bring it to the call's time, the remaining budget, decide,
// refund, and (the log) keep its events. They are made by windows() the first time a
// script call meets kind 3 or 4 (kGatewayWindowsFunctions, spliced before the gateway
// script's body), so a call of token buckets and fixed windows only makes no closure
// for them. The gateway's loop
// calls them from its dispatch points (marked "windows" there) and does the rest —
// rule changes, debt, shadow, the TTL — as for its other kinds, so each kind is
// bit-identical to KeyState (gateway/key_state.hpp, gateway/rules/rule_kinds.hpp). The
// arithmetic is the RedisStore twins': the estimate's est_* macros and kLuaEstimateMath
// (twin/sliding_window_estimate.hpp, twin/lua_macros.hpp), the log's kLuaLogEvents
// (twin/sliding_log.hpp). Immutable text: thread-safe.
//
// Fields, in the gateway's record (34 bytes, twin/gateway.hpp) and policy argument (35):
//   kind 4, the estimate: tu = cur, c = prev (both <= limit), tl = 0; the policy's m = w
//     and p = mode of the window grid (twin/fixed_window.hpp's), g = windows per second
//     (mode 1; 0 in mode 2), (fs, fn) = W, below 2^52 ns;
//   kind 3, the log: tu = used (the units its events hold), tl = c = 0; m = W ns (at most
//     9·10^15), p = g = 0, (fs, fn) = W. Its events are a LIST at its scope key .. '#'
//     .. its name .. '}l' (`key` below; in the same slot), 24-byte
//     events '<ddd' oldest
//     first, one per script call that counts units: what one call counts at its time (a
//     rule change's units, paid debt, the cost) is one event, as events of one time
//     decide, leave and are refunded alike however they are split.
//
// A log level's table `lg` (log_load) says what its list needs when written
// (log_write): `reset` (delete it: a fresh key, a rule change), `drop` (events that have
// left, trimmed), `base` (the units the list holds; tu − base are pushed as one event at
// the last time), `len` and the newest event's time (ts, tn). A refund rewrites the list
// at once (log_take_back, O(live events)). The list's TTL is the record's plus 1 ms (no
// TTL when the record has none), so the record never outlives its events; a record
// without its list (used > 0) is QUOTA_CORRUPT, a list without its record is deleted.
#pragma once

#include <string>

#include "quota/redis/twin/sliding_log.hpp"
#include "quota/redis/twin/sliding_window_estimate.hpp"

namespace quota::redis {

inline constexpr const char* kGatewayWindowsLua = R"lua(
local function win_corrupt(key, why)
  error(redis.error_reply('QUOTA_CORRUPT key ' .. key .. ' is not a quota gateway state: ' .. why))
end
-- A stored policy of kind 3 or 4 is well formed (its capacity is checked by the caller).
win_policy_ok = function(kind, m, p, g, fs, fn)
  if kind == 3 then
    return p == 0 and g == 0 and m >= 1 and m <= 9000000000000000 and fs * 1000000000 + fn == m
  end
  return kind == 4 and m >= 1 and ((p == 1 and fs * 1000000000 + fn == m and m * g == 1000000000) or
    (p == 2 and g == 0 and fs == m and fn == 0 and m <= 4500000))
end
win_state_ok = function(kind, cap, tu, tl, c)
  return tu >= 0 and tu <= cap and tl == 0 and ((kind == 3 and c == 0) or (kind == 4 and c <= cap))
end
-- The estimate's counters (cur, prev) brought from (lsec, lns) to the later (sec, ns).
est_advance = function(m, p, g, cur, prev, sec, ns, lsec, lns)
  local mode, w, per = p, m, g
  @window_start(local st, sec, ns)
  local idx = st / w
  local d
  @window_gap(d, idx, sec, lsec, lns)
  @est_roll(d, cur, prev)
  return cur, prev
end
local function est_offset(m, p, lsec, lns)
  local mode, w, el = p, m, 0
  @offset(el, lsec, lns)
  return el
end
-- The remaining whole units of a window kind's state (2, 3: limit − count; 4: estimated).
win_room = function(kind, cap, m, p, fs, fn, tu, c, lsec, lns)
  if kind ~= 4 then return cap - tu end
  local W, el = fs * 1000000000 + fn, est_offset(m, p, lsec, lns)
  @est_remaining(local rem, tu, c, cap, W, el)
  return rem
end
-- Decides `units` (1 <= units <= cap) on kind 3 or 4: ok (1/0), the new count, retry ns.
-- A log's excess not held by its listed events is in the units counted at this call's
-- time (not listed yet), which leave a whole window later.
win_decide = function(kind, cap, m, p, fs, fn, tu, c, lsec, lns, units, lg, key)
  if kind == 4 then
    local W, el = fs * 1000000000 + fn, est_offset(m, p, lsec, lns)
    @est_fits(local fits, tu, c, units, cap, W, el)
    if fits then return 1, tu + units, 0 end
    local retry
    @est_retry(retry, tu, c, units, cap, W, el)
    return 0, tu, retry
  end
  if units <= cap - tu then return 1, tu + units, 0 end
  local len = lg.len
  if lg.reset then len = 0 end
  local retry = log_room(key .. '}l', lg.drop, lg.drop + len, tu + units - cap, lsec, lns, m)
  if retry == nil then retry = m end
  return 0, tu, retry
end
-- The estimate's refund of up to `give` units spent at (ssec, sns) (`all`: at the last
-- time): off cur in the last time's window, off prev in the one before; returns cur,
-- prev and the units given back.
est_refund = function(m, p, g, cur, prev, give, all, ssec, sns, lsec, lns)
  local d = 0
  if not all then
    local mode, w, per = p, m, g
    @window_start(local st, lsec, lns)
    local idx = st / w
    @window_gap(d, idx, lsec, ssec, sns)
  end
  local back = 0
  if d == 0 then
    back = cur
    if back > give then back = give end
    cur = cur - back
  elseif d == 1 then
    back = prev
    if back > give then back = give end
    prev = prev - back
  end
  return cur, prev, back
end
-- The time from the last time until the state equals a fresh one (rs s, rn ns).
-- (The loop keeps no fs, fn for a level decided before the last: W is formed from m, p.)
win_reset = function(kind, m, p, tu, c, lsec, lns, lg)
  if kind == 4 then
    local W, el = m, est_offset(m, p, lsec, lns)
    if p ~= 1 then W = m * 1000000000 end
    @est_reset(local reset, tu, c, W, el)
    return 0, reset
  end
  if tu == 0 then return 0, 0 end
  if tu > lg.base then return 0, m end
  return 0, m - age(lsec, lns, lg.ts, lg.tn, m)
end
-- A log's list (`fresh`: the key had no record, so a list left there is not its own):
-- the events that have left at the last time (lsec, lns), the live ones, the newest.
-- Returns lg and the units still counted.
log_load = function(key, lsec, lns, w, used, fresh)
  -- (a fresh key's list is replaced: it holds nothing of the units counted, tu)
  local lg = {reset = fresh, drop = 0, len = 0, base = 0}
  if fresh then return lg, used end
  local lkey = key .. '}l'
  local len = redis.pcall('LLEN', lkey)
  if type(len) == 'table' then win_corrupt(lkey, 'not an event list') end
  lg.drop, used = log_expired(lkey, len, lsec, lns, w, used)
  lg.len, lg.base = len - lg.drop, used
  if used < 0 or (lg.len == 0 and used ~= 0) then win_corrupt(key, 'used does not match the events') end
  if lg.len > 0 then lg.ts, lg.tn = event(redis.call('LINDEX', lkey, -1), lkey) end
  return lg, used
end
-- A rule change to or from a log: the list is replaced by what the new state counts.
log_reset = function(lg)
  lg = lg or {}
  lg.reset, lg.drop, lg.len, lg.base = true, 0, 0, 0
  return lg
end
-- SlidingLog::take_back: up to `give` units of the newest events logged at or before
-- (ssec, sns) (`all`: every event) un-logged, newest first; the list rewritten at once.
-- Returns the units given back.
log_take_back = function(key, lg, give, all, ssec, sns)
  if give <= 0 or lg.reset or lg.len == 0 then return 0 end
  local lkey = key .. '}l'
  local raw = redis.call('LRANGE', lkey, lg.drop, -1)
  local es, en, ec, k = {}, {}, {}, 0
  for i = 1, #raw do
    es[i], en[i], ec[i] = event(raw[i], lkey)
    if all or es[i] < ssec or (es[i] == ssec and en[i] <= sns) then k = i end
  end
  local back = 0
  for i = k, 1, -1 do
    if back == give then break end
    local x = ec[i]
    if x > give - back then x = give - back end
    ec[i] = ec[i] - x
    back = back + x
  end
  if back == 0 then return 0 end
  redis.call('DEL', lkey)
  local kept = {}
  for i = 1, #raw do
    if ec[i] > 0 then
      kept[#kept + 1] = struct.pack('<ddd', es[i], en[i], ec[i])
      lg.ts, lg.tn = es[i], en[i]
    end
  end
  for i = 1, #kept, 1000 do
    local j = i + 999
    if j > #kept then j = #kept end
    redis.call('RPUSH', lkey, unpack(kept, i, j))
  end
  lg.drop, lg.len = 0, #kept
  return back
end
-- Writes a log level's list as its state `kind`, count tu at (lsec, lns) needs it; px:
-- the record's TTL (ms), nil for none.
log_write = function(key, lg, kind, tu, lsec, lns, px)
  local lkey = key .. '}l'
  if lg.reset or kind ~= 3 then
    redis.call('DEL', lkey)
    if kind ~= 3 then return end
  elseif lg.drop > 0 then
    redis.call('LTRIM', lkey, lg.drop, -1)
  end
  local len = lg.len
  if lg.reset then len = 0 end
  if tu > lg.base then
    redis.call('RPUSH', lkey, struct.pack('<ddd', lsec, lns, tu - lg.base))
    len = len + 1
  end
  if len > 0 then
    if px then redis.call('PEXPIRE', lkey, px + 1) else redis.call('PERSIST', lkey) end
  end
end
)lua";

// The functions' names, and windows(), which makes them (with kLuaEstimateMath's and
// kLuaLogEvents' as its locals) the first time a call meets kind 3 or 4: a call without
// them makes no closure. It returns true (for use inside an expression).
inline constexpr const char* kGatewayWindowsMake = R"lua(
local win_policy_ok, win_state_ok, est_advance, win_room, win_decide, est_refund, win_reset
local log_load, log_reset, log_take_back, log_write
local function windows()
if win_room then return true end
)lua";

// The whole text, after kLuaMath (twin/common.hpp), macros expanded.
inline const std::string kGatewayWindowsFunctions =
    std::string(kGatewayWindowsMake) + kLuaEstimateMath + kLuaLogEvents +
    detail::expand_lua(kGatewayWindowsLua) + "return true\nend\n";

}  // namespace quota::redis
