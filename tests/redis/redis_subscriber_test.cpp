// Tests for quota/redis/transport/subscriber.hpp against a redis-server of its own
// (RedisServer: the test kills and restarts it): messages delivered in order; a
// subscription cut off (CLIENT KILL, a server restart) comes back by itself and says so
// (on_subscribed, subscriptions()); stop() ends the thread and no callback runs after it.
#include "quota/redis/transport/subscriber.hpp"

#include <signal.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "support/redis_server.hpp"

using namespace std::chrono_literals;

namespace {

// What a subscriber received, read from the test's thread (Catch2's assertions are not
// thread-safe: the callbacks only record).
struct Inbox {
  std::mutex mu;
  std::vector<std::string> messages;
  std::vector<std::string> channels;
  std::atomic<int> subscribed{0};

  std::size_t size() {
    std::lock_guard<std::mutex> lock(mu);
    return messages.size();
  }
};

quota::redis::ConnectionConfig subscriber_config(int port) {
  return {.host = "127.0.0.1", .port = port, .deadline = 2s};
}

// Polls `done` every 10 ms for at most 20 s (generous for sanitizer builds): no timing is
// asserted, only that it happens.
template <class Fn>
bool eventually(Fn done) {
  for (int i = 0; i < 2000; ++i) {
    if (done()) return true;
    std::this_thread::sleep_for(10ms);
  }
  return done();
}

// PUBLISHes until the subscriber has `n` messages (a message published just before a
// SUBSCRIBE reached the server is not delivered, so the test publishes until one is).
bool publish_until(quota::redis::Connection& c, Inbox& in, std::size_t n, const std::string& text) {
  return eventually([&] {
    if (in.size() >= n) return true;
    auto r = c.command({"PUBLISH", "events", text});
    return r.ok() && in.size() >= n;
  });
}

}  // namespace

TEST_CASE("a subscriber delivers messages, comes back after a cut, and stops cleanly",
          "[redis][subscriber]") {
  quota::testing::RedisServer server("subscriber", {});
  REQUIRE(server.started());
  Inbox in;
  quota::redis::Subscriber sub(
      {.connection = subscriber_config(server.port()),
       .channels = {"events"},
       .poll = 20ms,
       .ping_every = 200ms},
      [&](std::string_view channel, std::string_view payload) {
        std::lock_guard<std::mutex> lock(in.mu);
        in.channels.emplace_back(channel);
        in.messages.emplace_back(payload);
      },
      [&] {
        ++in.subscribed;
        return true;
      });
  quota::redis::Connection admin(subscriber_config(server.port()));
  REQUIRE(eventually([&] { return sub.subscribed(); }));
  CHECK(sub.subscriptions() == 1);
  CHECK(in.subscribed.load() == 1);
  for (const char* m : {"one", "two", "three"})
    REQUIRE(admin.command({"PUBLISH", "events", m}).ok());
  REQUIRE(eventually([&] { return in.size() == 3; }));
  {
    std::lock_guard<std::mutex> lock(in.mu);
    CHECK(in.messages == std::vector<std::string>{"one", "two", "three"});
    CHECK(in.channels == std::vector<std::string>(3, "events"));
  }

  // The subscription's connection killed by the server: it subscribes again by itself.
  auto killed = admin.command({"CLIENT", "KILL", "TYPE", "pubsub"});
  REQUIRE(killed.ok());
  CHECK((*killed)->integer == 1);
  REQUIRE(eventually([&] { return sub.subscriptions() == 2 && sub.subscribed(); }));
  CHECK(in.subscribed.load() == 2);
  REQUIRE(publish_until(admin, in, 4, "after kill"));

  // The server killed and restarted on its port: the subscriber notices (the connection
  // is gone, or its PING goes unanswered) and subscribes again.
  REQUIRE(server.kill(SIGKILL));
  REQUIRE(server.restart());
  REQUIRE(eventually([&] { return sub.subscriptions() >= 3 && sub.subscribed(); }));
  quota::redis::Connection after(subscriber_config(server.port()));
  REQUIRE(publish_until(after, in, 5, "after restart"));

  // stop(): the thread ends; nothing is delivered after.
  sub.stop();
  CHECK_FALSE(sub.subscribed());
  const std::size_t before = in.size();
  REQUIRE(after.command({"PUBLISH", "events", "late"}).ok());
  std::this_thread::sleep_for(100ms);
  CHECK(in.size() == before);
}

TEST_CASE("a subscriber to a server that is not there keeps trying, and stops cleanly",
          "[redis][subscriber]") {
  // A port nothing listens on: a server started and stopped again.
  int port = 0;
  {
    quota::testing::RedisServer gone("subscriber-gone", {});
    REQUIRE(gone.started());
    port = gone.port();
  }
  std::atomic<int> messages{0};
  quota::redis::Subscriber sub(
      {.connection = subscriber_config(port), .channels = {"events"}, .backoff_min = 5ms},
      [&](std::string_view, std::string_view) { ++messages; });
  std::this_thread::sleep_for(50ms);
  CHECK_FALSE(sub.subscribed());
  CHECK(sub.subscriptions() == 0);
  sub.stop();
  CHECK(messages.load() == 0);
}

TEST_CASE("a subscriber whose catch-up fails is not subscribed, and tries again",
          "[redis][subscriber]") {
  quota::testing::RedisServer server("subscriber-catch-up", {});
  REQUIRE(server.started());
  std::atomic<int> attempts{0};
  quota::redis::Subscriber sub(
      {.connection = subscriber_config(server.port()),
       .channels = {"events"},
       .backoff_min = 5ms,
       .backoff_max = 20ms},
      [](std::string_view, std::string_view) {},
      [&] { return ++attempts >= 3; });  // the first two catch-ups fail
  REQUIRE(eventually([&] { return sub.subscribed(); }));
  CHECK(attempts.load() == 3);
  CHECK(sub.subscriptions() == 1);  // only the one whose catch-up succeeded
  sub.stop();
}
