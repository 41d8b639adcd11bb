// quota/redis/twin/token_bucket.hpp — the Lua twin of quota::TokenBucket.
//
// kTokenBucketLua decides one or more buckets of one tenant in one script call — read,
// refill, decide, deduct, write — bit-identical to TokenBucket::apply
// (include/quota/policy/token_bucket.hpp), with the idempotent attempt and the
// all-or-nothing check of several buckets. LuaTwin<TokenBucket> is its C++ codec: the
// exact range (params), the arguments (script_cost, pack_params) and the compact reply
// (decision, compact_parts). twin/call.hpp lays out a call with it; RedisStore<TokenBucket>
// (redis_store.hpp) sends it. The script's text is twin/token_bucket_lua.hpp.
//
// Guarantees: for every policy params() accepts (it rejects the others, naming the
// bound), every value the script forms is an exact integer below 2^53, so its decisions
// equal the C++ policy's; a bucket's state is 28 bytes; its TTL is at least its time to
// full plus the margin (none at rate 0); a corrupt state fails the whole call with
// QUOTA_CORRUPT and charges nothing. Thread safety: the constants are immutable text,
// LuaTwin's functions are pure; Redis runs each script call with nothing interleaved.
//
//   const TokenBucket tb{.rate = {.units = 100, .per = 1s}, .burst = 20};
//   const BucketRequest<TokenBucket> req{&tb, "{acme}read", 1};
//   auto call = build_call(CallOptions{}, std::span(&req, 1), Nanos{0}, {});
//   // EVALSHA <sha of kTokenBucketLua> 1 call->keys[0] call->args..., then
//   // parse_reply(*reply, std::span(&req, 1)): the Decision TokenBucket::apply gives.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <numeric>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <hiredis/hiredis.h>

#include "absl/numeric/int128.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "quota/decision.hpp"
#include "quota/policy/token_bucket.hpp"
#include "quota/redis/twin/common.hpp"
#include "quota/redis/twin/range.hpp"
#include "quota/redis/twin/skeleton.hpp"
#include "quota/redis/twin/token_bucket_lua.hpp"
#include "quota/units.hpp"

namespace quota::redis {

template <>
struct LuaTwin<TokenBucket> : TwinScript<kTokenBucketLua> {
  // The script's per-bucket parameters (kTokenBucketLuaBody: m/p the rate reduced by g,
  // the time to fill in ns, -1 at rate 0; wide: past the narrow range).
  struct Params {
    std::int64_t micros = 0;    // m: the rate is m micro-units every p ns, reduced by g
    std::int64_t per_ns = 1;    // p
    std::int64_t gcd = 1;       // g = gcd(rate.units·10^6, rate.per)
    std::int64_t fill_ns = -1;  // the time to fill the burst; -1 at rate 0
    bool wide = false;          // burst·10^6 or the time to fill past the narrow range
  };

