// quota/redis/twin/call.hpp — one script call of a policy twin: its keys and arguments,
// and its reply decoded into decisions.
//
// Every policy twin (token_bucket.hpp, fixed_window.hpp, sliding_log.hpp,
// sliding_window_estimate.hpp) takes the same call layout and answers in the same reply
// form (common.hpp states both). `build_call` lays out one call for one or more buckets
// of a policy — each bucket's arguments from LuaTwin<P> (range-checked there) — and
// `parse_reply` turns the reply into one Decision per bucket plus their combination.
// RedisStore (redis_store.hpp) is the only caller; tests and the benchmarks use them to
// send calls of their own.
//
//   const BucketRequest<TokenBucket> req{&policy, "{acme}read", 1};
//   auto call = build_call(CallOptions{.prefix = "quota:"}, std::span(&req, 1), now, {});
//   ... run call->keys, call->args with Script (transport/script.hpp) ...
//   absl::StatusOr<ScriptResult> r = parse_reply(*reply, std::span(&req, 1));
//
// Errors are values: an invalid key or attempt id, or a policy outside its twin's exact
// range, is kInvalidArgument naming the bound; an error reply is kUnavailable (kDataLoss
// for QUOTA_CORRUPT, kInvalidArgument for QUOTA_ATTEMPT_MISMATCH); a reply of the wrong
// shape is kUnavailable ("malformed reply"). Pure functions: thread-safe.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <hiredis/hiredis.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "quota/decision.hpp"
#include "quota/policy/policy.hpp"
#include "quota/redis/keys.hpp"
#include "quota/redis/transport/cluster.hpp"
#include "quota/redis/transport/connection.hpp"
#include "quota/redis/twin/common.hpp"
#include "quota/redis/twin/range.hpp"
#include "quota/units.hpp"

namespace quota::redis {

enum class TimeSource {
  kServer,  // redis.call('TIME'): the authority's clock (production)
  kCaller,  // the `now` given to the call (differential tests only)
};

// What a call's layout depends on besides its buckets (RedisStoreOptions' fields).
struct CallOptions {
  std::string_view prefix = "quota:";  // prepended to every Redis key
  TimeSource time = TimeSource::kServer;
  std::chrono::milliseconds ttl_margin{1000};     // added to each bucket's time to full
  std::chrono::milliseconds attempt_ttl{600000};  // how long an attempt's result is kept
  // Script appends the node's guards as the last argument (transport/node_watch.hpp):
  // the head says so (common.hpp's kLuaNodeGuard).
  bool node_guards = false;
};

// One bucket of a call: its policy, its store key ("{tenant}route") and its cost.
template <Policy P>
struct BucketRequest {
  const P* policy;
  std::string_view key;
  std::int64_t cost;
};

// The keys and arguments of one script call, owned.
struct Call {
  std::vector<std::string> keys;
  std::vector<std::string> args;
};

// A decoded reply.
struct ScriptResult {
  Decision decision;            // for several buckets: the combined decision
  std::vector<Decision> parts;  // one per bucket, in request order
  Nanos time{0};                // the time the script decided at (server or caller time)
  bool replayed = false;        // an attempt's stored first result
};

// The call for `reqs` at `now` (used in TimeSource::kCaller only). Every bucket's key
// must share one hash tag unless `batch` (independent decisions, each deducted when it
// alone allows); a non-empty `attempt_id` makes the call idempotent (common.hpp).
template <Policy P>
absl::StatusOr<Call> build_call(const CallOptions& options, std::span<const BucketRequest<P>> reqs,
                                Nanos now, std::string_view attempt_id, bool batch = false) {
  if (reqs.empty()) return absl::InvalidArgumentError("no buckets requested");
  Call call;
  std::string tag;
  std::string fingerprint;
  std::vector<std::int64_t> costs;
  std::vector<std::string> sets;
  for (std::size_t i = 0; i < reqs.size(); ++i) {
    auto parts = split_key(reqs[i].key);
    if (!parts.ok()) return parts.status();
    if (i == 0) {
      tag = std::string(parts->tag);
    } else if (!batch && parts->tag != tag) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "keys of one call must share one tenant (hash tag): \"%s\" vs \"%s\"", tag, parts->tag));
    }
    auto params = LuaTwin<P>::params(*reqs[i].policy);
    if (!params.ok()) return params.status();
    call.keys.push_back(bucket_key(options.prefix, *parts));
    costs.push_back(LuaTwin<P>::script_cost(*reqs[i].policy, reqs[i].cost));
    sets.push_back(LuaTwin<P>::pack_params(*reqs[i].policy, *params));
    if (!attempt_id.empty()) {
      absl::StrAppend(&fingerprint, call.keys.back(), "\x1f", reqs[i].cost, "\x1f");
    }
  }
  const bool has_attempt = !attempt_id.empty();
  if (has_attempt) {
    auto akey = attempt_key(options.prefix, tag, attempt_id);
    if (!akey.ok()) return akey.status();
    call.keys.push_back(std::move(*akey));
  }
  // The costs and the parameter sets are sent once when every bucket has the same (a
  // batch of one policy and one cost: the server looks at them once), else per bucket.
  const std::size_t n = reqs.size();
  const bool same_cost =
      std::all_of(costs.begin(), costs.end(), [&](std::int64_t c) { return c == costs[0]; });
  const bool same_params =
      std::all_of(sets.begin(), sets.end(), [&](const std::string& x) { return x == sets[0]; });
  std::int64_t sec = 0, ns = 0;
  if (options.time == TimeSource::kCaller) {
    // floor division, so that the nanoseconds limb is in [0, 1e9) for negative times too
    sec = now.count() / 1'000'000'000;
    ns = now.count() % 1'000'000'000;
    if (ns < 0) {
      ns += 1'000'000'000;
      --sec;
    }
  }
  std::int64_t attempt = 0;
  if (batch) {
    attempt = -1;
  } else if (has_attempt) {
    attempt = std::max<std::int64_t>(options.attempt_ttl.count(), 1);
  }
  std::string head;
  detail::pack_le(head,
                  (options.time == TimeSource::kCaller ? 1 : 0) + (options.node_guards ? 2 : 0), 1);
  detail::pack_le(head, same_cost ? 0 : 1, 1);
  detail::pack_le(head, same_params ? 0 : 1, 1);
  detail::pack_le(head, sec, 8);
  detail::pack_le(head, ns, 4);
  detail::pack_le(head, options.ttl_margin.count(), 8);
  detail::pack_le(head, attempt, 8);
  detail::pack_le(head, static_cast<std::int64_t>(n), 4);
  detail::pack_le(head, costs[0], 8);
  call.args.push_back(std::move(head));
  for (std::size_t i = 0; i < (same_params ? 1 : n); ++i) call.args.push_back(std::move(sets[i]));
  if (!same_cost) {
    for (std::int64_t c : costs) call.args.push_back(absl::StrCat(c));
  }
  if (has_attempt) call.args.push_back(std::move(fingerprint));
  return call;
}

