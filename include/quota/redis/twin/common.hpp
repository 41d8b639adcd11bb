// quota/redis/twin/common.hpp — the parts every policy's Lua twin shares.
//
// Each twin is kLuaMath + kLuaHead + its own body + kLuaTail, one script (the token
// bucket's also has kLuaReach). The shared contract (the
// store builds the arguments and parses the reply, redis_store.hpp):
//
// KEYS[1..n]       bucket keys (one hash slot: one tenant; distinct in a batch)
// KEYS[n+1]        attempt key, when ARGV[4] ~= '0'
// ARGV[1], ARGV[2] caller time (seconds, nanoseconds in [0, 1e9)), or '' and '' for the
//                  server's TIME
// ARGV[3]          TTL margin, ms
// ARGV[4]          attempt TTL, ms ('0': no attempt; '-1': a batch of independent
//                  decisions: each bucket deducted when it alone allows)
// ARGV[5]          attempt fingerprint (keys and costs; no newline; '' without an attempt)
// ARGV[6]          n
// ARGV[7]          k: 1 when every bucket has the same cost (sent once), else n
// ARGV[7+j]        cost j (j = 1..k); bucket i's cost is ARGV[8 + cstep·(i-1)] (the head
//                  sets `cstep`: 0 when k is 1, else 1)
// ARGV[8+k]        s: 1 when every bucket has the same parameters (sent once), else n
// ARGV[9+k+5(j-1)..] parameter set j: 5 values, the twin's own; bucket i uses set 1
//                  when s is 1, else set i. The head sets `pbase` and `pstep` so that
//                  bucket i's set starts at ARGV[pbase + pstep·(i-1)].
// (Each value sent costs the server about as much as a GET: a batch of one policy and
// one cost sends both once.)
// Reply: {replayed, time seconds, time nanoseconds, all allowed (1/0), then per bucket:
//         allowed (1/0: this bucket alone had enough), reason, remaining, retry_after ns
//         (-1 = never), reset_after ns (-1 = never)}. (The token bucket's twin answers a
//         call without an attempt in a compact form instead: twin/token_bucket.hpp.)
// Errors: "QUOTA_CORRUPT ..." (a key's state is not ours), "QUOTA_ATTEMPT_MISMATCH ...".
//
// The head (after kLuaMath) replays a stored attempt, reads the time into `sec`, `ns` and
// sets `n`, `margin`, `all`, and `seen`, `nwritten` and `fail` (a failed batch charges
// nothing). The body must fill `out` (the reply); a body that decides in two passes keeps
// its own scratch table. The tail stores the attempt's reply and returns `out`.
#pragma once
#include <cstdint>

#include "quota/policy/policy.hpp"

namespace quota::redis {

// Numbers from argument strings are read as `s + 0`: Lua 5.1 converts the string with one
// strtod, where tonumber(s) is a function call that converts it twice (a tenth of a
// one-bucket call's server time went to tonumber).
//
// Exact integer arithmetic in Lua doubles, for every script of quota: idiv (floor
// division and remainder of integers below 2^53: the quotient of a floating division is
// off by at most one, and one correction step fixes it) and int_in (an exact integer in
// [lo, hi]).
inline constexpr const char* kLuaMath = R"lua(
local floor = math.floor
local function idiv(a, b)
  local q = floor(a / b)
  local r = a - q * b
  if r < 0 then q = q - 1; r = r + b elseif r >= b then q = q + 1; r = r - b end
  return q, r
end
local function int_in(x, lo, hi)
  return x == x and x == floor(x) and x >= lo and x <= hi
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

inline constexpr const char* kLuaHead = R"lua(
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
local n = ARGV[6] + 0
local cstep, k = 1, n
if ARGV[7] == '1' then cstep, k = 0, 1 end
local pbase, pstep = 9 + k, 5
if ARGV[8 + k] == '1' then pstep = 0 end
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
local attempt_ttl = ARGV[4] + 0
local batch = attempt_ttl < 0
if attempt_ttl > 0 then
  local prev = redis.call('GET', KEYS[n + 1])
  if prev then
    local fp, rest = string.match(prev, '^(.-)\n(.*)$')
    if fp ~= ARGV[5] then
      return redis.error_reply('QUOTA_ATTEMPT_MISMATCH attempt id reused with another key or cost')
    end
    local out = {1}
    for v in string.gmatch(rest, '%S+') do out[#out + 1] = tonumber(v) end
    return out
  end
end
local sec, ns
if ARGV[1] == '' then
  local t = redis.call('TIME')
  sec = t[1] + 0
  ns = (t[2] + 0) * 1000
else
  sec = ARGV[1] + 0
  ns = ARGV[2] + 0
end
local margin = ARGV[3] + 0
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
-- Decision i's five reply fields, after the reply's four header fields.
local function put(out, i, ok, reason, rem, retry, reset)
  local k = 5 * i - 1
  out[k + 1] = ok; out[k + 2] = reason; out[k + 3] = rem; out[k + 4] = retry; out[k + 5] = reset
end
)lua";

inline constexpr const char* kLuaTail = R"lua(
if attempt_ttl > 0 then
  local parts = {}
  for i = 2, #out do parts[#parts + 1] = string.format('%.0f', out[i]) end
  redis.call('SET', KEYS[n + 1], ARGV[5] .. '\n' .. table.concat(parts, ' '), 'PX', attempt_ttl)
end
return out
)lua";

// State format versions. Every twin's state carries a format version in bits that no
// valid field value uses (each twin names them at its state): this release's format is
// version 0, those bits zero, so the range checks every reader already makes reject any
// other version as QUOTA_CORRUPT at no cost. The rule for each later format: a reader of
// version k reads k and k-1 (rewriting k-1 as k on its next write) and rejects anything
// else as QUOTA_CORRUPT (kDataLoss naming the key, nothing charged). A format whose
// version no longer fits its bits changes the state's length, which every earlier reader
// rejects (the length is checked before anything else).

// 2^53: Lua numbers (doubles) hold every integer below it exactly.
inline constexpr std::int64_t kLuaExact = std::int64_t{1} << 53;
// The longest time to fill a bucket the Lua twin handles: 9·10^6 s (~104 days).
inline constexpr std::int64_t kMaxFillNs = 9'000'000'000'000'000;

// The Lua twin of a policy: its script, its parameters as script arguments, and the
// range in which the script is exact. Specialized per policy.
template <Policy P>
struct LuaTwin;

}  // namespace quota::redis
