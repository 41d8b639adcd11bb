// quota/redis/twin/token_bucket_lua.hpp — the Lua text of quota::TokenBucket's twin.
//
// kTokenBucketLua is the script RedisStore<TokenBucket> (redis_store.hpp) sends: for one
// or more buckets of one tenant in one call it reads each bucket's state, refills,
// decides, deducts and writes — bit-identical to TokenBucket::apply
// (include/quota/policy/token_bucket.hpp) — with the idempotent attempt and the
// all-or-nothing check of several buckets. kTokenBucketLuaBody is its body: the sections
// of kLuaLoop (twin/common.hpp) that the token bucket fills in. Its C++ codec, which
// forms the arguments this text reads and parses the reply it gives, is
// LuaTwin<TokenBucket> (twin/token_bucket.hpp).
//
// Guarantees: for the parameters LuaTwin<TokenBucket>::params accepts, every value the
// script forms is an exact integer below 2^53 (the exactness notes below say how); a
// bucket's state is 28 bytes; its TTL is at least its time to full plus the margin (none
// at rate 0); a corrupt state fails the whole call with QUOTA_CORRUPT and charges
// nothing. The wire layout of the state, the TTL rule and both reply forms are on
// kTokenBucketLuaBody.
//
// Thread safety: immutable text, built once at static initialization; Redis runs each
// script call with nothing interleaved.
//
//   const std::string& text = kTokenBucketLua;  // == LuaTwin<TokenBucket>::script()
//   // SCRIPT LOAD text, then EVALSHA <sha> 1 "{acme}read" <args of twin/call.hpp>
#pragma once

#include <string>

#include "quota/redis/twin/common.hpp"
#include "quota/redis/twin/skeleton.hpp"

