// quota/redis/redis_store.hpp — RedisStore: one shared budget across every process.
//
// `RedisStore<P>` keeps each key's policy state in Redis and applies the policy's
// transition there, in the policy's Lua twin, in ONE `EVALSHA` round trip: read, refill,
// decide, deduct and write run atomically on the server, whichever gateway asks. It
// models quota::StateStore, so `Limiter<TokenBucket, RedisStore>` works like the
// in-process limiters:
//
//   auto pool = std::make_shared<quota::redis::ConnectionPool>(
//       quota::redis::ConnectionConfig{.host = "127.0.0.1", .port = 6379}, 8);
//   auto limiter = quota::Limiter<quota::TokenBucket, quota::RedisStore>::create(
//       {.rate = {.units = 100, .per = 1s}, .burst = 20}, quota::RedisStoreOptions{.pool = pool});
//   auto key = quota::redis::tenant_key("acme", "read");          // "{acme}read"
//   absl::StatusOr<quota::Decision> d = limiter->acquire(*key, 1);
//
// Time. By default the decision uses the SERVER's clock (`redis.call('TIME')`), the
// authority's, never the caller's: the `now` passed to apply is ignored. (Redis 7
// replicates scripts by their effects, so TIME in a writing script is allowed and
// replicas get the written state.) TimeSource::kCaller passes `now` instead: for
// differential tests against the C++ policy with a manual clock, not for production.
//
// Keys. See keys.hpp: "{tenant}route" keys (tenant_key) put all of a tenant's buckets in
// one hash slot; other keys become their own tag; braces and control characters
// elsewhere are rejected. The Redis key is `<prefix>{tag}rest`.
//
// Failures are values: transport failures, deadlines (ConnectionConfig), `BUSY`,
// `LOADING`, `READONLY`, any other error reply and malformed replies are
// absl::StatusCode::kUnavailable with the cause; nothing is allowed or denied then
// (a timed-out call may still have been applied on the server). `NOSCRIPT` (after a
// flush, restart or failover) retries once — only on that error — with EVAL and the
// script's text, which loads and runs it in one command.
// A key whose stored value is not a bucket of ours is kDataLoss naming the key; an
// invalid key or attempt id is kInvalidArgument; a policy outside the Lua twin's exact
// range is kInvalidArgument naming the bound (check it up front with
// `RedisStore<P>::check(policy)`).
//
// Policies: TokenBucket, FixedWindow, SlidingLog and SlidingWindowEstimate, each with
// its Lua twin (token_bucket_lua.hpp, fixed_window_lua.hpp, sliding_log_lua.hpp,
// sliding_window_estimate_lua.hpp), kept bit-identical to the C++ policy by
// tests/redis/redis_differential_test.cpp. Each twin's exact range is narrower than the
// C++ policy's (Lua numbers are doubles); `check` names the bound that a policy breaks.
//
// Beyond StateStore: `acquire` with an attempt id (idempotent: the first result is kept
// in the tenant's slot for `attempt_ttl` and replayed), `acquire_all` (hierarchy: several
// buckets of one tenant, all allow or nothing is deducted), `acquire_many` (a pipelined
// batch: one EVALSHA per decision, all in one write; one write per node on a cluster)
// and `acquire_batch` (independent decisions, many per EVALSHA; one EVALSHA per slot on
// a cluster). With RedisStoreOptions::coalesce, concurrent `apply` calls from many
// threads are decided together the same way, each exactly as if alone (see apply).
//
// Durability. The store keeps what Redis keeps: a server restarted without persistence
// (or a failover that loses writes) recreates buckets full — an extra burst per key.
// RedisStoreOptions::replicas makes every decision wait for that many replicas (WAIT),
// so that a failover keeps every decision given; a restart needs the server's AOF.
//
// Redis Cluster: set RedisStoreOptions::cluster (cluster.hpp) instead of `pool`. Each
// call goes to its slot's node and follows MOVED / ASK; a tenant's keys share a slot, so
// hierarchy and attempts work unchanged. acquire_many and acquire_batch group their
// calls by node and send each node's calls in ONE pipelined write, all nodes written
// before any reply is read; redirected calls (MOVED / ASK) and NOSCRIPT are sent again
// in a further round. A script call may declare keys of one slot only, so on a cluster
// acquire_batch makes one script call per slot (not one per batch). A call of several
// keys (acquire_all, a call of acquire_batch) that meets its slot half migrated gets
// -TRYAGAIN (the script did not run): it is sent again after a short backoff, a few
// times within the command deadline (redis::TryAgainPolicy, set on the ClusterPool),
// then it is kUnavailable naming TRYAGAIN, with nothing charged.
//
// Thread safety: every method may be called from any number of threads; connections
// come from the shared ConnectionPool.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <numeric>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/numeric/int128.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "quota/decision.hpp"
#include "quota/policy/fixed_window.hpp"
#include "quota/policy/policy.hpp"
#include "quota/policy/sliding_log.hpp"
#include "quota/policy/sliding_window_estimate.hpp"
#include "quota/policy/token_bucket.hpp"
#include "quota/redis/cluster.hpp"
#include "quota/redis/coalescer.hpp"
#include "quota/redis/connection.hpp"
#include "quota/redis/fixed_window_lua.hpp"
#include "quota/redis/keys.hpp"
#include "quota/redis/script.hpp"
#include "quota/redis/sliding_log_lua.hpp"
#include "quota/redis/sliding_window_estimate_lua.hpp"
#include "quota/redis/token_bucket_lua.hpp"
#include "quota/units.hpp"

