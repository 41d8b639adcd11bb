// Concurrency across processes for quota/redis/redis_store.hpp: 4 processes × 4 threads
// spend from ONE key with the server's time; the union of their admission logs (each
// admission stamped with the server time the script decided at) must stay inside the
// token-bucket envelope A(T) <= r·T + B, checked exactly by quota::verify.
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "quota/policy/token_bucket.hpp"
#include "quota/redis/redis_store.hpp"
#include "quota/verify/envelope.hpp"
#include "support/redis_server.hpp"

using namespace std::chrono_literals;
using quota::Nanos;
using quota::RedisStore;
using quota::TokenBucket;
using quota::verify::AdmittedEvent;

namespace {

constexpr int kProcesses = 4;
constexpr int kThreads = 4;

// One process's share of the load: kThreads threads for `duration`; admitted events and
// the count of errors go to `file` as text.
int run_process(const TokenBucket& p, const std::string& prefix, const std::string& file,
                std::chrono::milliseconds duration) {
  RedisStore<TokenBucket> store(
      quota::RedisStoreOptions{.pool = quota::testing::redis_pool(kThreads), .prefix = prefix});
  std::mutex mu;
  std::vector<AdmittedEvent> events;
  std::atomic<int> errors{0};
  const auto end = std::chrono::steady_clock::now() + duration;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::int64_t cost = 1 + t % 3;
      while (std::chrono::steady_clock::now() < end) {
        auto r = store.apply_attempt(p, "{conc}one", Nanos{0}, cost);
        if (!r.ok()) {
          ++errors;
          continue;
        }
        if (r->decision.allowed) {
          std::lock_guard<std::mutex> lock(mu);
          events.push_back({r->time.count(), cost});
        }
        cost = cost % 3 + 1;
      }
    });
  }
  for (auto& t : threads) t.join();
  std::ofstream out(file);
  out << errors.load() << "\n";
  for (const auto& e : events) out << e.time_ns << " " << e.cost << "\n";
  return out.good() ? 0 : 1;
}

}  // namespace

TEST_CASE("4 processes x 4 threads on one key: the union of admissions stays in the envelope") {
  // 2000 units/s with a burst of 40: far below what 16 clients ask, so most are denied
  // and the envelope is tight.
  const TokenBucket p{.rate = {.units = 2000, .per = 1s}, .burst = 40};
  const std::string prefix = quota::testing::unique_prefix("conc");
  const std::string dir = quota::testing::redis_dir();
  std::vector<pid_t> children;
  for (int i = 0; i < kProcesses; ++i) {
    const std::string file = dir + "/conc-" + std::to_string(::getpid()) + "-" + std::to_string(i);
    const pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) ::_exit(run_process(p, prefix, file, 700ms));
    children.push_back(pid);
  }
  for (pid_t pid : children) {
    int status = 0;
    REQUIRE(::waitpid(pid, &status, 0) == pid);
    REQUIRE(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 0);
  }
  std::vector<AdmittedEvent> all;
  int errors = 0;
  for (int i = 0; i < kProcesses; ++i) {
    const std::string file = dir + "/conc-" + std::to_string(::getpid()) + "-" + std::to_string(i);
    std::ifstream in(file);
    int e = 0;
    REQUIRE(in >> e);
    errors += e;
    AdmittedEvent ev;
    std::size_t n = 0;
    while (in >> ev.time_ns >> ev.cost) {
      all.push_back(ev);
      ++n;
    }
    CHECK(n > 0);  // every process got some admissions
    std::remove(file.c_str());
  }
  std::sort(all.begin(), all.end(),
            [](const AdmittedEvent& a, const AdmittedEvent& b) { return a.time_ns < b.time_ns; });
  auto report = quota::verify::verify_token_bucket(all, p.rate, p.burst);
  REQUIRE(report.ok());
  std::int64_t admitted = 0;
  for (const auto& e : all) admitted += e.cost;
  const double seconds = (all.back().time_ns - all.front().time_ns) / 1e9;
  std::printf("%zu admissions (%lld units over %.3f s of server time), %d errors: %s\n", all.size(),
              static_cast<long long>(admitted), seconds, errors,
              quota::verify::to_string(*report).c_str());
  INFO(quota::verify::to_string(*report));
  CHECK(errors == 0);
  CHECK(report->holds());
  // And not starved: the clients ask far more than the rate, so the admitted cost is
  // close to r·T + B. (Exact "no loss" needs a client that always asks; 16 threads
  // on 2 shared cores leave idle gaps in which a full bucket overflows.)
  const std::int64_t span_ns = all.back().time_ns - all.front().time_ns;
  const std::int64_t envelope_units = 2000 * span_ns / 1'000'000'000 + 40;
  CHECK(admitted * 2 >= envelope_units);
}
