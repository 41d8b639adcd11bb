// quota_server_shared_rules_test — one rule set for every server, published in Redis
// (shared_rules.hpp, rule_subscriber.hpp, rules_admin.hpp), over real processes: a real
// redis-server (quota/testing/redis_server.hpp RedisServer, stopped by pid),
// two quota-server processes with --rules-from-redis and the `publish` and `instances`
// subcommands, all on loopback.
//
//   - a published version is applied by both servers (a bounded wait, not a timing
//     assertion), answered with (applied_rule_version, the new burst), listed by
//     `instances`, and quota_rules_version_lag goes to 0;
//   - an invalid file is refused with file:line:column: field, and a `version:` not above
//     the published one with its line; nothing changes in Redis or in the servers;
//   - a version in a format the server cannot read (written to Redis directly): the rules
//     in force stay, the refusal is logged and counted, quota_rules_version_lag is 1;
//   - a paused Redis: the servers keep their rules and say so (log, /metrics), then apply
//     the next version once it answers again;
//   - Redis restarted empty under two servers at version 3 ([drift]): `publish` starts
//     again at version 1 with other rules and warns; the servers refuse it and then
//     another version 3 (log once each, quota_rules_refused_*, `instances`), keep
//     version 3's rules, and apply `publish --force-version 4`; digests in /metrics and
//     `instances` show who applied what was published;
//   - on a Redis Cluster ([cluster], the tests' cluster fixture): published through one
//     node, followed by servers seeded at two others (the keys share one slot).
#include <httplib.h>
#include <signal.h>
#include <stdlib.h>
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
#include <vector>

#include "quota/redis/transport/connection.hpp"
#include "redis/support/redis_server.hpp"
#include "testing/metrics_text.hpp"
#include "testing/probes.hpp"
#include "testing/scratch.hpp"
#include "testing/server_process.hpp"

