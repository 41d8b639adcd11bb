// quota/redis/twin/gateway_codec.hpp — the C++ side of the gateway's Lua twin.
//
// twin/gateway.hpp is the script GatewayStore runs; this header is what the store sends
// and reads: the twin's exact range (checked when a rule is used, the bound named), a
// policy packed as ONE script argument, the decide reply decoded into one Decision per
// level, and the refund / charge reply (attempts: twin/gateway_attempts.hpp). Together they
// are the gateway twin; tests/redis/redis_gateway_differential_test.cpp proves it equal
// to the in-process key_state.hpp.
//
//   auto arg = quota::redis::GatewayTwin::params(policy);   // 35 packed bytes, or the bound
//   auto decided = quota::redis::GatewayTwin::parse_decide(*reply, levels);
//
// Errors are values: a policy outside the range is kInvalidArgument naming the bound; an
// error reply is kUnavailable (kDataLoss for QUOTA_CORRUPT); a reply of the wrong shape
// is kUnavailable ("malformed reply"). Pure functions: thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <numeric>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include <hiredis/hiredis.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "quota/decision.hpp"
#include "quota/gateway/backend.hpp"
#include "quota/gateway/key_state.hpp"
#include "quota/redis/transport/connection.hpp"
#include "quota/redis/twin/fixed_window.hpp"
#include "quota/redis/twin/gateway_layout.hpp"
#include "quota/redis/twin/range.hpp"
#include "quota/redis/twin/sliding_window_estimate.hpp"
#include "quota/redis/twin/token_bucket.hpp"
#include "quota/units.hpp"

namespace quota::redis {

inline constexpr std::uint64_t kGatewayMaxVersion = (std::uint64_t{1} << 53) - 1;

// The C++ side of the gateway twin (twin/gateway.hpp): a policy's one packed argument,
// and the replies decoded. Pure functions: thread-safe.
struct GatewayTwin {
  // A policy's one script argument (see twin/gateway.hpp): 35 bytes, little-endian
  // '<BI5I7I7I7I4I4' (kind, burst|limit, m|w, p|mode, g|0, fill|W as s and ns), or
  // InvalidArgument naming the bound when the Lua twin cannot decide `policy` exactly.
  using PolicyArgs = std::string;
  static constexpr std::size_t kPolicyArgBytes = kGatewayPolicy.bytes();
  static PolicyArgs pack_policy(int kind, std::int64_t capacity, std::int64_t m, std::int64_t p,
                                std::int64_t g, std::int64_t fill) {
    PolicyArgs out;
    out.reserve(kPolicyArgBytes);
    pack<kGatewayPolicy>(out, kind, capacity, m, p, g, fill / kNanosPerSecond,
                         fill % kNanosPerSecond);
    return out;
  }
  static absl::StatusOr<PolicyArgs> params(const gateway::RulePolicy& policy) {
    if (auto s = gateway::detail::validate(policy); !s.ok()) return s;
    if (const auto* log = std::get_if<SlidingLog>(&policy)) return log_params(*log);
    if (const auto* est = std::get_if<SlidingWindowEstimate>(&policy)) return estimate_params(*est);
    if (const auto* tb = std::get_if<TokenBucket>(&policy)) {
      auto twin = LuaTwin<TokenBucket>::params(*tb, kGatewayRange);
      if (!twin.ok()) return twin.status();
      // Rate 0: m 0, p 1, g 1 whatever rate.per (it refills nothing; converting between
      // two such buckets of one burst changes nothing, so they decide alike).
      if (twin->micros == 0) return pack_policy(1, tb->burst, 0, 1, 1, 0);
      return pack_policy(1, tb->burst, twin->micros, twin->per_ns, twin->gcd, twin->fill_ns);
    }
    // The fixed window: the fixed window twin's grid, within the gateway's range.
    const auto& fw = std::get<FixedWindow>(policy);
    auto grid = LuaTwin<FixedWindow>::params(fw, kGatewayRange);
    if (!grid.ok()) return grid.status();
    return pack_policy(2, fw.limit, grid->w, grid->mode, 0, fw.window.count());
  }

