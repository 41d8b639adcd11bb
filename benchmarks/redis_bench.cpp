// redis_bench — the Redis store's load generator (issue 5's benchmark table).
//
// Against a real redis-server on loopback (started by this program through
// cmake/redis_server.sh, or the one at QUOTA_REDIS_PORT), for 1, 8 and 50 connections
// (one thread each), it measures decisions per second, p50/p99 latency per call and the
// server CPU per decision (INFO commandstats: usec of EVALSHA/EVAL/... divided by the
// decisions they made) for:
//   quota d1      RedisStore<TokenBucket>::apply, one EVALSHA per decision
//   quota p16     acquire_many: 16 EVALSHAs pipelined in one write
//   quota b16/b64 acquire_batch: 16 / 64 decisions in ONE EVALSHA
//   naive-lua d1  the straightforward published script (HMGET, TIME, floating refill,
//                 HSET, PEXPIRE) with EVALSHA
//   INCR          redis-benchmark INCR at the same connections and depth (the ceiling of
//                 any one-round-trip design)
// and then a naive client-side GET-compute-SET limiter under 8 threads on one key, with
// its over-admission against the envelope r·T + B, and MEMORY USAGE of one bucket.
//
// Run (release build):  ./build/release/benchmarks/redis_bench [--seconds S]
// Any --benchmark_* arguments (cmake/run.sh bench passes them) are ignored.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "quota/policy/token_bucket.hpp"
#include "quota/redis/redis_store.hpp"

using namespace std::chrono_literals;
using quota::Nanos;
using quota::RedisStore;
using quota::TokenBucket;
using Clock = std::chrono::steady_clock;

namespace {

std::string source_dir() {
  std::string f = __FILE__;
  return f.substr(0, f.rfind("/benchmarks/"));
}

struct Server {
  int port = 0;
  std::string dir;  // non-empty when we started it
  ~Server() {
    if (!dir.empty()) {
      const std::string cmd =
          "bash '" + source_dir() + "/cmake/redis_server.sh' stop '" + dir + "' >/dev/null 2>&1";
      if (std::system(cmd.c_str()) != 0) std::fprintf(stderr, "could not stop redis-server\n");
    }
  }
};

bool start_server(Server& s) {
  if (const char* p = std::getenv("QUOTA_REDIS_PORT"); p != nullptr) {
    s.port = std::atoi(p);
    return s.port > 0;
  }
  s.dir = "/tmp/quota-redis-bench-" + std::to_string(::getpid());
  const std::string cmd =
      "bash '" + source_dir() + "/cmake/redis_server.sh' start '" + s.dir + "' >/dev/null";
  if (std::system(cmd.c_str()) != 0) return false;
  std::ifstream in(s.dir + "/port");
  return static_cast<bool>(in >> s.port);
}

quota::redis::ConnectionConfig config(int port) {
  return {.host = "127.0.0.1",
          .port = port,
          .connect_timeout = 1s,
          .command_timeout = 2s,
          .pool_wait = 5s};
}

// usec of the script commands since the last CONFIG RESETSTAT.
std::int64_t server_script_usec(quota::redis::Connection& admin) {
  auto r = admin.command({"INFO", "commandstats"});
  if (!r.ok() || (*r)->type != REDIS_REPLY_STRING) return -1;
  const std::string info(quota::redis::reply_string(**r));
  std::int64_t total = 0;
  // Commands a script calls are counted again under their own names; the script's usec
  // already includes them, so only the script commands are summed.
  for (const char* cmd : {"cmdstat_evalsha:", "cmdstat_eval:"}) {
    const auto at = info.find(cmd);
    if (at == std::string::npos) continue;
    const auto u = info.find("usec=", at);
    total += std::atoll(info.c_str() + u + 5);
  }
  return total;
}

struct Result {
  double decisions_per_s = 0;
  double p50_us = 0, p99_us = 0;
  double server_us_per_decision = 0;
  std::int64_t errors = 0;
};

// Runs `threads` threads for `seconds`; each call of `one(thread, rng)` makes
// `per_call` decisions (returns false on error). Latency per call.
Result run(int port, int threads, double seconds, int per_call,
           const std::function<bool(int, std::mt19937_64&)>& one) {
  quota::redis::Connection admin(config(port));
  (void)admin.command({"CONFIG", "RESETSTAT"});
  std::vector<std::vector<float>> lat(static_cast<std::size_t>(threads));
  std::atomic<std::int64_t> calls{0}, errors{0};
  const auto t0 = Clock::now();
  const auto end = t0 + std::chrono::duration<double>(seconds);
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      std::mt19937_64 rng(static_cast<std::uint64_t>(t) * 7919 + 1);
      auto& mine = lat[static_cast<std::size_t>(t)];
      mine.reserve(1 << 18);
      while (Clock::now() < end) {
        const auto a = Clock::now();
        const bool ok = one(t, rng);
        mine.push_back(std::chrono::duration<float, std::micro>(Clock::now() - a).count());
        ++calls;
        if (!ok) ++errors;
      }
    });
  }
  for (auto& th : pool) th.join();
  const double elapsed = std::chrono::duration<double>(Clock::now() - t0).count();
  std::vector<float> all;
  for (auto& v : lat) all.insert(all.end(), v.begin(), v.end());
  std::sort(all.begin(), all.end());
  Result r;
  const double decisions = static_cast<double>(calls.load()) * per_call;
  r.decisions_per_s = decisions / elapsed;
  if (!all.empty()) {
    r.p50_us = all[all.size() / 2];
    r.p99_us = all[all.size() * 99 / 100];
  }
  r.server_us_per_decision = static_cast<double>(server_script_usec(admin)) / decisions;
  r.errors = errors.load();
  return r;
}

