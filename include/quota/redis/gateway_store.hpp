// quota/redis/gateway_store.hpp — the gateway's budgets in Redis, shared by every process.
//
// `GatewayStore` is a gateway backend (gateway/backend.hpp): a Gateway over it decides
// exactly like the in-process gateway, with Redis as the one authority:
//
//   auto pool = std::make_shared<quota::redis::ConnectionPool>(
//       quota::redis::ConnectionConfig{.host = "127.0.0.1", .port = 6379}, 8);
//   quota::redis::GatewayStore store({.pool = pool});
//   quota::gateway::Gateway gw(store, registry);
//   auto r = gw.decide({.who = {.tenant = "acme", .plan = "free"}, .route = "read"}, clock.now());
//
// Guarantees. Each key's state lives in Redis with the parameters and rule-set version
// that wrote it (the Lua twin of key_state.hpp: twin/gateway.hpp, its codec
// twin/gateway_codec.hpp), so a rule change is converted on the server without a burst,
// whichever process sees the new rules first. The limits of one scope are records of one
// Redis key ("{acme}#tpm" and "{acme}#tpd" both in "<prefix>{acme}": keys.hpp's
// scope_key), so a decision against several limits of a tenant reads and writes one key. The user
// and tenant levels share the tenant's hash slot and are decided by ONE script: all allow or
// nothing is deducted. The global level ("{~global}route", its own slot) is decided by a second
// script; when it denies or fails, the tenant's levels are given back by a third — never an
// admission beyond any level's envelope, at worst a brief under-admission. Each level deducts (and
// gets back) its own cost. Time is the server's, nanoseconds (TIME has microseconds).
// Failures are values: kUnavailable (the gateway's fail mode applies), kDataLoss for a
// key that is not ours, kInvalidArgument for a rule outside the twin's range (`check`).
// Attempts (decide_attempt, twin/gateway_attempts.hpp) are recorded in the tenant's slot
// by the script call that decides and deducts, so a retry through any process after a
// lost reply replays the decision and deducts nothing more.
// docs/gateway.md has the whole story (coalescing, durability, attempts).
//
// Thread safety: every method may be called from any thread.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_format.h"
#include "quota/decision.hpp"
#include "quota/detail/mutex.hpp"
#include "quota/gateway/backend.hpp"
#include "quota/gateway/key_state.hpp"
#include "quota/redis/gateway_policy_args.hpp"
#include "quota/redis/gateway_store_options.hpp"
#include "quota/redis/keys.hpp"
#include "quota/redis/redis_store.hpp"
#include "quota/redis/transport/cluster.hpp"
#include "quota/redis/transport/coalescer.hpp"
#include "quota/redis/transport/connection_pool.hpp"
#include "quota/redis/transport/script.hpp"
#include "quota/redis/transport/sentinel.hpp"
#include "quota/redis/twin/gateway.hpp"
#include "quota/redis/twin/gateway_attempts.hpp"
#include "quota/redis/twin/gateway_codec.hpp"
#include "quota/units.hpp"

