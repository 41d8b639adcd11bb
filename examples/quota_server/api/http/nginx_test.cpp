// nginx_test — a real nginx (Debian's /usr/sbin/nginx, in $QUOTA_NGINX) in front of a
// small httplib backend, asking quota-server with auth_request before every request, with
// the shipped config (testdata/nginx.conf.in):
//   - 200 within the budget, 429 with Retry-After and RateLimit once it is spent, 401 for
//     an unknown API key, 503 when quota-server is stopped;
//   - the trust boundary: once a tenant's burst is spent, a client that sends quota's own
//     headers (X-Quota-Plan, -User, -Cost, -Attempt-Id, -Tenant, -Route; alone and all
//     together) gets 429 every time, and one that sends a fixed attempt id from its first
//     request gets no more than the burst — even with quota-server reading every header
//     (--auth-headers naming all): the config alone keeps the client's headers out.
//
// Everything runs on 127.0.0.1: quota-server ($QUOTA_SERVER) and the backend on ports
// they pick, nginx on a free port with its own prefix directory under $QUOTA_NGINX_DIR,
// in the foreground without a master process, stopped by pid.
#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "testing/scratch.hpp"
#include "testing/server_process.hpp"

namespace {

using quota::testing::env;

// A port no one listens on now (the kernel's pick for a socket bound and closed).
int free_port() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  socklen_t len = sizeof a;
  int port = 0;
  if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0) {
    port = ntohs(a.sin_port);
  }
  close(fd);
  return port;
}

