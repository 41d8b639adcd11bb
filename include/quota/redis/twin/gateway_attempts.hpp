// quota/redis/twin/gateway_attempts.hpp — the gateway's attempts in Redis: the record
// kept in the same script call as the decision and its deduction.
//
// GatewayStore::decide_attempt (redis/gateway_store.hpp) decides a request with an
// attempt id: the tenant's script call (op 'a' of kGatewayLua, twin/gateway.hpp) first
// reads the attempt's record in the tenant's hash slot; a recorded decision is replayed
// without deducting anything; otherwise the levels are decided and the record written
// before the script returns. So a reply lost after the script ran leaves the decision
// recorded with its deduction, and a retry with the same id — through any gateway
// process — replays it. A script that fails (an error reply, nothing written) or never
// ran leaves no record: the retry decides afresh.
//
// A request with a global level (its own slot) takes two scripts: the tenant's writes
// the record "pending" with its levels' replies (the deduction and the record still in
// one call), the gateway then decides the global level and records the whole decision
// (kGatewayAttemptLua 'f'). A pending record is claimed by the call that wrote it for
// GatewayStoreOptions::attempt_pending; a retry in that time is Aborted ("being decided;
// retry"), after it the retry takes the record over and decides the remaining levels from
// the recorded replies, so the tenant's levels are not deducted again. A failed global
// call deletes the pending record and then gives the tenant's levels back. What may be
// deducted twice is an under-admission, never over: the global level (a slow first
// process, a lost global reply), the tenant's levels when that give-back fails.
//
// Thread safety: immutable text and pure functions.
//
//   // EVALSHA <kGatewayLua> 2 "quota:gw:{acme}read" "quota:gw:a{acme}req-1" <head, op 'a'>
//   //   <policy> <'<i8i8B': ttl ms, claim ms, last 1> "1|{acme}read" "-"
//   // → {0, "", <the decide reply>}  decided and recorded now
//   // → {1, deadline, <the recorded reply>}  replayed; {2} being decided elsewhere
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <hiredis/hiredis.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "quota/gateway/backend.hpp"
#include "quota/redis/transport/script.hpp"
#include "quota/redis/twin/common.hpp"
#include "quota/redis/twin/gateway_codec.hpp"
#include "quota/redis/twin/gateway_layout.hpp"
#include "quota/redis/twin/skeleton.hpp"
#include "quota/units.hpp"

namespace quota::redis {

// The Lua the gateway script runs for op 'a' (with kLuaRecord of twin/common.hpp at
// `@record`: gateway_attempt_prelude()).
// KEYS[nk + 1]: the attempt key, after the call's nk scope keys; ARGV[at] (after the
// levels' and keys' arguments, twin/gateway.hpp): kGatewayAttemptArgs: the record's TTL (ms), the
// claim (ms) and whether this call decides the request's last levels (1); ARGV[at + 1]:
// the fingerprint (no control characters); ARGV[at + 2]: the deadline (caller's ns) or "-".
// A call with an attempt takes the general path (its reply is recorded as it is).
// A record: 'D' (decided) or 'P' (pending), the fingerprint, the deadline, the server ms
// until which a pending record is claimed (0 for 'D'), the reply (record_text), separated
// by \31. attempt_open answers from the record (a.reply: {1, deadline, reply} replay,
// {3, deadline, reply} a pending record taken over, {2} claimed) or lets the call decide;
// attempt_close writes the record and puts {0, ""} before the reply.
// Its functions exist only in a call with op 'a' (spliced after the head is read, on its
// local `op`): a decision without an attempt creates none of them.
inline constexpr const char* kGatewayAttemptHead = R"lua(
local attempt_open, attempt_close, record_text, record_read
if op == 97 then
@record
local function attempt_now(now_ms)
  if now_ms then return now_ms end
  local t = redis.call('TIME')
  return t[1] * 1000 + floor(t[2] / 1000)
end
local function attempt_record(st, fp, dl, claim, text)
  return st .. '\31' .. fp .. '\31' .. dl .. '\31' .. string.format('%.0f', claim) .. '\31' .. text
end
attempt_open = function(nk, at, now_ms)
  local a = {key = KEYS[nk + 1], fp = ARGV[at + 1], dl = ARGV[at + 2]}
  a.ttl, a.claim, a.last = struct.unpack(@attempt_format(), ARGV[at])
  local prev = redis.call('GET', a.key)
  if not prev then return a end
  local st, fp, dl, claim, rest = string.match(prev, '^([PD])\31(.-)\31(.-)\31(%d+)\31(.*)$')
  if not st then
    a.reply = redis.error_reply('QUOTA_CORRUPT key ' .. a.key .. ' is not a quota attempt')
  elseif fp ~= a.fp then
    a.reply = redis.error_reply('QUOTA_ATTEMPT_MISMATCH attempt id reused with another key or cost')
  elseif st == 'D' then
    a.reply = record_read(rest, {1, dl})
  else
    local t = attempt_now(now_ms)
    if t < claim + 0 then
      a.reply = {2}
    else
      redis.call('SET', a.key, attempt_record('P', fp, dl, t + a.claim, rest), 'KEEPTTL')
      a.reply = record_read(rest, {3, dl})
    end
  end
  return a
end
attempt_close = function(a, res, final, now_ms)
  if final then
    redis.call('SET', a.key, attempt_record('D', a.fp, a.dl, 0, record_text(res, 1)), 'PX', a.ttl)
  else
    redis.call('SET', a.key,
      attempt_record('P', a.fp, a.dl, attempt_now(now_ms) + a.claim, record_text(res, 1)), 'PX', a.ttl)
  end
  table.insert(res, 1, '')
  table.insert(res, 1, 0)
end
end
)lua";

