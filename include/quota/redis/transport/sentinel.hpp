// quota/redis/transport/sentinel.hpp — a Sentinel-managed primary, found and followed.
//
// `SentinelPool` asks a list of sentinels for the address of the primary they monitor
// under a name (`SENTINEL get-master-addr-by-name <name>`, the first sentinel that
// answers wins, the last one that answered is asked first next time) and hands out a
// ConnectionPool whose connections go there. Each connection confirms with ROLE that the
// server it reached is the primary (connection.hpp's handshake), so a stale answer — a
// sentinel that has not yet seen a failover, a demoted primary come back — is never
// written to. The address is asked afresh after a connection to it fails (refused, lost,
// a timeout), when ROLE says it is not the primary, and when a reply says READONLY (the
// server was demoted under an open connection); all threads share one answer, and one
// lookup at a time is made.
//
// Guarantees. While no primary is reachable every call is kUnavailable (the route's fail
// mode applies), never a decision; decisions resume on the promoted replica with the
// first connect after the sentinels name it. A failover may lose the writes the replica
// had not received: use `replicas` (redis::Durability, WAIT) to acknowledge a decision
// only once a replica has it. AUTH: the sentinels' credentials (`sentinel_username`,
// `sentinel_password`) are separate from the data nodes' (`primary.username`,
// `primary.password`); a rejection is kUnauthenticated. The data connections also run
// the eviction-policy check of handshake.hpp.
//
// Thread safety: SentinelPool is thread-safe.
//
//   quota::redis::SentinelConfig cfg{.name = "quota",
//                                    .sentinels = {{"10.0.0.1", 26379}, {"10.0.0.2", 26379}}};
//   cfg.primary.password = "s3cret";
//   auto sentinel = std::make_shared<quota::redis::SentinelPool>(cfg, /*connections=*/8);
//   quota::RedisStoreOptions options;
//   options.sentinel = sentinel;  // instead of pool or cluster
#pragma once

#include <atomic>
#include <charconv>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "quota/redis/transport/connection_pool.hpp"
#include "quota/redis/transport/error_kind.hpp"

namespace quota::redis {

struct SentinelConfig {
  // The name the sentinels monitor the primary under (`sentinel monitor <name> ...`).
  std::string name = {};
  // The sentinels, asked in order (starting with the last one that answered).
  std::vector<Endpoint> sentinels = {};
  // AUTH on the sentinels (their requirepass, or an ACL user); empty: none.
  std::string sentinel_username = {};
  std::string sentinel_password = {};
  // The primary's connections: timeouts, credentials, eviction check. host and port are
  // ignored (the sentinels give them); the sentinel connections use the same timeouts.
  ConnectionConfig primary = {};
};

namespace detail {

// The AddressResolver behind SentinelPool: the cached answer of the sentinels.
class SentinelResolver final : public AddressResolver {
 public:
  explicit SentinelResolver(SentinelConfig config) : config_(std::move(config)) {
    for (const Endpoint& s : config_.sentinels) {
      ConnectionConfig c = config_.primary;
      c.host = s.host;
      c.port = s.port;
      c.username = config_.sentinel_username;
      c.password = config_.sentinel_password;
      c.eviction_check = EvictionPolicyCheck::kSkip;  // a sentinel holds no quota keys
      c.resolver = nullptr;
      c.handshake_stats = nullptr;
      c.node_watch = nullptr;
      sentinels_.push_back(std::make_unique<Connection>(std::move(c)));
    }
  }

  absl::StatusOr<Endpoint> resolve() override {
    std::lock_guard<std::mutex> lock(mu_);
    if (current_.has_value()) return *current_;
    if (sentinels_.empty()) {
      return absl::InvalidArgumentError("SentinelConfig: no sentinels given");
    }
    lookups_.fetch_add(1, std::memory_order_relaxed);
    absl::Status last;
    for (std::size_t i = 0; i < sentinels_.size(); ++i) {
      const std::size_t at = (preferred_ + i) % sentinels_.size();
      auto got = ask(*sentinels_[at]);
      if (!got.ok()) {
        // An authentication error says more than a later sentinel that is down.
        if (last.ok() || absl::IsUnavailable(last)) last = got.status();
        continue;
      }
      preferred_ = at;
      if (known_.has_value() && !(*known_ == *got)) {
        switches_.fetch_add(1, std::memory_order_relaxed);
      }
      known_ = *got;
      current_ = *got;
      return *got;
    }
    return with_message(last,
                        absl::StrFormat("redis sentinel: no primary for '%s' from %d sentinels: %s",
                                        config_.name, sentinels_.size(), last.message()));
  }

