// quota/redis/twin/sliding_log.hpp — the Lua twin of quota::SlidingLog.
//
// kSlidingLogLua decides one or more logs of one tenant in one script call,
// bit-identical to SlidingLog::apply (include/quota/policy/sliding_log.hpp): the admitted
// (time, cost) events still in the window (t − W, t]; a request admitted iff used + cost
// <= limit; a denial's retry_after is when the oldest events holding the excess have
// left. LuaTwin<SlidingLog> is its C++ codec: the exact range (params) and the arguments
// (script_cost, pack_params); the call layout, the reply and attempts are
// twin/common.hpp's and twin/call.hpp's.
//
// Guarantees: for every policy params() accepts (W <= 9·10^15 ns, ~104 days) the
// decisions equal the C++ policy's; a key holds a 24-byte meta and a list of at most
// `limit` live events, both expiring at reset_after plus the margin; a corrupt key fails
// the whole call with QUOTA_CORRUPT before anything is written. Thread safety: the
// constants are immutable text, LuaTwin's functions are pure; Redis runs each script call
// with nothing interleaved.
//
//   const SlidingLog sl{.limit = 100, .window = 1min};
//   const BucketRequest<SlidingLog> req{&sl, "{acme}read", 1};
//   auto call = build_call(CallOptions{}, std::span(&req, 1), Nanos{0}, {});
//   // EVALSHA <sha of kSlidingLogLua> 1 call->keys[0] call->args..., then parse_reply
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "quota/policy/sliding_log.hpp"
#include "quota/redis/twin/common.hpp"
#include "quota/redis/twin/range.hpp"
#include "quota/redis/twin/skeleton.hpp"

namespace quota::redis {

// The log's events in Lua, shared with the gateway's twin (twin/gateway_windows.hpp).
// Needs kLuaMath. An event is '<ddd' (seconds, nanoseconds, cost), 24 bytes, oldest
// first in the list; a malformed one fails the call with QUOTA_CORRUPT naming the list
// (raised: nothing after it runs). int_in(x, lo, hi): x an exact integer in [lo, hi].
// age: s1 + n1 − (s2 + n2) ns, formed only below 9·10^6 s + 1 s (beyond, w: it has surely
// left). log_expired: how many of the `len` events at the head have left the window w at
// (lsec, lns), and `used` less their costs (read in growing chunks: usually none or one
// has left). log_room: the time until the oldest events in [from, stop) holding `excess`
// units have left the window; nil when they hold less.
inline constexpr const char* kLuaLogEvents = R"lua(
local function int_in(x, lo, hi)
  return x == x and x == floor(x) and x >= lo and x <= hi
end
local function age(s1, n1, s2, n2, w)
  local dsec = s1 - s2
  if dsec > 9000001 then return w end
  return dsec * 1000000000 + (n1 - n2)
end
local function event(raw, lkey)
  if type(raw) == 'string' and #raw == 24 then
    local es, en, ec = struct.unpack('<ddd', raw)
    if int_in(es, -1e12, 1e12) and int_in(en, 0, 999999999) and int_in(ec, 1, 9007199254740991) then
      return es, en, ec
    end
  end
  error(redis.error_reply('QUOTA_CORRUPT key ' .. lkey .. ': malformed event'))
end
local function log_expired(lkey, len, lsec, lns, w, used)
  local drop, step, live = 0, 1, false
  while not live and drop < len do
    local chunk = redis.call('LRANGE', lkey, drop, drop + step - 1)
    if #chunk == 0 then break end
    for j = 1, #chunk do
      local es, en, ec = event(chunk[j], lkey)
      if age(lsec, lns, es, en, w) < w then live = true; break end
      drop = drop + 1
      used = used - ec
    end
    if step < 256 then step = step * 8 end
  end
  return drop, used
end
local function log_room(lkey, from, stop, excess, lsec, lns, w)
  local acc = 0
  while from < stop do
    local to = from + 63
    if to >= stop then to = stop - 1 end
    local chunk = redis.call('LRANGE', lkey, from, to)
    if #chunk == 0 then return nil end
    for j = 1, #chunk do
      local es, en, ec = event(chunk[j], lkey)
      acc = acc + ec
      if acc >= excess then return w - age(lsec, lns, es, en, w) end
    end
    from = from + 64
  end
  return nil
end
)lua";

