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
// The target it checks is issue 5's "decisions per Redis core with batches of 16 ≥ 2×
// the straightforward script's", as naive-lua's instructions per decision over quota
// b16's; the same for d1 is reported beside it.
//
// Run (release build; needs valgrind, else it says so and exits 0):
//   ./build/release/benchmarks/redis_instructions_bench [--calls N] [--json FILE]
// `--benchmark_out=FILE` (what `bash cmake/run.sh bench` passes) also names the JSON
// file; other --benchmark_* arguments are ignored.
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
#include <string>
#include <type_traits>
#include <vector>

#include "absl/flags/flag.h"
#include "common/cli.hpp"
#include "quota/policy/fixed_window.hpp"
#include "quota/policy/sliding_window_estimate.hpp"
#include "quota/policy/token_bucket.hpp"
#include "quota/redis/gateway_store.hpp"
#include "quota/redis/redis_store.hpp"
#include "quota/redis/transport/connection_pool.hpp"
#include "redis/support/redis_server.hpp"
#include "support/redis_info.hpp"
#include "support/redis_scripts.hpp"

using namespace std::chrono_literals;
using quota::FixedWindow;
using quota::Nanos;
using quota::RedisStore;
using quota::SlidingWindowEstimate;
using quota::TokenBucket;

namespace {

// A redis-server under callgrind (a ScratchServer with valgrind as its wrapper), which
// writes its dumps to the server's directory `dir`.
struct CallgrindServer {
  explicit CallgrindServer(const std::string& dir)
      : server(dir,
               "valgrind --tool=callgrind --toggle-collect=processInputBuffer "
               "--callgrind-out-file=" +
                   dir + "/callgrind.out.%p") {}

  quota::testing::ScratchServer server;

  bool started() const { return server.started() && server.pid() > 0; }
  int port() const { return server.port(); }

  bool control(const char* what) const {
    const std::string cmd = "callgrind_control " + std::string(what) + " " +
                            std::to_string(server.pid()) + " >/dev/null 2>&1";
    return std::system(cmd.c_str()) == 0;
  }

  // Instructions counted since the last zero: dumps them and reads the dump's total.
  long long instructions() const {
    for (const auto& e : std::filesystem::directory_iterator(server.dir())) {
      if (e.path().filename().string().rfind("callgrind.out.", 0) == 0) {
        std::filesystem::remove(e.path());
      }
    }
    if (!control("-d")) return -1;
    for (const auto& e : std::filesystem::directory_iterator(server.dir())) {
      if (e.path().filename().string().rfind("callgrind.out.", 0) != 0) continue;
      std::ifstream in(e.path());
      std::string line;
      while (std::getline(in, line)) {
        for (const char* head : {"summary: ", "totals: "}) {
          if (line.rfind(head, 0) == 0) return std::atoll(line.c_str() + std::strlen(head));
        }
      }
    }
    return -1;
  }
};

struct Row {
  std::string name;
  long long calls = 0;
  int decisions_per_call = 1;
  double per_call = 0;
  double per_decision() const { return per_call / decisions_per_call; }
};

}  // namespace

ABSL_FLAG(std::int64_t, calls, 2000, "script calls per single-decision row");
ABSL_FLAG(std::string, json, "", "also write the rows as JSON to this file");
ABSL_FLAG(std::string, node_guards, "off",
          "the stores' node guards: off, failover, clock or both (node_watch.hpp)");

constexpr const char* kUsage = R"(usage: redis_instructions_bench [--calls N] [--json FILE]

Instructions per script call and per decision, redis-server under callgrind (needs
valgrind; without it nothing is measured and the exit status is 0).

  --calls N             script calls per single-decision row, in [100, 10000000]
                        (default 2000; the batch rows make N / 8)
  --json FILE           also write the rows as JSON to FILE
  --node_guards G       the quota and gateway stores with failover_safety (a failover
                        recorded an hour before the run: every state is newer, as after
                        one), clock_guard, both, or off (default)
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
  const CallgrindServer server(quota::testing::scratch_dir("quota-redis-instr"));
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

  // Every key busy: three writes each (the quota keys in batches of 50), the naive
  // script's once (its TTL is never renewed by a later write).
  for (int pass = 0; pass < 3; ++pass) {
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
  {
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
  for (int i = 0; i < kKeys; ++i) {
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
  for (int pass = 0; pass < 3; ++pass) {
    for (int i = 0; i < kKeys; ++i) {
      errors += !gw_call(static_cast<std::uint64_t>(i), 1);
      errors += !gw_call(static_cast<std::uint64_t>(i), 3);
    }
  }

  std::vector<Row> rows;
  auto measure = [&](const std::string& name, int per_call, long long n,
                     const std::function<bool(std::mt19937_64&)>& one) {
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

  auto find = [&](const std::string& name) -> const Row* {
    for (const Row& r : rows) {
      if (r.name == name) return &r;
    }
    return nullptr;
  };
  const Row* naive = find("naive-lua d1");
  const Row* b16 = find("quota b16");
  const Row* d1 = find("quota d1");
  const double b16_ratio = naive && b16 ? naive->per_decision() / b16->per_decision() : 0;
  const double d1_ratio = naive && d1 ? naive->per_decision() / d1->per_decision() : 0;
  std::printf(
      "decisions per Redis core (by instructions) vs the straightforward script: "
      "b16 %.2fx (target >= 2: %s), d1 %.2fx; errors %d\n",
      b16_ratio, b16_ratio >= 2 ? "met" : "not met", d1_ratio, errors);
  if (!json_path.empty()) {
    std::ofstream out(json_path);
    out << "{\n  \"context\": {\"tool\": \"callgrind --toggle-collect=processInputBuffer\", "
           "\"keys\": "
        << kKeys << ", \"errors\": " << errors << "},\n  \"benchmarks\": [";
    for (std::size_t i = 0; i < rows.size(); ++i) {
      const Row& r = rows[i];
      out << (i ? "," : "") << "\n    {\"name\": \"" << r.name
          << "\", \"run_type\": \"iteration\", \"iterations\": " << r.calls
          << ", \"instructions_per_call\": " << r.per_call
          << ", \"instructions_per_decision\": " << r.per_decision() << "}";
    }
    out << "\n  ],\n  \"targets\": [\n    {\"name\": \"b16_per_core_vs_naive_instructions\", "
           "\"value\": "
        << b16_ratio << ", \"target\": 2, \"met\": " << (b16_ratio >= 2 ? "true" : "false")
        << "},\n    {\"name\": \"d1_per_core_vs_naive_instructions\", \"value\": " << d1_ratio
        << "}\n  ]\n}\n";
  }
  return errors == 0 ? 0 : 1;
}
