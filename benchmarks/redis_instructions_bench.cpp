// redis_instructions_bench — what one decision costs the Redis server, counted in
// instructions rather than timed.
//
// On a shared machine the server's CPU time per decision (redis_bench) moves by a factor
// of two from run to run. This program runs redis-server under valgrind's callgrind
// instead, which counts the instructions the server executes while it handles requests
// (`--toggle-collect=processInputBuffer`: reading the request, running the command or
// script, building the reply; not the event loop, the timers or the socket writes). The
// count does not depend on the machine's load, so two workloads compare as a ratio of
// instructions per decision. Workloads, each over 1,000 keys that exist and are busy
// (every key is written three times first, so that its TTL has been renewed and later
// writes keep it, as they mostly do under load):
//   quota d1       RedisStore<TokenBucket>::apply, one EVALSHA per decision
//   quota b16/b64  apply_batch: 16 / 64 decisions in one EVALSHA
//   fixed d1/b16   the same for RedisStore<FixedWindow> (1-hour windows, never full)
//   estimate d1/b16  the same for RedisStore<SlidingWindowEstimate> (prev = 0: the keys'
//                  first window)
//   est-prev d1/b16  the estimate in a key's second window (prev > 0: its previous
//                  window counted 1,000, written in caller-time mode an hour back)
//   naive-lua d1   the straightforward published script (redis_bench's kNaiveLua)
//   noop-lua d1    EVALSHA of `return 1` with one key and the same three arguments
//   INCR d1        the ceiling of any one-round-trip design
//   gateway 1lvl   GatewayStore::decide, the tenant level only (one script call)
//   gateway 2lvl   GatewayStore::decide, user + tenant levels (one script call, the
//                  tenant's slot: what one more level costs in a call)
//   gateway 3lvl   GatewayStore::decide, user + tenant + global levels: two script calls
//                  per decision (the tenant's slot with two levels, then the global key);
//                  per_call is per decision (halve it for per script call)
//   gateway 1lim   GatewayStore::decide, one limit of a tenant: tokens per minute
//                  ("{tenant-i}#tpm", a token bucket of 1,000,000 per minute; the first
//                  record of the tenant's scope key, beside 3lim's others)
//   gateway 3lim   GatewayStore::decide, three limits of one tenant (token buckets per
//                  minute, per day and per 30 days: "{tenant-i}#tpm", "#tpd", "#tp30d"),
//                  one script call (the quick path: twin/gateway_quick.hpp)
//   gateway 3lim-fw  the same with requests per minute (a fixed window) beside the per-
//                  minute and per-day token buckets, for other tenants ("{tenant-i-fw}":
//                  the general path)
//   sketch 1lim/3lim  the hot path of one key per scope, sketched (kScopeSketchLua: the
//                  same three token buckets as compact records of one key; not a twin)
//   floor ...      what a layout of the states must spend (kFloorLua, its modes): 80-byte
//                  states, one per key, read and written ("1key", "3keys"), unpacked and
//                  packed ("+pack"), three in one key ("1key/3rec+pack"); compact records
//                  in one key ("1key/…compact"), each with its identity ("+id"); a hash
// The target it checks is issue 5's "decisions per Redis core with batches of 16 ≥ 2×
// the straightforward script's", as naive-lua's instructions per decision over quota
// b16's; the same for d1 is reported beside it. Issue 20's "a decision against 3 limits of
// one tenant is one script call, at most 1.5x the server instructions of a 1-limit
// decision" as gateway 3lim's over gateway 1lim's (not met since the one-level path:
// docs/redis.md); issue 35's "one limit at or below the straightforward script" as
// gateway 1lim's over naive-lua d1's (all in redis_instructions/targets.hpp).
//
// Run (release build; needs valgrind, else it says so and exits 0):
//   ./build/release/benchmarks/redis_instructions_bench [--calls N] [--json FILE]
//       [--rows gateway,floor] [--profile_dir DIR]
// `--rows` measures only the rows whose name contains one of its parts (and writes only
// their keys first: a part names a row or a group, "gateway"); `--profile_dir`
// keeps each row's callgrind dump there (callgrind_annotate reads it: where a row's
// instructions go).
// `--benchmark_out=FILE` (what `bash cmake/run.sh bench` passes) also names the JSON
// file; other --benchmark_* arguments are ignored.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_split.h"
#include "common/cli.hpp"
#include "quota/policy/fixed_window.hpp"
#include "quota/policy/sliding_window_estimate.hpp"
#include "quota/policy/token_bucket.hpp"
#include "quota/redis/gateway_store.hpp"
#include "quota/redis/redis_store.hpp"
#include "quota/redis/transport/connection_pool.hpp"
#include "redis/support/redis_server.hpp"
#include "redis_instructions/targets.hpp"
#include "support/callgrind_server.hpp"
#include "support/redis_info.hpp"
#include "support/redis_scripts.hpp"

