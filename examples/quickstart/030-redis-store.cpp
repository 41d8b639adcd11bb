// 030 — one budget shared by every gateway process: the Redis store.
//
// Two "gateways" (two RedisStore instances with their own connection pools, as two
// processes would have) spend from one tenant's bucket in Redis. The decision is made
// in Redis, by the token bucket's Lua twin, with the server's clock: whichever gateway
// asks, the tenant gets its 5 units, not 5 per gateway. Failures of Redis are errors,
// never an allow or a deny: we show one against a port where nothing listens.
//
// Needs a redis-server: QUOTA_REDIS_PORT=<port> (default 6379) on 127.0.0.1.
// Build and run:  cmake --preset dev && cmake --build --preset dev &&
//                 QUOTA_REDIS_PORT=6379 ./build/dev/examples/quickstart/quickstart-030-redis-store
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <memory>
#include <string>

#include "quota/quota.hpp"
#include "quota/redis/redis_store.hpp"

int main() {
  using namespace std::chrono_literals;
  const char* env = std::getenv("QUOTA_REDIS_PORT");
  const int port = env != nullptr ? std::atoi(env) : 6379;
  quota::redis::ConnectionConfig config{.host = "127.0.0.1", .port = port, .deadline = 200ms};
  // 5 units per minute, bursts of 5. A unique prefix so that reruns start fresh.
  const quota::TokenBucket policy{.rate = {.units = 5, .per = 1min}, .burst = 5};
  const std::string prefix = "quickstart-030:" + std::to_string(std::time(nullptr)) + ":";
  using Limiter = quota::Limiter<quota::TokenBucket, quota::RedisStore>;
  auto gateway_a = Limiter::create(
      policy,
      quota::RedisStoreOptions{.pool = std::make_shared<quota::redis::ConnectionPool>(config, 2),
                               .prefix = prefix});
  auto gateway_b = Limiter::create(
      policy,
      quota::RedisStoreOptions{.pool = std::make_shared<quota::redis::ConnectionPool>(config, 2),
                               .prefix = prefix});
  if (!gateway_a.ok() || !gateway_b.ok()) {
    std::fprintf(stderr, "bad policy: %s\n", gateway_a.status().ToString().c_str());
    return 1;
  }

  // The key: tenant "acme", route class "read" -> "{acme}read", one hash slot per tenant.
  auto key = quota::redis::tenant_key("acme", "read");
  if (!key.ok()) return 1;
  int admitted = 0;
  for (int i = 0; i < 8; ++i) {
    Limiter& gw = i % 2 == 0 ? *gateway_a : *gateway_b;
    absl::StatusOr<quota::Decision> d = gw.acquire(*key, 1);
    if (!d.ok()) {  // Redis unreachable, timed out, ...: no decision (503, not 429)
      std::fprintf(stderr, "redis: %s\n", d.status().ToString().c_str());
      return 1;
    }
    admitted += d->allowed;
    std::printf("gateway %c: %-10s remaining %lld, retry after %lld ms\n", i % 2 == 0 ? 'A' : 'B',
                std::string(quota::to_string(d->reason)).c_str(),
                static_cast<long long>(d->remaining),
                static_cast<long long>(d->allowed ? 0 : d->retry_after / 1ms));
  }

  // A key that would reach into another tenant's hash slot is rejected.
  auto hijack = gateway_a->acquire("{acme}read}{other", 1);
  std::printf("crafted key: %s\n", hijack.status().ToString().c_str());

  // Redis unreachable: an error (kUnavailable), never an allow or a deny.
  config.port = 1;
  auto down = Limiter::create(
      policy,
      quota::RedisStoreOptions{.pool = std::make_shared<quota::redis::ConnectionPool>(config, 1)});
  auto d = down->acquire(*key, 1);
  std::printf("redis down: %s\n", d.status().ToString().c_str());

  const bool ok =
      admitted == 5 && absl::IsInvalidArgument(hijack.status()) && absl::IsUnavailable(d.status());
  std::printf("%s\n", ok ? "as expected: 5 admitted across both gateways" : "UNEXPECTED");
  return ok ? 0 : 1;
}
