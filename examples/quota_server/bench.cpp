// quota_server_bench — a load driver for quota-server: checks per second and the server's
// own CPU time per check, over gRPC (RLS v3) and HTTP (/v1/check), with 1 and 8 client
// connections on loopback; in process, or with --redis (a redis-server of its own on a free
// port, cmake/redis_server.sh).
//
// It starts the server binary (--server) on free ports with a rule file of its own (a
// budget far larger than the run asks for, so every check is an admission that writes the
// store), and for each case runs `connections` client threads, each with its own
// connection (gRPC: its own channel and subchannel), each asking 1 unit for its own tenant
// as fast as answers come back, for --seconds. The server's CPU time (utime + stime of
// /proc/<pid>/stat, clock ticks) is read before and after each case: CPU µs per check =
// that difference / checks. Client and server share the machine's cores, so checks/s is
// bounded by both; CPU per check is the server's alone. First, the decision alone: the
// same rules on a Checker in this process (resolve + pin + check, thread CPU time), the
// part of the server's CPU that is not the protocol. One JSON object per case on stdout.
//
// --descriptors 1,16 runs every gRPC case also with 16 descriptors per ShouldRateLimit
// call (each its own tenant, each one decision): CPU µs per check is then per descriptor
// decision, and per call is reported beside it. --grpc_floor adds the floor: the same
// gRPC cases against this binary run as a server (--echo_server) whose RateLimitService
// answers every call OK, one OK status per descriptor, without deciding — the sync gRPC
// server quota-server uses, with nothing behind it: what gRPC alone costs per call here.
// --leased (with --redis) runs the Redis cases again with the rule leased (`lease: {mode:
// on, units: 1000, expiry: 1s}`: a grant from Redis per 1000 checks, redis_leases.hpp).
//
//   cmake --preset release
//   cmake --build build/release --target quota_server quota_server_bench -j1
//   build/release/examples/quota_server/quota_server_bench
//       --server build/release/examples/quota_server/quota-server --seconds 5
//       [--redis [--leased]] [--grpc_floor] [--descriptors 1,16]
#include <httplib.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/flags/flag.h"
#include "backend/checker.hpp"
#include "common/cli.hpp"
#include "envoy/service/ratelimit/v3/rls.grpc.pb.h"
#include "quota/clock.hpp"
#include "quota/rules/rule_file.hpp"
#include "redis/support/redis_server.hpp"
#include "testing/server_process.hpp"

ABSL_FLAG(std::string, server, "", "the quota-server binary");
ABSL_FLAG(double, seconds, 5.0, "length of each case");
ABSL_FLAG(std::string, apis, "grpc,http", "the APIs to run: grpc, http or both");
ABSL_FLAG(std::string, connections, "1,8", "client connection counts to run: 1, 8 or both");
ABSL_FLAG(bool, redis, false, "also run the cases with --redis on a redis-server of its own");
ABSL_FLAG(std::string, descriptors, "1", "descriptors per gRPC call to run, e.g. 1,16");
ABSL_FLAG(bool, grpc_floor, false,
          "also run the gRPC cases against a server that answers without deciding");
ABSL_FLAG(bool, leased, false,
          "with --redis, also run the Redis cases with the rule leased (lease: on, 1000 units)");
ABSL_FLAG(bool, echo_server, false,
          "run as that server (the floor): answer every ShouldRateLimit OK until SIGTERM");

namespace {

namespace rls = envoy::service::ratelimit::v3;

// utime + stime of `pid`, in microseconds.
std::int64_t cpu_us(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const auto close = all.rfind(')');
  if (close == std::string::npos) return -1;
  std::istringstream rest(all.substr(close + 2));
  std::string field;
  long long utime = 0, stime = 0;
  for (int i = 3; i <= 15 && rest >> field; ++i) {
    if (i == 14) utime = std::atoll(field.c_str());
    if (i == 15) stime = std::atoll(field.c_str());
  }
  return (utime + stime) * 1'000'000 / sysconf(_SC_CLK_TCK);
}

// Comma-separated whole numbers ("1,16").
std::vector<int> int_list(const std::string& text) {
  std::vector<int> out;
  std::istringstream in(text);
  for (std::string item; std::getline(in, item, ',');) {
    if (const int n = std::atoi(item.c_str()); n > 0) out.push_back(n);
  }
  return out;
}

// The floor's RateLimitService: every call OK, one OK status per descriptor, nothing
// decided.
class EchoService final : public rls::RateLimitService::Service {
  grpc::Status ShouldRateLimit(grpc::ServerContext*, const rls::RateLimitRequest* request,
                               rls::RateLimitResponse* response) override {
    response->set_overall_code(rls::RateLimitResponse::OK);
    for (int i = 0; i < request->descriptors_size(); ++i) {
      response->add_statuses()->set_code(rls::RateLimitResponse::OK);
    }
    return grpc::Status::OK;
  }
};

// --echo_server: the floor's server, built as quota-server builds its own (default
// ServerBuilder, sync API), on a free loopback port; stops on SIGTERM or SIGINT.
int run_echo_server() {
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  EchoService service;
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || port == 0) return 1;
  std::printf("grpc listening on 127.0.0.1:%d\n", port);
  std::fflush(stdout);
  int signal_number = 0;
  sigwait(&stop_signals, &signal_number);
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(5));
  return 0;
}

