// attempt_reload_test — quota-server on a real redis-server: a request retried with its
// attempt id across a hot reload that adds a `lease:` to its rule, or removes it, is
// charged once (the Checker decides every attempt on Redis, where its record is, whatever
// the leasing: checker.hpp).
//
// The rule holds a burst of 3 that barely refills (1 per 100 s). Attempts a1 and a2 are
// admitted, the rule file changes (lease on, or off), a1 and a2 are retried: both must be
// admitted again without a charge, so a3 still finds the third unit and a4 none.
#include <httplib.h>

#include <catch2/catch.hpp>
#include <fstream>
#include <string>

#include "redis/support/redis_server.hpp"
#include "testing/metrics_text.hpp"
#include "testing/probes.hpp"
#include "testing/scratch.hpp"
#include "testing/server_process.hpp"

namespace {

using quota::testing::env;

std::string rules(bool leased) {
  return std::string(
             "routes:\n  - name: read\nrules:\n  - name: r\n    level: tenant\n    plan: free\n"
             "    route: read\n    token_bucket: {rate: 1/100s, burst: 3}\n") +
         (leased ? "    lease: {mode: on, units: 1, low_water: 0, expiry: 1s}\n" : "");
}

// POST /v1/check with `attempt`: whether it was admitted (a call without a 200 fails).
bool admitted(int port, const std::string& attempt) {
  httplib::Client c("127.0.0.1", port);
  c.set_read_timeout(10);
  auto r = c.Post("/v1/check", R"({"tenant":"retry","attempt_id":")" + attempt + R"("})",
                  "application/json");
  REQUIRE(r);
  INFO(r->body);
  REQUIRE(r->status == 200);
  return r->body.find("\"allowed\":true") != std::string::npos;
}

void retry_across_reload(bool leased_first) {
  quota::testing::ScratchServer redis(quota::testing::scratch_dir("quota-server-attempt-reload"));
  REQUIRE(redis.started());
  quota::testing::TempDir dir("attempt_reload");
  const std::string path = dir.write("rules.yaml", rules(leased_first));
  quota::testing::ServerProcess s;
  REQUIRE(s.start({env("QUOTA_SERVER"), "--rules", path, "--default-plan", "free",
                   "--default-route", "read", "--grpc-port", "0", "--http-port", "0", "--redis",
                   "127.0.0.1:" + std::to_string(redis.port()), "--redis-deadline-ms", "2000"},
                  {"grpc", "http"}));
  const int port = s.port("http");
  CHECK(admitted(port, "a1"));
  CHECK(admitted(port, "a2"));
  const double before = quota::testing::metric_value(quota::testing::http_get(port, "/metrics"),
                                                     "quota_rule_version");
  dir.write("rules.yaml", rules(!leased_first));
  REQUIRE(quota::testing::eventually([&] {
    return quota::testing::metric_value(quota::testing::http_get(port, "/metrics"),
                                        "quota_rule_version") > before;
  }));
  CHECK(admitted(port, "a1"));  // replayed
  CHECK(admitted(port, "a2"));  // replayed
  CHECK(admitted(port, "a3"));  // the third unit
  CHECK_FALSE(admitted(port, "a4"));
}

}  // namespace

TEST_CASE("an attempt retried across a reload that adds a lease is charged once", "[redis]") {
  retry_across_reload(false);
}

TEST_CASE("an attempt retried across a reload that removes a lease is charged once", "[redis]") {
  retry_across_reload(true);
}
