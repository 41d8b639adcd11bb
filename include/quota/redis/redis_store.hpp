// quota/redis/redis_store.hpp — RedisStore: one shared budget across every process.
//
// `RedisStore<P>` keeps each key's policy state in Redis and applies the policy's
// transition there, in the policy's Lua twin (twin/), in ONE `EVALSHA` round trip: read,
// refill, decide, deduct and write run atomically on the server, whichever gateway asks.
// It models quota::StateStore, so `Limiter<TokenBucket, RedisStore>` works like the
// in-process limiters:
//
//   auto pool = std::make_shared<quota::redis::ConnectionPool>(
//       quota::redis::ConnectionConfig{.host = "127.0.0.1", .port = 6379}, 8);
//   auto limiter = quota::Limiter<quota::TokenBucket, quota::RedisStore>::create(
//       {.rate = {.units = 100, .per = 1s}, .burst = 20}, quota::RedisStoreOptions{.pool = pool});
//   auto key = quota::redis::tenant_key("acme", "read");          // "{acme}read"
//   absl::StatusOr<quota::Decision> d = limiter->acquire(*key, 1);
//
// Guarantees. Decisions use the server's clock (TIME), never the caller's. Every
// policy's twin is bit-identical to its C++ policy within the twin's exact range
// (`check(policy)` names the bound a policy breaks). Failures are values: transport
// errors, deadlines and error replies are kUnavailable, nothing allowed or denied (a
// timed-out call may still have run); a key holding something else is kDataLoss; an
// invalid key or attempt id is kInvalidArgument. Keys: keys.hpp ("{tenant}route": one
// hash slot per tenant). On a Redis Cluster (RedisStoreOptions::cluster) calls follow
// MOVED / ASK / TRYAGAIN (transport/script.hpp); under Sentinel
// (RedisStoreOptions::sentinel) they go to the primary the sentinels name
// (transport/sentinel.hpp). AUTH and the eviction-policy check: handshake.hpp. With `replicas`, a
// decision is given only once that many replicas have it (WAIT). docs/redis.md has the whole story.
//
// Thread safety: every method may be called from any number of threads; connections
// come from the shared pool.
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
#include "quota/redis/keys.hpp"
#include "quota/redis/redis_store_options.hpp"
#include "quota/redis/transport/cluster.hpp"
#include "quota/redis/transport/coalescer.hpp"
#include "quota/redis/transport/connection_pool.hpp"
#include "quota/redis/transport/script.hpp"
#include "quota/redis/transport/sentinel.hpp"
#include "quota/redis/twin/call.hpp"
#include "quota/redis/twin/fixed_window.hpp"
#include "quota/redis/twin/sliding_log.hpp"
#include "quota/redis/twin/sliding_window_estimate.hpp"
#include "quota/redis/twin/token_bucket.hpp"
#include "quota/units.hpp"

namespace quota {

template <Policy P>
class RedisStore {
 public:
  using policy_type = P;
  using Twin = redis::LuaTwin<P>;

  explicit RedisStore(RedisStoreOptions options)
      : options_(redis::with_sentinel_pool(std::move(options))),
        script_(Twin::script(), options_.pool, options_.cluster, durability(), options_.limits,
                {.failover = options_.failover_safety,
                 .clock = options_.clock_guard,
                 .reply_time_at = 1}),
        config_error_(redis::check_store_options(options_, script_.deadline())) {
    if (options_.coalesce > 1) {
      coalescer_ = std::make_unique<Coalescer>(options_.coalesce, options_.coalesce_calls);
    }
  }

  // OK when the Lua twin decides `policy` exactly; else InvalidArgument naming the bound.
  static absl::Status check(const P& policy) { return Twin::params(policy).status(); }

  // The most decisions one coalesced round trip takes (RedisStoreOptions::coalesce).
  static constexpr int kMaxCoalesce = redis::kMaxCoalesce;

