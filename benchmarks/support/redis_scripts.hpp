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

}  // namespace quota::bench
