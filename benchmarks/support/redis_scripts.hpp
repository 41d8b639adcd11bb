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
// packed in the gateway's 80-byte format (twin/gateway.hpp), what struct costs per state;
// '2' ARGV[3] states of that format in ONE key (KEYS[1], one GET and one SETRANGE), each
// unpacked and packed: what one key per scope would cost; '3' the same with a compact
// record per limit (4 fields, 23 bytes '<i7I7I5I4': tokens, carry, last s, last ns) after
// one 7-byte header (the rule-set version, '<I7'): the least a state per limit can be.
inline constexpr const char* kFloorLua = R"lua(
local n, mode, fmt = #KEYS, ARGV[2], '<I7i6I3I7i6I4I5I3I4c35'
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

}  // namespace quota::bench
