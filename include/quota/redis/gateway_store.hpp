// quota/redis/gateway_store.hpp — the gateway's budgets in Redis, shared by every process.
//
// `GatewayStore` is a gateway backend (gateway/backend.hpp): `Gateway<GatewayStore>`
// decides exactly like the in-process gateway, with Redis as the one authority:
//
//   auto pool = std::make_shared<quota::redis::ConnectionPool>(
//       quota::redis::ConnectionConfig{.host = "127.0.0.1", .port = 6379}, 8);
//   quota::redis::GatewayStore store({.pool = pool});
//   quota::gateway::Gateway gw(store, registry);
//   auto r = gw.decide({.who = {.tenant = "acme", .plan = "free"}, .route = "read"}, clock.now());
//
// Each key's state lives in Redis with the parameters and rule-set version that wrote it
// (the Lua twin of key_state.hpp: twin/gateway.hpp), so a rule change — downgrade,
// upgrade, switching kind — is converted on the server without handing out a burst,
// whichever process sees the new rules first; a process still on an older rule set is
// decided by the newer rule and told its version (never rolled back).
//
// Levels and atomicity. The user and tenant levels of a request share the tenant's hash
// slot ("{tenant}route", "{tenant}route/user") and are decided by ONE script: all allow
// or nothing is deducted, atomically. The global level ("{~global}route") is in its own
// slot and decided by a second script after the tenant's; when it denies (or fails), the
// tenant's levels are given back by a third script (refund at their own latest time) —
// not isolated: between the two, a concurrent request of that tenant may find its budget
// lower by this cost and be denied, never admitted beyond any level's envelope. If the
// give-back itself fails (Redis unreachable), the tenant keeps the deduction: an
// under-admission, never an over-admission.
//
// Time: the server's (TIME, microseconds), never the caller's; `now` is ignored except
// in TimeSource::kCaller (differential tests), where it is used truncated to whole
// microseconds. `LevelsResult::time` is the server's time of the decision, which a
// settle's refund quotes (a window takes a refund back only in the window it counted).
//
// Failures are values: transport errors, deadlines, BUSY / LOADING / READONLY and
// malformed replies are kUnavailable with the cause — the gateway's fail modes then
// apply (fail_closed → 503; fail_open → the local emergency bucket, bounded). A key
// holding something else is kDataLoss naming it; a rule outside the Lua twin's exact
// range is kInvalidArgument naming the bound (check rules up front with `check`).
//
// Attempts are shared by every process: the Gateway keeps an attempt's first decision in
// Redis, in the tenant's slot (`<prefix>a{tenant}<id>`, for GatewayOptions::attempt_ttl),
// so a retry that reaches ANOTHER gateway process is replayed, not charged again. The
// record is written "pending" before the decision and "decided" after it; a duplicate
// arriving while it is pending gets Aborted ("in progress; retry"), the same id with
// another request of that tenant InvalidArgument (ids are scoped per tenant, as in
// RedisStore::apply_attempt). A process that dies between the two leaves the
// attempt pending for `attempt_pending` (then it may be decided anew). If the final
// write fails the attempt is simply not replayable (the decision stands).
// Estimate-then-settle tickets stay in the process that issued them (settle.hpp).
//
// Coalescing (GatewayStoreOptions::coalesce), for a gateway with many threads: the
// store's script calls made while `coalesce_calls` round trips are in flight wait, then
// go together in one pipelined write (Script::run_many; one per node on a cluster). Each
// is still its own atomic script call, decided exactly as alone; calls the server did
// not run (NOSCRIPT, MOVED, ASK, TRYAGAIN) are sent again in a further write per node.
// coalesce_stats() counts round trips and the calls they carried.
//
// Client CPU: each distinct policy (kind and parameters) is range-checked and its Lua
// argument (33 packed bytes) built once, then kept (up to 4096 policies; past that, per
// call); a rule outside the range is rejected on every call with the same error.
//
// Thread safety: every method may be called from any thread.
#pragma once

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <memory>
#include <numeric>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <variant>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/node_hash_map.h"
#include "absl/numeric/int128.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "quota/decision.hpp"
#include "quota/detail/mutex.hpp"
#include "quota/gateway/backend.hpp"
#include "quota/gateway/key_state.hpp"
#include "quota/redis/keys.hpp"
#include "quota/redis/redis_store.hpp"
#include "quota/redis/transport/cluster.hpp"
#include "quota/redis/transport/coalescer.hpp"
#include "quota/redis/transport/connection.hpp"
#include "quota/redis/transport/script.hpp"
#include "quota/redis/twin/gateway.hpp"
#include "quota/units.hpp"

