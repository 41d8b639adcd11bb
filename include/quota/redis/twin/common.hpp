// quota/redis/twin/common.hpp — the parts every policy's Lua twin shares: the call
// layout, the reply, exact integer helpers and the state format version rule.
//
// Each RedisStore twin is one script: kLuaMath, its helpers (kLuaReach, kLuaPut), kLuaHead,
// its body, kLuaTail. The token bucket, fixed window and window estimate share one body,
// kLuaLoop, and fill in its sections with their transitions (detail::loop_script); their
// Lua text, and the sliding log's and the gateway's, names the shared arithmetic as
// macros (`@mod(...)`, twin/lua_macros.hpp), spliced in when the script is built. twin/call.hpp
// builds the keys and arguments below and parses the reply; a script runs atomically on the server
// (nothing interleaves), so a call's buckets are read, decided and written as one step. The Lua
// constants are pure text, the C++ helpers pure functions: thread-safe.
//
// KEYS[1..n]  bucket keys (one hash slot: one tenant; distinct in a batch)
// KEYS[n+1]   attempt key, when the attempt TTL is above 0
// ARGV[1]     the head, struct-packed '<BBBi8I4i8i8I4i8': caller time (bit 0: 1) or the
//             server's TIME (0), plus 2 with the node argument (kLuaNodeGuard); costs vary (1: one
//             per bucket, below) or not (0); parameter sets vary (1) or not (0); the caller's time
//             (seconds, nanoseconds in [0, 1e9)); TTL margin, ms; attempt TTL, ms (0: no attempt;
//             -1: a batch of independent decisions, each deducted when it alone allows); n; the
//             cost shared by every bucket
// ARGV[2..]   the parameter sets, one packed string each (the twin's pack_params): one
//             when they do not vary, else n; then, when the costs vary, n decimal costs;
//             then, with an attempt, its fingerprint (keys and costs; no newline); last,
//             with the node argument, the node's guards (kLuaNodeGuard)
// Reply: {replayed, time seconds, time nanoseconds, all allowed (1/0), then per bucket:
//         allowed (1/0: this bucket alone had enough), reason, remaining, retry_after ns
//         (-1 = never), reset_after ns (-1 = never)}, a duration past 2^53 ns as its
//         decimal string (Lua numbers are doubles); the token bucket's twin answers a
//         call without an attempt in a compact form (twin/token_bucket.hpp).
// Errors: "QUOTA_CORRUPT ..." (a key's state is not ours), "QUOTA_ATTEMPT_MISMATCH ...",
// "QUOTA_CLOCK_AHEAD ..." (kLuaNodeGuard).
//
// The head replays a stored attempt and sets `sec`, `ns` (the time), `n`, `margin`,
// `server`, `fsec`, `fns` (the failover time, kLuaNodeGuard), `batch`, `cost1`, `cstep`, `pstep`,
// `cbase`, `all`, and `seen`, `nwritten` and `fail` (a failed batch charges nothing). The body
// fills `out` (the reply); the tail stores an attempt's reply and returns `out`.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_format.h"
#include "quota/policy/policy.hpp"
#include "quota/units.hpp"

namespace quota::redis {

// Numbers from decimal strings (TIME's reply, varying costs) are read as `s + 0`: Lua
// 5.1 converts the string with one strtod, where tonumber(s) is a function call that
// converts it twice.
//
// Exact integer arithmetic in Lua doubles, for every script of quota: idiv, the floor
// division and remainder of integers below 2^53 (the quotient of a floating division is
// off by at most one, and one correction step fixes it).
inline constexpr const char* kLuaMath = R"lua(
local floor = math.floor
local function idiv(a, b)
  local q = floor(a / b)
  local r = a - q * b
  if r < 0 then q = q - 1; r = r + b elseif r >= b then q = q + 1; r = r - b end
  return q, r
end
)lua";

// The token bucket's time to reach `need` micro-units from `tokens` with the carried
// remainder c (over p), at m/p micro-units per ns: ceil((need − tokens)·p − c) / m)
// nanoseconds, split so that no product reaches 2^53 (twin/token_bucket.hpp); 0 when
// already there, -1 (never) at rate 0. Needs kLuaMath.
inline constexpr const char* kLuaReach = R"lua(
local function reach(tokens, c, need, m, p)
  if tokens >= need then return 0 end
  if m == 0 then return -1 end
  -- idiv inlined (this runs for every decision): x % m is x - floor(x / m) * m, off by at
  -- most m, corrected in one step; then (x - r) / m is an exact quotient.
  local d = need - tokens
  if p == 1 and c == 0 then
    -- ceil(d / m): the general case below with nothing carried (a whole rate per ns)
    local r = d % m
    if r < 0 then r = r + m elseif r >= m then r = r - m end
    if r > 0 then return (d - r) / m + 1 end
    return d / m
  end
  local b = d % m
  if b < 0 then b = b + m elseif b >= m then b = b - m end
  local a = (d - b) / m
  local y = b * p - c
  if y > 0 then
    local r = y % m
    if r < 0 then r = r + m elseif r >= m then r = r - m end
    if r > 0 then return a * p + (y - r) / m + 1 end
    return a * p + y / m
  end
  y = -y
  local r = y % m
  if r < 0 then r = r + m elseif r >= m then r = r - m end
  return a * p - (y - r) / m
