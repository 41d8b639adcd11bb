// quota/redis/transport/subscriber.hpp — a Redis pub/sub subscription kept up on its own
// thread.
//
// `Subscriber` opens one Connection (connection.hpp: the same ConnectionConfig, so the
// same address or resolver, AUTH and deadlines as the pool's connections), SUBSCRIBEs to
// its channels, and calls `on_message(channel, payload)` for each message, on its thread,
// in the order Redis delivered them. After each successful SUBSCRIBE (the first, and
// every one after a reconnect) it calls `on_subscribed` before any message of that
// subscription: messages published while it was not subscribed are not delivered, so
// the caller reads there whatever state it must not miss, and returns whether it could:
// false drops the subscription and tries again after the backoff, so a subscription is up
// only with its catch-up done.
//
// Liveness: a lost connection (reset, closed, a server restart) is found at once; a link
// that goes silent is found by a PING sent every `ping_every` while no traffic comes,
// answered within `ping_every`, else the connection is dropped. Then it reconnects with
// backoff (doubling from backoff_min to backoff_max). `subscribed()` says whether a
// subscription is up now; `subscriptions()` counts the SUBSCRIBEs that succeeded, their
// catch-up included.
//
// Stop: `stop()` (and the destructor) ends the thread and joins it; no callback runs after
// it returns. While listening the thread notices it within `poll` (the longest wait on
// the socket); while connecting, subscribing or sending a PING, within the connection's
// deadline; while in `on_subscribed`, when that returns. Callbacks must not call stop()
// or destroy the Subscriber.
//
// Thread safety: the member functions may be called from any thread; callbacks run on
// the subscriber's thread.
//
//   quota::redis::Subscriber sub({.connection = pool->config(), .channels = {"events"}},
//       [](std::string_view channel, std::string_view payload) { /* ... */ });
//   // ... sub.subscribed(); sub.stop();
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "quota/redis/transport/connection.hpp"
#include "quota/redis/transport/deadline.hpp"
#include "quota/redis/transport/reply.hpp"

namespace quota::redis {

struct SubscriberOptions {
  ConnectionConfig connection{};
  // When set, asked before each connect for where to subscribe (replacing `connection`):
  // e.g. the next node of a cluster, so one node down does not hold the subscription.
  std::function<ConnectionConfig()> connect_to{};
  std::vector<std::string> channels{};
  // The longest wait on the socket: how soon stop() is noticed.
  std::chrono::milliseconds poll{50};
  // A PING after this long without traffic; no answer within as long again: reconnect.
  std::chrono::milliseconds ping_every{1000};
  std::chrono::milliseconds backoff_min{10};
  std::chrono::milliseconds backoff_max{1000};
};

class Subscriber {
 public:
  using OnMessage = std::function<void(std::string_view channel, std::string_view payload)>;
  using OnSubscribed = std::function<bool()>;  // false: the catch-up failed

  // Starts the thread. An empty channel list subscribes to nothing (the thread idles).
  Subscriber(SubscriberOptions options, OnMessage on_message, OnSubscribed on_subscribed = {})
      : options_(std::move(options)),
        on_message_(std::move(on_message)),
        on_subscribed_(std::move(on_subscribed)) {
    own(options_.connection);
    options_.poll = std::max(options_.poll, std::chrono::milliseconds(1));
    options_.backoff_min = std::max(options_.backoff_min, std::chrono::milliseconds(1));
    options_.backoff_max = std::max(options_.backoff_max, options_.backoff_min);
    thread_ = std::thread([this] { run(); });
  }
  ~Subscriber() { stop(); }
  Subscriber(const Subscriber&) = delete;
  Subscriber& operator=(const Subscriber&) = delete;