namespace quota::redis {

// The Lua twin's exact range (see twin/gateway.hpp).
inline constexpr std::int64_t kGatewayMaxCapacity = 2'000'000'000;        // units
inline constexpr std::int64_t kGatewayMaxSpanNs = 4'000'000'000'000'000;  // ~46 days
inline constexpr std::uint64_t kGatewayMaxVersion = (std::uint64_t{1} << 53) - 1;

struct GatewayStoreOptions {
  // Connections to the server (or set `cluster`).
  std::shared_ptr<ConnectionPool> pool;
  // Prepended to every Redis key. No braces or control characters.
  std::string prefix = "quota:gw:";
  TimeSource time = TimeSource::kServer;
  // Added to each key's time until idle when setting its TTL.
  std::chrono::milliseconds ttl_margin{1000};
  // Or, instead of `pool`: a Redis Cluster (cluster.hpp).
  std::shared_ptr<ClusterPool> cluster = nullptr;
  // How long an attempt stays "pending" if its process never records the decision.
  std::chrono::milliseconds attempt_pending{std::chrono::seconds(5)};
  // Coalescing, for a gateway with many threads: while `coalesce_calls` round trips of
  // this store's script calls are in flight, further calls wait and then go together, up
  // to `coalesce` in one pipelined write (per node, on a cluster). Each call is still its
  // own script call, atomic and decided exactly as alone; what they share is the round
  // trip (the system calls on both sides and the client's wait). A lone call goes at
  // once. 0 or 1: off. Each round trip in flight holds one of the pool's connections:
  // give the pool at least `coalesce_calls` (plus what attempts use alongside).
  int coalesce = 0;
  int coalesce_calls = 2;
  // Durability across a failover, as RedisStoreOptions::replicas: when > 0, every write of
  // script calls (decisions, settlements, attempt records) ends with `WAIT replicas
  // replica_timeout`, and a result is given only when that many replicas acknowledged
  // it; otherwise kUnavailable (the route's fail mode applies). replica_timeout must be
  // below the connections' command_timeout.
  int replicas = 0;
  std::chrono::milliseconds replica_timeout{2};
};

// The most script calls one coalesced round trip takes (GatewayStoreOptions::coalesce).
inline constexpr int kGatewayMaxCoalesce = 4096;

class GatewayStore {
 public:
  explicit GatewayStore(GatewayStoreOptions options)
      : options_(std::move(options)),
        script_(kGatewayLua, options_.pool, options_.cluster, durability()),
        attempts_(kGatewayAttemptLua, options_.pool, options_.cluster, durability()) {
    if (options_.pool == nullptr && options_.cluster == nullptr) {
      config_error_ =
          absl::InvalidArgumentError("GatewayStoreOptions: both pool and cluster are null");
    } else if (auto s = detail::check_chars(options_.prefix, "prefix"); !s.ok()) {
      config_error_ = s;
    } else if (options_.coalesce < 0 || options_.coalesce > kGatewayMaxCoalesce) {
      config_error_ = absl::InvalidArgumentError(
          absl::StrFormat("GatewayStoreOptions: coalesce=%d, must be in [0, %d]", options_.coalesce,
                          kGatewayMaxCoalesce));
    } else if (options_.coalesce > 1 && options_.coalesce_calls < 1) {
      config_error_ = absl::InvalidArgumentError(absl::StrFormat(
          "GatewayStoreOptions: coalesce_calls=%d, must be at least 1", options_.coalesce_calls));
    } else if (auto s = check_durability(durability(),
                                         options_.cluster != nullptr ? options_.cluster->config()
                                                                     : options_.pool->config(),
                                         "GatewayStoreOptions");
               !s.ok()) {
      config_error_ = s;
    }
    if (config_error_.ok() && options_.coalesce > 1) {
      coalescer_ = std::make_unique<CallCoalescer>(options_.coalesce, options_.coalesce_calls);
    }
  }