// The script's body (after kLuaMath, kLuaHead of twin/common.hpp and kLuaLogEvents; its
// macros expanded).
//
// Storage, per key (both in the tenant's slot: the suffix follows the hash tag):
//   KEYS[i]          meta: 24 bytes, struct-packed doubles (last seconds, last
//                    nanoseconds, used = the costs of the logged events);
//   KEYS[i] .. '}l'  a LIST of events, oldest first, 24 bytes each (seconds,
//                    nanoseconds, cost). No valid bucket key ends in '}', so the list
//                    never collides with another bucket. (The list key is derived here
//                    rather than passed in KEYS; it is in the same slot, which is what
//                    Redis Cluster checks.)
// Format version (twin/common.hpp): the meta's nanoseconds carry it as a multiple of 2^30
// (version 0: none; the range check int_in(lns, 0, 999999999) rejects any other); the
// events follow their meta's version.
//
// Expired events are trimmed from the head (amortized O(1)); a denial scans from the
// first live event until the excess is covered (O(events that must leave)). The first
// pass over the buckets only reads (a corrupt bucket fails the call before anything is
// written); the second writes.
//
// Exactness. Times are two limbs (seconds, nanoseconds); the age last − e of an event is
// formed only when it is below 9·10^6 s + 1 s (beyond that it has surely left). Costs
// and `used` are <= kMaxUnits < 2^44.
inline constexpr const char* kSlidingLogLuaBody = R"lua(
local st = {} -- each bucket's decision: the first pass reads and decides, the second writes
for i = 1, n do
  local cost = cost1
  if cstep ~= 0 then cost = ARGV[cbase + i - 1] + 0 end
  local limit, w = struct.unpack('<i8i8', ARGV[2 + pstep * (i - 1)])
  local key = KEYS[i]
  local lkey = key .. '}l'
  local raw, corrupt = read_state(key, 'log', 24)
  if corrupt then return corrupt end
  local lsec, lns, used
  if raw then
    lsec, lns, used = struct.unpack('<ddd', raw)
    if not (int_in(lsec, -1e12, 1e12) and int_in(lns, 0, 999999999) and
            int_in(used, 0, 9007199254740991)) then
      return redis.error_reply('QUOTA_CORRUPT key ' .. key .. ': field out of range')
    end
  else
    lsec, lns, used = sec, ns, 0
  end
  -- failover safety (kLuaNodeGuard): a log older than the failover, or none, is read as
  -- SlidingLog::exhausted(failover time): one event of `limit` units then
  local spent = false
  @if_spent(raw, lsec, lns)
    spent = true
    lsec, lns, used = fsec, fns, limit
  end
  local len = redis.pcall('LLEN', lkey)
  if type(len) == 'table' then
    return redis.error_reply('QUOTA_CORRUPT key ' .. lkey .. ' is not a quota event list')
  end
  if sec > lsec or (sec == lsec and ns > lns) then lsec, lns = sec, ns end
  local drop, live = 0, false
  if spent then
    -- the log is that one event until it leaves the window (the list is replaced below)
    len, live = 1, true
    if age(lsec, lns, fsec, fns, w) >= w then len, used = 0, 0 end
  end
  -- The first `drop` events have left the window. They are only counted here and trimmed
  -- in the second pass: a later bucket of this call may be corrupt, and a failed call
  -- changes nothing.
  if not live then drop, used = log_expired(lkey, len, lsec, lns, w, used) end
  len = len - drop
  if used < 0 or (len == 0 and used ~= 0) then
    return redis.error_reply('QUOTA_CORRUPT key ' .. key .. ': used does not match the events')
  end
  @decide(limit, cost <= limit - used)
  if reason == 1 and spent then retry = w - age(lsec, lns, fsec, fns, w) end
  if reason == 1 and not spent then
    retry = log_room(lkey, drop, drop + len, used + cost - limit, lsec, lns, w)
    if retry == nil then
      return redis.error_reply('QUOTA_CORRUPT key ' .. key .. ': used exceeds the events')
    end
  end
  if ok == 0 then all = 0 end
  st[i] = {key, lkey, lsec, lns, used, len, cost, ok, reason, retry, limit, w, drop, spent}
end
-- (sized for one log's reply: a table that grows is resized; put fills 5..9)
local out = {0, sec, ns, all, 0, 0, 0, 0, 0}
for i = 1, n do
  local s = st[i]
  local lkey, lsec, lns, used, len, w = s[2], s[3], s[4], s[5], s[6], s[12]
  if s[13] > 0 then redis.call('LTRIM', lkey, s[13], -1) end
  if s[14] then
    redis.call('DEL', lkey)
    if len > 0 then redis.call('RPUSH', lkey, struct.pack('<ddd', fsec, fns, s[11])) end
  end
  if all == 1 or (batch and s[8] == 1) then
    redis.call('RPUSH', lkey, struct.pack('<ddd', lsec, lns, s[7]))
    used = used + s[7]
    len = len + 1
  end
  local reset = 0
  if len > 0 then
    local es, en = event(redis.call('LINDEX', lkey, -1), lkey)
    reset = w - age(lsec, lns, es, en, w)
  end
  @ceil_ms(local ms, reset)
  ms = ms + margin
  redis.call('SET', s[1], struct.pack('<ddd', lsec, lns, used), 'PX', ms)
  if len > 0 then redis.call('PEXPIRE', lkey, ms) end
  local rem = s[11] - used
  if rem < 0 then rem = 0 end
  put(out, i, s[8], s[9], rem, s[10], reset)
end
)lua";

// The whole script.
inline const std::string kSlidingLogLua = std::string(kLuaMath) + kLuaHead + kLuaPut +
                                          kLuaLogEvents + detail::expand_lua(kSlidingLogLuaBody) +
                                          kLuaTail;

template <>
struct LuaTwin<SlidingLog> : TwinScript<kSlidingLogLua> {
  struct Params {};

  static absl::StatusOr<Params> params(const SlidingLog& sl) {
    if (auto s = sl.validate(); !s.ok()) return s;
    if (sl.window.count() > kMaxFillNs) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "window=%d ns: the Redis store's bound is %d ns (~104 days), so that event ages "
          "are exact in Lua",
          sl.window.count(), kMaxFillNs));
    }
    return Params{};
  }

  // The cost as sent (window_cost).
  static std::int64_t script_cost(const SlidingLog& sl, std::int64_t cost) {
    return window_cost(sl.limit, cost);
  }

  // The parameter set as one argument, '<i8i8': limit, W ns.
  static std::string pack_params(const SlidingLog& sl, const Params&) {
    std::string out;
    for (std::int64_t v : {sl.limit, static_cast<std::int64_t>(sl.window.count())}) {
      detail::pack_le(out, v, 8);
    }
    return out;
  }
};

}  // namespace quota::redis
