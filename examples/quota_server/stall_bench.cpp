// quota_server_stall_bench — the latency of a check while other clients try to stall
// quota-server's HTTP listener (http_listener.hpp): 64 idle keep-alive connections (each
// answered once, then silent) and 64 slow senders (a request head declaring a
// Content-Length of 99,999,999,999, then one body byte a second; reconnecting when the
// server closes them) held open, while one client checks 1 unit in a loop on its own
// keep-alive connection. Rows: `attackers:0` (the client alone) and `attackers:1`; each
// reports the check's p50, p99 and max latency in µs (counters) over a fixed number of
// checks, and how many times the slow senders were refused (400 and closed).
//
// The server runs in process with a budget far larger than the run asks for, started on
// free loopback ports from --server; everything is stopped by pid at the end of a row.
//
//   cmake --preset release
//   cmake --build build/release --target quota_server quota_server_stall_bench -j1
//   build/release/examples/quota_server/quota_server_stall_bench
//       --server build/release/examples/quota_server/quota-server
//       --benchmark_format=json --benchmark_out=stall.json
#include <benchmark/benchmark.h>
#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "common/cli.hpp"
#include "testing/raw_socket.hpp"
#include "testing/server_process.hpp"

ABSL_FLAG(std::string, server, "", "the quota-server binary");
ABSL_FLAG(std::int64_t, checks, 20000, "checks per row");

namespace {

using quota::testing::connect_to;
using quota::testing::send_all;

const std::string kSlowHead =
    "POST /v1/check HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    "Content-Length: 99999999999\r\n\r\n";

// 64 idle keep-alive connections and 64 slow senders against `port`, until stop().
class Attackers {
 public:
  explicit Attackers(int port) : port_(port) {
    for (int i = 0; i < 64; ++i) {
      const int fd = connect_to(port, std::chrono::seconds(2));
      if (fd < 0) continue;
      char buf[512];
      if (send_all(fd, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")) recv(fd, buf, sizeof buf, 0);
      idle_.push_back(fd);
    }
    for (int i = 0; i < 64; ++i) slow_.push_back(-1);
    thread_ = std::thread([this] { run(); });
  }
  ~Attackers() {
    stop_ = true;
    thread_.join();
    for (int fd : idle_) close(fd);
    for (int fd : slow_) {
      if (fd >= 0) close(fd);
    }
  }
  long long refused() const { return refused_.load(); }

 private:
  // Every second: one body byte on each slow connection; a closed one is opened again.
  void run() {
    while (!stop_) {
      for (int& fd : slow_) {
        char buf[512];
        // An answer (the 400) or the server's close: refused; else one more body byte.
        if (fd >= 0 && (recv(fd, buf, sizeof buf, MSG_DONTWAIT) >= 0 || !send_all(fd, "x"))) {
          close(fd);
          fd = -1;
          ++refused_;
        }
        if (fd < 0) {
          fd = connect_to(port_, std::chrono::seconds(2));
          if (fd >= 0 && !send_all(fd, kSlowHead)) {
            close(fd);
            fd = -1;
          }
        }
      }
      for (int i = 0; i < 10 && !stop_; ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
      }
    }
  }

  int port_;
  std::vector<int> idle_, slow_;
  std::atomic<bool> stop_{false};
  std::atomic<long long> refused_{0};
  std::thread thread_;
};

void BM_CheckLatency(benchmark::State& state) {
  const std::string rules = "/tmp/quota_server_stall_bench_rules.yaml";
  std::ofstream(rules) << "routes:\n  - name: read\nrules:\n  - name: big\n    level: tenant\n"
                          "    plan: free\n    route: read\n"
                          "    token_bucket: {rate: 1000000/1s, burst: 1000000000}\n";
  quota::testing::ServerProcess server;
  if (!server.start({absl::GetFlag(FLAGS_server), "--rules", rules, "--default-plan", "free",
                     "--default-route", "read", "--grpc-port", "0", "--http-port", "0"},
                    {"grpc", "http"})) {
    state.SkipWithError("quota-server did not start (--server)");
    return;
  }
  const int port = server.port("http");
  std::unique_ptr<Attackers> attackers;
  if (state.range(0) == 1) {
    attackers = std::make_unique<Attackers>(port);
    std::this_thread::sleep_for(std::chrono::seconds(2));  // the slow senders are sending
  }
  httplib::Client client("127.0.0.1", port);
  client.set_keep_alive(true);
  client.set_tcp_nodelay(true);
  client.set_read_timeout(30);
  std::vector<double> micros;
  long long errors = 0;
  for (auto _ : state) {
    const auto t0 = std::chrono::steady_clock::now();
    auto r = client.Post("/v1/check", R"({"tenant":"probe"})", "application/json");
    const auto t1 = std::chrono::steady_clock::now();
    if (!r || r->status != 200) ++errors;
    micros.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
  }
  std::sort(micros.begin(), micros.end());
  const auto at = [&](double q) {
    return micros.empty()
               ? 0.0
               : micros[std::min(micros.size() - 1, static_cast<std::size_t>(q * micros.size()))];
  };
  state.counters["p50_us"] = at(0.50);
  state.counters["p99_us"] = at(0.99);
  state.counters["max_us"] = micros.empty() ? 0.0 : micros.back();
  state.counters["errors"] = static_cast<double>(errors);
  state.counters["slow_refused"] = attackers ? static_cast<double>(attackers->refused()) : 0.0;
  attackers.reset();
  server.stop();
}

}  // namespace

constexpr const char* kUsage = R"(usage: quota_server_stall_bench --server PATH [--checks N]
                                [--benchmark_* flags of google-benchmark]

A check's latency (p50, p99, max) against quota-server while 64 idle keep-alive
connections and 64 slow senders are held open (attackers:1) and without them (attackers:0).

  --server PATH         the quota-server binary (required)
  --checks N            checks per row (default 20000)
  --help                this text
)";

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {  // ours, before google-benchmark's own --help
    if (std::string_view(argv[i]) == "--help" || std::string_view(argv[i]) == "-h") {
      std::fputs(kUsage, stdout);
      return 0;
    }
  }
  benchmark::Initialize(&argc, argv);
  quota::cli::parse({.name = "quota_server_stall_bench",
                     .usage = kUsage,
                     .checks = {quota::cli::integer("checks", 1, 100'000'000)}},
                    argc, argv);
  if (absl::GetFlag(FLAGS_server).empty()) {
    std::fprintf(stderr, "quota_server_stall_bench: --server PATH is required\n");
    return 2;
  }
  benchmark::RegisterBenchmark("BM_CheckLatency", BM_CheckLatency)
      ->ArgName("attackers")
      ->Arg(0)
      ->Arg(1)
      ->Iterations(static_cast<benchmark::IterationCount>(absl::GetFlag(FLAGS_checks)))
      ->Unit(benchmark::kMicrosecond)
      ->UseRealTime();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