  // The parameters of `tb`, or kInvalidArgument naming the bound when the twin cannot
  // decide it exactly within `range` (the store's: RedisStore's by default; GatewayStore
  // passes kGatewayRange): burst at most range.max_capacity, rate.per below 2^53 ns,
  // (m+2)(p+1) <= 2^53, time to fill at most range.max_span_ns; and, when the burst or the
  // time to fill is past range's narrow bounds (wide), m and p at most kMaxWideTerm.
  static absl::StatusOr<Params> params(const TokenBucket& tb,
                                       const TwinRange& range = kRedisStoreRange) {
    if (auto s = tb.validate(); !s.ok()) return s;
    if (auto s = check_capacity("burst", tb.burst, range); !s.ok()) return s;
    const std::int64_t big_m = to_micro(tb.rate.units);
    const std::int64_t big_p = tb.rate.per.count();
    if (big_m == 0) return Params{.micros = 0, .per_ns = 1, .gcd = big_p, .fill_ns = -1};
    if (big_p >= kLuaExact) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "rate.per=%d ns: %s needs rate.per below 2^53 ns (~104 days)", big_p, range.store));
    }
    const std::int64_t g = std::gcd(big_m, big_p);
    const std::int64_t m = big_m / g, p = big_p / g;
    if ((absl::int128(m) + 2) * (absl::int128(p) + 1) > kLuaExact) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "rate=%s: with g = gcd(rate.units*10^6, rate.per) = %d, %s needs "
          "(rate.units*10^6/g + 2)*(rate.per/g + 1) <= 2^53 (Lua doubles); got %d/g and %d/g — "
          "use a rate.per that shares more factors with rate.units*10^6 (e.g. whole ms)",
          to_string(tb.rate), g, range.store, big_m, big_p));
    }
    const absl::int128 fill =
        quota::detail::ceil_div(absl::int128(to_micro(tb.burst)) * p, absl::int128(m));
    if (fill > range.max_span_ns) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "burst/rate: refilling burst=%d at rate=%s takes %d ns; %s's bound is %d ns (%s) — "
          "raise rate.units or lower burst",
          tb.burst, to_string(tb.rate), static_cast<std::int64_t>(fill), range.store,
          range.max_span_ns, span_days(range.max_span_ns)));
    }
    const bool wide = tb.burst > range.narrow_capacity || fill > range.narrow_span_ns;
    if (wide && (m > kMaxWideTerm || p > kMaxWideTerm)) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "rate=%s: with burst=%d (above %d units) or a time to fill of %d ns (above %d ns), "
          "%s needs rate.units*10^6/g and rate.per/g at most %d, g = gcd(rate.units*10^6, "
          "rate.per) = %d; got %d/g and %d/g — use a rate.per that shares more factors with "
          "rate.units*10^6 (e.g. whole ms)",
          to_string(tb.rate), tb.burst, range.narrow_capacity, static_cast<std::int64_t>(fill),
          range.narrow_span_ns, range.store, kMaxWideTerm, g, big_m, big_p));
    }
    return Params{.micros = m,
                  .per_ns = p,
                  .gcd = g,
                  .fill_ns = static_cast<std::int64_t>(fill),
                  .wide = wide};
  }

  // The cost as sent: costs outside [1, burst] decide the same whatever their size;
  // clamping keeps them exact in Lua.
  static std::int64_t script_cost(const TokenBucket& tb, std::int64_t cost) {
    return std::clamp<std::int64_t>(cost, 0, tb.burst + 1);
  }

  // The parameter set as one argument, '<i8i8i8i8i8i8i8': burst, m, p, g, the time to
  // fill as seconds and nanoseconds (-1 s at rate 0), wide (1/0).
  static std::string pack_params(const TokenBucket& tb, const Params& pr) {
    std::string out;
    const std::int64_t fs = pr.fill_ns < 0 ? -1 : pr.fill_ns / 1'000'000'000;
    const std::int64_t fn = pr.fill_ns < 0 ? 0 : pr.fill_ns % 1'000'000'000;
    for (std::int64_t v :
         {tb.burst, pr.micros, pr.per_ns, pr.gcd, fs, fn, std::int64_t{pr.wide ? 1 : 0}})
      detail::pack_le(out, v, 8);
    return out;
  }

  // The compact reply (kTokenBucketLuaBody): each bucket's state as the script wrote it
  // (kStateBytes bytes: tokens' whole units (5 bytes) and micro-units (3), the carry (7),
  // little-endian, first), and the
  // reason of each denial. `decision` derives the rest as TokenBucket::apply does:
  // remaining = tokens / 10^6, retry_after (reason kOverLimit: the time to reach the cost;
  // kCostExceedsBurst, kInvalidCost: kNever; allowed: 0) and reset_after (the time to
  // reach burst) from the tokens and the carry over rate.per. `allowed` is left to the
  // caller (a bucket's own outcome or the call's). A state out of range (tokens above
  // burst, carry not below rate.per, an over-limit reason with enough tokens) is a
  // malformed reply.
  static constexpr std::size_t kStateBytes = 28;
  static absl::StatusOr<Decision> decision(const TokenBucket& tb, std::int64_t cost,
                                           std::string_view state, Reason reason) {
    if (state.size() != kStateBytes) {
      return absl::UnavailableError(absl::StrFormat(
          "malformed reply from the quota script: a state of %d bytes", state.size()));
    }
    auto field = [&](std::size_t at, std::size_t bytes) {
      std::int64_t v = 0;
      for (std::size_t i = bytes; i-- > 0;) {
        v = (v << 8) | static_cast<unsigned char>(state[at + i]);
      }
      return v;
    };
    const std::int64_t units = field(0, 5), micros = field(5, 3), carry = field(8, 7);
    if (units > kMaxUnits || micros >= kMicrosPerUnit) {
      return absl::UnavailableError(
          absl::StrFormat("malformed reply from the quota script: tokens %d units + %d micro-units",
                          units, micros));
    }
    const std::int64_t tokens = units * kMicrosPerUnit + micros;
    const MicroUnits cap = to_micro(tb.burst);
    const std::int64_t per = tb.rate.per.count();
    if (tokens > cap || carry >= per) {
      return absl::UnavailableError(absl::StrFormat(
          "malformed reply from the quota script: tokens %d, carry %d", tokens, carry));
    }
    const TokenBucket::State s{.tokens = tokens, .carry = carry, .last = 0};
    Nanos retry{0};
    if (reason == Reason::kOverLimit) {
      if (cost < 1 || cost > tb.burst || tokens >= to_micro(cost)) {
        return absl::UnavailableError(absl::StrFormat(
            "malformed reply from the quota script: over limit with %d micro-units for cost %d",
            tokens, cost));
      }
      retry = tb.time_to_reach(s, to_micro(cost));
    } else if (reason != Reason::kAllowed) {
      retry = kNever;
    }
    return Decision{.allowed = reason == Reason::kAllowed,
                    .remaining = tokens / kMicrosPerUnit,
                    .retry_after = retry,
                    .reset_after = tb.reset_after(s),
                    .version = 0,
                    .reason = reason};
  }

  // Whether `r` is a reply in the compact form (element 5 a string).
  static bool is_compact(const redisReply& r) {
    return r.type == REDIS_REPLY_ARRAY && r.elements > 4 && r.element[4] != nullptr &&
           r.element[4]->type == REDIS_REPLY_STRING;
  }

  // The n buckets' own decisions (`allowed`: the bucket alone had enough) from a compact
  // reply `r` (its four header elements are the caller's); `bucket(b)` gives bucket b's
  // policy and cost as a std::pair<const TokenBucket*, std::int64_t>.
  template <class Bucket>
  static absl::StatusOr<std::vector<Decision>> compact_parts(const redisReply& r, std::size_t n,
                                                             const Bucket& bucket) {
    if (!is_compact(r) || r.elements < 4 + n || r.elements > 4 + 2 * n) {
      return absl::UnavailableError(absl::StrFormat(
          "malformed reply from the quota script: %d elements for %d buckets", r.elements, n));
    }
    std::vector<Reason> reasons(n, Reason::kAllowed);
    std::size_t last = 0;  // denials come in bucket order, each bucket at most once
    for (std::size_t k = 4 + n; k < r.elements; ++k) {
      const redisReply* e = r.element[k];
      const long long x = e != nullptr && e->type == REDIS_REPLY_INTEGER ? e->integer : -1;
      const long long i = x / 4, reason = x % 4;
      if (x < 0 || i <= static_cast<long long>(last) || i > static_cast<long long>(n) ||
          reason < 1) {
        return absl::UnavailableError(absl::StrFormat(
            "malformed reply from the quota script: element %d is not a denial", k));
      }
      reasons[i - 1] = static_cast<Reason>(reason);
      last = static_cast<std::size_t>(i);
    }
    std::vector<Decision> parts;
    parts.reserve(n);
    for (std::size_t b = 0; b < n; ++b) {
      const redisReply* e = r.element[4 + b];
      if (e == nullptr || e->type != REDIS_REPLY_STRING) {
        return absl::UnavailableError(absl::StrFormat(
            "malformed reply from the quota script: element %d is not a state", 4 + b));
      }
      const auto [policy, cost] = bucket(b);
      auto d = decision(*policy, cost, std::string_view(e->str, e->len), reasons[b]);
      if (!d.ok()) return d.status();
      parts.push_back(*d);
    }
    return parts;
  }
};

}  // namespace quota::redis