struct Result {
  long long calls = 0;
  long long errors = 0;
};

// `descriptors` descriptors per call, each its own tenant (one decision each).
void grpc_loop(int port, int id, int descriptors, std::chrono::steady_clock::time_point until,
               Result& out) {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);  // a connection of its own
  auto stub = rls::RateLimitService::NewStub(grpc::CreateCustomChannel(
      "127.0.0.1:" + std::to_string(port), grpc::InsecureChannelCredentials(), args));
  rls::RateLimitRequest req;
  req.set_domain("quota");
  for (int k = 0; k < descriptors; ++k) {
    auto* e = req.add_descriptors()->add_entries();
    e->set_key("tenant");
    e->set_value("bench-" + std::to_string(id) + (k == 0 ? "" : "-" + std::to_string(k)));
  }
  while (std::chrono::steady_clock::now() < until) {
    rls::RateLimitResponse resp;
    grpc::ClientContext ctx;
    const grpc::Status s = stub->ShouldRateLimit(&ctx, req, &resp);
    if (s.ok() && resp.overall_code() == rls::RateLimitResponse::OK) {
      ++out.calls;
    } else {
      ++out.errors;
    }
  }
}

void http_loop(int port, int id, int, std::chrono::steady_clock::time_point until, Result& out) {
  httplib::Client c("127.0.0.1", port);
  c.set_keep_alive(true);
  c.set_tcp_nodelay(true);
  const std::string body = R"({"tenant":"bench-)" + std::to_string(id) + R"("})";
  while (std::chrono::steady_clock::now() < until) {
    auto r = c.Post("/v1/check", body, "application/json");
    if (r && r->status == 200 && r->body.find("\"allowed\":true") != std::string::npos) {
      ++out.calls;
    } else {
      ++out.errors;
    }
  }
}

void run_case(const quota::testing::ServerProcess& server, const std::string& store,
              const std::string& api, int connections, int descriptors, double seconds) {
  const int port = server.port(api);
  std::vector<Result> results(static_cast<std::size_t>(connections));
  const auto until = std::chrono::steady_clock::now() +
                     std::chrono::microseconds(static_cast<std::int64_t>(seconds * 1e6));
  const std::int64_t cpu_before = cpu_us(server.pid());
  const auto start = std::chrono::steady_clock::now();
  std::vector<std::thread> threads;
  for (int i = 0; i < connections; ++i) {
    threads.emplace_back(api == "grpc" ? grpc_loop : http_loop, port, i, descriptors, until,
                         std::ref(results[static_cast<std::size_t>(i)]));
  }
  for (auto& t : threads) t.join();
  const double elapsed =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const std::int64_t cpu = cpu_us(server.pid()) - cpu_before;
  Result total;
  for (const Result& r : results) {
    total.calls += r.calls;
    total.errors += r.errors;
  }
  const long long checks = total.calls * descriptors;
  const auto per = [cpu](long long n) {
    return n > 0 ? static_cast<double>(cpu) / static_cast<double>(n) : 0.0;
  };
  std::printf(
      "{\"store\":\"%s\",\"api\":\"%s\",\"connections\":%d,\"descriptors\":%d,"
      "\"seconds\":%.2f,\"calls\":%lld,\"checks\":%lld,\"errors\":%lld,"
      "\"checks_per_second\":%.0f,\"server_cpu_us\":%lld,\"server_cpu_us_per_call\":%.2f,"
      "\"server_cpu_us_per_check\":%.2f}\n",
      store.c_str(), api.c_str(), connections, descriptors, elapsed, total.calls, checks,
      total.errors, static_cast<double>(checks) / elapsed, static_cast<long long>(cpu),
      per(total.calls), per(checks));
  std::fflush(stdout);
}

// The decision alone: the same rules on a Checker in this process, one thread, no
// protocol — the part of a check that is not gRPC or HTTP.
bool run_checker(const std::string& rules, long long checks) {
  auto set = quota::rules::load_rule_file(rules);
  if (!set.ok()) return false;
  quota::server::Checker checker(*set, {});
  quota::SteadyClock clock;
  timespec t0{}, t1{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t0);
  long long admitted = 0;
  for (long long i = 0; i < checks; ++i) {
    auto req = checker.resolve({.tenant = "bench-0", .plan = "free", .route = "read"});
    if (!req.ok()) return false;
    const auto pin = checker.pin();
    auto c = checker.check(pin, *req, clock.now());
    admitted += c.ok() && c->result.decision.allowed;
  }
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t1);
  const double us = (t1.tv_sec - t0.tv_sec) * 1e6 + (t1.tv_nsec - t0.tv_nsec) / 1e3;
  std::printf(
      "{\"store\":\"in_process\",\"api\":\"checker\",\"connections\":0,\"checks\":%lld,"
      "\"admitted\":%lld,\"cpu_us_per_check\":%.3f}\n",
      checks, admitted, us / static_cast<double>(checks));
  std::fflush(stdout);
  return admitted == checks;
}

