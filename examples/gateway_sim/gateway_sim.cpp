// gateway_sim — G gateways, T tenants, skewed traffic, one table: why a shared budget.
//
// The same seeded request stream (traffic.hpp) is replayed through each strategy:
//
//   local-full   every gateway enforces the tenant's whole contract (r, B) on its own:
//                the classic overshoot, up to G times the contract;
//   local-split  every gateway enforces r/G and B/G: never over, but under skew it
//                denies requests that the tenant's budget could have served;
//   shared       one in-process quota::ShardedStore shared by all gateway threads;
//   leases       each gateway a quota::LeasedLimiter: grants of up to q_max units from
//                the tenant's central bucket (an in-process authority), spent locally;
//                promises r·T + B + G·q_max, with far fewer authority round trips;
//   redis        the shared Redis store (with --redis HOST:PORT), deciding on the
//                simulated time (TimeSource::kCaller) rounded down to its tick;
//   redis-leases leases whose authority is that Redis store (with --redis);
//   redis-coalesced  the Redis store with coalescing (RedisStoreOptions::coalesce): the
//                gateways' concurrent decisions of one tick go together in one script
//                call, each decided as if alone (with --redis).
//
// Gateways are threads. They move through simulated time in lock-step ticks (--tick-ms):
// each gateway decides its requests of one tick, stamped with their own simulated time,
// then waits for the others. So a run takes as long as the decisions take, not as long
// as the simulated duration, and local strategies give the same result on every run.
// (The shared ones admit nearly the same amount, but which gateway wins a race within a
// tick varies from run to run.) Decisions per second are measured apart from that: a
// fresh instance of the strategy, all G threads deciding flat out for 250 ms, unchecked.
//
// For every strategy the decisions are then checked:
//   - the envelope verifier (quota/verify/envelope.hpp) gives each tenant's worst excess
//     of admitted cost over r·T + B, over every interval, with the witness interval. Each
//     admission is logged at the time the bucket decided it (its state's time, which a
//     thread that lost a race within a tick may see slightly later than its own stamp);
//   - a reference: one exact token bucket per tenant, charged with every request the
//     strategy admitted (it may go below zero), in time order. A request the strategy
//     denied while the reference held enough tokens for it is a FALSE denial: the
//     tenant's contract had room. (Admissions at the same instant are charged first, so
//     this never overcounts.)
//
// Exit status: 0 when every strategy that promises an envelope keeps it for every tenant
// (shared, redis: r·T + B; leases: r·T + B + G·q_max); 1 when one breaks it; 2 for a bad command
// line; 3 when the run failed (e.g. Redis unreachable).
//
// Build and run:  bash cmake/run.sh demo            (release build, default scenario)
//                 ./build/release/examples/gateway_sim/gateway_sim --help
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <barrier>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/numeric/int128.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "chart.hpp"
#include "common/flags.hpp"
#include "quota/lease/leased_limiter.hpp"
#include "quota/quota.hpp"
#include "quota/verify/envelope.hpp"
#include "traffic.hpp"

#ifdef QUOTA_SIM_HAVE_REDIS
#include "quota/redis/redis_store.hpp"
#endif