namespace quota {

namespace redis {

enum class TimeSource {
  kServer,  // redis.call('TIME'): the authority's clock (production)
  kCaller,  // the `now` given to apply (differential tests only)
};

// 2^53: Lua numbers (doubles) hold every integer below it exactly.
inline constexpr std::int64_t kLuaExact = std::int64_t{1} << 53;
// The longest time to fill a bucket the Lua twin handles: 9·10^6 s (~104 days).
inline constexpr std::int64_t kMaxFillNs = 9'000'000'000'000'000;

// The Lua twin of a policy: its script, its parameters as script arguments, and the
// range in which the script is exact. Specialized per policy.
template <Policy P>
struct LuaTwin;

template <>
struct LuaTwin<TokenBucket> {
  static const std::string& script() { return kTokenBucketLua; }

  // The script's per-bucket parameters; see token_bucket_lua.hpp.
  struct Params {
    std::int64_t m = 0, p = 1, g = 1, fill = -1;
  };

  static absl::StatusOr<Params> params(const TokenBucket& tb) {
    if (auto s = tb.validate(); !s.ok()) return s;
    if (tb.burst > (kLuaExact - 1) / kMicrosPerUnit) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "burst=%d: the Redis store keeps micro-units in Lua doubles, exact below 2^53, so "
          "burst must be at most %d units",
          tb.burst, (kLuaExact - 1) / kMicrosPerUnit));
    }
    const std::int64_t big_m = to_micro(tb.rate.units);
    const std::int64_t big_p = tb.rate.per.count();
    if (big_m == 0) return Params{.m = 0, .p = 1, .g = big_p, .fill = -1};
    if (big_p >= kLuaExact) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "rate.per=%d ns: the Redis store needs rate.per below 2^53 ns (~104 days)", big_p));
    }
    const std::int64_t g = std::gcd(big_m, big_p);
    const std::int64_t m = big_m / g, p = big_p / g;
    if ((absl::int128(m) + 2) * (absl::int128(p) + 1) > kLuaExact) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "rate=%s: with g = gcd(rate.units*10^6, rate.per) = %d, the Redis store needs "
          "(rate.units*10^6/g + 2)*(rate.per/g + 1) <= 2^53 (Lua doubles); got %d/g and %d/g — "
          "use a rate.per that shares more factors with rate.units*10^6 (e.g. whole ms)",
          to_string(tb.rate), g, big_m, big_p));
    }
    const absl::int128 fill =
        quota::detail::ceil_div(absl::int128(to_micro(tb.burst)) * p, absl::int128(m));
    if (fill > kMaxFillNs) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "burst/rate: refilling burst=%d at rate=%s takes %d ns; the Redis store's bound is "
          "%d ns (~104 days) — raise rate.units or lower burst",
          tb.burst, to_string(tb.rate), static_cast<std::int64_t>(fill), kMaxFillNs));
    }
    return Params{.m = m, .p = p, .g = g, .fill = static_cast<std::int64_t>(fill)};
  }

  // Appends the 6 per-bucket arguments: the cost, then the 5 parameters (build() sends
  // the costs first and the parameters once when all buckets share them).
  static void append_args(const TokenBucket& tb, const Params& pr, std::int64_t cost,
                          std::vector<std::string>& args) {
    // Costs outside [1, burst] decide the same whatever their size; clamping keeps them
    // exact in Lua.
    const std::int64_t c = std::clamp<std::int64_t>(cost, 0, tb.burst + 1);
    args.push_back(absl::StrCat(c));
    args.push_back(absl::StrCat(tb.burst));
    args.push_back(absl::StrCat(pr.m));
    args.push_back(absl::StrCat(pr.p));
    args.push_back(absl::StrCat(pr.g));
    args.push_back(absl::StrCat(pr.fill));
  }

  // The compact reply (token_bucket_lua.hpp): each bucket's state as the script wrote it
  // (kStateBytes bytes: tokens and carry as 7-byte little-endian integers first), and the
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
    auto field = [&](std::size_t at) {
      std::int64_t v = 0;
      for (std::size_t i = 7; i-- > 0;) {
        v = (v << 8) | static_cast<unsigned char>(state[at + i]);
      }
      return v;
    };
    const std::int64_t tokens = field(0), carry = field(7);
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

template <>
struct LuaTwin<FixedWindow> {
  static const std::string& script() { return kFixedWindowLua; }

  struct Params {
    std::int64_t mode = 1, w = 1;  // see fixed_window_lua.hpp
  };