std::string replace_all(std::string s, const std::string& from, const std::string& to) {
  for (auto at = s.find(from); at != std::string::npos; at = s.find(from, at + to.size())) {
    s.replace(at, from.size(), to);
  }
  return s;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// quota-server started with `rules` and `extra` flags, a backend answering GET /hello,
// and nginx with the shipped config in front of both. Everything stopped by pid at the
// end.
struct Stack {
  quota::testing::ServerProcess quota_server;
  httplib::Server backend;
  std::thread backend_thread;
  std::string prefix;
  pid_t nginx = -1;
  int nginx_port = 0;

  Stack(const std::string& rules, const std::vector<std::string>& extra) {
    std::vector<std::string> args = {
        env("QUOTA_SERVER"), "--rules", rules, "--default-plan", "free", "--grpc-port", "0",
        "--http-port",       "0"};
    args.insert(args.end(), extra.begin(), extra.end());
    REQUIRE(quota_server.start(args, {"grpc", "http"}));
    backend.Get("/hello", [](const httplib::Request&, httplib::Response& res) {
      res.set_content("hello\n", "text/plain");
    });
    const int backend_port = backend.bind_to_any_port("127.0.0.1");
    REQUIRE(backend_port > 0);
    backend_thread = std::thread([this] { backend.listen_after_bind(); });

    // nginx's prefix: its config, logs and temp directories, all under the build tree.
    static int instance = 0;
    prefix = env("QUOTA_NGINX_DIR") + "/run-" + std::to_string(getpid()) + "-" +
             std::to_string(++instance);
    REQUIRE(std::system(("mkdir -p '" + prefix + "/logs' '" + prefix + "/tmp'").c_str()) == 0);
    nginx_port = free_port();
    REQUIRE(nginx_port > 0);
    std::string conf = read_file(env("QUOTA_NGINX_CONF"));
    REQUIRE(!conf.empty());
    conf = replace_all(conf, "@PREFIX@", prefix);
    conf = replace_all(conf, "@LISTEN@", "127.0.0.1:" + std::to_string(nginx_port));
    conf = replace_all(conf, "@BACKEND@", "127.0.0.1:" + std::to_string(backend_port));
    conf = replace_all(conf, "@QUOTA@", "127.0.0.1:" + std::to_string(quota_server.port("http")));
    std::ofstream(prefix + "/nginx.conf") << conf;

    nginx = fork();
    if (nginx == 0) {
      const std::string exe = env("QUOTA_NGINX");
      execl(exe.c_str(), exe.c_str(), "-p", prefix.c_str(), "-c", (prefix + "/nginx.conf").c_str(),
            "-e", (prefix + "/logs/error.log").c_str(), static_cast<char*>(nullptr));
      _exit(127);
    }
    REQUIRE(nginx > 0);
  }

  ~Stack() {
    if (nginx > 0) {
      kill(nginx, SIGTERM);
      int status = 0;
      for (int i = 0; i < 100 && waitpid(nginx, &status, WNOHANG) == 0; ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
      if (waitpid(nginx, &status, WNOHANG) == 0) {
        kill(nginx, SIGKILL);
        waitpid(nginx, &status, 0);
      }
    }
    backend.stop();
    if (backend_thread.joinable()) backend_thread.join();
  }

  httplib::Client client() const {
    httplib::Client c("127.0.0.1", nginx_port);
    c.set_connection_timeout(5);
    c.set_read_timeout(10);
    return c;
  }

  // The first answer of nginx to GET /hello with `headers`, once it is up (at most 10 s).
  std::optional<httplib::Response> first(const httplib::Headers& headers) const {
    auto c = client();
    for (int i = 0; i < 100; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      if (auto r = c.Get("/hello", headers)) return r.value();
    }
    return std::nullopt;
  }

  std::string error_log() const { return read_file(prefix + "/logs/error.log"); }
};

}  // namespace

TEST_CASE("nginx auth_request: 200 within budget, 429 over it, 503 without quota-server") {
  REQUIRE(!env("QUOTA_NGINX").empty());
  Stack stack(env("QUOTA_SERVER_RULES"), {"--fresh-budgets-at-start"});
  httplib::Client client = stack.client();
  const httplib::Headers acme = {{"X-API-Key", "acme-key"}};
  const std::optional<httplib::Response> first = stack.first(acme);
  INFO("nginx error log: " << stack.error_log());
  REQUIRE(first);
  CHECK(first->status == 200);
  CHECK(first->body == "hello\n");
  CHECK(first->get_header_value("RateLimit") == "\"free-read\";r=9;t=100");

  // 9 more units, then the budget is spent: 429 with the quota headers nginx passed on.
  int admitted = 1;
  std::optional<httplib::Response> denied;
  for (int i = 0; i < 20; ++i) {
    auto r = client.Get("/hello", acme);
    REQUIRE(r);
    if (r->status != 200) {
      denied = r.value();
      break;
    }
    ++admitted;
  }
  CHECK(admitted == 10);
  REQUIRE(denied);
  CHECK(denied->status == 429);
  const int retry_after = std::atoi(denied->get_header_value("Retry-After").c_str());
  CHECK(retry_after >= 1);
  CHECK(retry_after <= 100);
  CHECK_THAT(denied->get_header_value("RateLimit"),
             Catch::Matchers::StartsWith("\"free-read\";r=0;t="));
  CHECK(denied->get_header_value("RateLimit-Policy") == "\"free-read\";q=10;w=1000");

  auto unknown = client.Get("/hello", {{"X-API-Key", "nobody"}});
  REQUIRE(unknown);
  CHECK(unknown->status == 401);

  // quota-server stopped: nginx cannot ask, so 503, never 200 and never 429.
  stack.quota_server.stop();
  auto down = client.Get("/hello", acme);
  REQUIRE(down);
  CHECK(down->status == 503);
  CHECK(down->get_header_value("Retry-After") == "1");
}

TEST_CASE("nginx auth_request: a client gains nothing by sending quota's own headers") {
  REQUIRE(!env("QUOTA_NGINX").empty());
  // quota-server reads every X-Quota-* header here: only the config keeps the client's out.
  Stack stack(env("QUOTA_TRUST_RULES"), {"--fresh-budgets-at-start", "--auth-headers",
                                         "tenant,route,plan,user,cost,attempt-id"});
  httplib::Client client = stack.client();
  const httplib::Headers acme = {{"X-API-Key", "acme-key"}};
  const std::optional<httplib::Response> first = stack.first(acme);
  INFO("nginx error log: " << stack.error_log());
  REQUIRE(first);
  REQUIRE(first->status == 200);
  // The rest of free's burst of 6, then 429.
  for (int i = 1; i < 6; ++i) {
    auto r = client.Get("/hello", acme);
    REQUIRE(r);
    CHECK(r->status == 200);
  }
  auto spent = client.Get("/hello", acme);
  REQUIRE(spent);
  REQUIRE(spent->status == 429);

  const std::vector<std::pair<std::string, std::string>> forged = {
      {"X-Quota-Plan", "gold"},  {"X-Quota-User", "someone-else"},   {"X-Quota-Cost", "0"},
      {"X-Quota-Cost", "-5"},    {"X-Quota-Attempt-Id", "replay-1"}, {"X-Quota-Tenant", "beta"},
      {"X-Quota-Route", "write"}};
  httplib::Headers all = acme;
  for (const auto& [name, value] : forged) {
    all.emplace(name, value);
    httplib::Headers one = acme;
    one.emplace(name, value);
    for (int i = 0; i < 5; ++i) {
      auto r = client.Get("/hello", one);
      REQUIRE(r);
      INFO(name << ": " << value << ", request " << i);
      CHECK(r->status == 429);
    }
  }
  for (int i = 0; i < 5; ++i) {
    auto r = client.Get("/hello", all);
    REQUIRE(r);
    INFO("every header at once, request " << i);
    CHECK(r->status == 429);
  }

  // Another tenant sends one attempt id from its first request on: each request is
  // decided on its own (nothing replays the first ALLOW), so no more than the burst.
  const httplib::Headers beta = {{"X-API-Key", "beta-key"}, {"X-Quota-Attempt-Id", "fixed-1"}};
  int admitted = 0;
  for (int i = 0; i < 10; ++i) {
    auto r = client.Get("/hello", beta);
    REQUIRE(r);
    CHECK((r->status == 200 || r->status == 429));
    admitted += r->status == 200;
  }
  CHECK(admitted == 6);
}
