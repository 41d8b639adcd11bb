// nginx_test — a real nginx (Debian's /usr/sbin/nginx, in $QUOTA_NGINX) in front of a
// small httplib backend, asking quota-server with auth_request before every request:
// 200 within the budget, 429 with Retry-After and RateLimit once it is spent, 401 for an
// unknown API key, 503 when quota-server is stopped.
//
// Everything runs on 127.0.0.1: quota-server ($QUOTA_SERVER, rules $QUOTA_SERVER_RULES:
// the read route holds 10 units refilled 1 per 100 s) and the backend on ports they pick,
// nginx on a free port with its own prefix directory under $QUOTA_NGINX_DIR, the config
// written from testdata/nginx.conf.in (the config docs/service.md explains), in the
// foreground without a master process, stopped by pid.
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

}  // namespace

TEST_CASE("nginx auth_request: 200 within budget, 429 over it, 503 without quota-server") {
  REQUIRE(!env("QUOTA_NGINX").empty());
  quota::testing::ServerProcess quota_server;
  REQUIRE(quota_server.start({env("QUOTA_SERVER"), "--rules", env("QUOTA_SERVER_RULES"),
                              "--default-plan", "free", "--grpc-port", "0", "--http-port", "0"},
                             {"grpc", "http"}));

  httplib::Server backend;
  backend.Get("/hello", [](const httplib::Request&, httplib::Response& res) {
    res.set_content("hello\n", "text/plain");
  });
  const int backend_port = backend.bind_to_any_port("127.0.0.1");
  REQUIRE(backend_port > 0);
  std::thread backend_thread([&] { backend.listen_after_bind(); });

  // nginx's prefix: its config, logs and temp directories, all under the build tree.
  const std::string prefix = env("QUOTA_NGINX_DIR") + "/run-" + std::to_string(getpid());
  REQUIRE(std::system(("mkdir -p '" + prefix + "/logs' '" + prefix + "/tmp'").c_str()) == 0);
  const int nginx_port = free_port();
  REQUIRE(nginx_port > 0);
  std::string conf = read_file(env("QUOTA_NGINX_CONF"));
  REQUIRE(!conf.empty());
  conf = replace_all(conf, "@PREFIX@", prefix);
  conf = replace_all(conf, "@LISTEN@", "127.0.0.1:" + std::to_string(nginx_port));
  conf = replace_all(conf, "@BACKEND@", "127.0.0.1:" + std::to_string(backend_port));
  conf = replace_all(conf, "@QUOTA@", "127.0.0.1:" + std::to_string(quota_server.port("http")));
  std::ofstream(prefix + "/nginx.conf") << conf;

  const pid_t nginx = fork();
  if (nginx == 0) {
    const std::string exe = env("QUOTA_NGINX");
    execl(exe.c_str(), exe.c_str(), "-p", prefix.c_str(), "-c", (prefix + "/nginx.conf").c_str(),
          "-e", (prefix + "/logs/error.log").c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  REQUIRE(nginx > 0);

  httplib::Client client("127.0.0.1", nginx_port);
  client.set_connection_timeout(5);
  client.set_read_timeout(10);
  const httplib::Headers acme = {{"X-API-Key", "acme-key"}};
  // nginx is up when it answers; at most 10 s.
  std::optional<httplib::Response> first;
  for (int i = 0; i < 100 && !first; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    if (auto r = client.Get("/hello", acme)) first = r.value();
  }
  INFO("nginx error log: " << read_file(prefix + "/logs/error.log"));
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
  quota_server.stop();
  auto down = client.Get("/hello", acme);
  REQUIRE(down);
  CHECK(down->status == 503);
  CHECK(down->get_header_value("Retry-After") == "1");

  kill(nginx, SIGTERM);
  int status = 0;
  for (int i = 0; i < 100 && waitpid(nginx, &status, WNOHANG) == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  if (waitpid(nginx, &status, WNOHANG) == 0) {
    kill(nginx, SIGKILL);
    waitpid(nginx, &status, 0);
  }
  backend.stop();
  backend_thread.join();
}