void print(const char* name, int conns, const Result& r) {
  std::printf("%-14s %5d %12.0f %9.1f %9.1f %12.2f %7" PRId64 "\n", name, conns, r.decisions_per_s,
              r.p50_us, r.p99_us, r.server_us_per_decision, r.errors);
  std::fflush(stdout);
}

// The straightforward token bucket script as commonly published.
const char* kNaiveLua = R"lua(
local rate = tonumber(ARGV[1])
local burst = tonumber(ARGV[2])
local cost = tonumber(ARGV[3])
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local v = redis.call('HMGET', KEYS[1], 'tokens', 'ts')
local tokens = tonumber(v[1]) or burst
local ts = tonumber(v[2]) or now
tokens = math.min(burst, tokens + (now - ts) * rate)
local allowed = 0
if tokens >= cost then tokens = tokens - cost; allowed = 1 end
redis.call('HSET', KEYS[1], 'tokens', tokens, 'ts', now)
redis.call('PEXPIRE', KEYS[1], math.ceil(burst / rate * 1000))
return allowed
)lua";

double redis_benchmark_incr(int port, int conns, int depth) {
  const std::string cmd = "redis-benchmark -h 127.0.0.1 -p " + std::to_string(port) + " -c " +
                          std::to_string(conns) + " -P " + std::to_string(depth) +
                          " -n 200000 -t incr -q 2>/dev/null";
  FILE* f = ::popen(cmd.c_str(), "r");
  if (f == nullptr) return -1;
  char buf[4096];
  std::string out;
  while (std::fgets(buf, sizeof buf, f) != nullptr) out += buf;
  ::pclose(f);
  // "INCR: 123456.79 requests per second, p50=..." (the last \r-separated segment)
  const auto at = out.rfind("INCR:");
  return at == std::string::npos ? -1 : std::atof(out.c_str() + at + 5);
}

}  // namespace