  static absl::StatusOr<Params> params(const FixedWindow& fw) {
    if (auto s = fw.validate(); !s.ok()) return s;
    if (fw.limit > kLuaExact - 2) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "limit=%d: the Redis store counts in Lua doubles, exact below 2^53, so limit must be "
          "at most %d",
          fw.limit, kLuaExact - 2));
    }
    const std::int64_t w = fw.window.count();
    constexpr std::int64_t kSecond = 1'000'000'000;
    if (kSecond % w == 0) return Params{.mode = 1, .w = w};
    if (w % kSecond == 0 && w <= kMaxFillNs) return Params{.mode = 2, .w = w / kSecond};
    return absl::InvalidArgumentError(absl::StrFormat(
        "window=%d ns: the Redis store needs a window that divides 1 s or is a whole number "
        "of seconds up to %d s (~104 days), so that window starts are exact in Lua",
        w, kMaxFillNs / kSecond));
  }

  static void append_args(const FixedWindow& fw, const Params& pr, std::int64_t cost,
                          std::vector<std::string>& args) {
    args.push_back(absl::StrCat(std::clamp<std::int64_t>(cost, 0, fw.limit + 1)));
    args.push_back(absl::StrCat(fw.limit));
    args.push_back(absl::StrCat(pr.mode));
    args.push_back(absl::StrCat(pr.w));
    args.push_back("0");
    args.push_back("0");
  }
};

template <>
struct LuaTwin<SlidingWindowEstimate> {
  static const std::string& script() { return kSlidingWindowEstimateLua; }

  struct Params {
    std::int64_t mode = 1, w = 1, per = 0;  // see sliding_window_estimate_lua.hpp
  };

  // The longest window: below 2^52 ns (products of two values below 2^52 are exact).
  static constexpr std::int64_t kMaxWindowNs = 4'500'000'000'000'000;

  static absl::StatusOr<Params> params(const SlidingWindowEstimate& sw) {
    if (auto s = sw.validate(); !s.ok()) return s;
    const std::int64_t w = sw.window.count();
    constexpr std::int64_t kSecond = 1'000'000'000;
    if (kSecond % w == 0) return Params{.mode = 1, .w = w, .per = kSecond / w};
    if (w % kSecond == 0 && w <= kMaxWindowNs) return Params{.mode = 2, .w = w / kSecond, .per = 0};
    return absl::InvalidArgumentError(absl::StrFormat(
        "window=%d ns: the Redis store needs a window that divides 1 s or is a whole number "
        "of seconds up to %d s (~52 days, below 2^52 ns), so that the estimate is exact in Lua",
        w, kMaxWindowNs / kSecond));
  }

  static void append_args(const SlidingWindowEstimate& sw, const Params& pr, std::int64_t cost,
                          std::vector<std::string>& args) {
    args.push_back(absl::StrCat(std::clamp<std::int64_t>(cost, 0, sw.limit + 1)));
    args.push_back(absl::StrCat(sw.limit));
    args.push_back(absl::StrCat(pr.mode));
    args.push_back(absl::StrCat(pr.w));
    args.push_back(absl::StrCat(sw.window.count()));
    args.push_back(absl::StrCat(pr.per));
  }
};

template <>
struct LuaTwin<SlidingLog> {
  static const std::string& script() { return kSlidingLogLua; }

  struct Params {};

  static absl::StatusOr<Params> params(const SlidingLog& sl) {
    if (auto s = sl.validate(); !s.ok()) return s;
    if (sl.window.count() > kMaxFillNs) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "window=%d ns: the Redis store's bound is %d ns (~104 days), so that event ages "
          "are exact in Lua",
          sl.window.count(), kMaxFillNs));
    }
    return Params{};
  }

  static void append_args(const SlidingLog& sl, const Params&, std::int64_t cost,
                          std::vector<std::string>& args) {
    args.push_back(absl::StrCat(std::clamp<std::int64_t>(cost, 0, sl.limit + 1)));
    args.push_back(absl::StrCat(sl.limit));
    args.push_back(absl::StrCat(sl.window.count()));
    args.push_back("0");
    args.push_back("0");
    args.push_back("0");
  }
};

// The result of one script call, with what apply() leaves out.
struct Outcome {
  Decision decision;            // for several buckets: the combined decision
  std::vector<Decision> parts;  // one per bucket, in request order
  Nanos time{0};                // the time the script decided at (server or caller time)
  bool replayed = false;        // an attempt's stored first result
};

}  // namespace redis

struct RedisStoreOptions {
  // Connections to the server. Required.
  std::shared_ptr<redis::ConnectionPool> pool;
  // Prepended to every Redis key. No braces or control characters.
  std::string prefix = "quota:";
  redis::TimeSource time = redis::TimeSource::kServer;
  // Added to each bucket's time-to-full when setting its TTL.
  std::chrono::milliseconds ttl_margin{1000};
  // How long an attempt's first result is kept (>= the caller's retry window).
  std::chrono::milliseconds attempt_ttl{std::chrono::minutes(10)};
  // Or, instead of `pool`: a Redis Cluster (cluster.hpp). Each call goes to the node of
  // its slot, following MOVED and ASK. (Last and default-initialized, so that designated
  // initializers that skip it stay warning-free.)
  std::shared_ptr<redis::ClusterPool> cluster = nullptr;
  // Coalescing, for a gateway with many threads: while `coalesce_calls` of apply()'s
  // round trips are in flight, further apply() calls wait and are then decided
  // together, up to `coalesce` per round trip (independent decisions, as acquire_batch:
  // each deducted when it alone allows). Each caller still gets its own decision; a
  // lone caller goes at once. 0 or 1: off (one script call per apply). See
  // RedisStore::apply. Each round trip in flight holds one of the pool's connections:
  // give the pool at least `coalesce_calls` (plus what other calls use alongside).
  int coalesce = 0;
  int coalesce_calls = 2;
  // Durability across a failover: when > 0, every write of script calls ends with `WAIT
  // replicas replica_timeout` (in the same pipelined write), and a decision is given only
  // when that many replicas acknowledged it; otherwise kUnavailable (the deduction stands
  // on the master, so the caller may have paid, never got more than its budget; but a
  // replica promoted now would not have it). replica_timeout must be below the
  // connections' command_timeout. 0: no WAIT (a failover may forget acknowledged
  // decisions: an extra burst at most, per key).
  int replicas = 0;
  std::chrono::milliseconds replica_timeout{2};
};

