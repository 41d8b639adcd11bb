// benchmarks/support/redis_scripts.hpp — the scripts the Redis benchmarks compare quota's
// Lua twin with (redis_bench times them, redis_instructions_bench counts the server's
// instructions).
#pragma once

namespace quota::bench {

// The straightforward token bucket script as commonly published (floating point).
// ARGV: rate per second, burst, cost.
inline constexpr const char* kNaiveLua = R"lua(
local rate = tonumber(ARGV[1])
local burst = tonumber(ARGV[2])
local cost = tonumber(ARGV[3])
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local v = redis.call('HMGET', KEYS[1], 'tokens', 'ts')
local tokens = tonumber(v[1]) or burst
local ts = tonumber(v[2]) or now
tokens = math.min(burst, tokens + (now - ts) * rate)
local allowed = 0
if tokens >= cost then tokens = tokens - cost; allowed = 1 end
redis.call('HSET', KEYS[1], 'tokens', tokens, 'ts', now)
redis.call('PEXPIRE', KEYS[1], math.ceil(burst / rate * 1000))
return allowed
)lua";

// A script that does nothing: what Redis spends on any script call before it does work.
inline constexpr const char* kNoopLua = "return 1";

// The floor of a script that keeps one fixed-size state per limit: reads the states and
// writes ARGV[1] over each in place (SETRANGE, TTL kept). ARGV[2]: '0' one state per key
// (GET, or MGET for several keys), I/O only; '1' the same with each state unpacked and
// packed as an 80-byte state of ten fields and a 35-byte policy, what struct costs per
// state; '2' ARGV[3] states of that format in ONE key (KEYS[1], one GET and one SETRANGE),
// each unpacked and packed: one key per scope with such states; '3' the same with a
// compact record per limit (4 fields, 23 bytes '<i7I7I5I4': tokens, carry, last s, last ns) after
// one 7-byte header (the rule-set version, '<I7'): the least a state per limit can be;
// '5' as '3' with each record's 42-byte identity (ARGV[4]; after the records) unpacked
// and compared: what naming the limit in its record costs; '4' ARGV[3] fields of a HASH
// (names ARGV[4..]; HMGET, then one HSET), 5-field records: a hash per scope.
inline constexpr const char* kFloorLua = R"lua(
local n, mode, fmt = #KEYS, ARGV[2], '<I7i6I3I7i6I4I5I3I4c35'
if mode == '4' then
  local r, cf = ARGV[3] + 0, '<I7i7I7I5I4'
  local fields = {}
  for k = 1, r do fields[k] = ARGV[3 + k] end
  local raws = redis.call('HMGET', KEYS[1], unpack(fields))
  local args = {'HSET', KEYS[1]}
  for k = 1, r do
    local a, b, c, d, e = struct.unpack(cf, raws[k])
    args[2 * k + 1] = fields[k]
    args[2 * k + 2] = struct.pack(cf, a, b, c, d, e)
  end
  redis.call(unpack(args))
  return n
end
local raws
if n == 1 then raws = {redis.call('GET', KEYS[1])} else raws = redis.call('MGET', unpack(KEYS)) end
local v = ARGV[1]
if mode == '2' then
  local raw, parts = raws[1], {}
  for r = 1, ARGV[3] + 0 do
    local a, b, c, d, e, f, g, h, k, id = struct.unpack(fmt, raw, 80 * r - 79)
    parts[r] = struct.pack(fmt, a, b, c, d, e, f, g, h, k, id)
  end
  redis.call('SETRANGE', KEYS[1], '0', table.concat(parts))
  return n
end
if mode == '5' then
  local raw, cf, R, want = raws[1], '<i7I7I5I4', ARGV[3] + 0, ARGV[4]
  local parts = {struct.pack('<I7', (struct.unpack('<I7', raw)))}
  for r = 1, R do
    local a, b, c, d = struct.unpack(cf, raw, 23 * r - 15)
    local id = struct.unpack('c42', raw, 8 + 23 * R + 42 * (r - 1))
    if id ~= want then return redis.error_reply('id') end
    parts[r + 1] = struct.pack(cf, a, b, c, d)
  end
  redis.call('SETRANGE', KEYS[1], '0', table.concat(parts))
  return n