// One script call of a batch: the time it decides at and its requests, which are
// items[this->items[j]] of the batch.
template <Policy P>
struct BatchChunk {
  Nanos time{0};
  std::vector<BucketRequest<P>> reqs;
  std::vector<std::size_t> items;
};

// How a batch of independent decisions (`reqs`, item i at `times[i]`, or at `now` when
// `times` is empty) becomes script calls, in order: a call reads every key before it
// writes, so a key that repeats starts a new call, as does a change of time (one time per
// call). `by_slot` (a cluster): a script may declare keys of one slot only, so the items
// are grouped into one call per slot and time (a slot's items in their order); else the
// calls are consecutive runs of the batch. Each key's items keep their order either way.
// InvalidArgument for an invalid key.
template <Policy P>
absl::StatusOr<std::vector<BatchChunk<P>>> plan_batch(std::span<const BucketRequest<P>> reqs,
                                                      Nanos now, std::span<const Nanos> times,
                                                      bool by_slot) {
  std::vector<BatchChunk<P>> chunks;
  // (slot, time) -> the chunk taking that slot's items at that time
  std::map<std::pair<int, std::int64_t>, std::size_t> open;
  for (std::size_t i = 0; i < reqs.size(); ++i) {
    auto parts = split_key(reqs[i].key);
    if (!parts.ok()) return parts.status();
    const Nanos time = times.empty() ? now : times[i];
    const std::pair<int, std::int64_t> at{by_slot ? key_slot(parts->tag) : 0, time.count()};
    auto it = open.find(at);
    const bool repeats =
        it != open.end() &&
        std::any_of(chunks[it->second].reqs.begin(), chunks[it->second].reqs.end(),
                    [&](const BucketRequest<P>& r) { return r.key == reqs[i].key; });
    if (it == open.end() || repeats) {
      // Without slots the calls are consecutive: a new one closes the others.
      if (!by_slot) open.clear();
      chunks.push_back(BatchChunk<P>{.time = time, .reqs = {}, .items = {}});
      open[at] = chunks.size() - 1;
    }
    BatchChunk<P>& chunk = chunks[open[at]];
    chunk.reqs.push_back(reqs[i]);
    chunk.items.push_back(i);
  }
  return chunks;
}