  // Coalescing counters (GatewayStoreOptions::coalesce): round trips, the script calls
  // they carried, the calls waiting now. All zero without coalescing.
  CoalesceStats coalesce_stats() const {
    return coalescer_ == nullptr ? CoalesceStats{} : coalescer_->stats();
  }

  // OK when the Lua twin decides `policy` exactly; else InvalidArgument naming the bound.
  static absl::Status check(const gateway::RulePolicy& policy) { return params(policy).status(); }

  absl::StatusOr<gateway::LevelsResult> decide(std::span<const gateway::LevelCheck> levels,
                                               std::uint64_t version, std::int64_t cost,
                                               Nanos now) {
    if (levels.empty()) return absl::InvalidArgumentError("decide: no levels");
    // Runs of consecutive levels in one slot (tenant levels, then the global one).
    std::vector<std::pair<std::size_t, std::size_t>> groups;  // [begin, end)
    std::vector<std::string> tags;
    for (std::size_t i = 0; i < levels.size(); ++i) {
      auto parts = split_key(levels[i].key);
      if (!parts.ok()) return parts.status();
      if (groups.empty() || parts->tag != tags.back()) {
        groups.emplace_back(i, i + 1);
        tags.emplace_back(parts->tag);
      } else {
        groups.back().second = i + 1;
      }
    }
    gateway::LevelsResult out;
    out.parts.reserve(levels.size());
    std::vector<std::size_t> deducted_groups;
    for (std::size_t g = 0; g < groups.size(); ++g) {
      const auto [begin, end] = groups[g];
      auto call = build(levels.subspan(begin, end - begin), 'd', version, cost, now, std::nullopt);
      if (!call.ok()) return call.status();
      auto reply = run_script(*call);
      absl::StatusOr<Decided> decided =
          reply.ok() ? parse_decide(**reply, end - begin) : absl::StatusOr<Decided>(reply.status());
      if (!decided.ok()) {
        give_back(levels, groups, deducted_groups, out.parts, version, cost, now);
        return decided.status();
      }
      if (g == 0) out.time = decided->time;
      bool stopped = decided->parts.size() < end - begin;
      for (const Decision& d : decided->parts) out.parts.push_back(d);
      if (!stopped) {
        const Decision& last = out.parts.back();
        stopped = !last.allowed && !levels[end - 1].shadow;
      }
      if (stopped) {
        give_back(levels, groups, deducted_groups, out.parts, version, cost, now);
        return out;
      }
      deducted_groups.push_back(g);
    }
    return out;
  }

  absl::StatusOr<MicroUnits> refund(const gateway::RulePolicy& policy, std::uint64_t version,
                                    std::string_view key, std::int64_t units, Nanos spent_at,
                                    Nanos now) {
    const gateway::LevelCheck level{.policy = &policy, .key = key, .shadow = false};
    return one(level, 'r', version, units, now, quota::detail::floor_div(spent_at.count(), 1000));
  }

  absl::StatusOr<MicroUnits> charge(const gateway::RulePolicy& policy, std::uint64_t version,
                                    std::string_view key, std::int64_t units, Nanos now) {
    const gateway::LevelCheck level{.policy = &policy, .key = key, .shadow = false};
    return one(level, 'c', version, units, now, std::nullopt);
  }

