// http_gateway — quota embedded in an in-process HTTP server (cpp-httplib).
//
// A toy object API behind a per-tenant budget:
//
//   GET  /objects/:id   route class "read",   cost 1   → 200 (or 404 if no such object)
//   POST /objects       route class "create", cost 5   → 201 {"id": ...}
//
// Every request must carry `X-API-Key`. The key is looked up in a table (several keys may
// belong to one tenant, and then share its budget); an unknown or missing key is 401
// before any budget is touched. The tenant comes ONLY from that table: a client-supplied
// `X-Tenant-ID` header is ignored. Each tenant has one token bucket ("{tenant}api"),
// from which reads take 1 unit and creates 5.
//
// The answer for a decision comes from quota/http.hpp: over budget → 429 with
// `Retry-After` (whole seconds, rounded up, never 0) and the IETF `RateLimit-Policy` /
// `RateLimit` fields (e.g. `"default";q=20;w=20` and `"default";r=0;t=20`); admitted
// requests carry the RateLimit fields too. Both routes are fail-closed: when the store
// cannot decide (Redis unreachable), the answer is 503 with `Retry-After: 1`, never 429 —
// the tenant exceeded nothing.
//
// The store is an in-process quota::ShardedStore by default (httplib serves requests on
// a thread pool), or the shared Redis store with --redis HOST:PORT (server time, so all
// gateway processes share one clock).
//
// Build and run:  cmake --preset dev && cmake --build --preset dev
//                 ./build/dev/examples/http_gateway/http_gateway --port 8080
//                 curl -i -H 'X-API-Key: acme-key-1' localhost:8080/objects/1
#include <httplib.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/flags/flag.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/cli.hpp"
#include "quota/clock.hpp"
#include "quota/http.hpp"
#include "quota/policy/token_bucket.hpp"
#include "quota/store/sharded_store.hpp"

#ifdef QUOTA_HTTP_HAVE_REDIS
#include "quota/redis/redis_store.hpp"
#endif

ABSL_FLAG(std::string, host, "127.0.0.1", "address to listen on");
ABSL_FLAG(std::int64_t, port, 8080, "port; 0 picks a free one");
ABSL_FLAG(std::int64_t, rate, 10, "refill this many units ...");
ABSL_FLAG(std::int64_t, per, 1, "... every this many seconds");
ABSL_FLAG(std::int64_t, burst, 20, "bucket capacity in units");
ABSL_FLAG(std::string, redis, "", "HOST:PORT of Redis, to keep the budgets there");
ABSL_FLAG(std::int64_t, redis_deadline_ms, 3, "each Redis decision's deadline, ms");

namespace {

using namespace std::chrono_literals;

constexpr const char* kUsage = R"(usage: http_gateway [flags]

A toy object API with a per-tenant token bucket:
  GET  /objects/:id   (read, cost 1)      POST /objects   (create, cost 5)
Requests need X-API-Key; the demo keys are
  acme-key-1, acme-key-2 -> tenant acme (one shared budget)
  globex-key-1           -> tenant globex

Flags (--flag VALUE or --flag=VALUE):
  --host HOST        address to listen on (default 127.0.0.1)
  --port N           port; 0 picks a free one (default 8080). Prints "listening on HOST:PORT".
  --rate N           refill N units ... (default 10)
  --per S            ... every S seconds (default 1)
  --burst B          bucket capacity in units (default 20)
  --redis HOST:PORT  keep the budgets in Redis (shared by every gateway process)
  --redis_deadline_ms N  each Redis decision's deadline: connect, send and reply (default 3)
  --help             this text
)";

struct Options {
  std::string host = "127.0.0.1";
  int port = 8080;
  std::int64_t rate = 10;
  std::int64_t per_s = 1;
  std::int64_t burst = 20;
  std::string redis;
  std::int64_t redis_deadline_ms = 3;
};

// Where the budgets live: in-process or Redis. `spend` is called from httplib's worker
// threads.
class Budget {
 public:
  virtual ~Budget() = default;
  virtual absl::StatusOr<quota::Decision> spend(const std::string& key, std::int64_t cost) = 0;
};