namespace quota::redis {

// The script's body: the sections of kLuaLoop (twin/common.hpp), with its macros.
//
// Exactness. Lua 5.1 numbers are doubles, exact for integers below 2^53; nothing formed
// here reaches 2^53, for bursts up to 10^12 units (10^18 micro-units) and times to fill
// up to 10^17 ns (~1157 days):
//   - the rate M/P micro-units per ns is sent reduced by g = gcd(M, P) as m/p, so the
//     carried remainder c lives over p (stored multiplied back by g: exactly the C++
//     state's carry over rate.per);
//   - tokens are two limbs (whole units tu, micro-units tl in [0, 10^6)): a cost is
//     compared with and deducted from tu alone;
//   - time is two limbs (seconds, nanoseconds); an elapsed time at or past the time to
//     fill (fs s + fn ns) fills the bucket (what the C++ refill computes for such a gap),
//     a shorter one refills in steps below 2^53 ns (@refill_span, twin/lua_macros.hpp);
//   - refill floor((m·dt + c)/p) is split as dt = q·p + r: m·q + floor((m·r + c)/p),
//     and m·q in limbs when it reaches 2^53 (@refill);
//   - the time to reach ceil((D·p − c)/m) is kLuaReach's split while D and the time stay
//     below 2^53, else formed from D's limbs (@reach), and answered as two limbs;
//   - a floor division is corrected by one step (a floating quotient is off by at most 1).
// params() enforces burst <= 10^12, (m+2)(p+1) <= 2^53, fill <= 10^17 ns, rate.per below
// 2^53 ns, and, for a policy past the narrow range (burst·10^6 >= 2^53 or fill > 9·10^15
// ns: `wide`), m and p at most 9·10^9.
//
// State: 28 bytes per bucket, '<I5I3I7i5I4I4': tokens' whole units and micro-units, carry
// over rate.per (< 2^53), last time seconds, last time nanoseconds + 2^30, the key's
// expiry as last set (ms after the last time, 0 = unknown). 28 bytes keep the value in
// jemalloc's 48-byte class (an embedded string takes 16 + 3 + len + 1 bytes). Format
// version (twin/common.hpp): bits 30-31 of the nanoseconds field (< 10^9 < 2^30), version
// 1 = bit 30 set; the check `lns < 0 or lns > 999999999` after subtracting 2^30 rejects
// any other.
//
// TTL, set in the same script: time to full (rounded up to ms) plus the margin for a new
// key; none at rate 0 (a one-off budget must not come back). A later write keeps the
// key's TTL while the expiry set last still covers time to full + margin with 10 ms to
// spare, overwriting the state in place (SETRANGE key 0: the TTL kept as KEEPTTL would,
// no new value object); else it sets time to full + 2·margin, so that a busy key is
// re-armed about once per margin. The expiry is known only on the server's clock: in
// caller-time mode every write sets the TTL.
//
// One pass per bucket (refill, decide, deduct, write) for one bucket and for a batch of
// independent decisions; two for the all-or-nothing check of several (decide all, then
// write). A corrupt state found after some buckets of a batch were written puts those
// back (`fail`, twin/common.hpp).
//
// Reply, compact (no attempt, or a batch): {0, time seconds, time nanoseconds, all
// allowed (1/0), then each bucket's state as written (28 bytes), then for each bucket i
// that denies, in bucket order, 4·i + reason (1 over limit, 2 cost exceeds burst, 3
// invalid cost)}. LuaTwin<TokenBucket>::decision derives remaining, retry_after and
// reset_after from a state as TokenBucket::apply does. In an all-or-nothing check that
// denies, the states are the refilled ones, nothing deducted. With an attempt (and its
// replay) the reply is the full form of twin/common.hpp; element 5's type (a string:
// compact) tells them apart.
inline constexpr const char* kTokenBucketLuaBody = R"lua(
local state_what, state_bytes, state_long = 'bucket', 28, 28
-- (sized for one bucket's compact reply: a table that grows is resized)
local out = {0, sec, ns, 1, false}
-- The compact reply (see above) unless an attempt is stored: an attempt's
-- stored reply keeps the full form, which every version reads.
local compact = attempt_ttl <= 0
local den, nd = nil, 0
-- Server time in ms, when the script runs on the server's clock (the key's expiry is on
-- that clock too); nil in caller-time mode.
local now_ms
if server then now_ms = sec * 1000 + (ns - ns % 1000000) / 1000000 end
local MAXOFF = 4294967295
local burst, m, p, g, fs, fn, wide, fillms
--@@ params
local w1
burst, m, p, g, fs, fn, w1 = sunpack('<i8i8i8i8i8i8i8', set)
wide = w1 == 1
-- the time to fill in ms, rounded up, + margin + 10: a TTL that covers it covers any time
-- to full (reset <= fill), so the expiry set last can be kept without computing reset.
@ceil_ms2(local f, fs, fn)
fillms = f + margin + 10
--@@ state
-- tokens: tu units + tl micro-units (tl in [0, 10^6))
local tu, tl, c, lsec, lns
-- the key's expiry (server ms) as last set, or 0 if unknown
local expiry = 0
--@@ read
local carry, off, t
tu, tl, carry, lsec, t, off = sunpack('<I5I3I7i5I4I4', raw)
-- format version 1: bit 30 of the nanoseconds field set, bit 31 clear
lns = t - 1073741824
if tl > 999999 or carry > 9007199254740991 or lns < 0 or lns > 999999999 then
  @out_of_range()
end
if off > 0 then expiry = lsec * 1000 + (lns - lns % 1000000) / 1000000 + off end
-- c = floor(carry / g) (carry is stored multiplied by g)
c = carry
if g > 1 then
  @mod(local r, carry, g)
  c = (carry - r) / g
end
if tu >= burst then tu = burst; tl = 0; c = 0 end
if c >= p then c = 0 end
--@@ fresh
tu, tl, c, lsec, lns = burst, 0, 0, sec, ns
--@@ spent
tu, tl, c, lsec, lns = 0, 0, 0, fsec, fns
--@@ step
if sec > lsec or (sec == lsec and ns > lns) then
  if tu < burst and m > 0 then
    -- full once the elapsed time reaches the time to fill
    @refill_span(sec - lsec, ns - lns, tu, tl, c, burst, fs, fn)
  end
  lsec, lns = sec, ns
end
-- (tokens >= cost·10^6 exactly when the whole units do: tl < 10^6)
@decide(burst, cost <= tu)
--@@ write
if ok == 1 and deduct then tu = tu - cost end
-- The TTL: none at rate 0 (a one-off budget must not come back); else the one set
-- earlier while it still covers time to full plus the margin (10 ms to spare for the
-- server's clock read at the write: a cheaper write, SETRANGE) — looked at first against
-- the longest time to full (fillms), then, if that fails, this bucket's; else (px) time
-- to full + margin for a new key, one margin more for one whose TTL ran short, so that
-- the following writes can keep it. `off`: the expiry as stored in the state.
local off, px, rs, rn = 0, nil, nil, 0
if m > 0 then
  local base = lsec * 1000 + (lns - lns % 1000000) / 1000000
  if now_ms and expiry >= now_ms + fillms then off = expiry - base end
  if off < 1 or off > MAXOFF then
    @reach(rs, rn, tu, tl, c, burst)
    @ceil_ms2(local ttl, rs, rn)
    ttl = ttl + margin
    off = 0
    if now_ms and expiry >= now_ms + ttl + 10 then off = expiry - base end
    if off < 1 or off > MAXOFF then
      px = ttl
      if raw then px = ttl + margin end
      off = 0
      if now_ms then off = now_ms + px - base end
      if off < 1 or off > MAXOFF then off = 0 end
    end
  end
end
local v = pack('<I5I3I7i5I4I4', tu, tl, c * g, lsec, lns + 1073741824, off)
if m == 0 then
  rcall('SET', key, v)
elseif px then
  rcall('SET', key, v, 'PX', px)
else
  -- the key holds a 28-byte state (its expiry was read from it): overwritten in place,
  -- TTL kept
  rcall('SETRANGE', key, '0', v)
end
--@@ reply
if compact then
  -- the state as written (the caller derives remaining, retry_after and reset_after from
  -- its tokens and carry) and, for a denial, 4·i + reason after the states
  out[4 + i] = v
  if ok == 0 then
    if not den then den = {} end
    nd = nd + 1
    den[nd] = 4 * i + reason
  end
else
  if reason == 1 then
    local ys, yn
    @reach(ys, yn, tu, tl, c, cost)
    @dur(retry, ys, yn)
  end
  if not rs then
    @reach(rs, rn, tu, tl, c, burst)
  end
  local k = 5 * i - 1
  out[k + 1] = ok; out[k + 2] = reason; out[k + 3] = tu
  out[k + 4] = retry
  @dur(out[k + 5], rs, rn)
end
--@@ epilogue
for j = 1, nd do out[4 + n + j] = den[j] end
)lua";

inline const std::string kTokenBucketLua = detail::loop_script(kLuaReach, kTokenBucketLuaBody);

}  // namespace quota::redis