using namespace std::chrono_literals;
using quota::FixedWindow;
using quota::Nanos;
using quota::RedisStore;
using quota::SlidingWindowEstimate;
using quota::TokenBucket;

using Row = quota::bench::InstructionRow;

ABSL_FLAG(std::int64_t, calls, 2000, "script calls per single-decision row");
ABSL_FLAG(std::string, json, "", "also write the rows as JSON to this file");
ABSL_FLAG(std::string, node_guards, "off",
          "the stores' node guards: off, failover, clock or both (node_watch.hpp)");
ABSL_FLAG(std::string, rows, "",
          "measure only the rows whose name contains one of these (comma-separated)");
ABSL_FLAG(std::string, profile_dir, "", "keep each row's callgrind dump in this directory");

constexpr const char* kUsage = R"(usage: redis_instructions_bench [--calls N] [--json FILE]

Instructions per script call and per decision, redis-server under callgrind (needs
valgrind; without it nothing is measured and the exit status is 0).

  --calls N             script calls per single-decision row, in [100, 10000000]
                        (default 2000; the batch rows make N / 8)
  --json FILE           also write the rows as JSON to FILE
  --node_guards G       the quota and gateway stores with failover_safety (a failover
                        recorded an hour before the run: every state is newer, as after
                        one), clock_guard, both, or off (default)
  --rows a,b            measure only the rows whose name contains one of these
  --profile_dir DIR     keep each row's callgrind dump in DIR
  --benchmark_out=FILE  the same as --json FILE (what `bash cmake/run.sh bench` passes);
                        other --benchmark_* arguments are ignored
  --help                this text
)";