namespace {

using quota::testing::check_body;
using quota::testing::RedisServer;
using quota::testing::eventually;
using quota::testing::metric_value;
using quota::testing::read_all;
using quota::testing::ServerProcess;

using quota::testing::env;

using quota::testing::TempDir;

// A rule file: one route, plan free's tenant bucket of `burst` (no refill while the test
// runs), and `version:` when given.
std::string rules_text(int burst, int version = 0) {
  std::string t = version > 0 ? "version: " + std::to_string(version) + "\n" : "";
  return t + "routes:\n  - name: read\nrules:\n  - name: shared\n    level: tenant\n" +
         "    plan: free\n    route: read\n    token_bucket: {rate: 1/1000s, burst: " +
         std::to_string(burst) + "}\n";
}

// Runs `quota-server <args>`: its exit code and output (stdout and stderr).
std::pair<int, std::string> run(const std::string& args) {
  FILE* p = ::popen((env("QUOTA_SERVER") + " " + args + " 2>&1").c_str(), "r");
  REQUIRE(p != nullptr);
  std::string out;
  char buf[512];
  while (std::fgets(buf, sizeof buf, p) != nullptr) out += buf;
  const int status = ::pclose(p);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

std::string metrics(int port) {
  httplib::Client c("127.0.0.1", port);
  c.set_read_timeout(10);
  auto r = c.Get("/metrics");
  return r ? r->body : std::string();
}

}  // namespace

TEST_CASE(
    "a published rule set reaches every server; invalid files and a paused Redis change "
    "nothing",
    "[single]") {
  RedisServer redis("server-shared-rules", {});
  REQUIRE(redis.started());
  TempDir dir("shared");
  const std::string where = "--redis=127.0.0.1:" + std::to_string(redis.port());
  const std::string key = "--rules-key=shared-" + std::to_string(::getpid());

  // Nothing published: a server refuses to start and says why.
  {
    const auto [code, out] = run("--rules-from-redis " + where + " " + key);
    INFO(out);
    CHECK(code == 1);
    CHECK(out.find("no rules are published") != std::string::npos);
  }

  const auto [code1, out1] =
      run("publish " + where + " " + key + " --rules=" + dir.write("v1.yaml", rules_text(5)));
  INFO(out1);
  REQUIRE(code1 == 0);
  CHECK(out1.find("published version 1 ") != std::string::npos);

  ServerProcess a, b;
  const std::string a_log = dir.path + "/a.log";
  a.set_stderr(a_log);
  for (auto [s, id] : {std::pair{&a, "server-a"}, std::pair{&b, "server-b"}}) {
    REQUIRE(s->start({env("QUOTA_SERVER"), "--rules-from-redis", where, key, "--instance-id", id,
                      "--default-plan", "free", "--default-route", "read", "--grpc-port", "0",
                      "--http-port", "0", "--redis-deadline-ms", "2000"},
                     {"grpc", "http"}));
  }
  const std::string tenant = "t" + std::to_string(::getpid());
  {
    const std::string body = check_body(a.port("http"), tenant);
    INFO(body);
    CHECK(body.find("\"applied_rule_version\":1") != std::string::npos);
    CHECK(body.find("\"remaining\":4") != std::string::npos);  // burst 5, 1 spent
  }

  // Version 2 (burst 50): both servers apply it and answer with it.
  const auto [code2, out2] =
      run("publish " + where + " " + key + " --rules=" + dir.write("v2.yaml", rules_text(50)));
  INFO(out2);
  REQUIRE(code2 == 0);
  CHECK(out2.find("published version 2 ") != std::string::npos);
  for (ServerProcess* s : {&a, &b}) {
    const int port = s->port("http");
    CHECK(eventually([&] {
      const std::string m = metrics(port);
      return metric_value(m, "quota_rule_version") == 2 &&
             metric_value(m, "quota_rules_published_version") == 2 &&
             metric_value(m, "quota_rules_version_lag") == 0;
    }));
    // A tenant of its own: the budgets are shared in Redis too.
    const std::string body = check_body(port, tenant + "-v2-" + std::to_string(port));
    INFO(body);
    CHECK(body.find("\"applied_rule_version\":2") != std::string::npos);
    CHECK(body.find("\"remaining\":49") != std::string::npos);
  }
  // Their heartbeats say version 2.
  CHECK(eventually([&] {
    const auto [code, out] = run("instances " + where + " " + key);
    return code == 0 && out.find("published version 2 digest ") != std::string::npos &&
           out.find("server-a version 2 age ") != std::string::npos &&
           out.find("server-b version 2 age ") != std::string::npos;
  }));

  // An invalid file: refused with file:line:column: field; Redis and the servers unchanged.
  {
    const std::string bad = dir.write("bad.yaml", rules_text(0));
    const auto [code, out] = run("publish " + where + " " + key + " --rules=" + bad);
    INFO(out);
    CHECK(code == 1);
    CHECK(out.find(bad + ":8:") != std::string::npos);
    CHECK(out.find("rules[0].token_bucket.burst") != std::string::npos);
  }
  // A `version:` not above the published one: refused, naming its line.
  {
    const std::string old = dir.write("old.yaml", rules_text(7, 2));
    const auto [code, out] = run("publish " + where + " " + key + " --rules=" + old);
    INFO(out);
    CHECK(code == 1);
    CHECK(out.find(old + ":1:") != std::string::npos);
    CHECK(out.find("version 2 is not greater than the version in force, 2") != std::string::npos);
  }
  {
    const auto [code, out] = run("instances " + where + " " + key);
    INFO(out);
    CHECK(code == 0);
    CHECK(out.find("published version 2 digest ") != std::string::npos);
  }
  CHECK(metric_value(metrics(a.port("http")), "quota_rule_version") == 2);

  // A version this server cannot read (written past `publish`, as a newer publisher's
  // format would be): not applied, logged, counted; the lag shows it.
  {
    quota::redis::Connection direct(
        quota::redis::ConnectionConfig{.host = "127.0.0.1", .port = redis.port()});
    const std::string rules_key = "{shared-" + std::to_string(::getpid()) + "}:rules";
    auto r =
        direct.command({"HSET", rules_key, "version", "3", "format", "quota-next", "text", "x"},
                       quota::redis::Deadline::after(std::chrono::seconds(2)));
    REQUIRE(r.ok());
  }
  CHECK(eventually([&] {
    const std::string m = metrics(a.port("http"));
    return metric_value(m, "quota_rules_published_version") == 3 &&
           metric_value(m, "quota_rules_version_lag") == 1 &&
           metric_value(m, "quota_config_loads_total{outcome=\"error\"}") == 1;
  }));
  CHECK(metric_value(metrics(a.port("http")), "quota_rule_version") == 2);
  CHECK(read_all(a_log).find("shared rules version 3 not applied (version 2 stays in force)") !=
        std::string::npos);
  CHECK(read_all(a_log).find("format \"quota-next\" is not one this server reads") !=
        std::string::npos);

  // Redis paused: the servers keep version 2 and report it; once it answers again, the
  // next version (the file's own version: 9) is applied.
  REQUIRE(redis.kill(SIGSTOP));
  CHECK(eventually(
      [&] { return metric_value(metrics(a.port("http")), "quota_shared_rules_redis_up") == 0; }));
  CHECK(metric_value(metrics(a.port("http")), "quota_rule_version") == 2);
  CHECK(read_all(a_log).find("shared rules: redis cannot answer (version 2 stays in force)") !=
        std::string::npos);
  REQUIRE(redis.kill(SIGCONT));
  const auto [code3, out3] =
      run("publish " + where + " " + key + " --rules=" + dir.write("v9.yaml", rules_text(90, 9)));
  INFO(out3);
  REQUIRE(code3 == 0);
  CHECK(out3.find("published version 9 ") != std::string::npos);
  for (ServerProcess* s : {&a, &b}) {
    const int port = s->port("http");
    CHECK(eventually([&] {
      const std::string m = metrics(port);
      return metric_value(m, "quota_rule_version") == 9 &&
             metric_value(m, "quota_rules_version_lag") == 0 &&
             metric_value(m, "quota_shared_rules_redis_up") == 1;
    }));
  }
  CHECK(read_all(a_log).find("shared rules: redis answers again") != std::string::npos);
  CHECK(a.stop() == 0);
  CHECK(b.stop() == 0);
}

// The word after `before` in `text` (up to a space or the end of the line); empty when
// `before` is absent.
std::string word_after(const std::string& text, const std::string& before) {
  const std::size_t at = text.find(before);
  if (at == std::string::npos) return {};
  const std::size_t from = at + before.size();
  return text.substr(from, text.find_first_of(" \n", from) - from);
}

// How often `needle` occurs in `text`.
int occurrences(const std::string& text, const std::string& needle) {
  int n = 0;
  for (std::size_t at = text.find(needle); at != std::string::npos;
       at = text.find(needle, at + 1)) {
    ++n;
  }
  return n;
}

// Run by quota_server_shared_rules_drift_test.
TEST_CASE(
    "Redis restarted empty: a lower or equal version with another digest is refused loudly; "
    "--force-version recovers",
    "[drift]") {
  RedisServer redis("server-shared-drift", {});
  REQUIRE(redis.started());
  TempDir dir("drift");
  const std::string where = "--redis=127.0.0.1:" + std::to_string(redis.port());
  const std::string key = "--rules-key=drift-" + std::to_string(::getpid());
  const auto publish = [&](const std::string& name, const std::string& text,
                           const std::string& extra = "") {
    return run("publish " + where + " " + key + " " + extra + " --rules=" + dir.write(name, text));
  };

  REQUIRE(publish("v1.yaml", rules_text(5)).first == 0);
  ServerProcess a, b;
  const std::string a_log = dir.path + "/a.log";
  a.set_stderr(a_log);
  for (auto [s, id] : {std::pair{&a, "server-a"}, std::pair{&b, "server-b"}}) {
    REQUIRE(s->start({env("QUOTA_SERVER"), "--rules-from-redis", where, key, "--instance-id", id,
                      "--default-plan", "free", "--default-route", "read", "--grpc-port", "0",
                      "--http-port", "0", "--redis-deadline-ms", "2000",
                      // A budget first used after Redis restarted then starts full, so
                      // the answers show the burst of the rules in force.
                      "--redis-failover-safety=false"},
                     {"grpc", "http"}));
  }
  REQUIRE(publish("v2.yaml", rules_text(6)).first == 0);
  const auto [code3, out3] = publish("v3.yaml", rules_text(7));
  INFO(out3);
  REQUIRE(code3 == 0);
  CHECK(out3.find("published version 3 ") != std::string::npos);
  const std::string digest3 = word_after(out3, " digest ");
  CHECK(digest3.size() == 16);
  for (ServerProcess* s : {&a, &b}) {
    const int port = s->port("http");
    CHECK(eventually([&] {
      const std::string m = metrics(port);
      return metric_value(m, "quota_rule_version") == 3 &&
             metric_value(m, "quota_rules_version_lag") == 0 &&
             metric_value(
                 m, "quota_rules_digest_info{rules=\"applied\",digest=\"" + digest3 + "\"}") == 1 &&
             metric_value(
                 m, "quota_rules_digest_info{rules=\"published\",digest=\"" + digest3 + "\"}") == 1;
    }));
  }
  // Every instance applied what was published, and `instances` says so.
  CHECK(eventually([&] {
    const auto [code, out] = run("instances " + where + " " + key);
    return code == 0 &&
           out.find("published version 3 digest " + digest3 + "\n") != std::string::npos &&
           word_after(out, "server-a version 3 age ").size() > 0 &&
           out.find("2 of 2 instances applied the published rules") != std::string::npos &&
           occurrences(out, " digest " + digest3) == 3;
  }));

  // Redis restarts empty (no persistence): everything published is gone.
  REQUIRE(redis.restart());
  // The heartbeats come back; `publish` starts again at version 1, with other rules, and
  // warns that the servers will refuse it.
  CHECK(eventually([&] {
    const auto [code, out] = run("instances " + where + " " + key);
    return code == 0 && out.find("server-a version 3 ") != std::string::npos &&
           out.find("server-b version 3 ") != std::string::npos;
  }));
  const auto [code_r1, out_r1] = publish("r1.yaml", rules_text(50));
  INFO(out_r1);
  REQUIRE(code_r1 == 0);
  CHECK(out_r1.find("published version 1 ") != std::string::npos);
  const std::string digest_r1 = word_after(out_r1, " digest ");
  CHECK(digest_r1.size() == 16);
  CHECK(digest_r1 != digest3);
  CHECK(out_r1.find("server-a has applied version 3") != std::string::npos);
  CHECK(out_r1.find("--force-version 4") != std::string::npos);

  // The servers refuse it, loudly: /metrics, the log, `instances`; version 3 stays.
  for (ServerProcess* s : {&a, &b}) {
    const int port = s->port("http");
    CHECK(eventually([&] {
      const std::string m = metrics(port);
      return metric_value(m, "quota_rules_refused_total{reason=\"digest_mismatch\"}") == 1 &&
             metric_value(m, "quota_rules_refused_version") == 1 &&
             metric_value(m, "quota_rules_published_version") == 1 &&
             metric_value(m, "quota_rule_version") == 3 &&
             metric_value(
                 m, "quota_rules_digest_info{rules=\"applied\",digest=\"" + digest3 + "\"}") == 1 &&
             metric_value(m, "quota_rules_digest_info{rules=\"published\",digest=\"" + digest_r1 +
                                 "\"}") == 1;
    }));
    const std::string body = check_body(port, "drift-" + std::to_string(port));
    INFO(body);
    CHECK(body.find("\"applied_rule_version\":3") != std::string::npos);
    CHECK(body.find("\"remaining\":6") != std::string::npos);  // burst 7: version 3's
  }
  CHECK(eventually([&] {
    const auto [code, out] = run("instances " + where + " " + key);
    return code == 0 &&
           out.find("published version 1 digest " + digest_r1 + "\n") != std::string::npos &&
           out.find("digest " + digest3 + " refused version 1 digest " + digest_r1) !=
               std::string::npos &&
           occurrences(out, " refused version 1 ") == 2 &&
           out.find("0 of 2 instances applied the published rules") != std::string::npos;
  }));
  CHECK(eventually([&] {
    return read_all(a_log).find("shared rules version 1 (digest " + digest_r1 + ") refused") !=
           std::string::npos;
  }));

  // Two more publishes reach another version 3: refused too, each logged once.
  REQUIRE(publish("r2.yaml", rules_text(51)).first == 0);
  const auto [code_r3, out_r3] = publish("r3.yaml", rules_text(52));
  INFO(out_r3);
  REQUIRE(code_r3 == 0);
  CHECK(out_r3.find("published version 3 ") != std::string::npos);
  const std::string digest_r3 = word_after(out_r3, " digest ");
  CHECK(eventually([&] {
    const std::string m = metrics(a.port("http"));
    return metric_value(m, "quota_rules_refused_version") == 3 &&
           metric_value(m, "quota_rules_refused_total{reason=\"digest_mismatch\"}") >= 2 &&
           metric_value(m, "quota_rules_version_lag") == 0 &&
           metric_value(m, "quota_rule_version") == 3;
  }));
  CHECK(eventually([&] {
    const auto [code, out] = run("instances " + where + " " + key);
    return code == 0 && occurrences(out, " refused version 3 digest " + digest_r3) == 2;
  }));
  // Recovery: a forced version not above every server's applied one is refused...
  {
    const auto [code, out] = publish("f3.yaml", rules_text(60), "--force-version=3");
    INFO(out);
    CHECK(code == 1);
    CHECK(out.find("not published") != std::string::npos);
  }
  // ...version 4 is applied everywhere, and the refusal clears.
  const auto [code_f, out_f] = publish("f4.yaml", rules_text(60), "--force-version=4");
  INFO(out_f);
  REQUIRE(code_f == 0);
  CHECK(out_f.find("published version 4 ") != std::string::npos);
  const std::string digest4 = word_after(out_f, " digest ");
  for (ServerProcess* s : {&a, &b}) {
    const int port = s->port("http");
    CHECK(eventually([&] {
      const std::string m = metrics(port);
      return metric_value(m, "quota_rule_version") == 4 &&
             metric_value(m, "quota_rules_published_version") == 4 &&
             metric_value(m, "quota_rules_refused_version") == 0 &&
             metric_value(
                 m, "quota_rules_digest_info{rules=\"applied\",digest=\"" + digest4 + "\"}") == 1;
    }));
    const std::string body = check_body(port, "forced-" + std::to_string(port));
    INFO(body);
    CHECK(body.find("\"applied_rule_version\":4") != std::string::npos);
    CHECK(body.find("\"remaining\":59") != std::string::npos);
  }
  CHECK(eventually([&] {
    const auto [code, out] = run("instances " + where + " " + key);
    return code == 0 &&
           out.find("2 of 2 instances applied the published rules") != std::string::npos &&
           out.find(" refused ") == std::string::npos;
  }));
  // Each refusal was logged once, however many polls read it.
  {
    const std::string log = read_all(a_log);
    CHECK(occurrences(log, "shared rules version 1 (digest ") == 1);
    CHECK(occurrences(log, "shared rules version 3 (digest " + digest_r3 + ") refused") == 1);
  }
  CHECK(a.stop() == 0);
  CHECK(b.stop() == 0);
}

// Run by quota_server_shared_rules_cluster_test, on the tests' Redis Cluster (3 masters,
// the redis_cluster fixture; $QUOTA_REDIS_CLUSTER_DIR/ports).
TEST_CASE("shared rules on a Redis Cluster: any node publishes, every server follows",
          "[cluster]") {
  std::vector<int> ports;
  {
    std::ifstream in(env("QUOTA_REDIS_CLUSTER_DIR") + "/ports");
    for (int p = 0; in >> p;) ports.push_back(p);
  }
  REQUIRE(ports.size() >= 3);
  TempDir dir("shared");
  const auto node = [&](int i) {
    return "--redis-cluster=127.0.0.1:" + std::to_string(ports[static_cast<std::size_t>(i)]);
  };
  // Keys of this run only (the cluster is shared by other tests and runs).
  const std::string key = "--rules-key=cl-shared-" + std::to_string(::getpid());
  const auto [code1, out1] =
      run("publish " + node(0) + " " + key + " --rules=" + dir.write("v1.yaml", rules_text(5)));
  INFO(out1);
  REQUIRE(code1 == 0);
  ServerProcess a, b;
  for (auto [s, i] : {std::pair{&a, 1}, std::pair{&b, 2}}) {
    REQUIRE(
        s->start({env("QUOTA_SERVER"), "--rules-from-redis", node(i), key, "--instance-id",
                  "node-" + std::to_string(i), "--default-plan", "free", "--default-route", "read",
                  "--grpc-port", "0", "--http-port", "0", "--redis-deadline-ms", "2000"},
                 {"grpc", "http"}));
  }
  const auto [code2, out2] =
      run("publish " + node(2) + " " + key + " --rules=" + dir.write("v2.yaml", rules_text(50)));
  INFO(out2);
  REQUIRE(code2 == 0);
  CHECK(out2.find("published version 2 ") != std::string::npos);
  for (ServerProcess* s : {&a, &b}) {
    const int port = s->port("http");
    CHECK(eventually([&] {
      const std::string m = metrics(port);
      return metric_value(m, "quota_rule_version") == 2 &&
             metric_value(m, "quota_rules_version_lag") == 0;
    }));
  }
  CHECK(eventually([&] {
    const auto [code, out] = run("instances " + node(0) + " " + key);
    return code == 0 && out.find("node-1 version 2 age ") != std::string::npos &&
           out.find("node-2 version 2 age ") != std::string::npos;
  }));
  CHECK(a.stop() == 0);
  CHECK(b.stop() == 0);
}