template <Policy P>
class RedisStore {
 public:
  using policy_type = P;
  using Twin = redis::LuaTwin<P>;

  explicit RedisStore(RedisStoreOptions options)
      : options_(std::move(options)),
        script_(Twin::script(), options_.pool, options_.cluster, durability()) {
    if (options_.pool == nullptr && options_.cluster == nullptr) {
      config_error_ =
          absl::InvalidArgumentError("RedisStoreOptions: both pool and cluster are null");
    } else if (auto s = redis::detail::check_chars(options_.prefix, "prefix"); !s.ok()) {
      config_error_ = s;
    } else if (options_.coalesce < 0 || options_.coalesce > kMaxCoalesce) {
      config_error_ = absl::InvalidArgumentError(absl::StrFormat(
          "RedisStoreOptions: coalesce=%d, must be in [0, %d]", options_.coalesce, kMaxCoalesce));
    } else if (options_.coalesce > 1 && options_.coalesce_calls < 1) {
      config_error_ = absl::InvalidArgumentError(absl::StrFormat(
          "RedisStoreOptions: coalesce_calls=%d, must be at least 1", options_.coalesce_calls));
    } else if (auto s = check_durability(); !s.ok()) {
      config_error_ = s;
    }
    if (options_.coalesce > 1) {
      coalescer_ = std::make_unique<Coalescer>(options_.coalesce, options_.coalesce_calls);
    }
  }

  // OK when the Lua twin decides `policy` exactly; else InvalidArgument naming the bound.
  static absl::Status check(const P& policy) { return Twin::params(policy).status(); }

  // The most decisions one coalesced round trip takes (RedisStoreOptions::coalesce).
  static constexpr int kMaxCoalesce = 4096;

  // StateStore: one decision, one round trip. With RedisStoreOptions::coalesce, a call
  // made while `coalesce_calls` coalesced round trips are in flight waits for one of them
  // to return and then goes with the calls that waited with it (the oldest first, at
  // most `coalesce`), in one round trip, as acquire_batch decides a batch: each decision
  // independent, exactly as if made alone, in the order the calls arrived. That is one
  // script call (per slot, on a cluster), split where a key repeats or, in caller-time
  // mode, where the time changes. A key or policy the store rejects fails its
  // own call before it waits. A corrupt bucket fails the script call it is in and
  // charges nothing (lua_common.hpp); each caller of that call is then decided alone, so
  // that only the corrupt bucket's caller gets the error (likewise for a TRYAGAIN given
  // up on, on a cluster). A transport failure fails every caller of the call
  // (kUnavailable: their decisions may have been applied), as it would each alone.
  absl::StatusOr<Decision> apply(const P& policy, std::string_view key, Nanos now,
                                 std::int64_t cost) {
    if (coalescer_ != nullptr) return apply_coalesced(policy, key, now, cost);
    auto r = acquire(policy, key, now, cost);
    if (!r.ok()) return r.status();
    return r->decision;
  }

  // Coalescing counters (RedisStoreOptions::coalesce): the round trips made for apply()
  // (each one pipelined write, usually of one script call) and the decisions they
  // carried (decisions / round_trips: the mean batch), and the calls waiting now.
  using CoalesceStats = redis::CoalesceStats;
  CoalesceStats coalesce_stats() const {
    return coalescer_ == nullptr ? CoalesceStats{} : coalescer_->stats();
  }

  // One decision; with a non-empty `attempt_id`, idempotent: the first result for the id
  // is stored in the tenant's slot for options.attempt_ttl and replayed (replayed =
  // true) for a retry; the same id with another key or cost is InvalidArgument.
  absl::StatusOr<redis::Outcome> acquire(const P& policy, std::string_view key, Nanos now,
                                         std::int64_t cost, std::string_view attempt_id = {}) {
    const Request req{&policy, key, cost};
    return acquire_all(std::span<const Request>(&req, 1), now, attempt_id);
  }

  // One bucket of a hierarchical check.
  struct Request {
    const P* policy;
    std::string_view key;
    std::int64_t cost;
  };

  // Hierarchy: every bucket (all keys of ONE tenant: the same hash tag) is refilled and
  // checked in one script; all are deducted if all allow, none otherwise. The combined
  // decision: allowed iff all allow; remaining the least; retry_after and reset_after
  // the largest (kNever wins); reason that of the first bucket that denies.
  absl::StatusOr<redis::Outcome> acquire_all(std::span<const Request> reqs, Nanos now,
                                             std::string_view attempt_id = {}) {
    auto call = build(reqs, now, attempt_id);
    if (!call.ok()) return call.status();
    auto reply = execute(*call);
    if (!reply.ok()) return reply.status();
    return parse(**reply, reqs);
  }