int main(int argc, char** argv) {
  const auto args = quota::cli::parse(
      {.name = "redis_instructions_bench",
       .usage = kUsage,
       .checks = {quota::cli::integer("calls", 100, 10'000'000),
                  quota::cli::custom("node_guards", "off, failover, clock or both",
                                     [](std::string_view v) {
                                       return v == "off" || v == "failover" || v == "clock" ||
                                              v == "both";
                                     })},
       .benchmark_flags = true},
      argc, argv);
  const long long calls =
      absl::GetFlag(FLAGS_calls);  // per single-decision row; batches make calls / 8
  std::string json_path = absl::GetFlag(FLAGS_json);
  for (const std::string a : args.benchmark) {
    if (a.rfind("--benchmark_out=", 0) == 0) json_path = a.substr(16);
  }
  if (std::system("command -v valgrind >/dev/null 2>&1 && command -v callgrind_control "
                  ">/dev/null 2>&1") != 0) {
    std::printf("redis_instructions_bench: valgrind is not installed; nothing measured\n");
    return 0;
  }
  const quota::bench::CallgrindServer server(quota::testing::scratch_dir("quota-redis-instr"));
  if (!server.started()) {
    std::fprintf(stderr,
                 "redis_instructions_bench: could not start redis-server under "
                 "callgrind\n");
    return 1;
  }
  const quota::redis::ConnectionConfig cfg = [&] {
    auto c = quota::bench::loopback(server.port());
    c.deadline = 30s;  // the server runs ~50x slower under valgrind
    return c;
  }();
  auto pool = std::make_shared<quota::redis::ConnectionPool>(cfg, 1);
  const std::string guards = absl::GetFlag(FLAGS_node_guards);
  const bool failover = guards == "failover" || guards == "both";
  std::optional<quota::redis::ClockGuard> clock_guard;
  // (a wide tolerance: the server runs under valgrind, its replies are slow)
  if (guards == "clock" || guards == "both")
    clock_guard = quota::redis::ClockGuard{.tolerance = 60s};
  if (failover) {
    // As after a failover an hour ago: every state is newer, the check runs and passes.
    auto t = quota::redis::Connection(cfg).command({"TIME"});
    if (!t.ok() || (*t)->type != REDIS_REPLY_ARRAY || (*t)->elements != 2) {
      std::fprintf(stderr, "TIME failed\n");
      return 1;
    }
    const std::int64_t s =
        std::atoll(std::string(quota::redis::reply_string(*(*t)->element[0])).c_str());
    pool->node_watch().record_failover(Nanos{(s - 3600) * 1'000'000'000});
  }
  // A margin of 10 minutes keeps every key alive through the run (valgrind is slow):
  // what is measured is the busy bucket, as in redis_bench, not creation.
  RedisStore<TokenBucket> store({.pool = pool,
                                 .prefix = "bench:",
                                 .ttl_margin = 600s,
                                 .failover_safety = failover,
                                 .clock_guard = clock_guard});
  const TokenBucket policy{.rate = {.units = 1'000'000, .per = 1s}, .burst = 1'000'000};
  // The window policies: hour-long windows that never fill (a busy key within its window).
  RedisStore<FixedWindow> fixed_store({.pool = pool, .prefix = "bfw:", .ttl_margin = 600s});
  const FixedWindow fixed{.limit = 1'000'000'000, .window = 1h};
  RedisStore<SlidingWindowEstimate> estimate_store(
      {.pool = pool, .prefix = "bsw:", .ttl_margin = 600s});
  const SlidingWindowEstimate estimate{.limit = 1'000'000'000, .window = 1h};
  RedisStore<SlidingWindowEstimate> prev_store(
      {.pool = pool, .prefix = "bsp:", .ttl_margin = 600s});
  RedisStore<SlidingWindowEstimate> prev_setup({.pool = pool,
                                                .prefix = "bsp:",
                                                .time = quota::redis::TimeSource::kCaller,
                                                .ttl_margin = 600s});
  quota::redis::Connection conn(cfg);
  std::string naive_sha, noop_sha;
  for (auto [text, sha] : {std::pair{quota::bench::kNaiveLua, &naive_sha},
                           std::pair{quota::bench::kNoopLua, &noop_sha}}) {
    auto r = conn.command({"SCRIPT", "LOAD", text});
    if (!r.ok() || (*r)->type != REDIS_REPLY_STRING) {
      std::fprintf(stderr, "SCRIPT LOAD failed\n");
      return 1;
    }
    *sha = quota::redis::reply_string(**r);
  }
  constexpr int kKeys = 1'000;
  auto key = [](std::uint64_t i) { return "{tenant-" + std::to_string(i % kKeys) + "}read"; };
  using Item = RedisStore<TokenBucket>::BatchItem;
  int errors = 0;
  // One decision (or batch) of store `st` with policy `pol` and a random key from `rng`.
  auto call = [&](auto& st, const auto& pol, std::mt19937_64& rng, int batch) {
    if (batch == 1) return st.apply(pol, key(rng()), Nanos{0}, 1).ok();
    std::vector<std::string> names;
    for (int j = 0; j < batch; ++j) names.push_back(key(rng()));
    std::vector<typename std::remove_reference_t<decltype(st)>::BatchItem> items;
    for (const auto& n : names) items.push_back({n, 1});
    auto r = st.apply_batch(pol, items, Nanos{0});
    if (!r.ok()) return false;
    for (const auto& d : *r) {
      if (!d.ok()) return false;
    }
    return true;
  };
  const std::function<bool(std::mt19937_64&, int)> quota_call =
      [&](std::mt19937_64& rng, int batch) { return call(store, policy, rng, batch); };
  // The naive script's own TTL is burst / rate (1 s at redis_bench's policy); a rate of
  // 1,000/s keeps its keys for 1,000 s here. Its arithmetic does not depend on the values.
  auto script_call = [&](const std::string& sha, std::mt19937_64& rng) {
    const std::string k = "naive:" + key(rng());
    auto r = conn.command({"EVALSHA", sha, "1", k, "1000", "1000000", "1"});
    return r.ok() && (*r)->type == REDIS_REPLY_INTEGER;
  };
  auto incr_call = [&](std::mt19937_64& rng) {
    auto r = conn.command({"INCR", "incr:" + key(rng())});
    return r.ok() && (*r)->type == REDIS_REPLY_INTEGER;
  };

  // The rows --rows selects; only their keys are written first.
  const std::vector<std::string> only =
      absl::StrSplit(absl::GetFlag(FLAGS_rows), ',', absl::SkipEmpty());
  auto selected = [&](std::string_view name) {
    return only.empty() || std::any_of(only.begin(), only.end(), [&](const std::string& part) {
             return name.find(part) != std::string_view::npos;
           });
  };
  // Whether a row of `group` (the rows whose names contain it) may be selected.
  auto group_selected = [&](std::initializer_list<std::string_view> groups) {
    return only.empty() || std::any_of(groups.begin(), groups.end(), [&](std::string_view g) {
             return std::any_of(only.begin(), only.end(), [&](const std::string& part) {
               return part.find(g) != std::string::npos || g.find(part) != std::string_view::npos;
             });
           });
  };
  // Every key busy: three writes each (the quota keys in batches of 50), the naive
  // script's once (its TTL is never renewed by a later write).
  for (int pass = 0; pass < 3 && group_selected({"quota", "fixed", "estimate"}); ++pass) {
    for (int first = 0; first < kKeys; first += 50) {
      std::vector<std::string> names;
      for (int j = first; j < first + 50 && j < kKeys; ++j) names.push_back(key(j));
      std::vector<Item> items;
      for (const auto& n : names) items.push_back({n, 1});
      errors += !store.apply_batch(policy, items, Nanos{0}).ok();
      std::vector<RedisStore<FixedWindow>::BatchItem> fixed_items;
      std::vector<RedisStore<SlidingWindowEstimate>::BatchItem> estimate_items;
      for (const auto& n : names) {
        fixed_items.push_back({n, 1});
        estimate_items.push_back({n, 1});
      }
      errors += !fixed_store.apply_batch(fixed, fixed_items, Nanos{0}).ok();
      errors += !estimate_store.apply_batch(estimate, estimate_items, Nanos{0}).ok();
    }
  }
  if (group_selected({"est-prev"})) {
    // The est-prev keys: 1,000 counted an hour before the server's time (the previous
    // window), then three writes each at the server's time, as above.
    auto t = conn.command({"TIME"});
    if (!t.ok() || (*t)->type != REDIS_REPLY_ARRAY || (*t)->elements != 2) {
      std::fprintf(stderr, "TIME failed\n");
      return 1;
    }
    const std::int64_t server_ns =
        std::atoll(std::string(quota::redis::reply_string(*(*t)->element[0])).c_str()) *
            1'000'000'000 +
        std::atoll(std::string(quota::redis::reply_string(*(*t)->element[1])).c_str()) * 1'000;
    for (int pass = 0; pass < 4; ++pass) {
      for (int first = 0; first < kKeys; first += 50) {
        std::vector<RedisStore<SlidingWindowEstimate>::BatchItem> items;
        std::vector<std::string> names;
        for (int j = first; j < first + 50 && j < kKeys; ++j) names.push_back(key(j));
        for (const auto& n : names) items.push_back({n, pass == 0 ? 1000 : 1});
        errors += !(pass == 0 ? prev_setup.apply_batch(estimate, items,
                                                       Nanos{server_ns} - std::chrono::hours(1))
                              : prev_store.apply_batch(estimate, items, Nanos{0}))
                       .ok();
      }
    }
  }
  for (int i = 0; i < kKeys && group_selected({"naive-lua"}); ++i) {
    auto r = conn.command({"EVALSHA", naive_sha, "1", "naive:" + key(i), "1000", "1000000", "1"});
    errors += !r.ok();
  }
  // The gateway (GatewayStore::decide): generous token buckets, every key written three
  // times first (1 level: "{tenant-i}read"; 3 levels: its user "{tenant-i}read/u", the
  // tenant key and the one global key "{~global}read").
  quota::redis::GatewayStore gw_store({.pool = pool,
                                       .prefix = "bgw:",
                                       .ttl_margin = 600s,
                                       .failover_safety = failover,
                                       .clock_guard = clock_guard});
  const quota::gateway::RulePolicy gw_policy = policy;
  auto gw_call = [&](std::uint64_t x, int levels) {
    const std::string tenant = key(x);
    const std::string user = tenant + "/u";
    std::vector<quota::gateway::LevelCheck> checks;
    if (levels >= 2) checks.push_back({.policy = &gw_policy, .key = user});
    checks.push_back({.policy = &gw_policy, .key = tenant});
    if (levels == 3) checks.push_back({.policy = &gw_policy, .key = "{~global}read"});
    auto r = gw_store.decide(checks, 1, Nanos{0});
    return r.ok() && r->parts.size() == checks.size() && r->parts.back().allowed;
  };
  // Three limits of one tenant (its scope, one script call): tokens per minute, per day
  // and per 30 days ("{tenant-i}#tpm", "#tpd", "#tp30d"), or requests per minute in a
  // fixed window ("#rpm") beside the first two. Generous: never denied.
  const quota::gateway::RulePolicy per_minute =
      TokenBucket{.rate = {.units = 1'000'000, .per = 60s}, .burst = 1'000'000};
  const quota::gateway::RulePolicy per_day =
      TokenBucket{.rate = {.units = 100'000'000, .per = 24h}, .burst = 100'000'000};
  const quota::gateway::RulePolicy per_30_days =
      TokenBucket{.rate = {.units = 1'000'000'000, .per = 720h}, .burst = 1'000'000'000};
  const quota::gateway::RulePolicy requests_per_minute =
      FixedWindow{.limit = 1'000'000'000, .window = 60s};
  auto gw_limit = [&](std::uint64_t x) -> bool {
    const std::string tpm = "{tenant-" + std::to_string(x % kKeys) + "}#tpm";
    const quota::gateway::LevelCheck check{.policy = &per_minute, .key = tpm};
    auto r = gw_store.decide(std::span(&check, 1), 1, Nanos{0});
    return r.ok() && r->parts.size() == 1 && r->parts.back().allowed;
  };
  auto gw_limits = [&](std::uint64_t x, bool window) -> bool {
    // (the fixed window's tenants are others: one scope holds one tenant's limits)
    const std::string tenant = "{tenant-" + std::to_string(x % kKeys) + (window ? "-fw" : "") + "}";
    const std::string first = tenant + (window ? "#rpm" : "#tpm");
    const std::string tpd = tenant + "#tpd";
    const std::string third = tenant + (window ? "#tpm" : "#tp30d");
    const quota::gateway::LevelCheck checks[] = {
        {.policy = window ? &requests_per_minute : &per_minute, .key = first},
        {.policy = &per_day, .key = tpd},
        {.policy = window ? &per_minute : &per_30_days, .key = third}};
    auto r = gw_store.decide(checks, 1, Nanos{0});
    return r.ok() && r->parts.size() == 3 && r->parts.back().allowed;
  };
  // The floor of any layout: a script that only reads its keys' 80-byte states and writes
  // them back in place (redis_scripts.hpp's kFloorLua), over 1 or 3 keys of a tenant, and
  // the same with each state unpacked and packed as the gateway's is.
  std::string floor_sha;
  {
    auto r = conn.command({"SCRIPT", "LOAD", quota::bench::kFloorLua});
    if (!r.ok() || (*r)->type != REDIS_REPLY_STRING) {
      std::fprintf(stderr, "SCRIPT LOAD failed\n");
      return 1;
    }
    floor_sha = quota::redis::reply_string(**r);
  }
  const std::string state80(80, 'x');
  auto floor_key = [&](std::uint64_t x, int j) {
    return "floor:{tenant-" + std::to_string(x % kKeys) + "}#" + std::to_string(j);
  };
  const std::string state240(240, 'x');
  // Compact records (mode '3'): a 7-byte header and 23 bytes per limit.
  const std::string compact1(7 + 23, 'x');
  const std::string compact3(7 + 3 * 23, 'x');
  // Modes '2' to '5' keep `records` states in one key: 9 (80-byte), 10 and 11 (compact,
  // 1 and 3), 12 (a hash), 13 and 14 (compact with identities, 1 and 3).
  auto hash_field = [](int j) { return "lim" + std::to_string(j) + "|" + std::string(35, 'p'); };
  auto floor_call = [&](std::uint64_t x, int keys, const char* mode, int records = 3) -> bool {
    const std::string nkeys = std::to_string(keys);
    const bool one_key = mode[0] >= '2';
    const int shared = mode[0] == '5'   ? (records == 1 ? 13 : 14)
                       : mode[0] == '4' ? 12
                       : mode[0] == '3' ? (records == 1 ? 10 : 11)
                                        : 9;
    std::vector<std::string> names;
    for (int j = 0; j < keys; ++j) names.push_back(floor_key(x, one_key ? shared : j));
    std::vector<std::string_view> argv{"EVALSHA", floor_sha, nkeys};
    for (const std::string& k : names) argv.push_back(k);
    argv.push_back(state80);
    argv.push_back(mode);
    const std::string nrecords = std::to_string(records);
    if (one_key) argv.push_back(nrecords);
    std::vector<std::string> fields;  // mode '5': the identity; '4': the hash's fields
    if (mode[0] == '5') fields.push_back(std::string(42, 'i'));
    for (int j = 0; mode[0] == '4' && j < records; ++j) fields.push_back(hash_field(j));
    for (const std::string& f : fields) argv.push_back(f);
    auto r = conn.command(argv);
    return r.ok() && (*r)->type == REDIS_REPLY_INTEGER;
  };
  // The sketch of one key per scope (redis_scripts.hpp's kScopeSketchLua) on the same
  // three token buckets as gateway 3lim (capacity in micro-units, m/p per ns, fill ns).
  std::string sketch_sha;
  {
    const std::string text = std::string(quota::redis::kLuaMath) + quota::redis::kLuaReach +
                             quota::bench::kScopeSketchLua;
    auto r = conn.command({"SCRIPT", "LOAD", text});
    if (!r.ok() || (*r)->type != REDIS_REPLY_STRING) {
      std::fprintf(stderr, "SCRIPT LOAD of the scope sketch failed\n");
      return 1;
    }
    sketch_sha = quota::redis::reply_string(**r);
  }
  auto sketch_policy = [](std::int64_t cap, std::int64_t m, std::int64_t p, std::int64_t fill) {
    std::string out;
    for (std::int64_t v : {cap, m, p, fill}) quota::redis::detail::pack_le(out, v, 7);
    return out;
  };
  const std::string sketch_policies[] = {
      sketch_policy(1'000'000'000'000, 50, 3, 60'000'000'000),                 // 10^6 per minute
      sketch_policy(100'000'000'000'000, 125, 108, 86'400'000'000'000),        // 10^8 per day
      sketch_policy(1'000'000'000'000'000, 125, 324, 2'592'000'000'000'000)};  // 10^9 per 30 d
  auto sketch_call = [&](std::uint64_t x, int limits) -> bool {
    const std::string key =
        "sketch:{tenant-" + std::to_string(x % kKeys) + "}#" + std::to_string(limits);
    // the header's 15 bytes: the rule-set version and the scope's policies
    const std::string_view id = limits == 1 ? "v1:tpm........." : "v1:tpm+tpd+tp30";
    std::vector<std::string_view> argv{"EVALSHA", sketch_sha, "1", key, id, "1"};
    for (int j = 0; j < limits; ++j) argv.push_back(sketch_policies[j]);
    auto r = conn.command(argv);
    return r.ok() && (*r)->type == REDIS_REPLY_ARRAY &&
           (*r)->elements == 3 + 3 * static_cast<std::size_t>(limits);
  };
  for (int pass = 0; pass < 3 && group_selected({"sketch"}); ++pass) {
    for (int i = 0; i < kKeys; ++i) {
      errors += !sketch_call(static_cast<std::uint64_t>(i), 1);
      errors += !sketch_call(static_cast<std::uint64_t>(i), 3);
    }
  }
  for (int i = 0; i < kKeys && group_selected({"floor"}); ++i) {
    for (int j = 0; j < 3; ++j) errors += !conn.command({"SET", floor_key(i, j), state80}).ok();
    errors += !conn.command({"SET", floor_key(i, 9), state240}).ok();
    errors += !conn.command({"SET", floor_key(i, 10), compact1}).ok();
    errors += !conn.command({"SET", floor_key(i, 11), compact3}).ok();
    errors +=
        !conn.command({"SET", floor_key(i, 13), std::string(30, 'x') + std::string(42, 'i')}).ok();
    errors +=
        !conn.command({"SET", floor_key(i, 14), std::string(7 + 69, 'x') + std::string(126, 'i')})
             .ok();
    for (int j = 0; j < 3; ++j) {
      errors += !conn.command({"HSET", floor_key(i, 12), hash_field(j), std::string(30, 'x')}).ok();
    }
  }
  for (int pass = 0; pass < 3 && group_selected({"gateway"}); ++pass) {
    for (int i = 0; i < kKeys; ++i) {
      errors += !gw_call(static_cast<std::uint64_t>(i), 1);
      errors += !gw_call(static_cast<std::uint64_t>(i), 3);
      errors += !gw_limits(static_cast<std::uint64_t>(i), false);
      errors += !gw_limits(static_cast<std::uint64_t>(i), true);
    }
  }

  std::vector<Row> rows;
  const std::string profile_dir = absl::GetFlag(FLAGS_profile_dir);
  auto measure = [&](const std::string& name, int per_call, long long n,
                     const std::function<bool(std::mt19937_64&)>& one) {
    if (!selected(name)) return;
    std::mt19937_64 rng(2);
    for (int i = 0; i < 20; ++i) errors += !one(rng);  // the script loaded, buffers grown
    if (!server.control("-z")) {
      ++errors;
      return;
    }
    for (long long i = 0; i < n; ++i) errors += !one(rng);
    const long long ir = server.instructions();
    if (ir < 0) {
      ++errors;
      return;
    }
    if (!profile_dir.empty()) {
      std::string file = name;
      for (char& ch : file) {
        if (ch == ' ' || ch == '/') ch = '_';
      }
      quota::bench::keep_dump(server.server.dir(),
                              std::filesystem::path(profile_dir) / ("callgrind." + file));
    }
    Row row{.name = name, .calls = n, .decisions_per_call = per_call};
    row.per_call = static_cast<double>(ir) / static_cast<double>(n);
    rows.push_back(row);
    std::printf("%-14s %6lld calls  %10.0f instructions/call  %9.0f /decision\n", name.c_str(), n,
                row.per_call, row.per_decision());
    std::fflush(stdout);
  };
  std::printf(
      "redis_instructions_bench: redis-server under callgrind on port %d, %d keys, node guards "
      "%s (quota and gateway rows)\n",
      server.port(), kKeys, guards.c_str());
  measure("quota d1", 1, calls, [&](std::mt19937_64& r) { return quota_call(r, 1); });
  measure("quota b16", 16, calls / 8, [&](std::mt19937_64& r) { return quota_call(r, 16); });
  measure("quota b64", 64, calls / 32, [&](std::mt19937_64& r) { return quota_call(r, 64); });
  measure("fixed d1", 1, calls, [&](std::mt19937_64& r) { return call(fixed_store, fixed, r, 1); });
  measure("fixed b16", 16, calls / 8,
          [&](std::mt19937_64& r) { return call(fixed_store, fixed, r, 16); });
  measure("estimate d1", 1, calls,
          [&](std::mt19937_64& r) { return call(estimate_store, estimate, r, 1); });
  measure("estimate b16", 16, calls / 8,
          [&](std::mt19937_64& r) { return call(estimate_store, estimate, r, 16); });
  measure("est-prev d1", 1, calls,
          [&](std::mt19937_64& r) { return call(prev_store, estimate, r, 1); });
  measure("est-prev b16", 16, calls / 8,
          [&](std::mt19937_64& r) { return call(prev_store, estimate, r, 16); });
  measure("naive-lua d1", 1, calls, [&](std::mt19937_64& r) { return script_call(naive_sha, r); });
  measure("noop-lua d1", 1, calls, [&](std::mt19937_64& r) { return script_call(noop_sha, r); });
  measure("INCR d1", 1, calls, incr_call);
  measure("gateway 1lvl", 1, calls, [&](std::mt19937_64& r) { return gw_call(r(), 1); });
  measure("gateway 2lvl", 1, calls, [&](std::mt19937_64& r) { return gw_call(r(), 2); });
  measure("gateway 3lvl", 1, calls / 2, [&](std::mt19937_64& r) { return gw_call(r(), 3); });
  measure("gateway 1lim", 1, calls, [&](std::mt19937_64& r) { return gw_limit(r()); });
  measure("gateway 3lim", 1, calls, [&](std::mt19937_64& r) { return gw_limits(r(), false); });
  measure("gateway 3lim-fw", 1, calls, [&](std::mt19937_64& r) { return gw_limits(r(), true); });
  measure("floor 1key", 1, calls, [&](std::mt19937_64& r) { return floor_call(r(), 1, "0"); });
  measure("floor 3keys", 1, calls, [&](std::mt19937_64& r) { return floor_call(r(), 3, "0"); });
  measure("floor 1key+pack", 1, calls, [&](std::mt19937_64& r) { return floor_call(r(), 1, "1"); });
  measure("floor 3keys+pack", 1, calls,
          [&](std::mt19937_64& r) { return floor_call(r(), 3, "1"); });
  measure("floor 1key/3rec+pack", 1, calls,
          [&](std::mt19937_64& r) { return floor_call(r(), 1, "2"); });
  measure("sketch 1lim", 1, calls, [&](std::mt19937_64& r) { return sketch_call(r(), 1); });
  measure("sketch 3lim", 1, calls, [&](std::mt19937_64& r) { return sketch_call(r(), 3); });
  measure("floor hash/1field", 1, calls,
          [&](std::mt19937_64& r) { return floor_call(r(), 1, "4", 1); });
  measure("floor hash/3fields", 1, calls,
          [&](std::mt19937_64& r) { return floor_call(r(), 1, "4", 3); });
  measure("floor 1key/1rec+id", 1, calls,
          [&](std::mt19937_64& r) { return floor_call(r(), 1, "5", 1); });
  measure("floor 1key/3rec+id", 1, calls,
          [&](std::mt19937_64& r) { return floor_call(r(), 1, "5", 3); });
  measure("floor 1key/1rec compact", 1, calls,
          [&](std::mt19937_64& r) { return floor_call(r(), 1, "3", 1); });
  measure("floor 1key/3rec compact", 1, calls,
          [&](std::mt19937_64& r) { return floor_call(r(), 1, "3", 3); });

  quota::bench::report_targets(rows, kKeys, errors, json_path);
  return errors == 0 ? 0 : 1;
}
