// quota/redis/twin/gateway_attempts.hpp — the script that keeps the gateway's attempts.
//
// kGatewayAttemptLua stores, in the tenant's hash slot, the attempts GatewayStore shares
// between gateway processes (GatewayStore::begin_attempt, finish_attempt,
// abandon_attempt): a retry that reaches another process replays the decision recorded
// for its attempt id instead of deciding again. GatewayTwin::parse_record and
// format_record (twin/gateway_codec.hpp) read and write the record's decision. Thread
// safety: the constant is immutable text; Redis runs each script call with nothing
// interleaved.
//
//   // EVALSHA <sha of kGatewayAttemptLua> 1 "quota:gw:a{acme}<attempt id>" b <fingerprint> 5000
//   // → {0}: this call began the attempt; {1, record}: replay (or wait for) the record.
#pragma once

namespace quota::redis {

// Attempts shared by every gateway process (GatewayStore::begin_attempt and friends).
// KEYS[1]: the attempt key (the tenant's slot). ARGV[1]: op 'b' begin, 'f' finish, 'a'
// abandon; ARGV[2]: the request's fingerprint (no control characters); ARGV[3]: TTL, ms;
// ARGV[4]: 'f': the decision, six integers separated by spaces.
// A record is "P" (pending) or "D" (decided), then \x1f and the fingerprint, then for
// "D" \x1f and the decision.
// Reply 'b': {0} when this call began the attempt (pending written), {1, record} when a
//            record exists; 'f', 'a': {0}.
inline constexpr const char* kGatewayAttemptLua = R"lua(
local op, fp, ttl = ARGV[1], ARGV[2], ARGV[3]
if op == 'b' then
  local v = redis.call('GET', KEYS[1])
  if v then return {1, v} end
  redis.call('SET', KEYS[1], 'P\31' .. fp, 'PX', ttl)
  return {0}
elseif op == 'f' then
  redis.call('SET', KEYS[1], 'D\31' .. fp .. '\31' .. ARGV[4], 'PX', ttl)
  return {0}
elseif op == 'a' then
  local v = redis.call('GET', KEYS[1])
  if v and string.sub(v, 1, 1) == 'P' then redis.call('DEL', KEYS[1]) end
  return {0}
end
return redis.error_reply('QUOTA_BAD_OP ' .. tostring(op))
)lua";

}  // namespace quota::redis
