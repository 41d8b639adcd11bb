// readyz_test — GET /readyz reflects the budget store (Checker::store_ready): quota-server
// on a real redis-server is ready while Redis decides, 503 (naming why) while Redis is
// stopped (SIGSTOP: every call runs into its deadline), and ready again once it is
// continued; /healthz stays 200 throughout (the process serves). In process, ready. A
// redis:// URL where HOST:PORT is expected is refused at start (exit 2), never taken for a
// host name that then fails every check.
#include <httplib.h>
#include <signal.h>

#include <sys/wait.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <string>

#include "redis/support/redis_server.hpp"
#include "testing/probes.hpp"
#include "testing/scratch.hpp"
#include "testing/server_process.hpp"

namespace {

using quota::testing::env;

// GET `path`: the status (0 when no answer) and the body.
std::pair<int, std::string> get(int port, const char* path) {
  httplib::Client c("127.0.0.1", port);
  c.set_read_timeout(10);
  auto r = c.Get(path);
  return r ? std::pair{r->status, r->body} : std::pair{0, std::string()};
}

// A rule file of one bucket in `dir`: its path.
std::string write_rules(const quota::testing::TempDir& dir) {
  return dir.write("rules.yaml",
                   "routes:\n  - name: read\nrules:\n  - name: r\n    level: tenant\n"
                   "    plan: free\n    route: read\n    token_bucket: {rate: 10/s, burst: 10}\n");
}

}  // namespace

TEST_CASE("/readyz is 503 while Redis cannot decide and 200 once it can", "[redis]") {
  quota::testing::ScratchServer redis(quota::testing::scratch_dir("quota-server-readyz"));
  REQUIRE(redis.started());
  quota::testing::TempDir dir("readyz");
  const std::string rules = write_rules(dir);
  quota::testing::ServerProcess s;
  REQUIRE(s.start({env("QUOTA_SERVER"), "--rules", rules, "--default-plan", "free",
                   "--default-route", "read", "--grpc-port", "0", "--http-port", "0", "--redis",
                   "127.0.0.1:" + std::to_string(redis.port()), "--redis-deadline-ms", "200"},
                  {"grpc", "http"}));
  const int port = s.port("http");
  // "http listening" is printed just before the server marks itself ready.
  REQUIRE(quota::testing::eventually([&] { return get(port, "/readyz").first == 200; }));

  REQUIRE(::kill(static_cast<pid_t>(redis.pid()), SIGSTOP) == 0);
  std::pair<int, std::string> down;
  CHECK(quota::testing::eventually([&] {
    down = get(port, "/readyz");
    return down.first == 503 &&
           down.second.find("the budget store cannot decide") != std::string::npos;
  }));
  CHECK_THAT(down.second, Catch::Matchers::Contains("the budget store cannot decide"));
  CHECK(get(port, "/healthz").first == 200);

  REQUIRE(::kill(static_cast<pid_t>(redis.pid()), SIGCONT) == 0);
  CHECK(quota::testing::eventually([&] { return get(port, "/readyz").first == 200; }));
}

TEST_CASE("/readyz in process: 200 once serving") {
  quota::testing::TempDir dir("readyz_local");
  const std::string rules = write_rules(dir);
  quota::testing::ServerProcess s;
  REQUIRE(s.start({env("QUOTA_SERVER"), "--rules", rules, "--default-plan", "free", "--grpc-port",
                   "0", "--http-port", "0"},
                  {"grpc", "http"}));
  CHECK(quota::testing::eventually([&] { return get(s.port("http"), "/readyz").first == 200; }));
}

TEST_CASE("a redis:// URL is refused at start, naming the form expected") {
  for (const std::string flag : {"--redis", "--redis-cluster"}) {
    const std::string cmd =
        env("QUOTA_SERVER") + " --rules /nonexistent " + flag + " redis://127.0.0.1:6379 2>&1";
    FILE* p = ::popen(cmd.c_str(), "r");
    REQUIRE(p != nullptr);
    std::string out;
    char buf[512];
    while (std::fgets(buf, sizeof buf, p) != nullptr) out += buf;
    const int status = ::pclose(p);
    INFO(flag << ": " << out);
    CHECK(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 2);
    CHECK_THAT(out, Catch::Matchers::Contains("not a redis:// URL"));
  }
}