  // Attempts (see the header comment); `tenant_key` is the request's tenant-level key.
  // Begins an attempt: a decision to replay, or nullopt when the caller must decide and
  // then finish_attempt (or abandon_attempt on failure).
  absl::StatusOr<std::optional<Decision>> begin_attempt(std::string_view tenant_key,
                                                        std::string_view id,
                                                        std::string_view fingerprint) {
    auto key = attempt_record_key(tenant_key, id);
    if (!key.ok()) return key.status();
    auto reply = attempts_.run(
        {*key}, {"b", std::string(fingerprint),
                 absl::StrCat(std::max<std::int64_t>(options_.attempt_pending.count(), 1))});
    if (!reply.ok()) return reply.status();
    const redisReply& r = **reply;
    if (r.type == REDIS_REPLY_ERROR) return error_status(r);
    if (r.type == REDIS_REPLY_ARRAY && r.elements == 1) return std::optional<Decision>{};
    if (r.type != REDIS_REPLY_ARRAY || r.elements != 2 ||
        r.element[1]->type != REDIS_REPLY_STRING) {
      return absl::UnavailableError("malformed reply from the attempt script");
    }
    return parse_record(reply_string(*r.element[1]), id, fingerprint);
  }

  absl::Status finish_attempt(std::string_view tenant_key, std::string_view id,
                              std::string_view fingerprint, const Decision& d, Nanos ttl) {
    auto key = attempt_record_key(tenant_key, id);
    if (!key.ok()) return key.status();
    const std::string record =
        absl::StrFormat("%d %d %d %d %d %d", d.allowed ? 1 : 0, static_cast<int>(d.reason),
                        d.remaining, d.retry_after == kNever ? -1 : d.retry_after.count(),
                        d.reset_after == kNever ? -1 : d.reset_after.count(), d.version);
    const std::int64_t ms =
        std::max<std::int64_t>(std::chrono::ceil<std::chrono::milliseconds>(ttl).count(), 1);
    auto reply = attempts_.run({*key}, {"f", std::string(fingerprint), absl::StrCat(ms), record});
    if (!reply.ok()) return reply.status();
    return error_status(**reply);
  }

  void abandon_attempt(std::string_view tenant_key, std::string_view id) {
    auto key = attempt_record_key(tenant_key, id);
    if (key.ok()) (void)attempts_.run({*key}, {"a", "", "1"});
  }

  // The Redis key of a gateway key (tests and operators: TTL, MEMORY USAGE).
  absl::StatusOr<std::string> redis_key(std::string_view key) const {
    auto parts = split_key(key);
    if (!parts.ok()) return parts.status();
    return bucket_key(options_.prefix, *parts);
  }

  const GatewayStoreOptions& options() const { return options_; }

 private:
  Durability durability() const {
    return {.replicas = options_.replicas, .timeout = options_.replica_timeout};
  }

  absl::StatusOr<std::string> attempt_record_key(std::string_view tenant_key,
                                                 std::string_view id) const {
    if (!config_error_.ok()) return config_error_;
    auto parts = split_key(tenant_key);
    if (!parts.ok()) return parts.status();
    return attempt_key(options_.prefix, parts->tag, id);
  }