end
)lua";

// An attempt's stored reply, in every script that keeps one (kLuaHead and kLuaTail, the
// gateway's twin/gateway_attempts.hpp): record_text(out, from) writes out[from..#out],
// integers, as decimals separated by spaces; record_read(text, out) appends them to `out`
// again. It assigns the two locals the script declares, where `@record` stands
// (detail::with_record), only in a call that has an attempt: others create no closure.
inline constexpr const char* kLuaRecord = R"lua(
record_text = function(out, from)
  local parts = {}
  for i = from, #out do
    local v = out[i]
    if type(v) ~= 'string' then v = string.format('%.0f', v) end
    parts[#parts + 1] = v
  end
  return table.concat(parts, ' ')
end
-- (a value past 2^53 stays a decimal string, in the record and in the reply: a double
-- would round it; the C++ readers take either form)
record_read = function(text, out)
  for v in string.gmatch(text, '%S+') do
    if #v > 15 then out[#out + 1] = v else out[#out + 1] = tonumber(v) end
  end
  return out
end
)lua";

// The node's guards (transport/node_watch.hpp), in every script's head right after the
// time is read (`sec`, `ns`), before any state: when bit 1 of the head's first byte
// (`caller`) is set, the call's last argument, appended by Script, is '<i8I4i8I4': the
// node's failover time (fsec, fns; nil when none: -1 s) and a bound on TIME (-1 s: none).
// A TIME past the bound is a forward step of the server's clock: the call is refused,
// nothing read or written. A twin reads a state older than (fsec, fns), or a missing one,
// as its policy's exhausted(fsec, fns) (`failover safety`).
inline constexpr const char* kLuaNodeGuard = R"lua(local fsec, fns
if caller >= 2 then
  local bs, bn
  fsec, fns, bs, bn = struct.unpack('<i8I4i8I4', ARGV[#ARGV])
  if bs >= 0 and (sec > bs or (sec == bs and ns > bn)) then
    return redis.error_reply(string.format('QUOTA_CLOCK_AHEAD server TIME %.0f.%09.0f s is ' ..
      'past %.0f.%09.0f s, the latest agreeing TIME plus the client\'s monotonic time since ' ..
      'plus the tolerance: refused, nothing read or written', sec, ns, bs, bn))
  end
  if fsec < 0 then fsec = nil end
end)lua";

namespace detail {

// `lua` with kLuaRecord in place of its `@record`.
inline std::string with_record(std::string lua) {
  lua.replace(lua.find("@record"), 7, kLuaRecord);
  return lua;
}

// `lua` with kLuaNodeGuard in place of its `@node_guard()`.
inline std::string with_guard(std::string lua) {
  lua.replace(lua.find("@node_guard()"), 13, kLuaNodeGuard);
  return lua;
}

}  // namespace detail

inline const std::string kLuaHead = detail::with_guard(detail::with_record(R"lua(
local record_text, record_read
-- A key's packed state: nil when the key does not exist; an error reply (second value)
-- when it holds anything but `bytes` bytes of a twin's state. Allocates nothing.
local function read_state(key, what, bytes)
  local raw = redis.pcall('GET', key)
  if type(raw) == 'table' then
    return nil, redis.error_reply('QUOTA_CORRUPT key ' .. key .. ' is not a quota ' .. what)
  end
  if raw and #raw ~= bytes then
    return nil, redis.error_reply('QUOTA_CORRUPT key ' .. key .. ': state is ' .. #raw ..
      ' bytes, expected ' .. bytes)
  end
  return raw
end
-- The call's head (ARGV[1], one packed string: a single struct.unpack where decimal
-- arguments would each cost an argument and a conversion): whether the time is the
-- caller's, whether the costs and the parameter sets vary per bucket (cstep, pstep: 0 or
-- 1), the caller's time, the TTL margin, the attempt TTL, n and the shared cost.
local caller, cstep, pstep, sec, ns, margin, attempt_ttl, n, cost1 =
  struct.unpack('<BBBi8I4i8i8I4i8', ARGV[1])
local server = caller % 2 == 0
-- bucket i's parameter set is ARGV[2 + pstep·(i-1)], its cost (when they vary)
-- ARGV[cbase + i - 1]; the attempt's fingerprint is ARGV[fpi]
local cbase = 3 + pstep * (n - 1)
local fpi = cbase + cstep * n
-- The states of KEYS[1..n], read at once: one MGET for several keys (a call costs the
-- server about as much as a decision's arithmetic; the keys of one call are distinct: the
-- store starts a new call at a repeated key). MGET answers nil also for a key holding
-- another type, so each such key is looked at again (read_state) before anything is
-- written. The values (false for a key that does not exist; for one key, GET's reply, an
-- error table for another type), or nil and the QUOTA_CORRUPT error.
local function read_states(what, bytes)
  if n == 1 then return {redis.pcall('GET', KEYS[1])} end
  local raws
  if n <= 4000 then
    raws = redis.call('MGET', unpack(KEYS, 1, n))
  else
    -- in slices: Lua unpacks at most about 8,000 values onto its stack
    raws = {}
    for lo = 1, n, 4000 do
      local part = redis.call('MGET', unpack(KEYS, lo, math.min(lo + 3999, n)))
      for j = 1, #part do raws[lo + j - 1] = part[j] end
    end
  end
  for i = 1, n do
    if not raws[i] then
      local _, corrupt = read_state(KEYS[i], what, bytes)
      if corrupt then return nil, corrupt end
    end
  end
  return raws
end
local batch = attempt_ttl < 0
if attempt_ttl > 0 then
@record
  local prev = redis.call('GET', KEYS[n + 1])
  if prev then
    local fp, rest = string.match(prev, '^(.-)\n(.*)$')
    if fp ~= ARGV[fpi] then
      return redis.error_reply('QUOTA_ATTEMPT_MISMATCH attempt id reused with another key or cost')
    end
    return record_read(rest, {1})
  end
end
if server then
  local t = redis.call('TIME')
  sec = t[1] + 0
  ns = (t[2] + 0) * 1000
end
@node_guard()
local all = 1
-- A batch writes each bucket as soon as it is decided. A corrupt state found after some
-- were written fails the call, and `fail` first puts those back as they were read, so
-- that a failed call charges nothing: a twin keeps `seen[i]` (bucket i's state as read,
-- false when the key was missing; the twin creates the table) and `nwritten` (buckets
-- 1..nwritten written).
local seen, nwritten = nil, 0
local function fail(err)
  for j = 1, nwritten do
    if seen[j] then redis.call('SET', KEYS[j], seen[j], 'KEEPTTL') else redis.call('DEL', KEYS[j]) end
  end
  return err
end
)lua"));