  // StateStore: one decision, one round trip. With RedisStoreOptions::coalesce, a call
  // made while `coalesce_calls` coalesced round trips are in flight waits for one of them
  // to return and then goes with the calls that waited with it (the oldest first, at
  // most `coalesce`), in one round trip, as apply_batch decides a batch: each decision
  // independent, exactly as if made alone, in the order the calls arrived. That is one
  // script call (per slot, on a cluster), split where a key repeats or, in caller-time
  // mode, where the time changes. A key or policy the store rejects fails its
  // own call before it waits. A corrupt bucket fails the script call it is in and
  // charges nothing (twin/common.hpp); each caller of that call is then decided alone, so
  // that only the corrupt bucket's caller gets the error (likewise for a TRYAGAIN given
  // up on, on a cluster). A transport failure fails every caller of the call
  // (kUnavailable: their decisions may have been applied), as it would each alone.
  absl::StatusOr<Decision> apply(const P& policy, std::string_view key, Nanos now,
                                 std::int64_t cost) {
    if (coalescer_ != nullptr) return apply_coalesced(policy, key, now, cost);
    auto r = apply_attempt(policy, key, now, cost);
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
  absl::StatusOr<redis::ScriptResult> apply_attempt(const P& policy, std::string_view key,
                                                    Nanos now, std::int64_t cost,
                                                    std::string_view attempt_id = {}) {
    const Request req{&policy, key, cost};
    return apply_all(std::span<const Request>(&req, 1), now, attempt_id);
  }

  // One bucket of a hierarchical check: its policy, key and cost.
  using Request = redis::BucketRequest<P>;

  // Hierarchy: every bucket (all keys of ONE tenant: the same hash tag) is refilled and
  // checked in one script; all are deducted if all allow, none otherwise. The combined
  // decision: allowed iff all allow; remaining the least; retry_after and reset_after
  // the largest (kNever wins); reason that of the first bucket that denies.
  absl::StatusOr<redis::ScriptResult> apply_all(std::span<const Request> reqs, Nanos now,
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
  absl::StatusOr<std::vector<absl::StatusOr<Decision>>> apply_pipelined(
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
  // alone allows), in order, atomically per script call. Items may belong to different
  // tenants. A repeated key starts a new script call, and so, on a cluster, does each
  // slot (redis::plan_batch); all calls go in one pipelined write per node. Results as
  // apply_pipelined's: the outer status fails the whole batch (an invalid key: nothing
  // sent; on a standalone server a pool or transport failure: some calls may have run);
  // otherwise each item has its own result, and an item whose script call failed (an
  // error reply, a corrupt bucket, a node down, TRYAGAIN past its retries) carries that
  // call's error.
  absl::StatusOr<std::vector<absl::StatusOr<Decision>>> apply_batch(
      const P& policy, std::span<const BatchItem> items, Nanos now) {
    std::vector<Request> reqs;
    reqs.reserve(items.size());
    for (const BatchItem& item : items) reqs.push_back(Request{&policy, item.key, item.cost});
    return decide_batch(reqs, now);
  }

  const RedisStoreOptions& options() const { return options_; }
  // The nodes' circuit breakers and the in-flight guard, counted (transport/breaker.hpp).
  redis::FailFastStats fail_fast_stats() const { return script_.fail_fast_stats(); }

  // The Redis key a store key maps to (tests and operators use it, e.g. MEMORY USAGE).
  absl::StatusOr<std::string> redis_key(std::string_view key) const {
    auto parts = redis::split_key(key);
    if (!parts.ok()) return parts.status();
    return redis::bucket_key(options_.prefix, *parts);
  }

 private:
  // RedisStoreOptions::replicas and replica_timeout.
  redis::Durability durability() const {
    return {.replicas = options_.replicas, .timeout = options_.replica_timeout};
  }

  using Call = redis::Call;

  // The call for `reqs` (twin/call.hpp), or the options' error.
  absl::StatusOr<Call> build(std::span<const Request> reqs, Nanos now, std::string_view attempt_id,
                             bool batch = false) const {
    if (!config_error_.ok()) return config_error_;
    return redis::build_call<P>(
        {.prefix = options_.prefix,
         .time = options_.time,
         .ttl_margin = options_.ttl_margin,
         .attempt_ttl = options_.attempt_ttl,
         .node_guards = options_.failover_safety || options_.clock_guard.has_value()},
        reqs, now, attempt_id, batch);
  }
  static absl::StatusOr<redis::ScriptResult> parse(const redisReply& r,
                                                   std::span<const Request> reqs,
                                                   bool batch = false) {
    return redis::parse_reply<P>(r, reqs, batch);
  }

  // Sends one call (redis::Script: EVALSHA, NOSCRIPT → EVAL once, MOVED / ASK on a
  // cluster).
  absl::StatusOr<redis::Reply> execute(const Call& call) {
    return script_.run(call.keys, call.args);
  }

  // apply_batch over requests that may each have their own policy and, in caller-time
  // mode, their own time (`times[i]` for reqs[i]; empty: `now` for all): the items
  // become script calls (redis::plan_batch), all sent in one pipelined write per node.
  absl::StatusOr<std::vector<absl::StatusOr<Decision>>> decide_batch(
      std::span<const Request> reqs, Nanos now, std::span<const Nanos> times = {}) {
    if (reqs.empty()) return std::vector<absl::StatusOr<Decision>>{};
    const bool cluster = options_.cluster != nullptr;
    auto chunks = redis::plan_batch<P>(reqs, now, times, cluster);
    if (!chunks.ok()) return chunks.status();
    std::vector<Call> calls;
    calls.reserve(chunks->size());
    for (const auto& chunk : *chunks) {
      auto call = build(chunk.reqs, chunk.time, {}, /*batch=*/true);
      if (!call.ok()) return call.status();
      calls.push_back(std::move(*call));
    }
    auto replies = execute_many(calls);
    // One server: a failed write fails the whole batch (some calls may have run). On a
    // cluster a failed node fails only its own items.
    if (!cluster) {
      if (auto s = first_failure(replies); !s.ok()) return s;
    }
    std::vector<absl::StatusOr<Decision>> out(reqs.size(), absl::UnknownError("unset"));
    for (std::size_t c = 0; c < calls.size(); ++c) {
      const auto& chunk = (*chunks)[c];
      absl::StatusOr<redis::ScriptResult> parsed =
          replies[c].ok() ? parse(**replies[c], chunk.reqs, /*batch=*/true)
                          : absl::StatusOr<redis::ScriptResult>(replies[c].status());
      for (std::size_t j = 0; j < chunk.items.size(); ++j) {
        out[chunk.items[j]] = parsed.ok() ? absl::StatusOr<Decision>(parsed->parts[j])
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
    auto r = apply_all(std::span<const Request>(&req, 1), now);
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