  // A pipelined batch: one EVALSHA per request, all written at once on one connection,
  // replies read in order. Each element is that request's own result; a transport
  // failure fails the whole batch (kUnavailable: some may have been applied). On a
  // cluster: one pipelined write per node, written to every node before any reply is
  // read (execute_many); a node that fails (transport, pool, too many redirections)
  // makes each of ITS items kUnavailable, the other nodes' decisions are returned.
  struct BatchItem {
    std::string_view key;
    std::int64_t cost;
  };
  absl::StatusOr<std::vector<absl::StatusOr<Decision>>> acquire_many(
      const P& policy, std::span<const BatchItem> items, Nanos now) {
    std::vector<absl::StatusOr<Decision>> results(items.size(), absl::UnknownError("unset"));
    std::vector<Call> calls;
    std::vector<std::size_t> index;  // calls[i] answers items[index[i]]
    calls.reserve(items.size());
    for (std::size_t i = 0; i < items.size(); ++i) {
      const Request req{&policy, items[i].key, items[i].cost};
      auto call = build(std::span<const Request>(&req, 1), now, {});
      if (!call.ok()) {
        results[i] = call.status();
        continue;
      }
      calls.push_back(std::move(*call));
      index.push_back(i);
    }
    if (calls.empty()) return results;
    auto replies = execute_many(calls);
    if (options_.cluster == nullptr) {
      // One server: a failed write fails the whole batch (some calls may have run).
      if (auto s = first_failure(replies); !s.ok()) return s;
    }
    for (std::size_t c = 0; c < calls.size(); ++c) {
      if (!replies[c].ok()) {
        results[index[c]] = replies[c].status();
        continue;
      }
      const Request req{&policy, items[index[c]].key, items[index[c]].cost};
      auto out = parse(**replies[c], std::span<const Request>(&req, 1));
      results[index[c]] = out.ok() ? absl::StatusOr<Decision>(out->decision)
                                   : absl::StatusOr<Decision>(out.status());
    }
    return results;
  }

  // A batch in ONE script call: every item decided independently (each deducted when it
  // alone allows), in order, atomically as a whole. Items may belong to different
  // tenants. A key that repeats starts a new script call (the script reads every key
  // before it writes), and all the calls go in one pipelined write. Per-item errors (an
  // invalid key) fail the whole batch with that error; nothing is sent then.
  //
  //
  // Results as acquire_many's: the outer status fails the whole batch (an invalid key,
  // nothing sent; on a standalone server a pool or transport failure: some calls may
  // have been applied); otherwise each item has its own result, and an item whose
  // script call failed (an error reply, a corrupt bucket of its call) carries that
  // call's error.
  //
  // On a cluster a script may only declare keys of ONE slot (even with Redis 7's
  // `allow-cross-slot-keys` flag, which only lifts the check for keys a script touches
  // without declaring them), so the batch becomes one script call per slot (items of a
  // slot in their order; a repeated key starts the slot's next call), and each node's
  // calls go in one pipelined write (execute_many). Decisions come back in the
  // caller's order. Atomic per script call only; as in acquire_many, a node that fails
  // (transport, pool, too many redirections, TRYAGAIN past its retries) makes each of
  // ITS items kUnavailable (they may have been applied, except after TRYAGAIN), and the
  // other nodes' decisions are returned.
  absl::StatusOr<std::vector<absl::StatusOr<Decision>>> acquire_batch(
      const P& policy, std::span<const BatchItem> items, Nanos now) {
    std::vector<Request> reqs;
    reqs.reserve(items.size());
    for (const BatchItem& item : items) reqs.push_back(Request{&policy, item.key, item.cost});
    return decide_batch(reqs, now);
  }

  const RedisStoreOptions& options() const { return options_; }

  // The Redis key a store key maps to (tests and operators use it, e.g. MEMORY USAGE).
  absl::StatusOr<std::string> redis_key(std::string_view key) const {
    auto parts = redis::split_key(key);
    if (!parts.ok()) return parts.status();
    return redis::bucket_key(options_.prefix, *parts);
  }

 private:
  // RedisStoreOptions::replicas and replica_timeout, checked against the connections.
  absl::Status check_durability() const {
    const redis::ConnectionConfig& c =
        options_.cluster != nullptr ? options_.cluster->config() : options_.pool->config();
    return redis::check_durability(durability(), c, "RedisStoreOptions");
  }
  redis::Durability durability() const {
    return {.replicas = options_.replicas, .timeout = options_.replica_timeout};
  }

  // The keys and arguments of one script call, owned.
  struct Call {
    std::vector<std::string> keys;
    std::vector<std::string> args;
  };

  // Sends one call (redis::Script: EVALSHA, NOSCRIPT → EVAL once, MOVED / ASK on a
  // cluster).
  absl::StatusOr<redis::Reply> execute(const Call& call) {
    return script_.run(call.keys, call.args);
  }

