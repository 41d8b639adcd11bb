// http_gateway_test — starts the real http_gateway binary on a free loopback port and
// talks HTTP to it with httplib::Client.
//
//   http_gateway_test SERVER_BINARY                       in-process store
//   http_gateway_test SERVER_BINARY REDIS_DIR             Redis store: the server in
//       REDIS_DIR (cmake/redis_server.sh; its port in REDIS_DIR/port) — and at the end the
//       test stops that server and expects 503 (fail-closed), never 429.
//
// The budget is 10 units, refilled 1 unit every 10 s, so nothing refills noticeably
// while the test runs: a read costs 1, a create 5.
//
// Exit status 0 when every check passed; each failed check is printed.
#include <fcntl.h>
#include <httplib.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

namespace {

int failures = 0;

void check(bool ok, const std::string& what, const std::string& got) {
  std::printf("%s %s%s\n", ok ? "ok  " : "FAIL", what.c_str(),
              ok ? "" : (" — got: " + got).c_str());
  if (!ok) ++failures;
}

void expect_status(const httplib::Result& r, int status, const std::string& what) {
  check(r && r->status == status, what + " -> " + std::to_string(status),
        r ? std::to_string(r->status) + " " + r->body : "no response");
}

void expect_header(const httplib::Result& r, const std::string& name, const std::string& value,
                   const std::string& what) {
  const std::string got =
      r && r->has_header(name.c_str()) ? r->get_header_value(name.c_str()) : "(absent)";
  check(got == value, what + ": " + name + ": " + value, got);
}

void expect_no_header(const httplib::Result& r, const std::string& name, const std::string& what) {
  const bool absent = r && !r->has_header(name.c_str());
  check(absent, what + ": no " + name,
        r ? r->get_header_value(name.c_str()) : std::string("no response"));
}

httplib::Headers key(const std::string& api_key) { return {{"X-API-Key", api_key}}; }

struct Child {
  pid_t pid = -1;
  int port = 0;
};

// Starts the server with --port 0 and reads "listening on 127.0.0.1:PORT" from its stdout.
Child start_server(const std::string& exe, const std::vector<std::string>& extra) {
  int fds[2];
  if (pipe(fds) != 0) return {};
  const pid_t pid = fork();
  if (pid == 0) {
    dup2(fds[1], 1);
    close(fds[0]);
    close(fds[1]);
    std::vector<std::string> args = {exe,     "--port", "0",       "--rate", "1",
                                     "--per", "10",     "--burst", "10"};
    args.insert(args.end(), extra.begin(), extra.end());
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    execv(exe.c_str(), argv.data());
    _exit(127);
  }
  close(fds[1]);
  std::string out;
  const std::string marker = "listening on 127.0.0.1:";
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (std::chrono::steady_clock::now() < deadline) {
    pollfd p{fds[0], POLLIN, 0};
    if (poll(&p, 1, 100) <= 0) continue;
    char buf[256];
    const ssize_t n = read(fds[0], buf, sizeof buf);
    if (n <= 0) break;
    out.append(buf, static_cast<std::size_t>(n));
    const auto at = out.find(marker);
    if (at != std::string::npos && out.find(' ', at + marker.size()) != std::string::npos) {
      std::printf("server: %s", out.c_str());
      close(fds[0]);  // the server's later output (none) goes nowhere
      return Child{pid, std::atoi(out.c_str() + at + marker.size())};
    }
  }
  std::printf("server did not say where it listens; output so far: %s\n", out.c_str());
  kill(pid, SIGKILL);
  waitpid(pid, nullptr, 0);
  return {};
}

void stop_server(const Child& c) {
  kill(c.pid, SIGTERM);
  int status = 0;
  waitpid(c.pid, &status, 0);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: http_gateway_test SERVER_BINARY [REDIS_DIR]\n");
    return 2;
  }
  signal(SIGPIPE, SIG_IGN);
  const std::string exe = argv[1];
  const std::string redis_dir = argc > 2 ? argv[2] : "";
  std::vector<std::string> extra;
  if (!redis_dir.empty()) {
    std::ifstream port_file(redis_dir + "/port");
    int redis_port = 0;
    port_file >> redis_port;
    if (redis_port <= 0) {
      std::fprintf(stderr, "no redis port in %s/port\n", redis_dir.c_str());
      return 2;
    }
    // A generous deadline: the first request opens the connection and loads the script,
    // and the test shares the machine with others (the 3 ms default is for production).
    extra = {"--redis", "127.0.0.1:" + std::to_string(redis_port), "--redis_deadline_ms", "1000"};
  }
  const Child server = start_server(exe, extra);
  if (server.pid <= 0 || server.port <= 0) return 1;
  httplib::Client cli("127.0.0.1", server.port);
  cli.set_connection_timeout(5);
  cli.set_read_timeout(10);