// Every case of `apis` (grpc, http) the flags ask for, against `server`.
void run_cases(const quota::testing::ServerProcess& server, const std::string& store,
               const std::string& apis, double seconds) {
  const std::vector<int> counts = int_list(absl::GetFlag(FLAGS_connections));
  const std::vector<int> descriptors = int_list(absl::GetFlag(FLAGS_descriptors));
  for (const char* api : {"grpc", "http"}) {
    if (apis.find(api) == std::string::npos) continue;
    for (int connections : counts) {
      for (int n : descriptors) {
        if (n > 1 && std::string(api) != "grpc") continue;  // one check per HTTP call
        run_case(server, store, api, connections, n, seconds);
      }
    }
  }
}

bool run_store(const std::string& store, const std::string& rules,
               const std::vector<std::string>& extra, double seconds) {
  quota::testing::ServerProcess server;
  std::vector<std::string> args = {absl::GetFlag(FLAGS_server),
                                   "--rules",
                                   rules,
                                   "--default-plan",
                                   "free",
                                   "--default-route",
                                   "read",
                                   "--grpc-port",
                                   "0",
                                   "--http-port",
                                   "0"};
  args.insert(args.end(), extra.begin(), extra.end());
  if (!server.start(args, {"grpc", "http"})) return false;
  const std::string apis = absl::GetFlag(FLAGS_apis);
  run_cases(server, store, apis, seconds);
  return server.stop() == 0;
}

// The floor: the gRPC cases against this binary as --echo_server.
bool run_floor(double seconds) {
  quota::testing::ServerProcess server;
  if (!server.start({"/proc/self/exe", "--echo_server"}, {"grpc"})) return false;
  run_cases(server, "grpc_floor", "grpc", seconds);
  return server.stop() == 0;
}

}  // namespace

constexpr const char* kUsage = R"(usage: quota_server_bench --server PATH [flags]

Drives a quota-server binary on loopback: checks per second and the server's CPU per
check, over gRPC and HTTP, with 1 and 8 client connections; in process, or with --redis.
One JSON object per case on stdout.

Flags (--flag VALUE or --flag=VALUE):
  --server PATH         the quota-server binary (required)
  --seconds S           length of each case (default 5)
  --apis LIST           grpc, http or both (default grpc,http)
  --connections LIST    1, 8 or both (default 1,8)
  --descriptors LIST    descriptors per gRPC call, e.g. 1,16 (default 1)
  --redis               also run every case on a redis-server of its own
  --leased              with --redis: the Redis cases again with the rule leased
  --grpc-floor          add the floor: the gRPC cases against an echo server
  --help                this text
)";

int main(int argc, char** argv) {
  quota::cli::parse({.name = "quota_server_bench", .usage = kUsage, .checks = {}}, argc, argv);
  if (absl::GetFlag(FLAGS_echo_server)) return run_echo_server();
  const std::string binary = absl::GetFlag(FLAGS_server);
  if (binary.empty()) {
    std::fprintf(stderr,
                 "quota_server_bench: --server PATH (the quota-server binary) is required\n");
    return 2;
  }
  const double seconds = absl::GetFlag(FLAGS_seconds);
  const std::string rules = "/tmp/quota_server_bench_rules_" + std::to_string(::getpid()) + ".yaml";
  const std::string text =
      "routes:\n  - name: read\nrules:\n  - name: bench\n    level: tenant\n"
      "    plan: free\n    route: read\n"
      "    token_bucket: {rate: 1000000000/1s, burst: 1000000000}\n";
  std::ofstream(rules) << text;
  const std::string leased_rules = rules + ".leased.yaml";
  std::ofstream(leased_rules) << text << "    lease: {mode: on, units: 1000, expiry: 1s}\n";
  bool ok = run_checker(rules, 200'000) && run_store("in_process", rules, {}, seconds);
  if (ok && absl::GetFlag(FLAGS_grpc_floor)) ok = run_floor(seconds);
  if (ok && absl::GetFlag(FLAGS_redis)) {
    quota::testing::ScratchServer redis(quota::testing::scratch_dir("quota-server-bench-redis"));
    ok = redis.started() && run_store("redis", rules,
                                      {"--redis", "127.0.0.1:" + std::to_string(redis.port()),
                                       "--redis-deadline-ms", "1000"},
                                      seconds);
    if (ok && absl::GetFlag(FLAGS_leased)) {
      ok = run_store(
          "redis_leased", leased_rules,
          {"--redis", "127.0.0.1:" + std::to_string(redis.port()), "--redis-deadline-ms", "1000"},
          seconds);
    }
  }
  std::remove(rules.c_str());
  std::remove(leased_rules.c_str());
  return ok ? 0 : 1;
}
