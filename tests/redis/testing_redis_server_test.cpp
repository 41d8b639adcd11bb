// The testing kit's throw-away redis-server (quota/testing/redis_server.hpp), as a user's
// integration test holds it: started on a loopback port of its own with the test's config
// lines, a limiter deciding on it, paused and crashed by signal, restarted on its port,
// gone with its directory at the end of scope; a config redis-server refuses gives no
// server and an error naming the cause from its log.
#include <signal.h>

#include <chrono>
#include <filesystem>
#include <memory>
#include <string>

#include <catch2/catch.hpp>

#include "quota/redis/redis_store.hpp"
#include "quota/testing/redis_server.hpp"

using namespace std::chrono_literals;
using quota::testing::RedisServer;

namespace {

// A store on `server` with a budget of 2 per hour.
quota::RedisStore<quota::TokenBucket> bucket_store(const RedisServer& server) {
  return quota::RedisStore<quota::TokenBucket>(quota::RedisStoreOptions{
      .pool = std::make_shared<quota::redis::ConnectionPool>(server.connection(), 2),
      .prefix = "kit:"});
}

const quota::TokenBucket kTwoPerHour{.rate = {.units = 2, .per = std::chrono::hours(1)},
                                     .burst = 2};

}  // namespace

TEST_CASE("the kit's RedisServer serves a limiter and is gone at the end of scope",
          "[testing][redis_server]") {
  std::string dir;
  {
    RedisServer server("quota-kit-serves", {"maxmemory-policy noeviction"});
    INFO(server.error());
    REQUIRE(server.started());
    CHECK(server.error().empty());
    CHECK(server.port() >= 20000);
    CHECK(server.port() < 32000);
    CHECK(server.pid() > 0);
    dir = server.dir();
    CHECK(std::filesystem::exists(dir + "/redis.conf"));

    auto store = bucket_store(server);
    for (int i = 0; i < 2; ++i) {
      auto d = store.apply(kTwoPerHour, "acme", quota::Nanos(0), 1);
      REQUIRE(d.ok());
      CHECK(d->allowed);
    }
    auto third = store.apply(kTwoPerHour, "acme", quota::Nanos(0), 1);
    REQUIRE(third.ok());
    CHECK_FALSE(third->allowed);
  }
  CHECK_FALSE(std::filesystem::exists(dir));
}

TEST_CASE("the kit's RedisServer is crashed and restarted on its port, its data gone",
          "[testing][redis_server]") {
  RedisServer server("quota-kit-restart");
  INFO(server.error());
  REQUIRE(server.started());
  const int port = server.port();
  auto store = bucket_store(server);
  for (int i = 0; i < 2; ++i) REQUIRE(store.apply(kTwoPerHour, "acme", quota::Nanos(0), 1).ok());

  REQUIRE(server.kill(SIGKILL));
  auto down = store.apply(kTwoPerHour, "acme", quota::Nanos(0), 1);
  CHECK_FALSE(down.ok());  // an error, never a decision

  REQUIRE(server.restart());
  CHECK(server.port() == port);
  // No persistence: the restarted server has forgotten the spent budget, as a fresh one.
  bool allowed = false;
  for (int i = 0; i < 20 && !allowed; ++i) {  // the pool reconnects on a later call
    auto d = store.apply(kTwoPerHour, "acme", quota::Nanos(0), 1);
    allowed = d.ok() && d->allowed;
  }
  CHECK(allowed);
}

TEST_CASE("the kit's RedisServer reports a config redis-server refuses",
          "[testing][redis_server]") {
  RedisServer server("quota-kit-refused", {"no-such-directive yes"});
  CHECK_FALSE(server.started());
  CHECK(server.port() == 0);
  // redis-server names the bad directive, and the error carries it.
  CHECK_THAT(server.error(), Catch::Contains("no-such-directive"));
  std::filesystem::remove_all(server.dir());
}