  // acquire_batch over requests that may each have their own policy and, in caller-time
  // mode, their own time (`times[i]` for reqs[i]; empty: `now` for all): a change of
  // time starts a new script call, as a repeated key does.
  absl::StatusOr<std::vector<absl::StatusOr<Decision>>> decide_batch(
      std::span<const Request> reqs, Nanos now, std::span<const Nanos> times = {}) {
    if (reqs.empty()) return std::vector<absl::StatusOr<Decision>>{};
    auto time_of = [&](std::size_t i) { return times.empty() ? now : times[i]; };
    if (options_.cluster != nullptr) return acquire_batch_cluster(reqs, time_of);
    std::vector<std::vector<Request>> chunks(1);
    std::vector<Nanos> chunk_time = {time_of(0)};
    std::vector<std::string_view> seen;
    for (std::size_t i = 0; i < reqs.size(); ++i) {
      if (std::find(seen.begin(), seen.end(), reqs[i].key) != seen.end() ||
          time_of(i) != chunk_time.back()) {
        chunks.emplace_back();
        chunk_time.push_back(time_of(i));
        seen.clear();
      }
      seen.push_back(reqs[i].key);
      chunks.back().push_back(reqs[i]);
    }
    std::vector<Call> calls;
    for (std::size_t c = 0; c < chunks.size(); ++c) {
      auto call = build(chunks[c], chunk_time[c], {}, /*batch=*/true);
      if (!call.ok()) return call.status();
      calls.push_back(std::move(*call));
    }
    auto replies = execute_many(calls);
    // One server: a failed write fails the whole batch (some calls may have run).
    if (auto s = first_failure(replies); !s.ok()) return s;
    std::vector<absl::StatusOr<Decision>> out;
    out.reserve(reqs.size());
    for (std::size_t c = 0; c < calls.size(); ++c) {
      auto parsed = parse(**replies[c], chunks[c], /*batch=*/true);
      for (std::size_t j = 0; j < chunks[c].size(); ++j) {
        out.push_back(parsed.ok() ? absl::StatusOr<Decision>(parsed->parts[j])
                                  : absl::StatusOr<Decision>(parsed.status()));
      }
    }
    return out;
  }

  // acquire_batch on a cluster: one script call per slot (see acquire_batch).
  // `time_of(i)`: item i's time.
  template <class TimeOf>
  absl::StatusOr<std::vector<absl::StatusOr<Decision>>> acquire_batch_cluster(
      std::span<const Request> items, const TimeOf& time_of) {
    struct Chunk {
      Nanos time;
      std::vector<Request> reqs;
      std::vector<std::size_t> items;  // reqs[j] is items[this->items[j]]
    };
    std::vector<Chunk> chunks;
    // (slot, time) -> its chunk taking items
    std::map<std::pair<int, std::int64_t>, std::size_t> open;
    for (std::size_t i = 0; i < items.size(); ++i) {
      auto parts = redis::split_key(items[i].key);
      if (!parts.ok()) return parts.status();
      const std::pair<int, std::int64_t> slot{redis::key_slot(parts->tag), time_of(i).count()};
      auto it = open.find(slot);
      const bool repeats =
          it != open.end() &&
          std::any_of(chunks[it->second].reqs.begin(), chunks[it->second].reqs.end(),
                      [&](const Request& r) { return r.key == items[i].key; });
      if (it == open.end() || repeats) {
        chunks.push_back(Chunk{.time = time_of(i), .reqs = {}, .items = {}});
        open[slot] = chunks.size() - 1;
      }
      Chunk& chunk = chunks[open[slot]];
      chunk.reqs.push_back(items[i]);
      chunk.items.push_back(i);
    }
    std::vector<Call> calls;
    calls.reserve(chunks.size());
    for (const Chunk& chunk : chunks) {
      auto call = build(chunk.reqs, chunk.time, {}, /*batch=*/true);
      if (!call.ok()) return call.status();
      calls.push_back(std::move(*call));
    }
    auto replies = execute_many(calls);
    std::vector<absl::StatusOr<Decision>> out(items.size(), absl::UnknownError("unset"));
    for (std::size_t c = 0; c < calls.size(); ++c) {
      absl::StatusOr<redis::Outcome> parsed =
          replies[c].ok() ? parse(**replies[c], chunks[c].reqs, /*batch=*/true)
                          : absl::StatusOr<redis::Outcome>(replies[c].status());
      for (std::size_t j = 0; j < chunks[c].items.size(); ++j) {
        out[chunks[c].items[j]] = parsed.ok() ? absl::StatusOr<Decision>(parsed->parts[j])
                                              : absl::StatusOr<Decision>(parsed.status());
      }
    }
    return out;
  }

  // Many calls, each server's in one pipelined write, all written before any reply is
  // read; NOSCRIPT, MOVED, ASK and TRYAGAIN followed up in further rounds (see
  // redis::Script::run_many). One reply or status per call, in order: a server that
  // fails (pool, transport) fails only its own calls (kUnavailable: they may have run).
  std::vector<absl::StatusOr<redis::Reply>> execute_many(const std::vector<Call>& calls) {
    std::vector<redis::Script::Call> views;
    views.reserve(calls.size());
    for (const Call& c : calls) views.push_back({&c.keys, &c.args});
    return script_.run_many(views);
  }
  static absl::Status first_failure(const std::vector<absl::StatusOr<redis::Reply>>& replies) {
    for (const auto& r : replies) {
      if (!r.ok()) return r.status();
    }
    return absl::OkStatus();
  }

