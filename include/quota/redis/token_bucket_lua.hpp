// quota/redis/token_bucket_lua.hpp — the Lua twin of quota::TokenBucket.
//
// One EVALSHA runs read–refill–decide–deduct–write for one or more buckets of one
// tenant atomically (Redis runs a script with nothing interleaved), bit-identical to
// TokenBucket::apply in include/quota/policy/token_bucket.hpp. It also implements the
// idempotent attempt (a stored first result, replayed) and the hierarchical check (all
// buckets allow, or nothing is deducted). The C++ side is RedisTwin<TokenBucket> in
// redis_store.hpp, which builds the arguments and parses the reply.
//
// Exactness. Lua 5.1 numbers are doubles, exact for integers below 2^53. The script
// never forms a value at or above 2^53:
//   - the rate M/P micro-units per ns is passed reduced by g = gcd(M, P) as m/p, so the
//     carried remainder c lives over p (stored multiplied back by g, i.e. exactly the
//     C++ state's carry over rate.per);
//   - time is two limbs (seconds, nanoseconds); an elapsed time is formed only when it
//     is below the time to fill the bucket, `fill`, else the bucket is simply full —
//     exactly what the C++ refill computes for such a gap;
//   - refill floor((m·dt + c)/p) is split as dt = q·p + r: m·q + floor((m·r + c)/p);
//   - time to reach D micro-units ceil((D·p − c)/m) is split as D = a·m + b:
//     a·p + ceil((b·p − c)/m);
//   - floor division is corrected by one step (a floating quotient is off by at most 1).
// The C++ side rejects parameters for which any of this could reach 2^53 (the message
// names the bound): burst·10^6 < 2^53, (m+2)(p+1) <= 2^53, fill <= 9·10^15 ns (~104
// days), rate.per < 2^53 ns.
//
// State: one string of 32 bytes per bucket, struct-packed doubles (tokens in
// micro-units, carry over rate.per, last time seconds, last time nanoseconds) — every
// value an exact integer, no tostring precision loss. TTL (set in the same script):
// time to full, rounded up to ms, plus a margin; no TTL when the rate is 0 (a one-off
// budget must not come back).
//
// KEYS[1..n]       bucket keys (one hash slot: one tenant)
// KEYS[n+1]        attempt key, when ARGV[4] ~= '0'
// ARGV[1], ARGV[2] caller time (seconds, nanoseconds), or '' and '' for the server's TIME
// ARGV[3]          TTL margin, ms
// ARGV[4]          attempt TTL, ms ('0': no attempt)
// ARGV[5]          attempt fingerprint (keys and costs; no newline)
// ARGV[6]          n
// ARGV[7+6(i-1)..] per bucket: cost (clamped to [0, burst+1]), burst, m, p, g, fill (-1
//                  when the rate is 0)
// Reply: {replayed, time seconds, time nanoseconds, all allowed (1/0), then per bucket:
//         allowed (1/0: this bucket alone had enough), reason, remaining, retry_after ns
//         (-1 = never), reset_after ns (-1 = never)}.
// Errors: "QUOTA_CORRUPT ..." (a key's state is not ours), "QUOTA_ATTEMPT_MISMATCH ...".
#pragma once

#include <string>

#include "quota/redis/lua_common.hpp"

namespace quota::redis {

inline constexpr const char* kTokenBucketLuaBody = R"lua(
local function reach(tokens, c, need, m, p)
  if tokens >= need then return 0 end
  if m == 0 then return -1 end
  local a, b = idiv(need - tokens, m)
  local y = b * p - c
  if y > 0 then
    local q, r = idiv(y, m)
    if r > 0 then q = q + 1 end
    return a * p + q
  end
  local q = idiv(-y, m)
  return a * p - q
end
local st = {}
local all = 1
for i = 1, n do
  local o = 7 + 6 * (i - 1)
  local cost, burst = tonumber(ARGV[o]), tonumber(ARGV[o + 1])
  local m, p, g, fill = tonumber(ARGV[o + 2]), tonumber(ARGV[o + 3]), tonumber(ARGV[o + 4]),
    tonumber(ARGV[o + 5])
  local cap = burst * 1000000
  local key = KEYS[i]
  local raw, corrupt = read_state(key, 'bucket', 32)
  if corrupt then return corrupt end
  local tokens, c, lsec, lns
  if raw then
    local carry
    tokens, carry, lsec, lns = struct.unpack('<dddd', raw)
    if not (int_in(tokens, 0, 9007199254740991) and int_in(carry, 0, 9007199254740991) and
            int_in(lsec, -1e12, 1e12) and int_in(lns, 0, 999999999)) then
      return redis.error_reply('QUOTA_CORRUPT key ' .. key .. ': field out of range')
    end
    c = idiv(carry, g)
    if tokens >= cap then tokens = cap; c = 0 end
    if c >= p then c = 0 end
  else
    tokens, c, lsec, lns = cap, 0, sec, ns
  end
  if sec > lsec or (sec == lsec and ns > lns) then
    if tokens < cap and m > 0 then
      local dsec = sec - lsec
      local full = dsec > 9000000
      local dt = 0
      if not full then
        dt = dsec * 1000000000 + (ns - lns)
        full = dt >= fill
      end
      if full then
        tokens = cap; c = 0
      else
        local q, r = idiv(dt, p)
        local w, c2 = idiv(m * r + c, p)
        local whole = m * q + w
        if whole >= cap - tokens then tokens = cap; c = 0 else tokens = tokens + whole; c = c2 end
      end
    end
    lsec, lns = sec, ns
  end
  local ok, reason, retry, need = 0, 1, 0, 0
  if cost < 1 then
    reason = 3; retry = -1
  elseif cost > burst then
    reason = 2; retry = -1
  else
    need = cost * 1000000
    if need <= tokens then ok = 1; reason = 0 else retry = reach(tokens, c, need, m, p) end
  end
  if ok == 0 then all = 0 end
  st[i] = {key, tokens, c, lsec, lns, need, ok, reason, retry, cap, m, p, g}
end
local out = {0, sec, ns, all}
for i = 1, n do
  local s = st[i]
  local tokens, c, m, p = s[2], s[3], s[11], s[12]
  if all == 1 or (batch and s[7] == 1) then tokens = tokens - s[6] end
  local reset = reach(tokens, c, s[10], m, p)
  local v = struct.pack('<dddd', tokens, c * s[13], s[4], s[5])
  if m == 0 then
    redis.call('SET', s[1], v)
  else
    local ms = idiv(reset + 999999, 1000000)
    redis.call('SET', s[1], v, 'PX', ms + margin)
  end
  local rem = idiv(tokens, 1000000)
  local k = 4 + 5 * (i - 1)
  out[k + 1] = s[7]; out[k + 2] = s[8]; out[k + 3] = rem; out[k + 4] = s[9]; out[k + 5] = reset
end
)lua";

// The whole script.
inline const std::string kTokenBucketLua = std::string(kLuaHead) + kTokenBucketLuaBody + kLuaTail;

}  // namespace quota::redis
