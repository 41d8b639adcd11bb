// examples/quota_server/testing/probes.hpp — what the quota-server tests ask of a running
// server, over real HTTP on loopback, and a bounded wait for what they expect of it.
//
// http_get(port, path) and check_body(port, tenant) return the answer's body, empty when
// the server did not answer (the caller's assertions then fail on it, never hang: 10 s
// read timeout); eventually(done) polls every 50 ms for at most `limit` (15 s by default);
// read_all(path) is a file's text (empty when it cannot be read).
//
// Thread safety: each call opens its own client; call from any thread.
//
//   CHECK(quota::testing::eventually([&] {
//     return metric_value(http_get(port, "/metrics"), "quota_rule_version") == 2;
//   }));
#pragma once

#include <httplib.h>

#include <chrono>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <thread>

namespace quota::testing {

inline std::string http_get(int port, const std::string& path) {
  httplib::Client c("127.0.0.1", port);
  c.set_read_timeout(10);
  auto r = c.Get(path.c_str());
  return r ? r->body : std::string();
}

// POST /v1/check for `tenant` (1 unit): the body.
inline std::string check_body(int port, const std::string& tenant) {
  httplib::Client c("127.0.0.1", port);
  c.set_read_timeout(10);
  auto r = c.Post("/v1/check", R"({"tenant":")" + tenant + R"("})", "application/json");
  return r ? r->body : std::string();
}

inline bool eventually(const std::function<bool()>& done,
                       std::chrono::milliseconds limit = std::chrono::seconds(15)) {
  const auto until = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < until) {
    if (done()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return done();
}

inline std::string read_all(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

}  // namespace quota::testing
