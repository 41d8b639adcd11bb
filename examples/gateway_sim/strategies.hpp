// strategies.hpp — the ways the gateways decide (see the top of gateway_sim.cpp): each
// a Strategy whose decide() a gateway thread calls for each of its requests.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/cli.hpp"
#include "options.hpp"
#include "quota/lease/leased_limiter.hpp"
#include "quota/quota.hpp"

#ifdef QUOTA_SIM_HAVE_REDIS
#include <unistd.h>

#include "quota/redis/redis_store.hpp"
#endif

namespace gateway_sim {

using quota::Nanos;
using quota::TokenBucket;

struct Outcome {
  bool allowed;
  std::int64_t time_ns;  // the time the bucket decided at
};

class Strategy {
 public:
  virtual ~Strategy() = default;
  virtual std::string name() const = 0;
  // The envelope a strategy promises for `tenant`: r·T + B + allowance(tenant) units, or
  // -1 when it promises none (the local strategies).
  virtual std::int64_t allowance(std::uint32_t tenant) const = 0;
  // One line about the run for the verdicts (e.g. the leases' round trips), or "".
  virtual std::string note(std::int64_t /*decisions*/) const { return ""; }
  // Called from gateway `gateway`'s thread only.
  virtual absl::StatusOr<Outcome> decide(int gateway, std::uint32_t tenant, Nanos now,
                                         std::int64_t cost) = 0;
};

template <class Store>
absl::StatusOr<Outcome> decide_in(Store& store, const TokenBucket& policy, const std::string& key,
                                  Nanos now, std::int64_t cost) {
  return store.update(policy, key, now, [&](TokenBucket::State& s) {
    const quota::Decision d = policy.apply(s, now, cost);
    return Outcome{d.allowed, s.last};
  });
}

// One LocalStore per gateway (each used by its own thread only) with per-gateway policies.
class LocalStrategy : public Strategy {
 public:
  LocalStrategy(const Options& o, const Tenants& tenants, bool split)
      : split_(split), keys_(tenants.keys), stores_(o.traffic.gateways) {
    const std::int64_t g = o.traffic.gateways;
    for (const TokenBucket& c : tenants.contract) {
      // r/G exactly (the same units over G times the period) and floor(B/G), at least 1.
      policies_.push_back(split
                              ? TokenBucket{.rate = {.units = c.rate.units, .per = c.rate.per * g},
                                            .burst = std::max<std::int64_t>(1, c.burst / g)}
                              : c);
    }
  }
  std::string name() const override { return split_ ? "local-split" : "local-full"; }
  std::int64_t allowance(std::uint32_t) const override { return -1; }
  absl::StatusOr<Outcome> decide(int gateway, std::uint32_t tenant, Nanos now,
                                 std::int64_t cost) override {
    return decide_in(stores_[gateway], policies_[tenant], keys_[tenant], now, cost);
  }
  const TokenBucket& policy(std::uint32_t tenant) const { return policies_[tenant]; }

 private:
  bool split_;
  std::vector<std::string> keys_;
  std::vector<TokenBucket> policies_;
  std::vector<quota::LocalStore<TokenBucket>> stores_;
};

class SharedStrategy : public Strategy {
 public:
  explicit SharedStrategy(const Tenants& tenants) : tenants_(tenants) {}
  std::string name() const override { return "shared"; }
  std::int64_t allowance(std::uint32_t) const override { return 0; }
  absl::StatusOr<Outcome> decide(int, std::uint32_t tenant, Nanos now, std::int64_t cost) override {
    return decide_in(store_, tenants_.contract[tenant], tenants_.keys[tenant], now, cost);
  }

 private:
  const Tenants& tenants_;
  quota::ShardedStore<TokenBucket> store_;
};

// The simulated time of the calling gateway thread: leases read time from a Clock, not
// from an argument, so each gateway thread sets its own before every decision.
inline thread_local std::int64_t t_sim_now_ns = 0;
struct SimClock {
  Nanos now() const { return Nanos{t_sim_now_ns}; }
};

// Quota leases (quota/lease/leased_limiter.hpp): each gateway is a LeasedLimiter that
// takes grants of up to q_max units from an in-process authority (the tenant's central
// token bucket) and spends them locally. They promise r·T + B + H·q_max with H = G
// holders. Time is rounded down to the tick, as for redis: grants and spends of one
// tick share one time, so a grant is never logged after the spends it paid for.
template <class Authority>
class LeaseStrategy : public Strategy {
 public:
  using Leased = quota::LeasedLimiter<Authority, SimClock>;