  // A stored attempt record: "P\x1f<fp>" or "D\x1f<fp>\x1f<decision>".
  static absl::StatusOr<std::optional<Decision>> parse_record(std::string_view record,
                                                              std::string_view id,
                                                              std::string_view fingerprint) {
    const std::vector<absl::string_view> fields = absl::StrSplit(detail::av(record), '\x1f');
    if (fields.size() < 2 || (fields[0] != "P" && fields[0] != "D") ||
        (fields[0] == "D") != (fields.size() == 3)) {
      return absl::DataLossError(
          absl::StrFormat("attempt \"%s\": the stored record is not ours", detail::av(id)));
    }
    if (fields[1] != detail::av(fingerprint)) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "attempt id \"%s\" was first used for another request (key or cost differ)",
          detail::av(id)));
    }
    if (fields[0] == "P") {
      return absl::AbortedError(absl::StrFormat(
          "attempt \"%s\" is being decided by another call; retry", detail::av(id)));
    }
    const std::vector<absl::string_view> v = absl::StrSplit(fields[2], ' ');
    std::int64_t f[6];
    bool ok = v.size() == 6;
    for (std::size_t i = 0; ok && i < 6; ++i) ok = absl::SimpleAtoi(v[i], &f[i]);
    if (!ok || f[1] < 0 || f[1] > static_cast<std::int64_t>(Reason::kFailOpen) || f[5] < 0) {
      return absl::DataLossError(
          absl::StrFormat("attempt \"%s\": the stored decision is malformed", detail::av(id)));
    }
    return std::optional<Decision>(Decision{.allowed = f[0] != 0,
                                            .remaining = f[2],
                                            .retry_after = f[3] < 0 ? kNever : Nanos{f[3]},
                                            .reset_after = f[4] < 0 ? kNever : Nanos{f[4]},
                                            .version = static_cast<std::uint64_t>(f[5]),
                                            .reason = static_cast<Reason>(f[1])});
  }

  struct Call {
    std::vector<std::string> keys;
    std::vector<std::string> args;
  };

  // One script call: alone, or with other threads' calls in one round trip
  // (GatewayStoreOptions::coalesce). The caller's Call outlives the wait.
  using CallCoalescer = Coalescer<const Call*, absl::StatusOr<Reply>>;
  absl::StatusOr<Reply> run_script(const Call& call) {
    if (coalescer_ == nullptr) return script_.run(call.keys, call.args);
    return coalescer_->run(&call, [this](const std::vector<const Call* const*>& jobs) {
      std::vector<Script::Call> calls;
      calls.reserve(jobs.size());
      for (const Call* const* c : jobs) calls.push_back({&(*c)->keys, &(*c)->args});
      return script_.run_many(calls);
    });
  }
  struct Decided {
    Nanos time{0};
    gateway::LevelVector<Decision> parts;
  };

  // A policy's one script argument (see twin/gateway.hpp): 33 bytes, little-endian
  // '<BI4I7I7I7I7' (kind, burst|limit, m|window µs, p|0, g|0, fill ns|0), or
  // InvalidArgument naming the bound when the Lua twin cannot decide `policy` exactly.
  using PolicyArgs = std::string;
  static constexpr std::size_t kPolicyArgBytes = 33;
  static PolicyArgs pack_policy(int kind, std::int64_t capacity, std::int64_t m, std::int64_t p,
                                std::int64_t g, std::int64_t fill) {
    PolicyArgs out;
    out.reserve(kPolicyArgBytes);
    auto put = [&out](std::int64_t v, int bytes) {
      const auto u = static_cast<std::uint64_t>(v);
      for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((u >> (8 * i)) & 0xff));
    };
    put(kind, 1);
    put(capacity, 4);
    for (std::int64_t v : {m, p, g, fill}) put(v, 7);
    return out;
  }
  static absl::StatusOr<PolicyArgs> params(const gateway::RulePolicy& policy) {
    if (auto s = gateway::detail::validate(policy); !s.ok()) return s;
    const std::int64_t cap = gateway::detail::capacity(policy);
    if (cap > kGatewayMaxCapacity) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "capacity %d units: the Redis gateway store keeps micro-units with debt in Lua "
          "doubles, exact below 2^53, so burst or limit must be at most %d",
          cap, kGatewayMaxCapacity));
    }
    if (const auto* tb = std::get_if<TokenBucket>(&policy)) {
      auto twin = LuaTwin<TokenBucket>::params(*tb);
      if (!twin.ok()) return twin.status();
      if (twin->m > 0 && twin->fill > kGatewayMaxSpanNs) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "burst/rate: refilling burst=%d at rate=%s takes %d ns; the Redis gateway store's "
            "bound is %d ns (~46 days) — raise rate.units or lower burst",
            tb->burst, to_string(tb->rate), twin->fill, kGatewayMaxSpanNs));
      }
      // Rate 0: m 0, p 1, g 1 whatever rate.per (it refills nothing; converting between
      // two such buckets of one burst changes nothing, so they decide alike).
      if (twin->m == 0) return pack_policy(1, tb->burst, 0, 1, 1, 0);
      return pack_policy(1, tb->burst, twin->m, twin->p, twin->g, twin->fill);
    }
    const auto& fw = std::get<FixedWindow>(policy);
    const std::int64_t w = fw.window.count();
    if (w % 1000 != 0 || w > kGatewayMaxSpanNs) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "window=%d ns: the Redis gateway store needs a window of whole microseconds, at most "
          "%d ns (~46 days)",
          w, kGatewayMaxSpanNs));
    }
    return pack_policy(2, fw.limit, w / 1000, 0, 0, 0);
  }

  // What identifies a policy's arguments: its kind and parameters (the value, not the
  // address — a rule set freed and another built at the same address must not hit).
  using PolicyKey = std::tuple<std::size_t, std::int64_t, std::int64_t, std::int64_t>;
  static PolicyKey policy_key(const gateway::RulePolicy& policy) {
    if (const auto* tb = std::get_if<TokenBucket>(&policy)) {
      return {policy.index(), tb->rate.units, tb->rate.per.count(), tb->burst};
    }
    const auto& fw = std::get<FixedWindow>(policy);
    return {policy.index(), fw.limit, fw.window.count(), 0};
  }

  // Appends `policy`'s argument to `args`. Rule sets are immutable and hold few distinct
  // policies, so each one's range check and packing (a gcd, 128-bit products) is done
  // once and kept: later decisions copy the 33 bytes. Entries are never erased, so a
  // pointer taken under the lock stays valid; past kMaxCachedPolicies distinct policies
  // (many reloads, each with new parameters) new ones are checked and packed per call
  // instead. Errors are not kept: an out-of-range policy gets params()'s error on every
  // call.
  absl::Status append_params(const gateway::RulePolicy& policy,
                             std::vector<std::string>& args) const {
    const PolicyKey key = policy_key(policy);
    const PolicyArgs* cached = nullptr;
    {
      quota::detail::MutexLock lock(params_mu_);
      auto it = params_cache_.find(key);
      if (it != params_cache_.end()) cached = &it->second;
    }
    if (cached == nullptr) {
      auto p = params(policy);
      if (!p.ok()) return p.status();
      quota::detail::MutexLock lock(params_mu_);
      if (params_cache_.size() >= kMaxCachedPolicies) {
        args.push_back(*std::move(p));
        return absl::OkStatus();
      }
      cached = &params_cache_.try_emplace(key, *std::move(p)).first->second;
    }
    args.push_back(*cached);
    return absl::OkStatus();
  }

  static constexpr std::size_t kMaxCachedPolicies = 4096;

  absl::StatusOr<Call> build(std::span<const gateway::LevelCheck> levels, char op,
                             std::uint64_t version, std::int64_t units, Nanos now,
                             std::optional<std::int64_t> spent_us) const {
    if (!config_error_.ok()) return config_error_;
    if (version > kGatewayMaxVersion) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "rule-set version %d: the Redis gateway store keeps versions below 2^53", version));
    }
    Call call;
    call.keys.reserve(levels.size());
    call.args.reserve(1 + levels.size());
    // The head (twin/gateway.hpp): '<Bi8Bi8i8i8Bi8', then the shadow flags.
    const bool caller = options_.time == TimeSource::kCaller;
    std::string& head = call.args.emplace_back();
    detail::pack_le(head, caller ? 1 : 0, 1);
    detail::pack_le(head, caller ? quota::detail::floor_div(now.count(), 1000) : 0, 8);
    detail::pack_le(head, static_cast<unsigned char>(op), 1);
    detail::pack_le(head, std::max<std::int64_t>(options_.ttl_margin.count(), 1), 8);
    detail::pack_le(head, static_cast<std::int64_t>(version), 8);
    detail::pack_le(head, std::clamp<std::int64_t>(units, 0, kMaxUnits), 8);
    detail::pack_le(head, spent_us.has_value() ? 1 : 0, 1);
    detail::pack_le(head, spent_us.value_or(0), 8);
    if (op == 'd') {
      for (const gateway::LevelCheck& level : levels) head.push_back(level.shadow ? '1' : '0');
    }
    for (const gateway::LevelCheck& level : levels) {
      auto parts = split_key(level.key);
      if (!parts.ok()) return parts.status();
      call.keys.push_back(bucket_key(options_.prefix, *parts));
      if (auto s = append_params(*level.policy, call.args); !s.ok()) return s;
    }
    return call;
  }

  static absl::StatusOr<std::int64_t> integer_at(const redisReply& r, std::size_t i) {
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
    auto time = r.type == REDIS_REPLY_ARRAY ? integer_at(r, 0) : absl::StatusOr<std::int64_t>(0);
    auto count = r.type == REDIS_REPLY_ARRAY ? integer_at(r, 1) : absl::StatusOr<std::int64_t>(0);
    if (!time.ok()) return time.status();
    if (!count.ok()) return count.status();
    if (r.type != REDIS_REPLY_ARRAY || *count < 1 || static_cast<std::size_t>(*count) > n ||
        r.elements != 2 + 6 * static_cast<std::size_t>(*count)) {
      return absl::UnavailableError(absl::StrFormat(
          "malformed reply from the gateway script: type %d with %d elements for %d levels", r.type,
          r.type == REDIS_REPLY_ARRAY ? r.elements : 0, n));
    }
    Decided out{.time = Nanos{*time * 1000}, .parts = {}};
    for (std::size_t i = 0; i < static_cast<std::size_t>(*count); ++i) {
      std::int64_t f[6];
      for (std::size_t k = 0; k < 6; ++k) {
        auto x = integer_at(r, 2 + 6 * i + k);
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

  absl::StatusOr<MicroUnits> one(const gateway::LevelCheck& level, char op, std::uint64_t version,
                                 std::int64_t units, Nanos now,
                                 std::optional<std::int64_t> spent_us) {
    auto call =
        build(std::span<const gateway::LevelCheck>(&level, 1), op, version, units, now, spent_us);
    if (!call.ok()) return call.status();
    auto reply = run_script(*call);
    if (!reply.ok()) return reply.status();
    const redisReply& r = **reply;
    if (r.type == REDIS_REPLY_ERROR) return script_error(r);
    if (r.type != REDIS_REPLY_ARRAY || r.elements != 2) {
      return absl::UnavailableError(absl::StrFormat(
          "malformed reply from the gateway script: type %d, expected an array of 2", r.type));
    }
    auto v = integer_at(r, 1);
    if (!v.ok()) return v.status();
    if (*v < 0) {
      return absl::UnavailableError(
          absl::StrFormat("malformed reply from the gateway script: %d micro-units", *v));
    }
    return *v;
  }

  // Gives `cost` back to the allowed levels of the groups already deducted (one script
  // per group, at each state's own latest time). Best effort: a failure leaves the
  // deduction in place (under-admission).
  void give_back(std::span<const gateway::LevelCheck> levels,
                 const std::vector<std::pair<std::size_t, std::size_t>>& groups,
                 const std::vector<std::size_t>& deducted_groups, std::span<const Decision> parts,
                 std::uint64_t version, std::int64_t cost, Nanos now) {
    for (std::size_t g : deducted_groups) {
      std::vector<gateway::LevelCheck> back;
      for (std::size_t i = groups[g].first; i < groups[g].second; ++i) {
        if (parts[i].allowed) back.push_back(levels[i]);
      }
      if (back.empty()) continue;
      auto call = build(back, 'r', version, cost, now, std::nullopt);
      if (call.ok()) (void)run_script(*call);
    }
  }

  GatewayStoreOptions options_;
  Script script_;
  Script attempts_;
  absl::Status config_error_;
  mutable quota::detail::Mutex params_mu_;
  mutable absl::node_hash_map<PolicyKey, PolicyArgs> params_cache_ ABSL_GUARDED_BY(params_mu_);
  std::unique_ptr<CallCoalescer> coalescer_;  // with GatewayStoreOptions::coalesce > 1
};

static_assert(gateway::GatewayBackend<GatewayStore>);

}  // namespace quota::redis