class LocalBudget : public Budget {
 public:
  explicit LocalBudget(quota::TokenBucket policy) : policy_(policy) {}
  absl::StatusOr<quota::Decision> spend(const std::string& key, std::int64_t cost) override {
    return store_.apply(policy_, key, clock_.now(), cost);
  }

 private:
  quota::TokenBucket policy_;
  quota::SteadyClock clock_;
  quota::ShardedStore<quota::TokenBucket> store_;
};

#ifdef QUOTA_HTTP_HAVE_REDIS
class RedisBudget : public Budget {
 public:
  RedisBudget(quota::TokenBucket policy, quota::RedisStoreOptions options)
      : policy_(policy), store_(std::move(options)) {}
  absl::StatusOr<quota::Decision> spend(const std::string& key, std::int64_t cost) override {
    // The script decides on the server's clock; `now` is ignored.
    return store_.apply(policy_, key, quota::Nanos{0}, cost);
  }

 private:
  quota::TokenBucket policy_;
  quota::RedisStore<quota::TokenBucket> store_;
};
#endif

// The command line (common/cli.hpp: --help exits 0, a usage error 2) as Options.
Options parse_options(int argc, char** argv) {
  using quota::cli::integer;
  quota::cli::parse(
      {.name = "http_gateway",
       .usage = kUsage,
       .checks = {integer("port", 0, 65535), integer("rate", 0, 1'000'000'000),
                  integer("per", 1, 86'400 * 365), integer("burst", 1, 1'000'000'000),
                  quota::cli::host_port("redis"), integer("redis_deadline_ms", 1, 60'000)}},
      argc, argv);
  return Options{.host = absl::GetFlag(FLAGS_host),
                 .port = static_cast<int>(absl::GetFlag(FLAGS_port)),
                 .rate = absl::GetFlag(FLAGS_rate),
                 .per_s = absl::GetFlag(FLAGS_per),
                 .burst = absl::GetFlag(FLAGS_burst),
                 .redis = absl::GetFlag(FLAGS_redis),
                 .redis_deadline_ms = absl::GetFlag(FLAGS_redis_deadline_ms)};
}

std::string json_error(std::string_view reason, std::string_view detail) {
  return absl::StrFormat("{\"error\":\"%s\",\"detail\":\"%s\"}\n", std::string(reason),
                         std::string(detail));
}

// The toy objects, per tenant: an object is visible only to the tenant that created it.
class Objects {
 public:
  std::string create(const std::string& tenant, std::string body) {
    std::lock_guard<std::mutex> lock(mu_);
    const std::string id = absl::StrCat(++next_id_);
    objects_[absl::StrCat(tenant, "/", id)] = std::move(body);
    return id;
  }
  bool find(const std::string& tenant, const std::string& id, std::string* body) const {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = objects_.find(absl::StrCat(tenant, "/", id));
    if (it == objects_.end()) return false;
    *body = it->second;
    return true;
  }

 private:
  mutable std::mutex mu_;
  std::int64_t next_id_ = 0;
  absl::flat_hash_map<std::string, std::string> objects_;
};

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse_options(argc, argv);
  const quota::TokenBucket policy{.rate = {.units = o.rate, .per = std::chrono::seconds(o.per_s)},
                                  .burst = o.burst};
  auto info = quota::http::describe("default", policy);
  if (!info.ok()) {
    std::fprintf(stderr, "http_gateway: bad policy: %s\n", info.status().ToString().c_str());
    return 2;
  }

  // Authentication stand-in: API key → tenant. Several keys of one tenant share its budget.
  const absl::flat_hash_map<std::string, std::string> tenant_of_key = {
      {"acme-key-1", "acme"}, {"acme-key-2", "acme"}, {"globex-key-1", "globex"}};

  std::unique_ptr<Budget> budget;
  if (o.redis.empty()) {
    budget = std::make_unique<LocalBudget>(policy);
  } else {
#ifdef QUOTA_HTTP_HAVE_REDIS
    std::string host;
    int port = 0;
    quota::cli::parse_host_port(o.redis, &host, &port);  // checked by parse_options
    if (auto s = quota::RedisStore<quota::TokenBucket>::check(policy); !s.ok()) {
      std::fprintf(stderr, "http_gateway: policy not supported by Redis: %s\n",
                   s.ToString().c_str());
      return 2;
    }
    auto pool = std::make_shared<quota::redis::ConnectionPool>(
        quota::redis::ConnectionConfig{
            .host = host, .port = port, .deadline = std::chrono::milliseconds(o.redis_deadline_ms)},
        8);
    budget = std::make_unique<RedisBudget>(policy, quota::RedisStoreOptions{.pool = pool});
#else
    std::fprintf(stderr,
                 "http_gateway: --redis: not available in this build (hiredis not found)\n");
    return 2;
#endif
  }

  Objects objects;
  const quota::http::Options answer_options{.unavailable_retry_after = 1s};
  httplib::Server server;

  // Authenticates, spends `cost` of the tenant's budget and sets the quota headers. On
  // success returns the tenant; otherwise the response is complete and "" is returned.
  auto admit = [&](const httplib::Request& req, httplib::Response& res,
                   std::int64_t cost) -> std::string {
    const std::string api_key = req.get_header_value("X-API-Key");
    const auto it = tenant_of_key.find(api_key);
    if (api_key.empty() || it == tenant_of_key.end()) {
      res.status = 401;
      res.set_header("WWW-Authenticate", "ApiKey");
      res.set_content(json_error("unauthenticated", "missing or unknown X-API-Key"),
                      "application/json");
      return "";
    }
    const std::string& tenant = it->second;
    const auto decision = budget->spend(absl::StrCat("{", tenant, "}api"), cost);
    const quota::http::Answer a = quota::http::answer(decision, *info, answer_options);
    for (const auto& h : a.headers) res.set_header(h.name, h.value);
    if (a.status != 200) {
      res.status = a.status;
      res.set_content(json_error(a.reason, decision.ok() ? tenant : decision.status().ToString()),
                      "application/json");
      return "";
    }
    return tenant;
  };

  server.Get(R"(/objects/([A-Za-z0-9_-]{1,64}))",
             [&](const httplib::Request& req, httplib::Response& res) {
               const std::string tenant = admit(req, res, 1);
               if (tenant.empty()) return;
               std::string body;
               if (!objects.find(tenant, req.matches[1].str(), &body)) {
                 res.status = 404;
                 res.set_content(json_error("not_found", req.matches[1].str()), "application/json");
                 return;
               }
               res.set_content(body, "application/json");
             });
  server.Post("/objects", [&](const httplib::Request& req, httplib::Response& res) {
    const std::string tenant = admit(req, res, 5);
    if (tenant.empty()) return;
    const std::string id = objects.create(tenant, req.body.empty() ? "{}" : req.body);
    res.status = 201;
    res.set_header("Location", absl::StrCat("/objects/", id));
    res.set_content(absl::StrFormat("{\"id\":\"%s\"}\n", id), "application/json");
  });

  int port = o.port;
  if (o.port == 0) {
    port = server.bind_to_any_port(o.host);
  } else if (!server.bind_to_port(o.host, o.port)) {
    port = -1;
  }
  if (port <= 0) {
    std::fprintf(stderr, "http_gateway: cannot listen on %s:%d\n", o.host.c_str(), o.port);
    return 1;
  }
  std::printf("listening on %s:%d (budget: %lld units per %lld s, burst %lld; store: %s)\n",
              o.host.c_str(), port, static_cast<long long>(o.rate), static_cast<long long>(o.per_s),
              static_cast<long long>(o.burst),
              o.redis.empty() ? "in-process" : ("redis " + o.redis).c_str());
  std::fflush(stdout);
  return server.listen_after_bind() ? 0 : 1;
}