end
if mode == '3' then
  local raw, cf = raws[1], '<i7I7I5I4'
  local parts = {struct.pack('<I7', (struct.unpack('<I7', raw)))}
  for r = 1, ARGV[3] + 0 do
    local a, b, c, d = struct.unpack(cf, raw, 23 * r - 15)
    parts[r + 1] = struct.pack(cf, a, b, c, d)
  end
  redis.call('SETRANGE', KEYS[1], '0', table.concat(parts))
  return n
end
for i = 1, n do
  if mode == '1' then
    local a, b, c, d, e, f, g, h, k, id = struct.unpack(fmt, raws[i])
    v = struct.pack(fmt, a, b, c, d, e, f, g, h, k, id)
  end
  redis.call('SETRANGE', KEYS[i], '0', v)
end
return n
)lua";

// A sketch of the hot path of one key per scope (not a twin: it decides only what the
// benchmark sends): token buckets in the narrow range, their states compact records in
// ONE key, 21 bytes of header ('c15' the rule-set version and a fingerprint of the
// scope's policies, so that one comparison stands for every record's parameters; 'I6'
// the expiry as last set, server ms) and 23 bytes per limit ('<i7I7I5I4': tokens in
// micro-units, carry over p, last s, last ns). Per limit: its policy argument unpacked
// ('<I7I7I7I7': capacity in micro-units, m, p, the time to fill in ns), its record
// unpacked and range-checked, refilled (twin/skeleton.hpp's @refill in one limb), decided,
// its time to full (common.hpp's reach) and packed; the key's TTL (the longest time to
// full + 1 s margin) kept by one SETRANGE of the records while the stored expiry covers
// it, else set with the header. Reply: time s, ns, limits, then per limit: allowed,
// tokens, carry (the rest derived by the caller). Not sketched: debt, the wide range,
// the other policies, conversion (a fingerprint that differs is an error here), the
// give-back of a denial, attempts. KEYS[1] the scope key; ARGV[1] the header's 15 bytes;
// ARGV[2] the cost in units; ARGV[3..] the policies. Needs kLuaMath and kLuaReach first.
inline constexpr const char* kScopeSketchLua = R"lua(
local sunpack, spack = struct.unpack, struct.pack
local now = redis.call('TIME')
local us = now[2] + 0
local sec, ns = now[1] + 0, us * 1000
local now_ms = sec * 1000 + (us - us % 1000) / 1000
local key, id, cost = KEYS[1], ARGV[1], ARGV[2] * 1000000
local n = #ARGV - 2
local raw = redis.call('GET', key)
local expiry = 0
if raw then
  if #raw ~= 21 + 23 * n or string.sub(raw, 1, 15) ~= id then
    return redis.error_reply('sketch: a state of other policies (conversion not sketched)')
  end
  expiry = sunpack('<I6', raw, 16)
end
local res, parts, longest = {sec, ns, n}, {}, 0
for i = 1, n do
  local cap, m, p, fill = sunpack('<I7I7I7I7', ARGV[2 + i])
  local t, c, ls, lns = cap, 0, sec, ns
  if raw then
    t, c, ls, lns = sunpack('<i7I7I5I4', raw, 23 * i - 1)
    if t < -cap or t > cap or c >= p or lns > 999999999 then
      return redis.error_reply('QUOTA_CORRUPT key ' .. key .. ': field out of range')
    end
  end
  local el = (sec - ls) * 1000000000 + ns - lns
  if el > 0 then
    if el >= 2 * fill then
      t, c = cap, 0
    elseif t < cap then
      local rr = el % p
      local ry = m * rr + c
      local rc = ry % p
      t = t + m * ((el - rr) / p) + (ry - rc) / p
      if t >= cap then t, c = cap, 0 else c = rc end
    end
    ls, lns = sec, ns
  end
  local ok = 0
  if cost <= t then t = t - cost; ok = 1 end
  local rs = reach(t, c, cap, m, p)
  if rs > longest then longest = rs end
  local k = 3 * i
  res[k + 1], res[k + 2], res[k + 3] = ok, t, c
  parts[i] = spack('<i7I7I5I4', t, c, ls, lns)
end
local ttl = (longest - longest % 1000000) / 1000000 + 1001
if expiry >= now_ms + ttl + 10 then
  redis.call('SETRANGE', key, '21', table.concat(parts))
else
  ttl = ttl + 1000
  redis.call('SET', key, id .. spack('<I6', now_ms + ttl) .. table.concat(parts), 'PX', ttl)
end
return res
)lua";

}  // namespace quota::bench