  // 1. Unknown or missing keys: 401, and no budget touched (checked in 2: acme is full).
  for (int i = 0; i < 20; ++i) {
    auto r = cli.Get("/objects/1", key("not-a-key-" + std::to_string(i)));
    if (i == 0) {
      expect_status(r, 401, "GET with an unknown API key");
      expect_no_header(r, "RateLimit", "401");
    }
  }
  expect_status(cli.Get("/objects/1"), 401, "GET without an API key");
  expect_status(cli.Post("/objects", key("nope"), "{}", "application/json"), 401,
                "POST with an unknown API key");

  // 2. acme: create (cost 5) with key 1 — the budget is full, so 10 - 5 = 5 remain.
  auto created = cli.Post("/objects", key("acme-key-1"), "{\"name\":\"a\"}", "application/json");
  expect_status(created, 201, "acme POST /objects (cost 5)");
  expect_header(created, "RateLimit-Policy", "\"default\";q=10;w=100", "acme POST");
  expect_header(created, "RateLimit", "\"default\";r=5;t=50", "acme POST");
  std::string id = "1";
  if (created && created->body.find("\"id\":\"") != std::string::npos) {
    const auto at = created->body.find("\"id\":\"") + 6;
    id = created->body.substr(at, created->body.find('"', at) - at);
  }

  // 3. Five reads with acme's OTHER key spend the same budget down to 0.
  for (int i = 0; i < 5; ++i) {
    auto r = cli.Get(("/objects/" + id).c_str(), key("acme-key-2"));
    expect_status(r, 200, "acme GET with key 2, read " + std::to_string(i + 1));
    if (i == 4) expect_header(r, "RateLimit", "\"default\";r=0;t=100", "acme 5th read");
  }

  // 4. The next read is over budget, with either key: 429 and the headers. Refill is one
  // unit per 10 s, so the missing unit comes in just under 10 s: Retry-After 10.
  auto over = cli.Get(("/objects/" + id).c_str(), key("acme-key-1"));
  expect_status(over, 429, "acme GET with key 1 after the burst");
  expect_header(over, "Retry-After", "10", "429");
  expect_header(over, "RateLimit-Policy", "\"default\";q=10;w=100", "429");
  expect_header(over, "RateLimit", "\"default\";r=0;t=100", "429");

  // 5. X-Tenant-ID is ignored: acme's key claiming to be globex is still acme (429) ...
  httplib::Headers spoof = {{"X-API-Key", "acme-key-2"}, {"X-Tenant-ID", "globex"}};
  expect_status(cli.Get(("/objects/" + id).c_str(), spoof), 429,
                "acme key with X-Tenant-ID: globex");
  // ... and globex's own budget is untouched: full.
  auto g1 = cli.Post("/objects", key("globex-key-1"), "{}", "application/json");
  expect_status(g1, 201, "globex POST (cost 5)");
  expect_header(g1, "RateLimit", "\"default\";r=5;t=50", "globex POST");
  // Objects are per tenant: acme's object is not globex's.
  expect_status(cli.Get(("/objects/" + id).c_str(), key("globex-key-1")), 404,
                "globex GET of acme's object (cost 1, then not found)");

  // 6. A create needs 5 units; globex has 4 left: 429, and Retry-After says when 5 will
  // be there: 1 more unit, just under 10 s.
  auto g2 = cli.Post("/objects", key("globex-key-1"), "{}", "application/json");
  expect_status(g2, 429, "globex POST with 4 units left");
  expect_header(g2, "Retry-After", "10", "globex 429");
  expect_header(g2, "RateLimit", "\"default\";r=4;t=60", "globex 429");

  // 7. Unknown routes are not budgeted routes.
  expect_status(cli.Get("/admin", key("acme-key-1")), 404, "GET /admin");

  // 8. With Redis: stop it; a fail-closed route answers 503, not 429, with Retry-After 1
  // and RateLimit-Policy but no RateLimit (no decision was made).
  if (!redis_dir.empty()) {
    const char* script = std::getenv("QUOTA_REDIS_SCRIPT");
    const std::string cmd =
        std::string("bash ") + (script ? script : "cmake/redis_server.sh") + " stop " + redis_dir;
    check(std::system(cmd.c_str()) == 0, "stopping redis: " + cmd, "non-zero exit");
    auto down = cli.Get(("/objects/" + id).c_str(), key("globex-key-1"));
    expect_status(down, 503, "globex GET with Redis stopped");
    expect_header(down, "Retry-After", "1", "503");
    expect_header(down, "RateLimit-Policy", "\"default\";q=10;w=100", "503");
    expect_no_header(down, "RateLimit", "503");
    expect_status(cli.Get("/objects/1", key("nope")), 401, "unknown key with Redis stopped");
  }

  stop_server(server);
  std::printf("%s: %d check(s) failed\n", failures == 0 ? "PASS" : "FAIL", failures);
  return failures == 0 ? 0 : 1;
}