namespace detail {

// Element i as an integer: an integer reply, or a decimal string (how the scripts answer
// a duration past 2^53 ns, which a Lua double cannot hold exactly).
inline absl::StatusOr<std::int64_t> integer_at(const redisReply& r, std::size_t i) {
  std::int64_t v = 0;
  if (i < r.elements && r.element[i] != nullptr && r.element[i]->type == REDIS_REPLY_STRING &&
      absl::SimpleAtoi(absl::string_view(r.element[i]->str, r.element[i]->len), &v)) {
    return v;
  }
  if (i >= r.elements || r.element[i] == nullptr || r.element[i]->type != REDIS_REPLY_INTEGER) {
    return absl::UnavailableError(
        absl::StrFormat("malformed reply from the quota script: element %d is not an integer", i));
  }
  return static_cast<std::int64_t>(r.element[i]->integer);
}

inline Nanos to_nanos(std::int64_t v) { return v < 0 ? kNever : Nanos{v}; }

}  // namespace detail

// The reply of a script call for `reqs` (twin/common.hpp), in the full form (five
// integers per bucket: every twin's, and the token bucket's with an attempt or
// replayed) or in the token bucket's compact form (each bucket's state, then its
// denials: twin/token_bucket.hpp; LuaTwin<TokenBucket>::decision derives the fields).
// `batch`: independent decisions (apply_batch): each part allowed on its own.
template <Policy P>
absl::StatusOr<ScriptResult> parse_reply(const redisReply& r,
                                         std::span<const BucketRequest<P>> reqs,
                                         bool batch = false) {
  const std::size_t n = reqs.size();
  if (r.type == REDIS_REPLY_ERROR) {
    const std::string_view msg = reply_string(r);
    if (msg.find("QUOTA_CORRUPT") != std::string_view::npos) {
      return absl::DataLossError(absl::StrCat("redis: ", detail::av(msg)));
    }
    if (msg.find("QUOTA_ATTEMPT_MISMATCH") != std::string_view::npos) {
      return absl::InvalidArgumentError(absl::StrCat("redis: ", detail::av(msg)));
    }
    return error_status(r);
  }
  constexpr bool kHasCompact = requires { LuaTwin<P>::kStateBytes; };
  bool compact = false;
  if constexpr (kHasCompact) compact = LuaTwin<P>::is_compact(r);
  if (r.type != REDIS_REPLY_ARRAY || (!compact && r.elements != 4 + 5 * n)) {
    return absl::UnavailableError(absl::StrFormat(
        "malformed reply from the quota script: type %d with %d elements, expected an array "
        "of %d",
        r.type, r.type == REDIS_REPLY_ARRAY ? r.elements : 0, 4 + 5 * n));
  }
  std::int64_t v[4];
  for (std::size_t i = 0; i < 4; ++i) {
    auto x = detail::integer_at(r, i);
    if (!x.ok()) return x.status();
    v[i] = *x;
  }
  ScriptResult out;
  out.replayed = v[0] != 0;
  out.time = Nanos{v[1] * 1'000'000'000 + v[2]};
  const bool all = v[3] != 0;
  // Each bucket's own decision first (`allowed`: it alone had enough).
  if constexpr (kHasCompact) {
    if (compact) {
      auto parts = LuaTwin<P>::compact_parts(r, n, [&](std::size_t b) {
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
        auto x = detail::integer_at(r, 4 + 5 * b + i);
        if (!x.ok()) return x.status();
        f[i] = *x;
      }
      if (f[1] < 0 || f[1] > 3) {
        return absl::UnavailableError(
            absl::StrFormat("malformed reply from the quota script: reason %d", f[1]));
      }
      out.parts.push_back(Decision{.allowed = f[0] != 0,
                                   .remaining = f[2],
                                   .retry_after = detail::to_nanos(f[3]),
                                   .reset_after = detail::to_nanos(f[4]),
                                   .version = 0,
                                   .reason = static_cast<Reason>(f[1])});
    }
  }
  out.decision = combine_all(out.parts);
  if (out.decision.allowed != all) {
    return absl::UnavailableError(absl::StrFormat(
        "malformed reply from the quota script: all allowed %d, but the buckets say %d", all,
        out.decision.allowed));
  }
  if (!batch) {
    for (Decision& d : out.parts) d.allowed = all;
  }
  return out;
}

}  // namespace quota::redis