  // `authorities`: one per tenant (each holds that tenant's contract).
  static absl::StatusOr<std::unique_ptr<LeaseStrategy>> create(
      std::string name, const Options& o, const Tenants& tenants,
      std::vector<std::unique_ptr<Authority>> authorities) {
    std::unique_ptr<LeaseStrategy> s(new LeaseStrategy(std::move(name), tenants, o));
    s->authorities_ = std::move(authorities);
    for (const TokenBucket& c : tenants.contract) s->q_max_.push_back(std::min(o.lease_q, c.burst));
    s->limiters_.resize(o.traffic.gateways);
    for (int g = 0; g < o.traffic.gateways; ++g) {
      for (std::size_t t = 0; t < tenants.contract.size(); ++t) {
        auto l =
            Leased::create(*s->authorities_[t], {.q_min = 1,
                                                 .q_max = s->q_max_[t],
                                                 .grant_ttl = 1s,
                                                 .incarnation = static_cast<std::uint64_t>(g) + 1,
                                                 .max_keys = 16,
                                                 .central = tenants.contract[t]});
        if (!l.ok()) return l.status();
        s->limiters_[g].push_back(std::move(*l));
      }
    }
    return s;
  }
  std::string name() const override { return name_; }
  std::int64_t allowance(std::uint32_t tenant) const override {
    return static_cast<std::int64_t>(limiters_.size()) * q_max_[tenant];
  }
  absl::StatusOr<Outcome> decide(int gateway, std::uint32_t tenant, Nanos now,
                                 std::int64_t cost) override {
    t_sim_now_ns = now.count() / tick_ns_ * tick_ns_;
    auto d = limiters_[gateway][tenant]->acquire(tenants_.keys[tenant], cost);
    if (!d.ok()) return d.status();
    return Outcome{d->allowed, t_sim_now_ns};
  }
  std::string note(std::int64_t decisions) const override {
    std::int64_t trips = 0;
    for (const auto& a : authorities_) trips += a->round_trips();
    return absl::StrFormat("%d authority round trips for %d decisions (q_max %d, %d holders)",
                           trips, decisions, q_max_[0], limiters_.size());
  }

 private:
  LeaseStrategy(std::string name, const Tenants& tenants, const Options& o)
      : name_(std::move(name)), tenants_(tenants), tick_ns_(o.tick_ms * 1'000'000) {}
  std::string name_;
  const Tenants& tenants_;
  std::int64_t tick_ns_;
  std::vector<std::unique_ptr<Authority>> authorities_;         // per tenant
  std::vector<std::int64_t> q_max_;                             // per tenant
  std::vector<std::vector<std::unique_ptr<Leased>>> limiters_;  // [gateway][tenant]
};

using InProcessAuthority = quota::StoreAuthority<quota::ShardedStore, SimClock>;

#ifdef QUOTA_SIM_HAVE_REDIS
// Connects to --redis (and checks it answers) and checks that the Lua twin decides every
// contract exactly. The store decides on the caller's time (simulated), under a per-run
// key prefix.
absl::StatusOr<quota::RedisStoreOptions> redis_options(const Options& o, const Tenants& tenants) {
  quota::redis::ConnectionConfig cfg;
  if (!quota::cli::parse_host_port(o.redis, &cfg.host, &cfg.port)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("--redis expects HOST:PORT, got '%s'", o.redis));
  }
  cfg.deadline = 500ms;
  auto pool = std::make_shared<quota::redis::ConnectionPool>(cfg, o.traffic.gateways);
  {
    auto lease = pool->acquire();
    if (!lease.ok()) return lease.status();
    auto pong = (*lease)->command({"PING"});
    if (!pong.ok()) return pong.status();
  }
  for (const auto& c : tenants.contract) {
    if (auto s = quota::RedisStore<TokenBucket>::check(c); !s.ok()) return s;
  }
  quota::RedisStoreOptions opts{
      .pool = pool,
      .prefix = absl::StrFormat("quota-sim:%d:%d:", ::getpid(),
                                std::chrono::steady_clock::now().time_since_epoch().count()),
      .time = quota::redis::TimeSource::kCaller};
  return opts;
}

// The Redis store on the caller's (simulated) clock: TimeSource::kCaller, so the run is
// as reproducible as the in-process one. Keys get a per-run prefix. Redis expires a key
// on ITS wall clock (time to full + a 1 s margin); the simulation runs faster than real
// time, so an active bucket does not expire early here — and if one did, the verifier
// would report the extra burst.
//
// Coalescing (redis-coalesced): the gateways' calls that wait while one is in flight go
// together in one script call; all of a tick's calls carry the same time, so they may.
class RedisStrategy : public Strategy {
 public:
  static absl::StatusOr<std::unique_ptr<RedisStrategy>> create(const Options& o,
                                                               const Tenants& tenants,
                                                               bool coalesce) {
    auto opts = redis_options(o, tenants);
    if (!opts.ok()) return opts.status();
    if (coalesce) {
      opts->coalesce = std::max(2, o.traffic.gateways);
    }
    return std::unique_ptr<RedisStrategy>(
        new RedisStrategy(tenants, std::move(*opts), o.tick_ms * 1'000'000));
  }
  std::string name() const override { return coalesce_ ? "redis-coalesced" : "redis"; }
  // (coalesce_: RedisStoreOptions::coalesce > 1, as create() sets it for redis-coalesced.)
  std::int64_t allowance(std::uint32_t) const override { return 0; }
  std::string note(std::int64_t) const override {
    if (!coalesce_) return "";
    const auto stats = store_.coalesce_stats();
    return absl::StrFormat("%d round trips for %d decisions", stats.round_trips, stats.decisions);
  }
  // Time is rounded down to the start of its lock-step tick. The script decides a request
  // stamped earlier than its bucket's stored time at the stored time, but reports the
  // stamp it was given (redis::ScriptResult::time), so with exact stamps a gateway that lost
  // a race within a tick would be logged earlier than it was decided. With one time per
  // tick, and ticks separated by the barrier, every decision happens at its logged time.
  absl::StatusOr<Outcome> decide(int, std::uint32_t tenant, Nanos now, std::int64_t cost) override {
    const Nanos at{now.count() / tick_ns_ * tick_ns_};
    // apply: the path that coalesces (acquire, with an outcome, goes alone).
    auto d = store_.apply(tenants_.contract[tenant], tenants_.keys[tenant], at, cost);
    if (!d.ok()) return d.status();
    return Outcome{d->allowed, at.count()};
  }