// kGatewayAttemptHead with kLuaRecord in place (the gateway script's prelude).
inline std::string gateway_attempt_prelude() {
  return detail::expand_lua(detail::with_record(kGatewayAttemptHead));
}

// The script that completes or abandons a pending record (two-slot requests).
// KEYS[1]: the attempt key. ARGV[1]: op 'f' finish, 'a' abandon; ARGV[2]: the
// fingerprint; 'f': ARGV[3] the TTL (ms), ARGV[4] the rest of the record after "D\31"
// and the fingerprint. Only a pending record of the same fingerprint is touched.
// Reply: {1} when the record was written ('f') or deleted ('a'), else {0}.
inline constexpr const char* kGatewayAttemptLua = R"lua(
local op, fp = ARGV[1], ARGV[2]
if op ~= 'f' and op ~= 'a' then return redis.error_reply('QUOTA_BAD_OP ' .. tostring(op)) end
local v = redis.call('GET', KEYS[1])
if not v or string.sub(v, 1, 2 + #fp) ~= 'P\31' .. fp or string.byte(v, 3 + #fp) ~= 31 then
  return {0}
end
if op == 'f' then
  redis.call('SET', KEYS[1], 'D\31' .. fp .. '\31' .. ARGV[4], 'PX', ARGV[3])
else
  redis.call('DEL', KEYS[1])
end
return {1}
)lua";

struct GatewayAttemptTwin {
  // The attempt's arguments, after the levels' and keys' (ARGV[at ..]).
  static void append_args(std::vector<std::string>& args, const gateway::AttemptRequest& a,
                          std::int64_t claim_ms, bool last) {
    std::string& packed = args.emplace_back();
    const std::int64_t ttl =
        std::max<std::int64_t>(std::chrono::ceil<std::chrono::milliseconds>(a.ttl).count(), 1);
    pack<kGatewayAttemptArgs>(packed, ttl, std::max<std::int64_t>(claim_ms, 1), last ? 1 : 0);
    args.emplace_back(a.fingerprint);
    args.push_back(format_deadline(a.deadline));
  }

  static std::string format_deadline(std::optional<Nanos> d) {
    return d.has_value() ? absl::StrCat(d->count()) : std::string("-");
  }

