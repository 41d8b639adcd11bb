// quota_server_failover_safety_rules_test — a sliding_log rule under
// --redis-failover-safety is refused when the rules are loaded
// (failover_safety_rules.hpp), over real processes: a real redis-server
// (quota/testing/redis_server.hpp RedisServer, stopped by pid) and quota-server.
//
//   - at start, from a rule file or from rules published in Redis: exit 2, the message
//     names the rule, its place (file:line:column: rules[i].sliding_log, or the published
//     version) and the option; failover safety is on by default, and the same rules
//     start with --redis-failover-safety=false;
//   - on a hot reload of the file and on a version published in Redis: the new set is
//     refused like any invalid one (stderr, quota_config_loads_total{outcome="error"}),
//     the rules in force stay and keep deciding; the next valid set is applied.
#include <httplib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <thread>

#include "redis/support/redis_server.hpp"
#include "testing/metrics_text.hpp"
#include "testing/probes.hpp"
#include "testing/scratch.hpp"
#include "testing/server_process.hpp"

namespace {

using quota::testing::check_body;
using quota::testing::RedisServer;
using quota::testing::env;
using quota::testing::eventually;
using quota::testing::http_get;
using quota::testing::metric_value;
using quota::testing::read_all;
using quota::testing::ServerProcess;
using quota::testing::TempDir;

// A rule file: route read pays 1 unit; plan free's tenant bucket of `burst` and, with
// `log`, a sliding log "audit-log" on the route's `calls` (line 14: its policy).
std::string rules_text(int burst, bool log, int version = 0) {
  std::string t = version > 0 ? "version: " + std::to_string(version) + "\n" : "";
  t += "routes:\n  - name: read\n    costs: {units: 1" + std::string(log ? ", calls: 1" : "") +
       "}\nrules:\n  - name: units\n    level: tenant\n    plan: free\n    limit: units\n" +
       "    token_bucket: {rate: 1/1000s, burst: " + std::to_string(burst) + "}\n";
  if (log) {
    t += "  - name: audit-log\n    level: tenant\n    plan: free\n    limit: calls\n"
         "    sliding_log: {limit: 100, window: 1s}\n";
  }
  return t;
}

// Runs `quota-server <args>` to its end: its exit code and output (stdout and stderr).
std::pair<int, std::string> run(const std::string& args) {
  FILE* p = ::popen((env("QUOTA_SERVER") + " " + args + " 2>&1").c_str(), "r");
  REQUIRE(p != nullptr);
  std::string out;
  char buf[512];
  while (std::fgets(buf, sizeof buf, p) != nullptr) out += buf;
  const int status = ::pclose(p);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

// The refusal's words, wherever the rules came from.
void check_names_rule_and_option(const std::string& out) {
  CHECK(out.find("rule \"audit-log\" is a sliding_log") != std::string::npos);
  CHECK(out.find("--redis-failover-safety does not take") != std::string::npos);
  CHECK(out.find("--redis-failover-safety=false") != std::string::npos);
}

}  // namespace

TEST_CASE("a sliding_log rule under failover safety (the default) is refused at start") {
  RedisServer redis("server-fs-start", {});
  REQUIRE(redis.started());
  TempDir dir("fs_start");
  const std::string where = "--redis=127.0.0.1:" + std::to_string(redis.port());
  const std::string file = dir.write("log.yaml", rules_text(5, true));
  const std::string common =
      " --default-plan free --default-route read --grpc-port 0 --http-port 0 " + where;

  SECTION("from the rule file, default flags: exit 2 with file:line:column, the rule, the option") {
    const auto [code, out] = run("--rules " + file + common);
    INFO(out);
    CHECK(code == 2);
    CHECK(out.find(file + ":14:18: rules[1].sliding_log: ") != std::string::npos);
    check_names_rule_and_option(out);
    CHECK(out.find("listening") == std::string::npos);
  }
  SECTION("from the rules published in Redis: exit 2 naming the published version") {
    const std::string key = "--rules-key=fs-start-" + std::to_string(::getpid());
    const auto [pcode, pout] = run("publish " + where + " " + key + " --rules=" + file);
    INFO(pout);
    REQUIRE(pcode == 0);
    const auto [code, out] = run("--rules-from-redis " + key + common + " --redis-failover-safety");
    INFO(out);
    CHECK(code == 2);
    CHECK(out.find("redis {fs-start-") != std::string::npos);
    CHECK(out.find(" version 1:14:18: rules[1].sliding_log: ") != std::string::npos);
    check_names_rule_and_option(out);
  }
  SECTION("with --redis-failover-safety=false the same rules start and decide") {
    ServerProcess s;
    REQUIRE(s.start({env("QUOTA_SERVER"), "--rules", file, "--default-plan", "free",
                     "--default-route", "read", "--grpc-port", "0", "--http-port", "0", where,
                     "--redis-deadline-ms", "2000", "--redis-failover-safety=false"},
                    {"grpc", "http"}));
    const std::string body = check_body(s.port("http"), "fs-" + std::to_string(::getpid()));
    INFO(body);
    CHECK(body.find("\"allowed\":true") != std::string::npos);
    CHECK(s.stop() == 0);
  }
}

TEST_CASE("a reload that adds a sliding_log rule under --redis-failover-safety changes nothing") {
  RedisServer redis("server-fs-reload", {});
  REQUIRE(redis.started());
  TempDir dir("fs_reload");
  const std::string where = "--redis=127.0.0.1:" + std::to_string(redis.port());
  const std::string tenant = "fs-" + std::to_string(::getpid());
  // Counts the refusals and reads the rule version a server serves.
  const auto refusals = [](int port) {
    return metric_value(http_get(port, "/metrics"), R"(quota_config_loads_total{outcome="error"})");
  };
  const auto version = [](int port) {
    return metric_value(http_get(port, "/metrics"), "quota_rule_version");
  };

  SECTION("the rule file, hot reloaded") {
    const std::string file = dir.write("rules.yaml", rules_text(5, false));
    ServerProcess s;
    const std::string log = dir.path + "/server.log";
    s.set_stderr(log);
    REQUIRE(s.start({env("QUOTA_SERVER"), "--rules", file, "--default-plan", "free",
                     "--default-route", "read", "--grpc-port", "0", "--http-port", "0", where,
                     "--redis-failover-safety", "--redis-deadline-ms", "2000"},
                    {"grpc", "http"}));
    const int port = s.port("http");
    CHECK(check_body(port, tenant).find("\"remaining\":4") != std::string::npos);

    // Renamed into place, as rule files should be written.
    std::rename(dir.write("next.yaml", rules_text(50, true)).c_str(), file.c_str());
    REQUIRE(eventually([&] { return refusals(port) == 1; }));
    const std::string err = read_all(log);
    INFO(err);
    CHECK(err.find("rule file not reloaded (version 1 stays in force): " + file +
                   ":14:18: rules[1].sliding_log: ") != std::string::npos);
    check_names_rule_and_option(err);
    CHECK(version(port) == 1);
    // Still version 1's bucket (burst 5: 3 left), and no sliding log in the way.
    const std::string body = check_body(port, tenant);
    INFO(body);
    CHECK(body.find("\"applied_rule_version\":1") != std::string::npos);
    CHECK(body.find("\"remaining\":3") != std::string::npos);

    // The next valid file is taken.
    std::rename(dir.write("next.yaml", rules_text(50, false, 3)).c_str(), file.c_str());
    CHECK(eventually([&] { return version(port) == 3; }));
    CHECK(refusals(port) == 1);
    CHECK(s.stop() == 0);
  }
  SECTION("a version published in Redis") {
    const std::string key = "--rules-key=fs-reload-" + std::to_string(::getpid());
    const auto publish = [&](const std::string& name, const std::string& text) {
      const auto [code, out] =
          run("publish " + where + " " + key + " --rules=" + dir.write(name, text));
      INFO(out);
      REQUIRE(code == 0);
    };
    publish("v1.yaml", rules_text(5, false));
    ServerProcess s;
    const std::string log = dir.path + "/server.log";
    s.set_stderr(log);
    REQUIRE(s.start({env("QUOTA_SERVER"), "--rules-from-redis", key, "--default-plan", "free",
                     "--default-route", "read", "--grpc-port", "0", "--http-port", "0", where,
                     "--redis-failover-safety", "--redis-deadline-ms", "2000"},
                    {"grpc", "http"}));
    const int port = s.port("http");
    CHECK(check_body(port, tenant).find("\"remaining\":4") != std::string::npos);

    publish("v2.yaml", rules_text(50, true));
    REQUIRE(eventually([&] { return refusals(port) == 1; }));
    const std::string err = read_all(log);
    INFO(err);
    CHECK(err.find(
              "shared rules version 2 not applied (version 1 stays in force): redis {fs-reload-") !=
          std::string::npos);
    CHECK(err.find(" version 2:14:18: rules[1].sliding_log: ") != std::string::npos);
    check_names_rule_and_option(err);
    const std::string m = http_get(port, "/metrics");
    CHECK(metric_value(m, "quota_rule_version") == 1);
    CHECK(metric_value(m, "quota_rules_version_lag") == 1);
    const std::string body = check_body(port, tenant);
    INFO(body);
    CHECK(body.find("\"applied_rule_version\":1") != std::string::npos);
    CHECK(body.find("\"remaining\":3") != std::string::npos);

    publish("v3.yaml", rules_text(50, false));
    CHECK(eventually([&] { return version(port) == 3; }));
    CHECK(refusals(port) == 1);
    CHECK(s.stop() == 0);
  }
}