  absl::StatusOr<Call> build(std::span<const Request> reqs, Nanos now, std::string_view attempt_id,
                             bool batch = false) const {
    if (!config_error_.ok()) return config_error_;
    if (reqs.empty()) return absl::InvalidArgumentError("no buckets requested");
    Call call;
    std::string tag;
    std::string fingerprint;
    std::vector<std::string> bucket_args;
    for (std::size_t i = 0; i < reqs.size(); ++i) {
      auto parts = redis::split_key(reqs[i].key);
      if (!parts.ok()) return parts.status();
      if (i == 0) {
        tag = std::string(parts->tag);
      } else if (!batch && parts->tag != tag) {
        return absl::InvalidArgumentError(
            absl::StrFormat("keys of one call must share one tenant (hash tag): \"%s\" vs \"%s\"",
                            tag, parts->tag));
      }
      auto params = Twin::params(*reqs[i].policy);
      if (!params.ok()) return params.status();
      call.keys.push_back(redis::bucket_key(options_.prefix, *parts));
      Twin::append_args(*reqs[i].policy, *params, reqs[i].cost, bucket_args);
      if (!attempt_id.empty()) {
        absl::StrAppend(&fingerprint, call.keys.back(), "\x1f", reqs[i].cost, "\x1f");
      }
    }
    const bool has_attempt = !attempt_id.empty();
    if (has_attempt) {
      auto akey = redis::attempt_key(options_.prefix, tag, attempt_id);
      if (!akey.ok()) return akey.status();
      call.keys.push_back(std::move(*akey));
    }
    if (options_.time == redis::TimeSource::kCaller) {
      // floor division, so that the nanoseconds limb is in [0, 1e9) for negative times too
      std::int64_t sec = now.count() / 1'000'000'000;
      std::int64_t ns = now.count() % 1'000'000'000;
      if (ns < 0) {
        ns += 1'000'000'000;
        --sec;
      }
      call.args.push_back(absl::StrCat(sec));
      call.args.push_back(absl::StrCat(ns));
    } else {
      call.args.emplace_back();
      call.args.emplace_back();
    }
    call.args.push_back(absl::StrCat(options_.ttl_margin.count()));
    if (batch) {
      call.args.push_back("-1");
    } else if (has_attempt) {
      call.args.push_back(absl::StrCat(std::max<std::int64_t>(options_.attempt_ttl.count(), 1)));
    } else {
      call.args.push_back("0");
    }
    call.args.push_back(std::move(fingerprint));  // empty without an attempt: unused
    // append_args gave 6 per bucket: the cost, then 5 parameters. The costs go first,
    // once when every bucket has the same, then the parameters, once when every bucket
    // has the same (a batch of one policy and one cost: the server converts a sixth of
    // the values), else once per bucket (lua_common.hpp).
    const std::size_t n = reqs.size();
    bool shared = true;
    bool same_cost = true;
    for (std::size_t i = 1; i < n; ++i) {
      shared = shared && std::equal(bucket_args.begin() + 6 * i + 1,
                                    bucket_args.begin() + 6 * i + 6, bucket_args.begin() + 1);
      same_cost = same_cost && bucket_args[6 * i] == bucket_args[0];
    }
    call.args.push_back(absl::StrCat(n));
    call.args.push_back(same_cost ? std::string("1") : absl::StrCat(n));
    for (std::size_t i = 0; i < (same_cost ? 1 : n); ++i) {
      call.args.push_back(std::move(bucket_args[6 * i]));
    }
    call.args.push_back(shared ? std::string("1") : absl::StrCat(n));
    for (std::size_t i = 0; i < (shared ? 1 : n); ++i) {
      for (std::size_t j = 1; j < 6; ++j) call.args.push_back(std::move(bucket_args[6 * i + j]));
    }
    return call;
  }

  static absl::StatusOr<std::int64_t> integer_at(const redisReply& r, std::size_t i) {
    if (i >= r.elements || r.element[i] == nullptr || r.element[i]->type != REDIS_REPLY_INTEGER) {
      return absl::UnavailableError(absl::StrFormat(
          "malformed reply from the quota script: element %d is not an integer", i));
    }
    return static_cast<std::int64_t>(r.element[i]->integer);
  }

  static Nanos to_nanos(std::int64_t v) { return v < 0 ? kNever : Nanos{v}; }