int main(int argc, char** argv) {
  double seconds = 1.5;
  for (int i = 1; i < argc; ++i) {
    if (std::string(argv[i]) == "--seconds" && i + 1 < argc) seconds = std::atof(argv[++i]);
  }
  Server server;
  if (!start_server(server)) {
    std::fprintf(stderr, "redis_bench: no redis-server (set QUOTA_REDIS_PORT or install it)\n");
    return 1;
  }
  const int port = server.port;
  const TokenBucket policy{.rate = {.units = 1'000'000, .per = 1s}, .burst = 1'000'000};
  constexpr int kKeys = 10'000;
  std::vector<std::string> keys;
  for (int i = 0; i < kKeys; ++i) keys.push_back("{tenant-" + std::to_string(i) + "}read");
  auto key = [&](std::mt19937_64& rng) -> const std::string& { return keys[rng() % kKeys]; };

  std::printf("redis_bench on 127.0.0.1:%d, %.1f s per row, %d keys, token bucket\n", port, seconds,
              kKeys);
  std::printf("%-14s %5s %12s %9s %9s %12s %7s\n", "workload", "conns", "decisions/s", "p50 us",
              "p99 us", "server us/d", "errors");
  for (int conns : {1, 8, 50}) {
    auto pool = std::make_shared<quota::redis::ConnectionPool>(config(port),
                                                               static_cast<std::size_t>(conns));
    RedisStore<TokenBucket> store({.pool = pool, .prefix = "bench:"});
    print("quota d1", conns, run(port, conns, seconds, 1, [&](int, std::mt19937_64& rng) {
            return store.apply(policy, key(rng), Nanos{0}, 1).ok();
          }));
    using Item = RedisStore<TokenBucket>::BatchItem;
    for (int depth : {16}) {
      print("quota p16", conns, run(port, conns, seconds, depth, [&](int, std::mt19937_64& rng) {
              std::vector<Item> items;
              for (int i = 0; i < depth; ++i) items.push_back({key(rng), 1});
              auto r = store.acquire_many(policy, items, Nanos{0});
              return r.ok();
            }));
    }
    for (int batch : {16, 64}) {
      const std::string name = "quota b" + std::to_string(batch);
      print(name.c_str(), conns, run(port, conns, seconds, batch, [&](int, std::mt19937_64& rng) {
              std::vector<Item> items;
              for (int i = 0; i < batch; ++i) items.push_back({key(rng), 1});
              return store.acquire_batch(policy, items, Nanos{0}).ok();
            }));
    }
    // The straightforward script, loaded once, one EVALSHA per decision.
    std::string sha;
    {
      quota::redis::Connection c(config(port));
      auto r = c.command({"SCRIPT", "LOAD", kNaiveLua});
      if (r.ok() && (*r)->type == REDIS_REPLY_STRING) sha = quota::redis::reply_string(**r);
    }
    std::vector<std::unique_ptr<quota::redis::Connection>> conns_naive;
    for (int i = 0; i < conns; ++i) {
      conns_naive.push_back(std::make_unique<quota::redis::Connection>(config(port)));
    }
    print("naive-lua d1", conns, run(port, conns, seconds, 1, [&](int t, std::mt19937_64& rng) {
            const std::string k = "naive:" + key(rng);
            auto r = conns_naive[static_cast<std::size_t>(t)]->command(
                {"EVALSHA", sha, "1", k, "1000000", "1000000", "1"});
            return r.ok() && (*r)->type == REDIS_REPLY_INTEGER;
          }));
    for (int depth : {1, 16}) {
      std::printf("%-14s %5d %12.0f   (redis-benchmark -c %d -P %d -t incr)\n",
                  depth == 1 ? "INCR d1" : "INCR p16", conns,
                  redis_benchmark_incr(port, conns, depth), conns, depth);
    }
  }

  // Bytes per bucket (spend first: an idle bucket of this fast policy has expired).
  {
    auto pool = std::make_shared<quota::redis::ConnectionPool>(config(port), 1);
    RedisStore<TokenBucket> store({.pool = pool, .prefix = "bench:"});
    (void)store.apply(policy, "{tenant-1}read", Nanos{0}, 500'000);
    quota::redis::Connection c(config(port));
    auto r = c.command({"MEMORY", "USAGE", "bench:{tenant-1}read"});
    if (r.ok() && (*r)->type == REDIS_REPLY_INTEGER) {
      std::printf(
          "MEMORY USAGE of one bucket (key \"bench:{tenant-1}read\", 20 bytes): %lld bytes\n",
          static_cast<long long>((*r)->integer));
    }
  }

  // A naive client-side limiter: GET tokens+time, compute, SET — not atomic. 8 threads
  // on one key; admitted units compared with the envelope r·T + B.
  {
    const double rate = 1000, burst = 50;
    std::atomic<std::int64_t> admitted{0};
    quota::redis::Connection init(config(port));
    (void)init.command({"DEL", "naive-client"});
    const auto t0 = Clock::now();
    const auto end = t0 + std::chrono::duration<double>(seconds);
    std::vector<std::thread> threads;
    for (int t = 0; t < 8; ++t) {
      threads.emplace_back([&] {
        quota::redis::Connection c(config(port));
        while (Clock::now() < end) {
          const double now = std::chrono::duration<double>(Clock::now() - t0).count();
          auto g = c.command({"GET", "naive-client"});
          if (!g.ok()) continue;
          double tokens = burst, last = now;
          if ((*g)->type == REDIS_REPLY_STRING) {
            std::sscanf((*g)->str, "%lf %lf", &tokens, &last);
          }
          tokens = std::min(burst, tokens + (now - last) * rate);
          if (tokens >= 1) {
            tokens -= 1;
            ++admitted;
          }
          char v[64];
          std::snprintf(v, sizeof v, "%.9f %.9f", tokens, now);
          (void)c.command({"SET", "naive-client", v});
        }
      });
    }
    for (auto& th : threads) th.join();
    const double elapsed = std::chrono::duration<double>(Clock::now() - t0).count();
    const double envelope = rate * elapsed + burst;
    std::printf(
        "naive GET-compute-SET, 8 threads, one key (rate %.0f/s, burst %.0f): admitted %" PRId64
        " over %.2f s, envelope r*T+B = %.0f -> over-admission %.1f%%\n",
        rate, burst, admitted.load(), elapsed, envelope,
        100.0 * (static_cast<double>(admitted.load()) - envelope) / envelope);
  }
  return 0;
}
