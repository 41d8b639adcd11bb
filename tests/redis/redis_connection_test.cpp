// Tests for quota/redis/transport/connection.hpp against a real redis-server: commands,
// pipelining, error replies as replies, failures as kUnavailable, reconnect after a
// failure, and the pool under many threads.
#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "quota/redis/transport/connection_pool.hpp"
#include "support/redis_server.hpp"

using namespace std::chrono_literals;
using quota::redis::Connection;
using quota::redis::ConnectionPool;
using quota::redis::reply_string;

TEST_CASE("a command round-trips and binary-safe arguments survive") {
  Connection conn(quota::testing::redis_config());
  const std::string key = quota::testing::unique_prefix("conn") + "bin";
  const std::string value("a\0b\nc", 5);
  auto set = conn.command({"SET", key, value});
  REQUIRE(set.ok());
  REQUIRE((*set)->type == REDIS_REPLY_STATUS);
  auto get = conn.command({"GET", key});
  REQUIRE(get.ok());
  REQUIRE((*get)->type == REDIS_REPLY_STRING);
  CHECK(reply_string(**get) == value);
  REQUIRE(conn.command({"DEL", key}).ok());
}

TEST_CASE("a pipeline writes all commands and reads the replies in order") {
  Connection conn(quota::testing::redis_config());
  const std::string key = quota::testing::unique_prefix("conn") + "ctr";
  std::vector<std::vector<std::string_view>> cmds;
  for (int i = 0; i < 50; ++i) cmds.push_back({"INCR", key});
  auto replies = conn.pipeline(cmds);
  REQUIRE(replies.ok());
  REQUIRE(replies->size() == 50);
  for (int i = 0; i < 50; ++i) {
    REQUIRE((*replies)[i]->type == REDIS_REPLY_INTEGER);
    CHECK((*replies)[i]->integer == i + 1);
  }
  REQUIRE(conn.command({"DEL", key}).ok());
}

TEST_CASE("an error reply is a reply; error_status maps it to unavailable with the cause") {
  Connection conn(quota::testing::redis_config());
  auto r = conn.command({"NOSUCHCOMMAND"});
  REQUIRE(r.ok());
  REQUIRE((*r)->type == REDIS_REPLY_ERROR);
  const absl::Status s = quota::redis::error_status(**r);
  CHECK(absl::IsUnavailable(s));
  CHECK(s.message().find("unknown command") != absl::string_view::npos);
  auto noscript = conn.command({"EVALSHA", "0000000000000000000000000000000000000000", "0"});
  REQUIRE(noscript.ok());
  CHECK(quota::redis::is_error(**noscript, "NOSCRIPT"));
  CHECK_FALSE(quota::redis::is_error(**noscript, "NOSCRIPTX"));
  CHECK(conn.connected());  // an error reply does not drop the connection
}

TEST_CASE("a refused connection is unavailable, quickly, and names the address") {
  auto cfg = quota::testing::redis_config(50ms);
  cfg.port = 1;  // nothing listens on port 1
  Connection conn(cfg);
  const auto t0 = std::chrono::steady_clock::now();
  auto r = conn.command({"PING"});
  CHECK(std::chrono::steady_clock::now() - t0 < 2s);
  REQUIRE_FALSE(r.ok());
  CHECK(absl::IsUnavailable(r.status()));
  CHECK(r.status().message().find("127.0.0.1:1") != absl::string_view::npos);
  CHECK_FALSE(conn.connected());
}

TEST_CASE(
    "a command past its deadline is unavailable, drops the connection, and the next call "
    "reconnects") {
  Connection conn(quota::testing::redis_config(100ms));
  const auto t0 = std::chrono::steady_clock::now();
  // BLPOP on an empty list blocks this client (only) for 0.5 s: past the 100 ms deadline.
  const std::string key = quota::testing::unique_prefix("conn") + "empty-list";
  auto r = conn.command({"BLPOP", key, "0.5"});
  const auto took = std::chrono::steady_clock::now() - t0;
  REQUIRE_FALSE(r.ok());
  CHECK(absl::IsUnavailable(r.status()));
  CHECK(r.status().message().find("deadline of 100000 us passed") != absl::string_view::npos);
  CHECK(took < 450ms);
  CHECK_FALSE(conn.connected());
  auto ping = conn.command({"PING"});
  REQUIRE(ping.ok());
  CHECK(reply_string(**ping) == "PONG");
}

TEST_CASE("the pool serves many threads, one connection each at a time") {
  auto pool = quota::testing::redis_pool(3);
  const std::string key = quota::testing::unique_prefix("conn") + "pool";
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 200; ++i) {
        auto lease = pool->acquire();
        if (!lease.ok()) {
          ++failures;
          continue;
        }
        auto r = (*lease)->command({"INCR", key});
        if (!r.ok() || (*r)->type != REDIS_REPLY_INTEGER) ++failures;
      }
    });
  }
  for (auto& t : threads) t.join();
  CHECK(failures == 0);
  auto lease = pool->acquire();
  REQUIRE(lease.ok());
  auto total = (*lease)->command({"GET", key});
  REQUIRE(total.ok());
  CHECK(reply_string(**total) == "1600");
  REQUIRE((*lease)->command({"DEL", key}).ok());
}

TEST_CASE("an exhausted pool answers unavailable when the deadline passes") {
  auto cfg = quota::testing::redis_config();
  cfg.deadline = 20ms;
  ConnectionPool pool(cfg, 1);
  auto first = pool.acquire();
  REQUIRE(first.ok());
  auto second = pool.acquire();
  REQUIRE_FALSE(second.ok());
  CHECK(absl::IsUnavailable(second.status()));
}