  // The reply of a script call for `reqs` (lua_common.hpp), in the full form (five
  // integers per bucket: every twin's, and the token bucket's with an attempt or
  // replayed) or in the token bucket's compact form (each bucket's state, then its
  // denials: token_bucket_lua.hpp; LuaTwin<TokenBucket>::decision derives the fields).
  // `batch`: independent decisions (acquire_batch): each part allowed on its own.
  static absl::StatusOr<redis::Outcome> parse(const redisReply& r, std::span<const Request> reqs,
                                              bool batch = false) {
    const std::size_t n = reqs.size();
    if (r.type == REDIS_REPLY_ERROR) {
      const std::string_view msg = redis::reply_string(r);
      if (msg.find("QUOTA_CORRUPT") != std::string_view::npos) {
        return absl::DataLossError(absl::StrCat("redis: ", redis::detail::av(msg)));
      }
      if (msg.find("QUOTA_ATTEMPT_MISMATCH") != std::string_view::npos) {
        return absl::InvalidArgumentError(absl::StrCat("redis: ", redis::detail::av(msg)));
      }
      return redis::error_status(r);
    }
    constexpr bool kHasCompact = requires { Twin::kStateBytes; };
    bool compact = false;
    if constexpr (kHasCompact) compact = Twin::is_compact(r);
    if (r.type != REDIS_REPLY_ARRAY || (!compact && r.elements != 4 + 5 * n)) {
      return absl::UnavailableError(absl::StrFormat(
          "malformed reply from the quota script: type %d with %d elements, expected an array "
          "of %d",
          r.type, r.type == REDIS_REPLY_ARRAY ? r.elements : 0, 4 + 5 * n));
    }
    std::int64_t v[4];
    for (std::size_t i = 0; i < 4; ++i) {
      auto x = integer_at(r, i);
      if (!x.ok()) return x.status();
      v[i] = *x;
    }
    redis::Outcome out;
    out.replayed = v[0] != 0;
    out.time = Nanos{v[1] * 1'000'000'000 + v[2]};
    const bool all = v[3] != 0;
    // Each bucket's own decision first (`allowed`: it alone had enough).
    if constexpr (kHasCompact) {
      if (compact) {
        auto parts = Twin::compact_parts(r, n, [&](std::size_t b) {
          return std::pair<const P*, std::int64_t>(reqs[b].policy, reqs[b].cost);
        });
        if (!parts.ok()) return parts.status();
        out.parts = *std::move(parts);
      }
    }
    if (!compact) {
      out.parts.reserve(n);
      for (std::size_t b = 0; b < n; ++b) {
        std::int64_t f[5];
        for (std::size_t i = 0; i < 5; ++i) {
          auto x = integer_at(r, 4 + 5 * b + i);
          if (!x.ok()) return x.status();
          f[i] = *x;
        }
        if (f[1] < 0 || f[1] > 3) {
          return absl::UnavailableError(
              absl::StrFormat("malformed reply from the quota script: reason %d", f[1]));
        }
        out.parts.push_back(Decision{.allowed = f[0] != 0,
                                     .remaining = f[2],
                                     .retry_after = to_nanos(f[3]),
                                     .reset_after = to_nanos(f[4]),
                                     .version = 0,
                                     .reason = static_cast<Reason>(f[1])});
      }
    }
    Decision combined{.allowed = all,
                      .remaining = std::numeric_limits<std::int64_t>::max(),
                      .retry_after = Nanos{0},
                      .reset_after = Nanos{0},
                      .version = 0,
                      .reason = Reason::kAllowed};
    bool have_reason = false;
    for (Decision& d : out.parts) {
      combined.remaining = std::min(combined.remaining, d.remaining);
      combined.retry_after = std::max(combined.retry_after, d.retry_after);
      combined.reset_after = std::max(combined.reset_after, d.reset_after);
      if (!all && !d.allowed && !have_reason) {
        combined.reason = d.reason;
        have_reason = true;
      }
      if (!batch) d.allowed = all;
    }
    out.decision = combined;
    return out;
  }

  // Coalescing (apply): a caller's request and time, decided with others'.
  struct Job {
    Request req;
    Nanos now;
  };
  using Coalescer = redis::Coalescer<Job, absl::StatusOr<Decision>>;

  absl::StatusOr<Decision> apply_coalesced(const P& policy, std::string_view key, Nanos now,
                                           std::int64_t cost) {
    // What would fail the whole batch fails this call alone, before it waits.
    if (!config_error_.ok()) return config_error_;
    if (auto parts = redis::split_key(key); !parts.ok()) return parts.status();
    if (auto params = Twin::params(policy); !params.ok()) return params.status();
    return coalescer_->run(
        Job{Request{&policy, key, cost}, now},
        [this](const std::vector<const Job*>& jobs) { return decide_coalesced(jobs); });
  }

  // Decides a coalesced batch in one pipelined write (one script call per time, in
  // caller-time mode; one per slot on a cluster): one result per job.
  std::vector<absl::StatusOr<Decision>> decide_coalesced(const std::vector<const Job*>& batch) {
    std::vector<Request> reqs;
    std::vector<Nanos> times;
    reqs.reserve(batch.size());
    times.reserve(batch.size());
    for (const Job* j : batch) {
      reqs.push_back(j->req);
      // The server's clock decides: the callers' times would only split the batch.
      times.push_back(options_.time == redis::TimeSource::kServer ? Nanos{0} : j->now);
    }
    std::vector<absl::StatusOr<Decision>> out;
    out.reserve(batch.size());
    auto got = decide_batch(reqs, Nanos{0}, times);
    for (std::size_t i = 0; i < batch.size(); ++i) {
      absl::StatusOr<Decision> r =
          got.ok() ? std::move((*got)[i]) : absl::StatusOr<Decision>(got.status());
      // Nothing of that script call was charged: decide this one alone.
      if (reqs.size() > 1 && !r.ok() &&
          (absl::IsDataLoss(r.status()) || redis::not_run(r.status()))) {
        auto alone = single(reqs[i], times[i]);
        r = alone.ok() ? std::move((*alone)[0]) : absl::StatusOr<Decision>(alone.status());
      }
      out.push_back(std::move(r));
    }
    return out;
  }

  // One decision, shaped as decide_batch's result.
  absl::StatusOr<std::vector<absl::StatusOr<Decision>>> single(const Request& req, Nanos now) {
    auto r = acquire_all(std::span<const Request>(&req, 1), now);
    std::vector<absl::StatusOr<Decision>> out;
    out.push_back(r.ok() ? absl::StatusOr<Decision>(r->decision)
                         : absl::StatusOr<Decision>(r.status()));
    return out;
  }

  RedisStoreOptions options_;
  redis::Script script_;
  absl::Status config_error_;
  std::unique_ptr<Coalescer> coalescer_;  // with RedisStoreOptions::coalesce > 1
};

}  // namespace quota