  // The sliding log (kind 3, twin/gateway_windows.hpp): limit, W ns, 0, 0, W. Event ages
  // are exact for W up to kMaxFillNs (the RedisStore log twin's bound).
  static absl::StatusOr<PolicyArgs> log_params(const SlidingLog& log) {
    if (auto s = check_capacity("limit", log.limit, kGatewayRange); !s.ok()) return s;
    if (log.window.count() > kMaxFillNs) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "window=%d ns: %s keeps a sliding log's event ages exact up to %d ns (%s)",
          log.window.count(), kGatewayRange.store, kMaxFillNs, span_days(kMaxFillNs)));
    }
    return pack_policy(3, log.limit, log.window.count(), 0, 0, log.window.count());
  }
  // The window estimate (kind 4): limit, the grid's w and mode, windows per second (mode
  // 1), W; windows below 2^52 ns, as LuaTwin<SlidingWindowEstimate> (exact products).
  static absl::StatusOr<PolicyArgs> estimate_params(const SlidingWindowEstimate& est) {
    if (auto s = check_capacity("limit", est.limit, kGatewayRange); !s.ok()) return s;
    auto grid = window_grid(est.window, LuaTwin<SlidingWindowEstimate>::kMaxWindowNs,
                            "(~52 days, below 2^52 ns), so that the estimate is exact in Lua",
                            kGatewayRange.store);
    if (!grid.ok()) return grid.status();
    const std::int64_t per = grid->mode == 1 ? kNanosPerSecond / grid->w : 0;
    return pack_policy(4, est.limit, grid->w, grid->mode, per, est.window.count());
  }

  // A time as the script's two limbs: seconds (floor) and nanoseconds in [0, 10^9).
  static std::pair<std::int64_t, std::int64_t> limbs(Nanos t) {
    const std::int64_t sec = quota::detail::floor_div(t.count(), kNanosPerSecond);
    return {sec, t.count() - sec * kNanosPerSecond};
  }
  static constexpr std::int64_t kNanosPerSecond = 1'000'000'000;

  struct Decided {
    Nanos time{0};
    gateway::CheckVector<Decision> parts;
  };

  // Element i as an integer: an integer reply, or a decimal string (how the script
  // answers a value past 2^53, which a Lua double cannot hold exactly).
  static absl::StatusOr<std::int64_t> integer_at(const redisReply& r, std::size_t i) {
    std::int64_t v = 0;
    if (i < r.elements && r.element[i] != nullptr && r.element[i]->type == REDIS_REPLY_STRING &&
        absl::SimpleAtoi(absl::string_view(r.element[i]->str, r.element[i]->len), &v)) {
      return v;
    }
    if (i >= r.elements || r.element[i] == nullptr || r.element[i]->type != REDIS_REPLY_INTEGER) {
      return absl::UnavailableError(absl::StrFormat(
          "malformed reply from the gateway script: element %d is not an integer", i));
    }
    return static_cast<std::int64_t>(r.element[i]->integer);
  }

  static absl::Status script_error(const redisReply& r) {
    const std::string_view msg = reply_string(r);
    if (msg.find("QUOTA_CORRUPT") != std::string_view::npos) {
      return absl::DataLossError(absl::StrCat("redis: ", detail::av(msg)));
    }
    return error_status(r);
  }

  static absl::StatusOr<Decided> parse_decide(const redisReply& r, std::size_t n) {
    if (r.type == REDIS_REPLY_ERROR) return script_error(r);
    const bool array = r.type == REDIS_REPLY_ARRAY;
    auto sec = array ? integer_at(r, 0) : absl::StatusOr<std::int64_t>(0);
    auto ns = array ? integer_at(r, 1) : absl::StatusOr<std::int64_t>(0);
    auto count = array ? integer_at(r, 2) : absl::StatusOr<std::int64_t>(0);
    if (!sec.ok()) return sec.status();
    if (!ns.ok()) return ns.status();
    if (!count.ok()) return count.status();
    if (!array || *count < 1 || static_cast<std::size_t>(*count) > n ||
        r.elements != 3 + 6 * static_cast<std::size_t>(*count) || *ns < 0 ||
        *ns >= kNanosPerSecond) {
      return absl::UnavailableError(absl::StrFormat(
          "malformed reply from the gateway script: type %d with %d elements for %d levels", r.type,
          array ? r.elements : 0, n));
    }
    Decided out{.time = Nanos{*sec * kNanosPerSecond + *ns}, .parts = {}};
    for (std::size_t i = 0; i < static_cast<std::size_t>(*count); ++i) {
      std::int64_t f[6];
      for (std::size_t k = 0; k < 6; ++k) {
        auto x = integer_at(r, 3 + 6 * i + k);
        if (!x.ok()) return x.status();
        f[k] = *x;
      }
      if (f[1] < 0 || f[1] > 3 || (f[0] != 0) != (f[1] == 0) || f[5] < 0) {
        return absl::UnavailableError(absl::StrFormat(
            "malformed reply from the gateway script: allowed %d with reason %d, version %d", f[0],
            f[1], f[5]));
      }
      out.parts.push_back(Decision{.allowed = f[0] != 0,
                                   .remaining = f[2],
                                   .retry_after = f[3] < 0 ? kNever : Nanos{f[3]},
                                   .reset_after = f[4] < 0 ? kNever : Nanos{f[4]},
                                   .version = static_cast<std::uint64_t>(f[5]),
                                   .reason = static_cast<Reason>(f[1])});
    }
    return out;
  }

  // A decide reply in either form (twin/gateway.hpp): the general one (parse_decide
  // above), or the quick path's: the count negative, then per level decided its outcome,
  // its tokens (micro-units) and carry over the policy's reduced period; the reason,
  // remaining, retry_after and reset_after derived as TokenBucket::apply does (the
  // gateway's KeyState arithmetic for a token bucket), the version the caller's.
  static absl::StatusOr<Decided> parse_decide(const redisReply& r,
                                              std::span<const gateway::LevelCheck> levels,
                                              std::uint64_t version) {
    if (r.type != REDIS_REPLY_ARRAY || r.elements < 3) return parse_decide(r, levels.size());
    auto count = integer_at(r, 2);
    if (!count.ok()) return count.status();
    if (*count >= 0) return parse_decide(r, levels.size());
    auto sec = integer_at(r, 0);
    auto ns = integer_at(r, 1);
    if (!sec.ok()) return sec.status();
    if (!ns.ok()) return ns.status();
    const std::size_t n = static_cast<std::size_t>(-*count);
    if (n > levels.size() || r.elements != 3 + 3 * n || *ns < 0 || *ns >= kNanosPerSecond) {
      return absl::UnavailableError(absl::StrFormat(
          "malformed reply from the gateway script: %d elements for %d quick levels of %d",
          r.elements, n, levels.size()));
    }
    Decided out{.time = Nanos{*sec * kNanosPerSecond + *ns}, .parts = {}};
    for (std::size_t i = 0; i < n; ++i) {
      std::int64_t f[3];
      for (std::size_t k = 0; k < 3; ++k) {
        auto x = integer_at(r, 3 + 3 * i + k);
        if (!x.ok()) return x.status();
        f[k] = *x;
      }
      const auto* tb = std::get_if<TokenBucket>(levels[i].policy);
      if (tb == nullptr) {
        return absl::UnavailableError(
            "malformed reply from the gateway script: a quick level that is not a token bucket");
      }
      auto d = quick_decision(*tb, std::clamp<std::int64_t>(levels[i].cost, 0, kMaxUnits), f[0],
                              f[1], f[2]);
      if (!d.ok()) return d.status();
      d->version = version;
      out.parts.push_back(*d);
    }
    return out;
  }

  // One quick level's decision from its outcome `ok`, tokens (micro-units) and carry (over
  // rate.per / g, g = gcd(rate.units·10^6, rate.per): the twin's reduced period).
  static absl::StatusOr<Decision> quick_decision(const TokenBucket& tb, std::int64_t cost,
                                                 std::int64_t ok, std::int64_t tokens,
                                                 std::int64_t carry) {
    const MicroUnits cap = to_micro(tb.burst);
    const std::int64_t per = tb.rate.per.count();
    const std::int64_t g = tb.rate.units == 0 ? per : std::gcd(to_micro(tb.rate.units), per);
    const bool fits = cost >= 1 && cost <= tb.burst;
    if ((ok != 0 && ok != 1) || tokens < gateway::detail::token_floor(cap) || tokens > cap ||
        carry < 0 || carry >= per / g || (ok == 1 && !fits) ||
        (ok == 0 && fits && tokens >= to_micro(cost))) {
      return absl::UnavailableError(absl::StrFormat(
          "malformed reply from the gateway script: allowed %d, tokens %d, carry %d for cost %d",
          ok, tokens, carry, cost));
    }
    const TokenBucket::State st{.tokens = tokens, .carry = carry * g, .last = 0};
    const Reason reason = ok == 1    ? Reason::kAllowed
                          : cost < 1 ? Reason::kInvalidCost
                          : !fits    ? Reason::kCostExceedsBurst
                                     : Reason::kOverLimit;
    Nanos retry{0};
    if (reason == Reason::kOverLimit) {
      retry = tb.time_to_reach(st, to_micro(cost));
    } else if (reason != Reason::kAllowed) {
      retry = kNever;
    }
    return Decision{.allowed = ok == 1,
                    .remaining = tokens / kMicrosPerUnit,
                    .retry_after = retry,
                    .reset_after = tb.reset_after(st),
                    .version = 0,
                    .reason = reason};
  }

  // The reply of a refund or charge: the micro-units the key holds after it.
  static absl::StatusOr<MicroUnits> parse_units(const redisReply& r) {
    if (r.type == REDIS_REPLY_ERROR) return script_error(r);
    if (r.type != REDIS_REPLY_ARRAY || r.elements != 3) {
      return absl::UnavailableError(absl::StrFormat(
          "malformed reply from the gateway script: type %d, expected an array of 3", r.type));
    }
    auto v = integer_at(r, 2);
    if (!v.ok()) return v.status();
    if (*v < 0) {
      return absl::UnavailableError(
          absl::StrFormat("malformed reply from the gateway script: %d micro-units", *v));
    }
    return *v;
  }
};

}  // namespace quota::redis