  void stale(const Endpoint& at) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (current_.has_value() && *current_ == at) current_.reset();
  }

  std::uint64_t lookups() const { return lookups_.load(std::memory_order_relaxed); }
  std::uint64_t switches() const { return switches_.load(std::memory_order_relaxed); }
  const SentinelConfig& config() const { return config_; }

 private:
  // SENTINEL get-master-addr-by-name on one sentinel (mu_ held).
  absl::StatusOr<Endpoint> ask(Connection& sentinel) {
    const std::string where =
        absl::StrFormat("%s:%d", sentinel.config().host, sentinel.config().port);
    auto reply = sentinel.command({"SENTINEL", "get-master-addr-by-name", config_.name});
    if (!reply.ok()) return reply.status();
    const redisReply& r = **reply;
    if (r.type == REDIS_REPLY_ERROR) {
      absl::Status s = error_status(r);
      return absl::Status(s.code(), absl::StrCat("sentinel ", where, ": ", s.message()));
    }
    if (r.type != REDIS_REPLY_ARRAY || r.elements != 2 ||
        r.element[0]->type != REDIS_REPLY_STRING || r.element[1]->type != REDIS_REPLY_STRING) {
      return absl::UnavailableError(
          absl::StrCat("sentinel ", where, " does not know a primary named '", config_.name, "'"));
    }
    const std::string_view port_text = reply_string(*r.element[1]);
    int port = 0;
    const auto [end, ec] =
        std::from_chars(port_text.data(), port_text.data() + port_text.size(), port);
    if (ec != std::errc() || end != port_text.data() + port_text.size() || port <= 0) {
      return absl::UnavailableError(absl::StrCat("sentinel ", where, " gave a malformed port"));
    }
    return Endpoint{std::string(reply_string(*r.element[0])), port};
  }

  const SentinelConfig config_;
  std::mutex mu_;  // guards everything below (std::mutex: see ConnectionPool)
  std::vector<std::unique_ptr<Connection>> sentinels_;
  std::size_t preferred_ = 0;
  std::optional<Endpoint> current_;  // the address connections use; reset when stale
  std::optional<Endpoint> known_;    // the last address any sentinel gave
  std::atomic<std::uint64_t> lookups_{0}, switches_{0};
};

}  // namespace detail

class SentinelPool {
 public:
  // A pool of `connections` (>= 1) to the primary the sentinels name, opened lazily.
  SentinelPool(SentinelConfig config, std::size_t connections)
      : resolver_(std::make_shared<detail::SentinelResolver>(std::move(config))) {
    ConnectionConfig c = resolver_->config().primary;
    // Named in messages until a connection has an address of its own.
    c.host = absl::StrCat("(primary '", resolver_->config().name, "' of the sentinels)");
    c.port = 0;
    c.resolver = resolver_;
    pool_ = std::make_shared<ConnectionPool>(std::move(c), connections);
  }

  // The connections to the primary (what RedisStoreOptions::sentinel uses as its pool).
  const std::shared_ptr<ConnectionPool>& pool() const { return pool_; }

  // The primary's address as the sentinels give it now (cached until found stale).
  absl::StatusOr<Endpoint> primary() { return resolver_->resolve(); }

  // Lookups made at the sentinels, and how often the answer changed (failovers seen).
  std::uint64_t lookups() const { return resolver_->lookups(); }
  std::uint64_t switches() const { return resolver_->switches(); }
  const SentinelConfig& config() const { return resolver_->config(); }

 private:
  std::shared_ptr<detail::SentinelResolver> resolver_;
  std::shared_ptr<ConnectionPool> pool_;
};

}  // namespace quota::redis