  // What op 'a' answered (`n`: the levels this call decides; a replay holds up to `all`):
  // replayed, or the levels this call decided (or took over from a pending record, then
  // with the recorded deadline); Aborted for a pending record claimed by another call.
  static absl::StatusOr<gateway::AttemptResult> parse(const redisReply& r, std::size_t n,
                                                      std::size_t all,
                                                      const gateway::AttemptRequest& a) {
    if (r.type == REDIS_REPLY_ERROR) {
      if (std::string_view(r.str, r.len).find("QUOTA_ATTEMPT_MISMATCH") != std::string_view::npos) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "attempt id \"%s\" was first used for another request (key or cost differ)",
            detail::av(a.id)));
      }
      return GatewayTwin::parse_decide(r, n).status();
    }
    if (r.type != REDIS_REPLY_ARRAY || r.elements < 1 ||
        r.element[0]->type != REDIS_REPLY_INTEGER) {
      return absl::UnavailableError("malformed reply from the gateway script's attempt");
    }
    const long long mode = r.element[0]->integer;
    if (mode == 2) {
      return absl::AbortedError(absl::StrFormat(
          "attempt \"%s\" is being decided by another call; retry", detail::av(a.id)));
    }
    if (mode < 0 || mode > 3 || r.elements < 3 || r.element[1]->type != REDIS_REPLY_STRING) {
      return absl::UnavailableError("malformed reply from the gateway script's attempt");
    }
    gateway::AttemptResult out{.levels = {}, .replayed = mode == 1, .deadline = a.deadline};
    const std::string_view dl(r.element[1]->str, r.element[1]->len);
    if (mode != 0) {
      std::int64_t ns = 0;
      out.deadline = std::nullopt;
      if (dl != "-" && !absl::SimpleAtoi(detail::av(dl), &ns)) {
        return absl::DataLossError(absl::StrFormat(
            "attempt \"%s\": the recorded deadline is malformed", detail::av(a.id)));
      }
      if (dl != "-") out.deadline = Nanos{ns};
    }
    // The reply after the two attempt fields, read as the decide reply it is.
    redisReply rest = r;
    rest.elements -= 2;
    rest.element += 2;
    auto decided = GatewayTwin::parse_decide(rest, mode == 1 ? all : n);
    if (!decided.ok()) return decided.status();
    out.levels.time = decided->time;
    for (const Decision& d : decided->parts) out.levels.parts.push_back(d);
    return out;
  }

  // Completes a pending record with the whole decision `levels` (kGatewayAttemptLua 'f'),
  // or with nullptr abandons it ('a'); true when the record was written or removed.
  static bool close_record(Script& script, const std::string& key, const gateway::AttemptRequest& a,
                           std::optional<Nanos> deadline, const gateway::LevelsResult* levels) {
    const std::string fp(a.fingerprint);
    std::vector<std::string> args{"a", fp};
    if (levels != nullptr) {
      const std::int64_t ttl =
          std::max<std::int64_t>(std::chrono::ceil<std::chrono::milliseconds>(a.ttl).count(), 1);
      args = {"f", fp, absl::StrCat(ttl), finished_record(deadline, *levels)};
    }
    auto written = script.run({key}, args);
    return written.ok() && (*written)->type == REDIS_REPLY_ARRAY && (*written)->elements == 1 &&
           (*written)->element[0]->type == REDIS_REPLY_INTEGER &&
           (*written)->element[0]->integer == 1;
  }

  // The rest of a decided record after its fingerprint (kGatewayAttemptLua 'f').
  static std::string finished_record(std::optional<Nanos> deadline,
                                     const gateway::LevelsResult& levels) {
    std::string out = absl::StrCat(format_deadline(deadline), "\x1f", "0\x1f");
    absl::StrAppend(&out, levels.time.count() / GatewayTwin::kNanosPerSecond, " ",
                    levels.time.count() % GatewayTwin::kNanosPerSecond, " ", levels.parts.size());
    for (const Decision& d : levels.parts) {
      absl::StrAppend(&out, " ", d.allowed ? 1 : 0, " ", static_cast<int>(d.reason), " ",
                      d.remaining, " ", d.retry_after == kNever ? -1 : d.retry_after.count(), " ",
                      d.reset_after == kNever ? -1 : d.reset_after.count(), " ", d.version);
    }
    return out;
  }
};

}  // namespace quota::redis
