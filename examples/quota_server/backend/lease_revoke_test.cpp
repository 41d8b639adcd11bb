// quota_server_lease_revoke_test — a rule change that reaches another server's grant at once
// (`lease.revoke: at_once`, include/quota/gateway/leases/lease_revocation.hpp).
//
// Two quota-server processes, a and b, on one real redis-server (a ScratchServer of this
// test, stopped by pid), each with its own copy of one rule file: a tenant token bucket
// that never refills within the test (1 unit per hour, burst 40 + g in generation g),
// leased in grants of 10 units that live 60 s. Each server takes a grant for tenant "t"
// and spends from it. Then only a's file is rewritten (generation 2: burst 42), so a
// installs version 2 while b stays on version 1.
//   - With `revoke: at_once`: a records the revocation at the authority before installing
//     version 2, and b, told through Redis pub/sub, drops what it holds of its grant
//     (quota_lease_units_revoked_total on b's /metrics; nothing held) within a bounded
//     wait; b's next check is decided at the authority (a script call), not from a grant.
//   - Without it: b keeps its grant (nothing revoked, its units still held) and its next
//     check is decided from the grant, with no script call — the rule change would reach
//     b only when the grant expires.
#include <httplib.h>
#include <stdlib.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>

#include "quota/redis/transport/connection.hpp"
#include "redis/support/redis_server.hpp"
#include "testing/load_clients.hpp"
#include "testing/metrics_text.hpp"
#include "testing/probes.hpp"
#include "testing/scratch.hpp"
#include "testing/script_calls.hpp"
#include "testing/server_process.hpp"

namespace {

using quota::testing::env;
using quota::testing::eventually;
using quota::testing::http_check;
using quota::testing::metric_value;
using quota::testing::script_calls;

std::string generation(int g, bool at_once) {
  return "routes:\n  - name: read\nrules:\n  - name: shared\n    level: tenant\n"
         "    plan: free\n    route: read\n"
         "    token_bucket: {rate: 1/1h, burst: " +
         std::to_string(40 + g) +
         "}\n"
         "    lease: {mode: on, units: 10, low_water: 2, expiry: 60s" +
         (at_once ? std::string(", revoke: at_once") : std::string()) + "}\n";
}

// Replaces `path` by a complete file with `text` (rename: never seen half-written).
void write_file(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  std::ofstream(tmp, std::ios::trunc) << text;
  REQUIRE(std::rename(tmp.c_str(), path.c_str()) == 0);
}

std::string metrics_of(quota::testing::ServerProcess& s) {
  httplib::Client c("127.0.0.1", s.port("http"));
  c.set_read_timeout(10);
  auto r = c.Get("/metrics");
  return r && r->status == 200 ? r->body : std::string();
}

double tenant_lease(quota::testing::ServerProcess& s, const std::string& family) {
  return metric_value(metrics_of(s), family + "{level=\"tenant\"}");
}

// Runs the scenario of the file comment; `at_once` chooses the rule's revoke option.
void run(bool at_once) {
  quota::testing::ScratchServer redis(
      quota::testing::scratch_dir("quota-server-lease-revoke-test"));
  REQUIRE(redis.started());
  char dir_template[] = "/tmp/quota_server_revoke_XXXXXX";
  REQUIRE(mkdtemp(dir_template) != nullptr);
  const std::string files[2] = {std::string(dir_template) + "/a.yaml",
                                std::string(dir_template) + "/b.yaml"};
  for (const auto& f : files) write_file(f, generation(1, at_once));

  quota::testing::ServerProcess servers[2];
  for (int i = 0; i < 2; ++i) {
    REQUIRE(servers[i].start(
        {env("QUOTA_SERVER"), "--rules", files[i], "--default-plan", "free", "--default-route",
         "read", "--grpc-port", "0", "--http-port", "0", "--redis",
         "127.0.0.1:" + std::to_string(redis.port()), "--redis-deadline-ms", "2000"},
        {"grpc", "http"}));
  }
  auto& a = servers[0];
  auto& b = servers[1];
  httplib::Client ca("127.0.0.1", a.port("http"));
  httplib::Client cb("127.0.0.1", b.port("http"));
  ca.set_read_timeout(10);
  cb.set_read_timeout(10);
  quota::redis::Connection direct(
      quota::redis::ConnectionConfig{.host = "127.0.0.1", .port = redis.port()});

  // Each server takes a grant of 10 and spends 2 of it.
  for (int i = 0; i < 2; ++i) {
    CHECK(http_check(ca, "t") == 1);
    CHECK(http_check(cb, "t") == 1);
  }
  CHECK(tenant_lease(b, "quota_lease_units_held") == 8);
  CHECK(tenant_lease(b, "quota_lease_units_revoked_total") == 0);
  for (auto* s : {&a, &b}) {
    CHECK(eventually(
        [&] { return metric_value(metrics_of(*s), "quota_lease_revocations_subscribed") == 1; }));
  }

  // Only a's file changes: a installs version 2, b stays on version 1.
  write_file(files[0], generation(2, at_once));
  REQUIRE(eventually([&] { return metric_value(metrics_of(a), "quota_rule_version") == 2; }));
  CHECK(metric_value(metrics_of(b), "quota_rule_version") == 1);

  if (at_once) {
    // b hears of the revocation through pub/sub and drops the 8 units it held.
    CHECK(eventually([&] { return tenant_lease(b, "quota_lease_units_revoked_total") == 8; }));
    CHECK(tenant_lease(b, "quota_lease_units_held") == 0);
    // Its next check goes to the authority: at least one script call, admitted from what
    // the budget still has (42 − 20 granted).
    const long long before = script_calls(direct);
    CHECK(http_check(cb, "t") == 1);
    const long long after = script_calls(direct);
    REQUIRE(before >= 0);
    CHECK(after > before);
    CHECK(tenant_lease(b, "quota_lease_units_held") == 0);
  } else {
    // b keeps its grant: nothing revoked, and the next check spends from it locally.
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    CHECK(tenant_lease(b, "quota_lease_units_revoked_total") == 0);
    CHECK(tenant_lease(b, "quota_lease_units_held") == 8);
    const long long before = script_calls(direct);
    CHECK(http_check(cb, "t") == 1);
    const long long after = script_calls(direct);
    REQUIRE(before >= 0);
    CHECK(after == before);
    CHECK(tenant_lease(b, "quota_lease_units_held") == 7);
  }

  for (auto& s : servers) CHECK(s.stop() == 0);
  for (const auto& f : files) std::remove(f.c_str());
  rmdir(dir_template);
}

}  // namespace

TEST_CASE("revoke: at_once: a rule change at one server drops another server's grant at once",
          "[redis]") {
  run(/*at_once=*/true);
}

TEST_CASE("without revoke: at_once another server keeps spending its grant until expiry",
          "[redis]") {
  run(/*at_once=*/false);
}