 private:
  RedisStrategy(const Tenants& tenants, quota::RedisStoreOptions opts, std::int64_t tick_ns)
      : tenants_(tenants),
        coalesce_(opts.coalesce > 1),
        store_(std::move(opts)),
        tick_ns_(tick_ns) {}
  const Tenants& tenants_;
  const bool coalesce_;
  quota::RedisStore<TokenBucket> store_;
  std::int64_t tick_ns_;
};

// quota::redis::LeaseAuthority, but on the calling gateway's simulated time (it passes no
// time: the server's TIME decides). A grant is one acquire with the grant id as the
// attempt id, so a retried grant replays instead of charging twice.
class SimRedisAuthority {
 public:
  SimRedisAuthority(std::shared_ptr<quota::RedisStore<TokenBucket>> store, TokenBucket policy)
      : store_(std::move(store)), policy_(policy) {}
  absl::StatusOr<quota::Decision> grant(std::string_view key, std::int64_t units,
                                        std::string_view grant_id) {
    round_trips_.fetch_add(1, std::memory_order_relaxed);
    auto r = store_->apply_attempt(policy_, key, Nanos{t_sim_now_ns}, units, grant_id);
    if (!r.ok()) return r.status();
    return r->decision;
  }
  std::int64_t round_trips() const { return round_trips_.load(std::memory_order_relaxed); }

 private:
  std::shared_ptr<quota::RedisStore<TokenBucket>> store_;
  TokenBucket policy_;
  std::atomic<std::int64_t> round_trips_{0};
};
static_assert(quota::LeaseAuthority<SimRedisAuthority>);
#endif

inline absl::StatusOr<std::unique_ptr<Strategy>> make_strategy(const std::string& name,
                                                               const Options& o,
                                                               const Tenants& tenants) {
  if (name == "local-full" || name == "local-split") {
    return std::make_unique<LocalStrategy>(o, tenants, name == "local-split");
  }
  if (name == "shared") return std::make_unique<SharedStrategy>(tenants);
  if (name == "leases") {
    std::vector<std::unique_ptr<InProcessAuthority>> authorities;
    for (const TokenBucket& c : tenants.contract) {
      authorities.push_back(std::make_unique<InProcessAuthority>(c));
    }
    auto l = LeaseStrategy<InProcessAuthority>::create(name, o, tenants, std::move(authorities));
    if (!l.ok()) return l.status();
    return std::unique_ptr<Strategy>(std::move(*l));
  }
  if (name == "redis-leases") {
#ifdef QUOTA_SIM_HAVE_REDIS
    auto opts = redis_options(o, tenants);
    if (!opts.ok()) {
      return absl::Status(opts.status().code(),
                          absl::StrCat("--redis ", o.redis, ": ", opts.status().message()));
    }
    auto store = std::make_shared<quota::RedisStore<TokenBucket>>(std::move(*opts));
    std::vector<std::unique_ptr<SimRedisAuthority>> authorities;
    for (const TokenBucket& c : tenants.contract) {
      authorities.push_back(std::make_unique<SimRedisAuthority>(store, c));
    }
    auto l = LeaseStrategy<SimRedisAuthority>::create(name, o, tenants, std::move(authorities));
    if (!l.ok()) return l.status();
    return std::unique_ptr<Strategy>(std::move(*l));
#else
    return absl::UnimplementedError(
        "--redis: the Redis store is not available in this build (hiredis was not found "
        "when it was configured)");
#endif
  }
  if (name == "redis" || name == "redis-coalesced") {
#ifdef QUOTA_SIM_HAVE_REDIS
    auto r = RedisStrategy::create(o, tenants, name == "redis-coalesced");
    if (!r.ok()) {
      return absl::Status(r.status().code(),
                          absl::StrCat("--redis ", o.redis, ": ", r.status().message()));
    }
    return std::unique_ptr<Strategy>(std::move(*r));
#else
    return absl::UnimplementedError(
        "--redis: the Redis store is not available in this build (not available yet, or "
        "hiredis was not found when it was configured)");
#endif
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown strategy '", name, "'"));
}

}  // namespace gateway_sim