  void stop() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
    }
    wake_.notify_all();
    std::lock_guard<std::mutex> joining(join_mu_);  // a second stop() waits for the first
    if (thread_.joinable()) thread_.join();
  }

  bool subscribed() const { return subscribed_.load(std::memory_order_acquire); }
  std::uint64_t subscriptions() const { return subscriptions_.load(std::memory_order_acquire); }

 private:
  bool stopping() {
    std::lock_guard<std::mutex> lock(mu_);
    return stopping_;
  }

  // It holds no keys and decides nothing: no policy check, and its connects are not
  // counted or watched with the pool's (a handshake of its own).
  static void own(ConnectionConfig& c) {
    c.eviction_check = EvictionPolicyCheck::kSkip;
    c.handshake_stats = nullptr;
    c.node_watch = nullptr;
  }

  // Waits `d` or until stop(); true when stopping.
  bool pause(std::chrono::milliseconds d) {
    std::unique_lock<std::mutex> lock(mu_);
    return wake_.wait_for(lock, d, [this] { return stopping_; });
  }

  void run() {
    std::chrono::milliseconds backoff = options_.backoff_min;
    while (!stopping()) {
      if (options_.channels.empty()) {
        pause(options_.poll);
        continue;
      }
      if (options_.connect_to) {
        options_.connection = options_.connect_to();
        own(options_.connection);
      }
      Connection c(options_.connection);
      // The catch-up first: subscribed() and subscriptions() say so only once it ran.
      if (subscribe(c) && (!on_subscribed_ || on_subscribed_())) {
        backoff = options_.backoff_min;
        subscriptions_.fetch_add(1, std::memory_order_acq_rel);
        subscribed_.store(true, std::memory_order_release);
        listen(c);
        subscribed_.store(false, std::memory_order_release);
      }
      if (pause(backoff)) break;
      backoff = std::min(backoff * 2, options_.backoff_max);
    }
  }

  // SUBSCRIBE and its confirmations, one per channel, within the connection's deadline.
  bool subscribe(Connection& c) {
    std::vector<std::string_view> args{"SUBSCRIBE"};
    for (const std::string& ch : options_.channels) args.push_back(ch);
    const Deadline deadline = Deadline::after(options_.connection.deadline);
    const std::vector<std::vector<std::string_view>> commands(1, args);
    if (!c.send(commands, deadline).ok()) return false;
    auto confirmed = c.receive(options_.channels.size(), deadline);
    if (!confirmed.ok()) return false;
    for (const Reply& r : *confirmed) {
      if (kind(*r) != "subscribe") return false;  // an error reply (NOPERM, ...)
    }
    return true;
  }

  // Delivers messages until the connection fails, goes silent, or stop() is called.
  void listen(Connection& c) {
    using Clock = std::chrono::steady_clock;
    auto last_traffic = Clock::now();
    bool ping_out = false;
    while (!stopping()) {
      auto pushed = c.next_pushed(Deadline::after(options_.poll));
      if (!pushed.ok()) return;
      const auto now = Clock::now();
      if (!pushed->has_value()) {
        if (now - last_traffic < options_.ping_every) continue;
        if (ping_out) return;  // no answer to the PING: the link is dead
        const std::vector<std::vector<std::string_view>> ping(1, {"PING"});
        if (!c.send(ping, Deadline::after(options_.connection.deadline)).ok()) return;
        ping_out = true;
        last_traffic = now;
        continue;
      }
      last_traffic = now;
      ping_out = false;
      const redisReply& r = ***pushed;
      if (kind(r) == "message" && r.elements == 3) {
        on_message_(reply_string(*r.element[1]), reply_string(*r.element[2]));
      }
    }
  }

  // The first element of a pushed array ("subscribe", "message", "pong"), else "".
  static std::string_view kind(const redisReply& r) {
    if (r.type != REDIS_REPLY_ARRAY || r.elements == 0) return {};
    const redisReply& first = *r.element[0];
    if (first.type != REDIS_REPLY_STRING && first.type != REDIS_REPLY_STATUS) return {};
    return reply_string(first);
  }

  SubscriberOptions options_;
  OnMessage on_message_;
  OnSubscribed on_subscribed_;
  std::mutex mu_;
  std::mutex join_mu_;
  std::condition_variable wake_;
  bool stopping_ = false;
  std::atomic<bool> subscribed_{false};
  std::atomic<std::uint64_t> subscriptions_{0};
  std::thread thread_;
};

}  // namespace quota::redis