namespace gateway_sim {
namespace {

using quota::Nanos;
using quota::TokenBucket;
using quota::examples::Flag;
using quota::examples::flag_integer;
using quota::examples::flag_real;
using quota::examples::parse_host_port;
using quota::examples::read_flag;
using namespace std::chrono_literals;

// ---------------------------------------------------------------------------- options

struct Options {
  TrafficConfig traffic;
  std::int64_t rate = 1000;  // hot tenant's contract, units per second
  std::int64_t burst = 200;
  double load = 1.8;  // hot tenant's offered cost / contract rate
  std::int64_t quiet_rate = 100;
  std::int64_t quiet_burst = 50;
  double quiet_load = 0.4;
  std::int64_t tick_ms = 10;
  std::int64_t verify_burst = -1;
  std::int64_t lease_q = 50;  // leases: the largest grant, units (capped at each burst)       //
                              // the burst the hot tenant is checked against; -1: its own
  std::vector<std::string> strategies;  // empty: the defaults
  std::string redis;                    // HOST:PORT
  std::string svg;  // "": gateway_sim.svg beside the executable (its build directory)
  bool progress = true;
};

constexpr const char* kUsage = R"(usage: gateway_sim [flags]

Replays one seeded, skewed request stream through several rate-limiting strategies and
prints, per strategy, the hot tenant's admitted rate, the verifier's worst excess over
r*T + B, false denials, quiet tenants' denials and decisions per second; writes an SVG
chart of cumulative admitted cost against the r*T + B envelope.

Flags (--flag VALUE or --flag=VALUE):
  --gateways N       gateway threads (default 8)
  --tenants N        tenants; tenant-0 is hot, the others quiet (default 8)
  --hot-gateways N   gateways carrying most of the hot tenant's traffic (default 3)
  --hot-share F      share of the hot tenant's traffic on them, 0..1 (default 0.8)
  --shift-every S    the balancer moves the hot set every S simulated seconds; 0 never
                     (default 10)
  --seconds S        simulated duration in seconds (default 60)
  --rate R           hot tenant's contract rate, units per second (default 1000)
  --burst B          hot tenant's contract burst, units (default 200)
  --load F           hot tenant's offered cost as a multiple of its rate (default 1.8)
  --quiet-rate R     each quiet tenant's rate, units per second (default 100)
  --quiet-burst B    each quiet tenant's burst, units (default 50)
  --quiet-load F     each quiet tenant's offered cost / its rate (default 0.4)
  --tick-ms MS       lock-step granularity of simulated time, 1..100 (default 10);
                     within one tick the gateways race each other
  --seed N           traffic seed (default 1)
  --strategies LIST  comma-separated, from local-full, local-split, shared, leases,
                     redis, redis-leases, redis-coalesced (default: local-full,
                     local-split,shared,leases, plus redis,redis-leases,redis-coalesced
                     with --redis)
  --lease-q Q        leases: the largest grant a gateway holds, units (default 50,
                     at most the tenant's burst); they promise r*T + B + G*Q
  --redis HOST:PORT  also run the shared Redis store at HOST:PORT, directly (redis),
                     as the authority of leases (redis-leases) and coalescing the
                     gateways' calls (redis-coalesced)
  --redis local      the same against a throw-away redis-server this run starts on a
                     free loopback port (redis-server must be on PATH) and stops
  --verify-burst B   check the hot tenant against r*T + B with this B instead of its
                     contract's (to watch the checker fail: exit status 1)
  --svg PATH         where to write the chart (default: gateway_sim.svg in the
                     directory of this executable, i.e. the build tree)
  --no-progress      no progress line on stderr
  --help             this text

Requests are reads (cost 1) or, one in ten, creates (cost 5).
Exit status: 0 ok; 1 a strategy broke the envelope it promises (shared, redis,
redis-coalesced:
r*T + B; leases, redis-leases: r*T + B + G*Q);
2 bad flags; 3 the run failed (e.g. Redis unreachable).
)";

struct UsageError {
  std::string message;
};

// Parses argv into `o`. Returns "" on success, else the message for a usage error; sets
// *help when --help was given.
std::string parse_flags(int argc, char** argv, Options& o, bool* help) {
  *help = false;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      *help = true;
      return "";
    }
    if (arg == "--no-progress") {
      o.progress = false;
      continue;
    }
    Flag flag;
    if (std::string e = read_flag(argc, argv, i, flag); !e.empty()) return e;
    const std::string& name = flag.name;
    const std::string& value = flag.value;
    std::int64_t n = 0;
    std::string err;
    if (name == "--gateways") {
      err = flag_integer(flag, &n, 1, 256);
      o.traffic.gateways = static_cast<int>(n);
    } else if (name == "--tenants") {
      err = flag_integer(flag, &n, 1, 10000);
      o.traffic.tenants = static_cast<int>(n);
    } else if (name == "--hot-gateways") {
      err = flag_integer(flag, &n, 1, 256);
      o.traffic.hot_gateways = static_cast<int>(n);
    } else if (name == "--hot-share") {
      err = flag_real(flag, &o.traffic.hot_share, 0, 1);
    } else if (name == "--shift-every") {
      err = flag_integer(flag, &o.traffic.shift_every_s, 0, 1'000'000);
    } else if (name == "--seconds") {
      err = flag_integer(flag, &o.traffic.seconds, 1, 86'400);
    } else if (name == "--rate") {
      err = flag_integer(flag, &o.rate, 1, 100'000'000);
    } else if (name == "--burst") {
      err = flag_integer(flag, &o.burst, 1, 1'000'000'000);
    } else if (name == "--load") {
      err = flag_real(flag, &o.load, 0, 1000);
    } else if (name == "--quiet-rate") {
      err = flag_integer(flag, &o.quiet_rate, 1, 100'000'000);
    } else if (name == "--quiet-burst") {
      err = flag_integer(flag, &o.quiet_burst, 1, 1'000'000'000);
    } else if (name == "--quiet-load") {
      err = flag_real(flag, &o.quiet_load, 0, 1000);
    } else if (name == "--tick-ms") {
      err = flag_integer(flag, &o.tick_ms, 1, 100);
    } else if (name == "--seed") {
      std::uint64_t s;
      if (!absl::SimpleAtoi(value, &s))
        err = absl::StrFormat("--seed expects an integer, got '%s'", value);
      o.traffic.seed = s;
    } else if (name == "--strategies") {
      o.strategies = absl::StrSplit(value, ',', absl::SkipEmpty());
      for (const auto& s : o.strategies) {
        if (s != "local-full" && s != "local-split" && s != "shared" && s != "leases" &&
            s != "redis" && s != "redis-leases" && s != "redis-coalesced") {
          return absl::StrFormat(
              "unknown strategy '%s' (known: local-full, local-split, shared, leases, redis, "
              "redis-leases, redis-coalesced)",
              s);
        }
      }
      if (o.strategies.empty()) return "--strategies needs at least one strategy";
    } else if (name == "--redis") {
      o.redis = value;
    } else if (name == "--lease-q") {
      err = flag_integer(flag, &o.lease_q, 1, 1'000'000'000);
    } else if (name == "--verify-burst") {
      err = flag_integer(flag, &o.verify_burst, 0, 1'000'000'000);
    } else if (name == "--svg") {
      if (value.empty()) return "--svg needs a path";
      o.svg = value;
    } else {
      return absl::StrFormat("unknown flag '%s' (see --help)", name);
    }
    if (!err.empty()) return err;
  }
  if (o.traffic.hot_gateways > o.traffic.gateways) {
    return absl::StrFormat("--hot-gateways (%d) cannot exceed --gateways (%d)",
                           o.traffic.hot_gateways, o.traffic.gateways);
  }
  if (o.strategies.empty()) {
    o.strategies = {"local-full", "local-split", "shared", "leases"};
    if (!o.redis.empty()) {
      o.strategies.push_back("redis");
      o.strategies.push_back("redis-leases");
      o.strategies.push_back("redis-coalesced");
    }
  }
  for (const char* r : {"redis", "redis-leases", "redis-coalesced"}) {
    if (std::find(o.strategies.begin(), o.strategies.end(), r) != o.strategies.end() &&
        o.redis.empty()) {
      return absl::StrFormat("strategy '%s' needs --redis HOST:PORT", r);
    }
  }
  o.traffic.hot_units_per_s = o.load * static_cast<double>(o.rate);
  o.traffic.quiet_units_per_s = o.quiet_load * static_cast<double>(o.quiet_rate);
  return "";
}

// --------------------------------------------------------------------------- strategies

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

// The contract of each tenant and the store keys.
struct Tenants {
  std::vector<TokenBucket> contract;
  std::vector<std::string> keys;  // "{tenant-N}all": one budget per tenant

  explicit Tenants(const Options& o) {
    for (int t = 0; t < o.traffic.tenants; ++t) {
      contract.push_back(
          t == 0 ? TokenBucket{.rate = {.units = o.rate, .per = 1s}, .burst = o.burst}
                 : TokenBucket{.rate = {.units = o.quiet_rate, .per = 1s}, .burst = o.quiet_burst});
      keys.push_back(absl::StrCat("{tenant-", t, "}all"));
    }
  }
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
thread_local std::int64_t t_sim_now_ns = 0;
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
  if (!parse_host_port(o.redis, &cfg.host, &cfg.port)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("--redis expects HOST:PORT, got '%s'", o.redis));
  }
  cfg.connect_timeout = 500ms;
  cfg.command_timeout = 500ms;
  cfg.pool_wait = 500ms;
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
  // stamp it was given (redis::Outcome::time), so with exact stamps a gateway that lost
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

// -------------------------------------------------------------------------------- run

enum : std::uint8_t { kDenied = 0, kAllowed = 1, kError = 2 };

struct Record {
  std::int64_t time_ns;
  std::uint32_t tenant;
  std::uint16_t cost;
  std::uint8_t outcome;
};

struct RunResult {
  std::vector<Record> records;  // all gateways
  double wall_s = 0;
  std::int64_t errors = 0;
  std::string first_error;
};

RunResult run(Strategy& strategy, const std::vector<std::vector<Request>>& traffic,
              const Options& o) {
  const int g_count = o.traffic.gateways;
  const std::int64_t tick_ns = o.tick_ms * 1'000'000;
  const std::int64_t end_ns = o.traffic.seconds * 1'000'000'000;
  const std::int64_t ticks = (end_ns + tick_ns - 1) / tick_ns;
  std::vector<std::vector<Record>> logs(g_count);
  std::atomic<std::int64_t> ticks_done{0};
  std::atomic<int> finished{0};
  std::atomic<std::int64_t> errors{0};
  std::string first_error;
  std::atomic<bool> have_error{false};
  std::barrier sync(g_count,
                    [&]() noexcept { ticks_done.fetch_add(1, std::memory_order_relaxed); });

  const auto start = std::chrono::steady_clock::now();
  std::vector<std::chrono::steady_clock::time_point> done_at(g_count);
  std::vector<std::thread> threads;
  for (int g = 0; g < g_count; ++g) {
    threads.emplace_back([&, g] {
      const auto& reqs = traffic[g];
      auto& log = logs[g];
      log.reserve(reqs.size());
      std::size_t i = 0;
      for (std::int64_t k = 0; k < ticks; ++k) {
        const std::int64_t tick_end = (k + 1) * tick_ns;
        for (; i < reqs.size() && reqs[i].time_ns < tick_end; ++i) {
          const Request& r = reqs[i];
          auto out = strategy.decide(g, r.tenant, Nanos{r.time_ns}, r.cost);
          if (!out.ok()) {
            errors.fetch_add(1, std::memory_order_relaxed);
            if (!have_error.exchange(true)) first_error = out.status().ToString();
            log.push_back(Record{r.time_ns, r.tenant, static_cast<std::uint16_t>(r.cost), kError});
            continue;
          }
          log.push_back(Record{out->time_ns, r.tenant, static_cast<std::uint16_t>(r.cost),
                               out->allowed ? kAllowed : kDenied});
        }
        sync.arrive_and_wait();
      }
      done_at[g] = std::chrono::steady_clock::now();
      finished.fetch_add(1);
    });
  }
  const bool tty = o.progress && ::isatty(2);
  while (finished.load() < g_count) {
    std::this_thread::sleep_for(100ms);
    if (tty) {
      const double sim_s = static_cast<double>(ticks_done.load()) * tick_ns / 1e9;
      std::fprintf(stderr, "\r  %-15s %3.0f%%  (%.1f of %lld simulated seconds)",
                   strategy.name().c_str(), 100.0 * ticks_done.load() / ticks,
                   std::min(sim_s, double(o.traffic.seconds)),
                   static_cast<long long>(o.traffic.seconds));
    }
  }
  for (auto& t : threads) t.join();
  const auto end = *std::max_element(done_at.begin(), done_at.end());
  RunResult result;
  result.wall_s = std::chrono::duration<double>(end - start).count();
  if (o.progress) {
    std::fprintf(stderr, "%s  %-15s done: %.2f s wall%s\n", tty ? "\r" : "",
                 strategy.name().c_str(), result.wall_s, tty ? "                         " : "");
  }
  result.errors = errors.load();
  result.first_error = first_error;
  std::size_t total = 0;
  for (const auto& l : logs) total += l.size();
  result.records.reserve(total);
  for (auto& l : logs) result.records.insert(result.records.end(), l.begin(), l.end());
  return result;
}

absl::StatusOr<std::unique_ptr<Strategy>> make_strategy(const std::string& name, const Options& o,
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

// Decisions per second of `strategy` with all G gateway threads deciding as fast as they
// can (no lock-step), replaying their requests (shifted by the duration on each pass, so
// each gateway's time keeps moving forward) for about kThroughputWindow of wall time.
// The decisions themselves are not checked here: only how many were made.
constexpr auto kThroughputWindow = 250ms;

double throughput(Strategy& strategy, const std::vector<std::vector<Request>>& traffic,
                  const Options& o) {
  const int g_count = o.traffic.gateways;
  const std::int64_t span_ns = o.traffic.seconds * 1'000'000'000;
  std::atomic<bool> stop{false};
  std::atomic<std::int64_t> decided{0};
  std::barrier start_line(g_count + 1);
  std::vector<std::thread> threads;
  for (int g = 0; g < g_count; ++g) {
    threads.emplace_back([&, g] {
      const auto& reqs = traffic[g];
      std::int64_t n = 0;
      start_line.arrive_and_wait();
      for (std::int64_t pass = 0; !reqs.empty() && !stop.load(std::memory_order_relaxed); ++pass) {
        for (std::size_t i = 0; i < reqs.size(); ++i) {
          const Request& r = reqs[i];
          (void)strategy.decide(g, r.tenant, Nanos{r.time_ns + pass * span_ns}, r.cost);
          ++n;
          if ((n & 63) == 0 && stop.load(std::memory_order_relaxed)) break;
        }
      }
      decided.fetch_add(n);
    });
  }
  start_line.arrive_and_wait();
  const auto t0 = std::chrono::steady_clock::now();
  std::this_thread::sleep_for(kThroughputWindow);
  stop.store(true);
  for (auto& t : threads) t.join();
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return static_cast<double>(decided.load()) / s;
}

// ---------------------------------------------------------------------------- analysis

struct TenantStats {
  std::int64_t requests = 0, offered_units = 0, admitted_units = 0, denied = 0, false_denied = 0,
               errors = 0;
  quota::verify::TokenBucketReport report;
};

struct Analysis {
  std::vector<TenantStats> tenants;
  std::vector<std::pair<double, double>> hot_curve;  // (seconds, cumulative admitted units)
  std::int64_t decisions = 0;
};

Analysis analyze(RunResult& run, const Tenants& tenants, const Options& o) {
  auto& recs = run.records;
  // Time order; at one instant admissions first (see "reference" at the top).
  std::sort(recs.begin(), recs.end(), [](const Record& a, const Record& b) {
    if (a.time_ns != b.time_ns) return a.time_ns < b.time_ns;
    if ((a.outcome == kAllowed) != (b.outcome == kAllowed)) return a.outcome == kAllowed;
    if (a.tenant != b.tenant) return a.tenant < b.tenant;
    return a.cost < b.cost;
  });
  const std::size_t n = tenants.contract.size();
  Analysis out;
  out.tenants.resize(n);
  out.decisions = static_cast<std::int64_t>(recs.size());
  std::vector<quota::verify::TokenBucketVerifier> verifiers;
  std::vector<TokenBucket::State> ref(n);
  std::vector<bool> seen(n, false);
  for (std::size_t t = 0; t < n; ++t) {
    const TokenBucket& c = tenants.contract[t];
    verifiers.emplace_back(c.rate, t == 0 && o.verify_burst >= 0 ? o.verify_burst : c.burst);
  }

  const int points = 600;
  const std::int64_t end_ns = o.traffic.seconds * 1'000'000'000;
  std::int64_t cum = 0;
  int next_point = 0;
  auto emit_until = [&](std::int64_t t) {
    while (next_point <= points && end_ns * next_point / points < t) {
      out.hot_curve.emplace_back(static_cast<double>(end_ns) * next_point / points / 1e9,
                                 static_cast<double>(cum));
      ++next_point;
    }
  };
  for (const Record& r : recs) {
    TenantStats& ts = out.tenants[r.tenant];
    const TokenBucket& c = tenants.contract[r.tenant];
    ++ts.requests;
    ts.offered_units += r.cost;
    if (!seen[r.tenant]) {
      ref[r.tenant] = c.init(Nanos{r.time_ns});
      seen[r.tenant] = true;
    }
    TokenBucket::State& s = ref[r.tenant];
    c.refill(s, r.time_ns);
    if (r.outcome == kAllowed) {
      s.tokens -= quota::to_micro(r.cost);  // may go below zero: the strategy overspent
      ts.admitted_units += r.cost;
      (void)verifiers[r.tenant].add({.time_ns = r.time_ns, .cost = r.cost});
      if (r.tenant == 0) {
        emit_until(r.time_ns);
        cum += r.cost;
      }
    } else if (r.outcome == kDenied) {
      ++ts.denied;
      if (s.tokens >= quota::to_micro(r.cost)) ++ts.false_denied;
    } else {
      ++ts.errors;
    }
  }
  emit_until(end_ns + 1);
  for (std::size_t t = 0; t < n; ++t) out.tenants[t].report = verifiers[t].report();
  return out;
}

// "+12.50" over the envelope; "-3.25" or "0.00" within it.
std::string format_units(std::int64_t micro) {
  return absl::StrFormat(micro > 0 ? "%+.2f" : "%.2f", static_cast<double>(micro) / 1e6);
}

std::string with_commas(std::int64_t v) {
  std::string s = absl::StrCat(v < 0 ? -v : v);
  for (int i = static_cast<int>(s.size()) - 3; i > 0; i -= 3)
    s.insert(static_cast<std::size_t>(i), ",");
  return v < 0 ? "-" + s : s;
}

// gateway_sim.svg beside the executable (so `bash cmake/run.sh demo`, run from the source
// tree, writes into the build tree), else in the current directory.
std::string default_svg_path() {
  char buf[4096];
  const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) return "gateway_sim.svg";
  std::string exe(buf, static_cast<std::size_t>(n));
  const auto slash = exe.rfind('/');
  return slash == std::string::npos ? "gateway_sim.svg"
                                    : exe.substr(0, slash + 1) + "gateway_sim.svg";
}

const char* color_of(const std::string& name) {
  if (name == "local-full") return "#d62728";
  if (name == "local-split") return "#ff7f0e";
  if (name == "shared") return "#2ca02c";
  if (name == "redis") return "#1f77b4";
  if (name == "leases") return "#9467bd";
  if (name == "redis-leases") return "#17becf";
  if (name == "redis-coalesced") return "#e377c2";
  return "#8c564b";
}

}  // namespace
}  // namespace gateway_sim

#ifdef QUOTA_SIM_HAVE_REDIS
// --redis local: a throw-away redis-server on a free loopback port, stopped (SIGTERM,
// then SIGKILL) when the run ends. Ports are drawn below the kernel's ephemeral range,
// and a port counts as ours only when the server answering there reports our child's
// process id (another server may already be listening on it).
class LocalRedis {
 public:
  static absl::StatusOr<std::unique_ptr<LocalRedis>> start(std::uint64_t seed) {
    std::mt19937_64 rng(seed ^ static_cast<std::uint64_t>(::getpid()));
    for (int attempt = 0; attempt < 30; ++attempt) {
      const int port = 20000 + static_cast<int>(rng() % 12000);
      const pid_t pid = ::fork();
      if (pid < 0) return absl::InternalError("fork failed");
      if (pid == 0) {
        const int devnull = ::open("/dev/null", O_RDWR);
        if (devnull >= 0) {
          ::dup2(devnull, 1);
          ::dup2(devnull, 2);
        }
        const std::string port_s = std::to_string(port);
        ::execlp("redis-server", "redis-server", "--port", port_s.c_str(), "--bind", "127.0.0.1",
                 "--save", "", "--appendonly", "no", "--protected-mode", "no",
                 static_cast<char*>(nullptr));
        ::_exit(127);
      }
      auto local = std::unique_ptr<LocalRedis>(new LocalRedis(pid, port));
      for (int i = 0; i < 100; ++i) {
        int status = 0;
        if (::waitpid(pid, &status, WNOHANG) == pid) {
          local->pid_ = -1;
          if (WIFEXITED(status) && WEXITSTATUS(status) == 127) {
            return absl::NotFoundError("redis-server is not on PATH");
          }
          break;  // it exited: most likely the port was taken; try another
        }
        if (local->answers()) return local;
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
    }
    return absl::UnavailableError("could not start redis-server on a free loopback port");
  }

  ~LocalRedis() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGTERM);
    for (int i = 0; i < 100; ++i) {
      if (::waitpid(pid_, nullptr, WNOHANG) == pid_) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
  }

  int port() const { return port_; }

 private:
  LocalRedis(pid_t pid, int port) : pid_(pid), port_(port) {}

  // True when the server on port_ is our child.
  bool answers() const {
    quota::redis::Connection c(
        quota::redis::ConnectionConfig{.host = "127.0.0.1",
                                       .port = port_,
                                       .connect_timeout = std::chrono::milliseconds(50),
                                       .command_timeout = std::chrono::milliseconds(50)});
    auto r = c.command({"INFO", "server"});
    if (!r.ok() || (*r)->type != REDIS_REPLY_STRING) return false;
    return quota::redis::reply_string(**r).find(absl::StrCat("process_id:", pid_, "\r\n")) !=
           std::string_view::npos;
  }

  pid_t pid_;
  int port_;
};
#endif

int main(int argc, char** argv) {
  using namespace gateway_sim;
  Options o;
  if (const int rc =
          quota::examples::parse_command_line("gateway_sim", kUsage, argc, argv, o, parse_flags);
      rc >= 0) {
    return rc;
  }
#ifdef QUOTA_SIM_HAVE_REDIS
  std::unique_ptr<LocalRedis> local_redis;
  if (o.redis == "local") {
    auto started = LocalRedis::start(o.traffic.seed);
    if (!started.ok()) {
      std::fprintf(stderr, "gateway_sim: --redis local: %s\n", started.status().ToString().c_str());
      return 3;
    }
    local_redis = std::move(*started);
    o.redis = absl::StrCat("127.0.0.1:", local_redis->port());
    std::printf("  started a throw-away redis-server on %s for this run\n", o.redis.c_str());
  }
#endif
  Tenants tenants(o);
  for (const auto& c : tenants.contract) {
    if (auto s = c.validate(); !s.ok()) {
      std::fprintf(stderr, "gateway_sim: bad contract: %s\n", s.ToString().c_str());
      return 2;
    }
  }
  const auto& tc = o.traffic;
  std::printf("quota gateway simulator: %d gateways, %d tenants, %lld s simulated, seed %llu\n",
              tc.gateways, tc.tenants, static_cast<long long>(tc.seconds),
              static_cast<unsigned long long>(tc.seed));
  std::printf(
      "  hot tenant-0: contract r = %lld units/s, B = %lld; offers %.0f units/s (%.1fx), "
      "%.0f%% of it on %d of %d gateways, rebalanced every %lld s\n",
      static_cast<long long>(o.rate), static_cast<long long>(o.burst), tc.hot_units_per_s, o.load,
      tc.hot_share * 100, tc.hot_gateways, tc.gateways, static_cast<long long>(tc.shift_every_s));
  if (tc.tenants > 1) {
    std::printf(
        "  quiet tenant-1..%d: contract r = %lld units/s, B = %lld each; offer %.0f units/s "
        "each, spread evenly\n",
        tc.tenants - 1, static_cast<long long>(o.quiet_rate), static_cast<long long>(o.quiet_burst),
        tc.quiet_units_per_s);
  }
  std::printf(
      "  requests: reads cost 1, creates (1 in 10) cost 5; time in lock-step ticks of %lld ms\n",
      static_cast<long long>(o.tick_ms));
  if (o.verify_burst >= 0) {
    std::printf(
        "  NOTE: the hot tenant is checked against B = %lld (--verify-burst), not its contract's\n",
        static_cast<long long>(o.verify_burst));
  }
  std::fflush(stdout);

  // Every strategy twice (one for the checked run, a fresh one for the throughput
  // measurement), all before anything runs: an unreachable Redis fails at once.
  std::vector<std::pair<std::unique_ptr<Strategy>, std::unique_ptr<Strategy>>> strategies;
  for (const std::string& name : o.strategies) {
    auto sim = make_strategy(name, o, tenants);
    auto bench = sim.ok() ? make_strategy(name, o, tenants) : sim.status();
    if (!sim.ok() || !bench.ok()) {
      const absl::Status st = sim.ok() ? bench.status() : sim.status();
      std::fprintf(stderr, "gateway_sim: %s: %s\n", name.c_str(),
                   std::string(st.message()).c_str());
      return st.code() == absl::StatusCode::kInvalidArgument ||
                     st.code() == absl::StatusCode::kUnimplemented
                 ? 2
                 : 3;
    }
    strategies.emplace_back(std::move(*sim), std::move(*bench));
  }
  const auto traffic = generate(tc);

  struct Row {
    std::string name;
    std::vector<std::int64_t> allowance;  // per tenant; -1: no promise
    std::string note;
    RunResult run;
    Analysis a;
    double decisions_per_s = 0;
  };
  std::vector<Row> rows;
  for (auto& [sim, bench] : strategies) {
    Row row{sim->name(), {}, "", run(*sim, traffic, o), {}};
    for (std::uint32_t t = 0; t < static_cast<std::uint32_t>(tc.tenants); ++t) {
      row.allowance.push_back(sim->allowance(t));
    }
    row.a = analyze(row.run, tenants, o);
    row.note = sim->note(row.a.decisions);
    row.decisions_per_s = throughput(*bench, traffic, o);
    rows.push_back(std::move(row));
  }

  // ------------------------------------------------------------------------- the table
  std::printf("\n%-15s %14s %14s %13s %13s %13s %13s\n", "strategy", "hot admitted", "contract",
              "worst excess", "false", "quiet", "decisions/s");
  std::printf("%-15s %14s %14s %13s %13s %13s %13s\n", "", "units/s", "r/s, B", "over rT+B",
              "denials", "denials", "");
  int exit_code = 0;
  for (const Row& row : rows) {
    const TenantStats& hot = row.a.tenants[0];
    std::int64_t false_denied = 0, quiet_denied = 0;
    for (std::size_t t = 0; t < row.a.tenants.size(); ++t) {
      false_denied += row.a.tenants[t].false_denied;
      if (t > 0) quiet_denied += row.a.tenants[t].denied;
    }
    std::printf("%-15s %14.1f %14s %13s %13s %13s %13s\n", row.name.c_str(),
                static_cast<double>(hot.admitted_units) / static_cast<double>(tc.seconds),
                absl::StrFormat("%d, %d", o.rate, o.burst).c_str(),
                format_units(hot.report.excess_micro()).c_str(), with_commas(false_denied).c_str(),
                with_commas(quiet_denied).c_str(),
                with_commas(static_cast<std::int64_t>(row.decisions_per_s)).c_str());
  }
  std::printf("\n");
  for (const Row& row : rows) {
    const TenantStats& hot = row.a.tenants[0];
    const auto& w = hot.report.witness;
    if (w.empty) {
      std::printf("%-15s hot tenant: nothing admitted\n", row.name.c_str());
    } else {
      const double span_s = static_cast<double>(w.last_time_ns - w.first_time_ns) / 1e9;
      std::printf(
          "%-15s hot tenant %s: worst interval [%.3f s, %.3f s] admitted %s units vs "
          "r*T + B = %.1f\n",
          row.name.c_str(), hot.report.holds() ? "within r*T + B" : "OVER r*T + B",
          static_cast<double>(w.first_time_ns) / 1e9, static_cast<double>(w.last_time_ns) / 1e9,
          with_commas(static_cast<std::int64_t>(w.admitted)).c_str(),
          static_cast<double>(o.rate) * span_s + static_cast<double>(hot.report.burst));
    }
    // Every tenant against the envelope the strategy promises (r*T + B + allowance).
    int quiet_over = 0, broken = 0;
    std::int64_t errors = 0;
    for (std::size_t t = 0; t < row.a.tenants.size(); ++t) {
      const auto& report = row.a.tenants[t].report;
      if (t > 0 && !report.holds()) ++quiet_over;
      if (row.allowance[t] >= 0 && report.excess_micro() > quota::to_micro(row.allowance[t])) {
        ++broken;
      }
      errors += row.a.tenants[t].errors;
    }
    if (quiet_over > 0) {
      std::printf("%-15s %d quiet tenant(s) OVER their r*T + B\n", row.name.c_str(), quiet_over);
    }
    if (row.allowance[0] > 0) {
      std::printf("%-15s promises r*T + B + %lld (holders x q_max): hot excess %s %s %lld\n",
                  row.name.c_str(), static_cast<long long>(row.allowance[0]),
                  format_units(hot.report.excess_micro()).c_str(),
                  hot.report.excess_micro() <= quota::to_micro(row.allowance[0]) ? "<=" : ">",
                  static_cast<long long>(row.allowance[0]));
    }
    if (!row.note.empty()) std::printf("%-15s %s\n", row.name.c_str(), row.note.c_str());
    if (errors > 0) {
      std::printf("%-12s %lld decisions FAILED (no answer), first: %s\n", row.name.c_str(),
                  static_cast<long long>(errors), row.run.first_error.c_str());
      exit_code = std::max(exit_code, 3);
    }
    if (broken > 0) {
      std::printf("%-12s BROKE the envelope it promises (%d tenant(s))\n", row.name.c_str(),
                  broken);
      exit_code = std::max(exit_code, 1);
    }
  }
  std::printf(
      "\nfalse denials: denied while the tenant's contract bucket, charged with what the "
      "strategy admitted, had room.\n");
  std::printf(
      "decisions/s: all %d gateway threads deciding flat out (no lock-step) for %lld ms of "
      "wall time, on %u hardware threads.\n",
      tc.gateways, static_cast<long long>(kThroughputWindow.count()),
      std::thread::hardware_concurrency());

  // ------------------------------------------------------------------------- the chart
  // The offered load first (local-full runs along it, on top), the envelope last (shared
  // runs along it, beneath).
  std::vector<Series> series;
  {
    // The hot tenant's offered cost: the same for every strategy.
    std::vector<std::pair<std::int64_t, std::int64_t>> ev;
    for (const auto& g : traffic) {
      for (const Request& r : g) {
        if (r.tenant == 0) ev.emplace_back(r.time_ns, r.cost);
      }
    }
    std::sort(ev.begin(), ev.end());
    Series offered{"offered", "#bbbbbb", "", {{0.0, 0.0}}};
    std::int64_t cum = 0;
    std::size_t k = 0;
    for (int p = 1; p <= 600; ++p) {
      const std::int64_t t = tc.seconds * 1'000'000'000 * p / 600;
      for (; k < ev.size() && ev[k].first <= t; ++k) cum += ev[k].second;
      offered.points.emplace_back(static_cast<double>(t) / 1e9, static_cast<double>(cum));
    }
    series.push_back(std::move(offered));
  }
  for (const Row& row : rows) {
    series.push_back(Series{row.name, color_of(row.name), "", row.a.hot_curve});
  }
  series.push_back(Series{absl::StrFormat("r*T + B (r=%d/s, B=%d)", o.rate, o.burst),
                          "#000000",
                          "7 5",
                          {{0.0, static_cast<double>(o.burst)},
                           {static_cast<double>(tc.seconds),
                            static_cast<double>(o.rate) * static_cast<double>(tc.seconds) +
                                static_cast<double>(o.burst)}}});
  // The same minus r*T: the envelope becomes the flat line B.
  std::vector<Series> minus_rt = series;
  for (Series& ser : minus_rt) {
    for (auto& [x, y] : ser.points) y -= static_cast<double>(o.rate) * x;
  }
  const double b = static_cast<double>(o.burst);
  std::vector<Series> zoomed = minus_rt;
  const std::string svg = render_svg(
      {Panel{absl::StrFormat("tenant-0: cumulative admitted units (%d gateways, seed %d)",
                             tc.gateways, tc.seed),
             "simulated time T (s)", "admitted units since 0", std::move(series)},
       Panel{"tenant-0: admitted minus r*T (the envelope is the line at B)", "simulated time T (s)",
             "admitted units - r*T", std::move(minus_rt)},
       Panel{"the same, zoomed to [-2B, 3B]: shared stays at or under B", "simulated time T (s)",
             "admitted units - r*T", std::move(zoomed), -2 * b, 3 * b}});
  if (o.svg.empty()) o.svg = default_svg_path();
  if (write_file(o.svg, svg)) {
    std::printf("chart: %s\n", o.svg.c_str());
  } else {
    std::fprintf(stderr, "gateway_sim: cannot write chart to %s: %s\n", o.svg.c_str(),
                 std::strerror(errno));
    exit_code = std::max(exit_code, 3);
  }
  return exit_code;
}
