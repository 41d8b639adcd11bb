// http_listener_test — quota-server's HTTP listener (http_listener.hpp) against clients
// that try to stall it, over real loopback sockets, with 2 workers so that a tied worker
// shows at once:
//   - idle connections (never sending, or kept alive after a request) hold no worker: a
//     check on a new connection is answered while 40 of them are open;
//   - a body declared huge is answered 400 before any of it is sent, and the connection
//     closed; a request that arrives too slowly is cut off at --http-request-timeout-ms;
//   - one connection over --http-max-connections is closed at once;
//   - /metrics counts each refusal.
// Every wait is bounded (socket timeouts of a few seconds); nothing here measures speed
// (the p99 under such load is quota_server_stall_bench's, docs/benchmarks.md).
#include <httplib.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "testing/metrics_text.hpp"
#include "testing/probes.hpp"
#include "testing/raw_socket.hpp"
#include "testing/scratch.hpp"
#include "testing/server_process.hpp"

namespace {

using quota::testing::connect_to;
using quota::testing::env;
using quota::testing::send_all;

// Everything the peer sends until it closes (or the read timeout): its answer, and
// whether it closed the connection.
struct Received {
  std::string text;
  bool closed = false;
};
Received receive(int fd) {
  Received r;
  char buf[4096];
  for (;;) {
    const ssize_t n = recv(fd, buf, sizeof buf, 0);
    if (n == 0) {
      r.closed = true;
      return r;
    }
    if (n < 0) return r;  // timed out (or reset)
    r.text.append(buf, static_cast<std::size_t>(n));
  }
}

const std::string kCheck =
    "POST /v1/check HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    "Content-Length: 18\r\n\r\n{\"tenant\":\"stall\"}";

struct Server {
  quota::testing::ServerProcess process;
  int port = 0;
  Server() {
    REQUIRE(process.start({env("QUOTA_SERVER"), "--rules", env("QUOTA_SERVER_RULES"),
                           "--default-plan", "free", "--default-route", "read", "--grpc-port", "0",
                           "--http-port", "0", "--fresh-budgets-at-start", "--http-workers", "2",
                           "--http-max-connections", "48", "--http-request-timeout-ms", "500"},
                          {"grpc", "http"}));
    port = process.port("http");
  }
  double metric(const std::string& series) {
    return quota::testing::metric_value(quota::testing::http_get(port, "/metrics"), series);
  }
};

}  // namespace

TEST_CASE("idle connections hold no worker: a check is answered while 40 are open") {
  Server s;
  std::vector<int> idle;
  // 30 that never send, 10 kept alive after one answered request each.
  for (int i = 0; i < 30; ++i) idle.push_back(connect_to(s.port));
  for (int i = 0; i < 10; ++i) {
    const int fd = connect_to(s.port);
    REQUIRE(send_all(fd, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"));
    char buf[512];
    REQUIRE(recv(fd, buf, sizeof buf, 0) > 0);
    idle.push_back(fd);
  }
  for (int fd : idle) REQUIRE(fd >= 0);
  // With a worker tied to each connection (2 of them here), this check would wait for
  // an idle connection to time out; the client gives up after 3 s.
  const int fd = connect_to(s.port);
  REQUIRE(fd >= 0);
  REQUIRE(send_all(fd, kCheck));
  char buf[1024];
  const ssize_t n = recv(fd, buf, sizeof buf, 0);
  REQUIRE(n > 0);
  CHECK_THAT(std::string(buf, static_cast<std::size_t>(n)),
             Catch::Matchers::StartsWith("HTTP/1.1 200"));
  close(fd);
  for (int i : idle) close(i);
}

TEST_CASE("a body declared over the bound is refused unread; a slow request is cut off") {
  Server s;
  // 99,999,999,999 bytes declared, one sent: 400 at once, the connection closed.
  const int big = connect_to(s.port);
  REQUIRE(big >= 0);
  REQUIRE(send_all(big,
                   "POST /v1/check HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                   "Content-Length: 99999999999\r\n\r\n{"));
  const Received r = receive(big);
  close(big);
  CHECK_THAT(r.text, Catch::Matchers::StartsWith("HTTP/1.1 400"));
  CHECK_THAT(r.text, Catch::Matchers::Contains("at most 8192 are accepted"));
  CHECK(r.closed);

  // Half a request head, then nothing: closed after the request timeout (500 ms here),
  // well before this client's 3 s.
  const int slow = connect_to(s.port);
  REQUIRE(slow >= 0);
  REQUIRE(send_all(slow, "POST /v1/check HTTP/1.1\r\nHost:"));
  const Received cut = receive(slow);
  close(slow);
  CHECK(cut.closed);

  CHECK(s.metric("quota_server_http_refused_total{reason=\"body_size\"}") == 1);
  CHECK(s.metric("quota_server_http_refused_total{reason=\"request_timeout\"}") == 1);
  // The server still decides.
  CHECK_THAT(quota::testing::check_body(s.port, "after-slow"),
             Catch::Matchers::Contains("\"allowed\":true"));
}

TEST_CASE("one connection over --http-max-connections is closed at once") {
  Server s;
  // 48 connections, each served once (so the listener has taken every one), kept open.
  std::vector<int> open;
  for (int i = 0; i < 48; ++i) {
    const int fd = connect_to(s.port);
    REQUIRE(fd >= 0);
    REQUIRE(send_all(fd, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"));
    char buf[512];
    REQUIRE(recv(fd, buf, sizeof buf, 0) > 0);
    open.push_back(fd);
  }
  const int extra = connect_to(s.port);
  REQUIRE(extra >= 0);  // the kernel accepts; the listener closes it unread
  const Received r = receive(extra);
  close(extra);
  CHECK(r.closed);
  CHECK(r.text.empty());
  for (int fd : open) close(fd);
  // Closed connections free their places, once the listener has read each close (until
  // then a new connection may still be one too many).
  std::string after;
  (void)quota::testing::eventually([&] {
    after = quota::testing::check_body(s.port, "after-limit");
    return after.find("\"allowed\":true") != std::string::npos;
  });
  CHECK_THAT(after, Catch::Matchers::Contains("\"allowed\":true"));
  CHECK(quota::testing::eventually(
      [&] { return s.metric("quota_server_http_refused_total{reason=\"connections\"}") >= 1; }));
}

TEST_CASE("SIGTERM with idle keep-alive connections open: exit 0 at once, nothing to wait for") {
  Server s;
  std::vector<int> idle;
  for (int i = 0; i < 10; ++i) {
    const int fd = connect_to(s.port);
    REQUIRE(fd >= 0);
    REQUIRE(send_all(fd, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"));
    char buf[512];
    REQUIRE(recv(fd, buf, sizeof buf, 0) > 0);
    idle.push_back(fd);
  }
  // Nothing is in flight: the idle connections are closed, not waited for (a connection
  // that kept a worker until its keep-alive timeout held the exit for seconds). 1 s is a
  // bound far above the exit's own time and far below a keep-alive timeout of 5 s.
  const auto t0 = std::chrono::steady_clock::now();
  const int status = s.process.stop();
  const auto took = std::chrono::steady_clock::now() - t0;
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
  CHECK(took < std::chrono::seconds(1));
  for (int fd : idle) close(fd);
}