namespace quota::redis {

// The most script calls one coalesced round trip takes (GatewayStoreOptions::coalesce).
inline constexpr int kGatewayMaxCoalesce = 4096;
// The most levels one script call decides (the script reads their count as one byte).
inline constexpr std::size_t kGatewayMaxLevels = 255;

class GatewayStore : public gateway::Backend {
 public:
  explicit GatewayStore(GatewayStoreOptions options)
      : options_(with_sentinel_pool(std::move(options))),
        script_(kGatewayLua, options_.pool, options_.cluster, durability(), options_.limits,
                {.failover = options_.failover_safety,
                 .clock = options_.clock_guard,
                 .reply_time_at = 0}),
        attempts_(kGatewayAttemptLua, options_.pool, options_.cluster, durability(),
                  options_.limits) {
    if (options_.pool == nullptr && options_.cluster == nullptr) {
      config_error_ = absl::InvalidArgumentError(
          "GatewayStoreOptions: pool, cluster and sentinel are all null");
    } else if (options_.sentinel != nullptr &&
               (options_.cluster != nullptr || options_.pool != options_.sentinel->pool())) {
      config_error_ = absl::InvalidArgumentError(
          "GatewayStoreOptions: sentinel is set together with pool or cluster; set one");
    } else if (auto s = quota::detail::check_key_chars(options_.prefix, "prefix"); !s.ok()) {
      config_error_ = s;
    } else if (options_.coalesce < 0 || options_.coalesce > kGatewayMaxCoalesce) {
      config_error_ = absl::InvalidArgumentError(
          absl::StrFormat("GatewayStoreOptions: coalesce=%d, must be in [0, %d]", options_.coalesce,
                          kGatewayMaxCoalesce));
    } else if (options_.coalesce > 1 && options_.coalesce_calls < 1) {
      config_error_ = absl::InvalidArgumentError(absl::StrFormat(
          "GatewayStoreOptions: coalesce_calls=%d, must be at least 1", options_.coalesce_calls));
    } else if (auto s = check_durability(durability(), script_.deadline(), "GatewayStoreOptions");
               !s.ok()) {
      config_error_ = s;
    } else if (auto s =
                   check_clock_guard(options_.clock_guard, options_.time == TimeSource::kCaller,
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
  static absl::Status check(const gateway::RulePolicy& policy) {
    return GatewayTwin::params(policy).status();
  }

  absl::StatusOr<gateway::LevelsResult> decide(std::span<const gateway::LevelCheck> levels,
                                               std::uint64_t version, Nanos now) override {
    auto groups = slot_groups(levels);
    if (!groups.ok()) return groups.status();
    return gateway::decide_all_or_nothing<std::size_t>(
        levels, now, [&](std::size_t begin) { return group_end(*groups, begin); },
        [&](std::size_t begin, std::size_t end, gateway::CheckVector<Decision>& parts,
            gateway::CheckVector<std::size_t>& deducted) {
          return decide_group(levels, begin, end, version, now, parts, deducted);
        },
        [&](std::span<const std::size_t> deducted) {
          give_back(levels, *groups, deducted, version, now);
        });
  }

  // decide() with an attempt: the record kept in the call that decides (the tenant's) and
  // a lost reply replayed, as twin/gateway_attempts.hpp describes.
  bool shares_attempts() const override { return true; }
  absl::StatusOr<gateway::AttemptResult> decide_attempt(
      std::span<const gateway::LevelCheck> levels, std::uint64_t version, Nanos now,
      const gateway::AttemptRequest& attempt) override {
    auto groups = slot_groups(levels);
    if (!groups.ok()) return groups.status();
    auto akey = attempt_record_key(levels.front(), attempt.id);
    if (!akey.ok()) return akey.status();
    const auto [begin, end] = groups->front();
    auto call = build(levels.subspan(begin, end - begin), 'a', version, now, std::nullopt);
    if (!call.ok()) return call.status();
    call->keys.push_back(*std::move(akey));
    GatewayAttemptTwin::append_args(call->args, attempt, options_.attempt_pending.count(),
                                    groups->size() == 1);
    auto reply = run_script(*call);
    if (!reply.ok()) return reply.status();
    auto opened = GatewayAttemptTwin::parse(**reply, end - begin, levels.size(), attempt);
    if (!opened.ok()) return opened.status();
    gateway::AttemptResult& out = *opened;
    const bool stopped =
        out.levels.parts.size() < end - begin ||
        (!out.levels.parts.back().allowed && !levels[out.levels.parts.size() - 1].shadow);
    if (out.replayed || groups->size() == 1 || stopped) return out;
    // The global level, then the record of the whole decision.
    gateway::CheckVector<std::size_t> deducted;
    for (std::size_t i = begin; i < end; ++i) {
      if (out.levels.parts[i].allowed) deducted.push_back(i);
    }
    auto s = gateway::decide_runs(
        levels, end, out.levels, deducted, [&](std::size_t b) { return group_end(*groups, b); },
        [&](std::size_t b, std::size_t e, gateway::CheckVector<Decision>& parts,
            gateway::CheckVector<std::size_t>& d) {
          return decide_group(levels, b, e, version, now, parts, d);
        });
    // A denial is recorded like an admission; an error abandons the pending record, and
    // only once it is gone are the tenant's levels given back.
    const bool done = GatewayAttemptTwin::close_record(
        attempts_, call->keys.back(), attempt, out.deadline, s.ok() ? &out.levels : nullptr);
    if (done && (!s.ok() || *s)) give_back(levels, *groups, deducted, version, now);
    if (!s.ok()) return s.status();
    return out;
  }

  absl::StatusOr<MicroUnits> refund(const gateway::RulePolicy& policy, std::uint64_t version,
                                    gateway::LevelKey key, std::int64_t units, Nanos spent_at,
                                    Nanos now) override {
    const gateway::LevelCheck level{
        .policy = &policy, .key = key.key, .shadow = false, .cost = units, .layout = key.layout};
    return one(level, 'r', version, now, spent_at);
  }

  absl::StatusOr<MicroUnits> charge(const gateway::RulePolicy& policy, std::uint64_t version,
                                    gateway::LevelKey key, std::int64_t units, Nanos now) override {
    const gateway::LevelCheck level{
        .policy = &policy, .key = key.key, .shadow = false, .cost = units, .layout = key.layout};
    return one(level, 'c', version, now, std::nullopt);
  }

  // The Redis key that holds a gateway key's record: its scope's (tests and operators:
  // TTL, MEMORY USAGE).
  absl::StatusOr<std::string> redis_key(std::string_view key) const {
    auto scope = scope_key(options_.prefix, key);
    if (!scope.ok()) return scope.status();
    return std::move(scope->first);
  }

  // The Redis key of a sliding log's events, beside its record (tests and operators).
  absl::StatusOr<std::string> log_key(std::string_view key) const {
    auto scope = scope_key(options_.prefix, key);
    if (!scope.ok()) return scope.status();
    return absl::StrCat(scope->first, "#", detail::av(scope->second), "}l");
  }

  const GatewayStoreOptions& options() const { return options_; }
  // The nodes' circuit breakers and the in-flight guard, counted (breaker.hpp).
  FailFastStats fail_fast_stats() const { return script_.fail_fast_stats(); }
  // The failovers and clock refusals its connections saw (node_watch.hpp), summed over
  // the nodes (the pool's, the cluster's, or the primary a sentinel follows).
  NodeWatchStats node_watch_stats() const { return script_.node_watch_stats(); }

 private:
  // With a sentinel and no pool: the sentinel's pool (to the primary) as the pool.
  static GatewayStoreOptions with_sentinel_pool(GatewayStoreOptions o) {
    o.pool = pool_of(o);
    return o;
  }
  Durability durability() const {
    return {.replicas = options_.replicas, .timeout = options_.replica_timeout};
  }

  // Where the attempt of a request whose first level is `first` is recorded: in its slot.
  absl::StatusOr<std::string> attempt_record_key(const gateway::LevelCheck& first,
                                                 std::string_view id) const {
    if (!config_error_.ok()) return config_error_;
    auto l = layout(first);
    if (!l.ok()) return l.status();
    return attempt_key(options_.prefix, l->tag(first.key), id);
  }

  // A level's layout: the Gateway's (only its size checked), or read from its key.
  static absl::StatusOr<gateway::KeyLayout> layout(const gateway::LevelCheck& level) {
    if (!level.layout.has_value()) return layout_of(level.key);
    if (auto s = check_key_size(level.key); !s.ok()) return s;
    return *level.layout;
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
  // One script call on `levels` (one slot), each with its own units (LevelCheck::cost:
  // the cost 'd', the units to give back 'r' or to charge 'c').
  absl::StatusOr<Call> build(std::span<const gateway::LevelCheck> levels, char op,
                             std::uint64_t version, Nanos now,
                             std::optional<Nanos> spent_at) const {
    if (!config_error_.ok()) return config_error_;
    if (version > kGatewayMaxVersion) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "rule-set version %d: the Redis gateway store keeps versions below 2^53", version));
    }
    if (levels.size() > kGatewayMaxLevels) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%d levels in one call: the Redis gateway store decides at most %d",
                          levels.size(), kGatewayMaxLevels));
    }
    Call call;
    // Each level's scope key (KEYS, distinct, in order of first use) and its place there;
    // each key's layout: its levels' entries (name, rule-set version, policy) in order.
    std::string kmap;
    std::vector<std::string> layouts;
    std::vector<std::string_view> names;
    for (const gateway::LevelCheck& level : levels) {
      if (options_.failover_safety && std::holds_alternative<SlidingLog>(*level.policy)) {
        // (a log read as spent would need its one event at the failover time in its list)
        return absl::InvalidArgumentError(
            "GatewayStoreOptions: failover_safety does not take sliding_log rules; use a token "
            "bucket, a fixed window or a window estimate");
      }
      auto l = layout(level);
      if (!l.ok()) return l.status();
      auto scope = scope_key(options_.prefix, level.key, *l);
      auto at = std::find(call.keys.begin(), call.keys.end(), scope.first);
      for (std::size_t j = 0; at != call.keys.end() && j < names.size(); ++j) {
        if (static_cast<unsigned char>(kmap[j]) == at - call.keys.begin() + 1 &&
            names[j] == scope.second) {
          return absl::InvalidArgumentError(
              absl::StrFormat("levels %d and %d of one call are one record (\"%s\" of %s)", j,
                              names.size(), detail::av(scope.second), scope.first));
        }
      }
      if (at == call.keys.end()) {
        call.keys.push_back(std::move(scope.first));
        layouts.emplace_back();
        at = call.keys.end() - 1;
      }
      kmap.push_back(static_cast<char>(at - call.keys.begin() + 1));
      names.push_back(scope.second);
    }
    call.args.reserve(3 + 2 * levels.size());
    // The head (twin/gateway_layout.hpp's kGatewayHead), then the shadow flags and the
    // units per level.
    const bool caller = options_.time == TimeSource::kCaller;
    std::string& head = call.args.emplace_back();
    const auto [sec, ns] = GatewayTwin::limbs(caller ? now : Nanos{0});
    const bool guarded = options_.failover_safety || options_.clock_guard.has_value();
    auto units = [](const gateway::LevelCheck& l) {
      return std::clamp<std::int64_t>(l.cost, 0, kMaxUnits);
    };
    const auto [spent_sec, spent_ns] = GatewayTwin::limbs(spent_at.value_or(Nanos{0}));
    pack<kGatewayHead>(
        head, (caller ? 1 : 0) + (guarded ? 2 : 0), sec, ns, static_cast<unsigned char>(op),
        std::max<std::int64_t>(options_.ttl_margin.count(), 1), version, units(levels.front()),
        spent_at.has_value() ? 1 : 0, spent_sec, spent_ns, levels.size(), call.keys.size());
    if (op == 'd' || op == 'a') {
      for (const gateway::LevelCheck& level : levels) head.push_back(level.shadow ? '1' : '0');
    }
    // Each level's own units, only when they differ (the script reads them per level).
    if (std::any_of(levels.begin(), levels.end(),
                    [&](const gateway::LevelCheck& l) { return l.cost != levels.front().cost; })) {
      for (const gateway::LevelCheck& level : levels) detail::pack_le(head, units(level), 8);
    }
    for (std::size_t i = 0; i < levels.size(); ++i) {
      if (auto s = policy_args_.append(*levels[i].policy, call.args); !s.ok()) return s;
      std::string& layout = layouts[static_cast<unsigned char>(kmap[i]) - 1];
      layout.push_back(static_cast<char>(names[i].size()));
      layout.append(names[i]);
      detail::pack_le(layout, static_cast<std::int64_t>(version), 7);
      layout.append(call.args.back());
    }
    call.args.push_back(std::move(kmap));
    for (std::string& layout : layouts) call.args.push_back(std::move(layout));
    return call;
  }

  absl::StatusOr<MicroUnits> one(const gateway::LevelCheck& level, char op, std::uint64_t version,
                                 Nanos now, std::optional<Nanos> spent_at) {
    auto call = build(std::span<const gateway::LevelCheck>(&level, 1), op, version, now, spent_at);
    if (!call.ok()) return call.status();
    auto reply = run_script(*call);
    if (!reply.ok()) return reply.status();
    return GatewayTwin::parse_units(**reply);
  }

  using Groups = std::vector<std::pair<std::size_t, std::size_t>>;  // [begin, end)

  // Runs of consecutive levels in one slot (tenant levels, then the global one).
  static absl::StatusOr<Groups> slot_groups(std::span<const gateway::LevelCheck> levels) {
    if (levels.empty()) return absl::InvalidArgumentError("decide: no levels");
    Groups groups;
    std::string_view tag;
    for (std::size_t i = 0; i < levels.size(); ++i) {
      auto l = layout(levels[i]);
      if (!l.ok()) return l.status();
      if (groups.empty() || l->tag(levels[i].key) != tag) {
        groups.emplace_back(i, i + 1);
        tag = l->tag(levels[i].key);
      } else {
        groups.back().second = i + 1;
      }
    }
    return groups;
  }

  // The end of the slot group that starts at level `begin`.
  static std::size_t group_end(const Groups& groups, std::size_t begin) {
    for (const auto& [b, e] : groups) {
      if (b == begin) return e;
    }
    return begin + 1;  // not reached: decide_runs() starts runs only where groups start
  }

  // One run of gateway::decide_runs(): the levels of one slot group in one script call,
  // all or nothing there; `deducted` gets each level it allowed. The time of the first
  // group's decision is the result's.
  absl::StatusOr<gateway::RunStep> decide_group(std::span<const gateway::LevelCheck> levels,
                                                std::size_t begin, std::size_t end,
                                                std::uint64_t version, Nanos now,
                                                gateway::CheckVector<Decision>& parts,
                                                gateway::CheckVector<std::size_t>& deducted) {
    const auto group = levels.subspan(begin, end - begin);
    auto call = build(group, 'd', version, now, std::nullopt);
    if (!call.ok()) return call.status();
    auto reply = run_script(*call);
    if (!reply.ok()) return reply.status();
    auto decided = GatewayTwin::parse_decide(**reply, group, version);
    if (!decided.ok()) return decided.status();
    for (std::size_t k = 0; k < decided->parts.size(); ++k) {
      parts.push_back(decided->parts[k]);
      if (decided->parts[k].allowed) deducted.push_back(begin + k);
    }
    if (begin != 0) return gateway::RunStep{};
    return gateway::RunStep{.redo = false, .time = decided->time};
  }

  // Gives each level in `deducted` its own cost back, one script per slot group, at each
  // state's own latest time. Best effort: a failure leaves the deduction in place
  // (under-admission).
  void give_back(std::span<const gateway::LevelCheck> levels, const Groups& groups,
                 std::span<const std::size_t> deducted, std::uint64_t version, Nanos now) {
    for (const auto& [begin, end] : groups) {
      std::vector<gateway::LevelCheck> back;
      for (std::size_t i : deducted) {
        if (i >= begin && i < end) back.push_back(levels[i]);
      }
      if (back.empty()) continue;
      auto call = build(back, 'r', version, now, std::nullopt);
      if (call.ok()) (void)run_script(*call);
    }
  }

  GatewayStoreOptions options_;
  Script script_;
  Script attempts_;
  absl::Status config_error_;
  GatewayPolicyArgCache policy_args_;
  std::unique_ptr<CallCoalescer> coalescer_;  // with GatewayStoreOptions::coalesce > 1
};

}  // namespace quota::redis