// put(out, i, ...): decision i's five reply fields, after the reply's four header fields
// (after kLuaHead, in the twins that answer in the full form only; the token bucket's
// writes them inline, sparing a closure per call).
inline constexpr const char* kLuaPut = R"lua(
local function put(out, i, ok, reason, rem, retry, reset)
  local k = 5 * i - 1
  out[k + 1] = ok; out[k + 2] = reason; out[k + 3] = rem; out[k + 4] = retry; out[k + 5] = reset
end
)lua";

inline constexpr const char* kLuaTail = R"lua(
if attempt_ttl > 0 then
  redis.call('SET', KEYS[n + 1], ARGV[fpi] .. '\n' .. record_text(out, 2), 'PX', attempt_ttl)
end
return out
)lua";

// State format versions. Every twin's state carries a format version in bits that no
// valid field value uses (each twin names them at its state): this release's formats are
// version 1 for the token bucket and the gateway (tokens and debt in two limbs) and 0 for
// the others, and the range checks every reader already makes reject any other version
// as QUOTA_CORRUPT. The rule for each later format: a reader of version k reads k and k-1
// (rewriting k-1 as k on its next write) and rejects anything else as QUOTA_CORRUPT
// (kDataLoss naming the key, nothing charged); a version no release wrote needs no
// reader. A format whose
// version no longer fits its bits changes the state's length, which every earlier reader
// rejects (the length is checked before anything else).

// The Lua twin of a policy: its script, its parameters as script arguments, and the
// range in which the script is exact. Specialized per policy.
template <Policy P>
struct LuaTwin;

// What every LuaTwin<P> derives from: its whole script (`Text`, built once at static
// initialization), by which Script (transport/script.hpp) loads and calls it.
template <const std::string& Text>
struct TwinScript {
  static const std::string& script() { return Text; }
};

namespace detail {

// Appends the low `bytes` bytes of v, little-endian: the script reads them with
// struct.unpack ('i8', 'I4', 'B': two's complement, so a negative value reads back as
// itself in a signed field).
inline void pack_le(std::string& out, std::int64_t v, int bytes) {
  const auto u = static_cast<std::uint64_t>(v);
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((u >> (8 * i)) & 0xff));
}

}  // namespace detail

}  // namespace quota::redis
