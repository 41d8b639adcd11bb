// quota/redis/transport/script.hpp — runs one Lua script on Redis, standalone or Cluster.
//
// `Script::run(keys, args)` sends `EVALSHA <sha> numkeys keys... args...` to the server
// (or, on a cluster, to the node serving the first key's slot) and returns its reply:
//   - the script is loaded with SCRIPT LOAD on first use and its sha cached;
//   - on `NOSCRIPT` (after a flush, restart or failover) it is sent once more with EVAL
//     and the script's text, which loads and runs it in one command — only on that error;
//   - on a cluster, a node that fails or answers `CLUSTERDOWN` has the slot map reloaded
//     soon (ClusterPool::note_failure: rate-limited, from any node that answers); the
//     failed call itself is not sent again (it may have run);
//   - on a cluster, `MOVED` refreshes the slot map and retries on the named node, `ASK`
//     retries there once after `ASKING` (the map unchanged), at most kMaxRedirects hops;
//     `TRYAGAIN` (a call of several keys whose slot is half migrated: nothing ran) is
//     sent again to the slot's owner after a short backoff, as the cluster's
//     TryAgainPolicy allows, then kUnavailable naming TRYAGAIN (cluster.hpp).
// Every wait of one run / run_many (the pool, the connect, the writes, the replies, the
// slot map, redirections and TRYAGAIN backoffs) is bounded by ONE Deadline set when the
// call starts (CallLimits::deadline; the connections' ConnectionConfig::deadline, 3 ms,
// when 0). A call beyond CallLimits::in_flight, or to a node whose breaker is open
// (breaker.hpp), fails at once. Transport failures and the deadline are kUnavailable;
// error replies are returned as replies, for the caller to interpret. `Script::run_many(calls)`
// sends several calls in one pipelined write per server (every server written before any reply is
// read), and follows up NOSCRIPT, MOVED, ASK and TRYAGAIN in further rounds.
//
// Durability (redis::Durability): with `replicas` > 0 every server's write of script
// calls ends with `WAIT replicas timeout`, in the same pipelined write, and a call whose
// script ran is returned only when that many of the server's replicas acknowledged the
// write (WAIT counts the replicas that have everything the connection wrote before it);
// otherwise kUnavailable: the write stands on the master, but a failover to a replica
// that lacks it would forget it, so it is not acknowledged.
//
// Node guards (node_watch.hpp): with `guards.any()`, every call gets one more argument,
// last, built for the server it goes to at the moment of its write, once the connection
// is open (so a failover its connect found is in it): the node's failover time and the
// bound on its TIME (the highest server time minus monotonic time its replies showed,
// plus the monotonic time now, plus the tolerance). The script's head must say so (bit 1
// of its first byte: the stores set it). Replies feed the bound: the time at element
// `reply_time_at` of a reply (seconds, nanoseconds) that does not run ahead of it raises
// the node's offset; a QUOTA_CLOCK_AHEAD refusal is counted in the node's NodeWatch.
//
// Thread safety: every method may be called from any thread.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "quota/redis/transport/cluster.hpp"
#include "quota/redis/transport/connection_pool.hpp"
#include "quota/redis/transport/limits.hpp"
#include "quota/redis/transport/node_watch.hpp"
#include "quota/redis/transport/script_follow_up.hpp"

namespace quota::redis {

// The argv of `<cmd> <script or sha> numkeys keys... args...` (EVAL / EVALSHA), viewing
// the owned strings.
inline std::vector<std::string_view> script_argv(std::string_view cmd, std::string_view script,
                                                 std::string_view numkeys,
                                                 const std::vector<std::string>& keys,
                                                 const std::vector<std::string>& args) {
  std::vector<std::string_view> v;
  v.reserve(3 + keys.size() + args.size());
  v.push_back(cmd);
  v.push_back(script);
  v.push_back(numkeys);
  for (const auto& k : keys) v.push_back(k);
  for (const auto& a : args) v.push_back(a);
  return v;
}

class Script {
 public:
  // `pool` for a standalone server, or `cluster`; one of them non-null.
  Script(std::string text, std::shared_ptr<ConnectionPool> pool,
         std::shared_ptr<ClusterPool> cluster, Durability durability = {}, CallLimits limits = {},
         NodeGuards guards = {})
      : text_(std::move(text)),
        pool_(std::move(pool)),
        cluster_(std::move(cluster)),
        durability_(durability),
        limits_(std::move(limits)),
        guards_(std::move(guards)),
        wait_argv_{"WAIT", absl::StrCat(durability.replicas),
                   absl::StrCat(durability.timeout.count())} {}

  // One call: run_many of one.
  absl::StatusOr<Reply> run(const std::vector<std::string>& keys,
                            const std::vector<std::string>& args) {
    const Call call{&keys, &args};
    return std::move(run_many(std::span<const Call>(&call, 1)).front());
  }

  // A script call's keys and arguments, viewed: they must outlive run_many.
  struct Call {
    const std::vector<std::string>* keys;
    const std::vector<std::string>* args;
  };

  // Several calls, each in a pipelined write to its server (on a cluster: to the node of
  // its first key's slot), every server written before any reply is read, so the nodes
  // work at the same time. A call's position in its server's write keeps the caller's
  // order, so two calls on one key run in order. Replies that say the script did not run
  // go out again in a further round, again one write per server:
  //   - NOSCRIPT: once, with EVAL and the script's text;
  //   - on a cluster, MOVED (the slot map is refreshed) and ASK (with ASKING first, the
  //     map unchanged): to the named node, at most kMaxRedirects hops per call;
  //   - on a cluster, TRYAGAIN (several keys, the slot half migrated): to the slot's owner
  //     in the map, without ASKING, in a round that starts after the backoff of the
  //     cluster's TryAgainPolicy; past its retries kUnavailable naming TRYAGAIN.
  // One result per call, in order: a server that fails (pool, transport) fails only the
  // calls of its write (kUnavailable: the caller cannot tell which of them ran); an error
  // reply is returned as a reply.
  std::vector<absl::StatusOr<Reply>> run_many(std::span<const Call> calls) {
    std::vector<absl::StatusOr<Reply>> out;
    out.reserve(calls.size());
    for (std::size_t c = 0; c < calls.size(); ++c) {
      out.emplace_back(absl::UnknownError("script call not sent"));
    }
    std::optional<InFlightGuard::Token> place;
    if (limits_.in_flight != nullptr) {
      auto entered = limits_.in_flight->enter();
      if (!entered.ok()) {
        for (auto& o : out) o = entered.status();
        return out;
      }
      place.emplace(*std::move(entered));
    }
    using Pending = detail::PendingCall;
    const Deadline deadline = Deadline::after(this->deadline());
    auto slot_of = [&](std::size_t c) { return key_slot(calls[c].keys->front()); };
    std::vector<Pending> pending;
    pending.reserve(calls.size());
    {
      std::map<int, std::shared_ptr<ConnectionPool>> by_slot;
      for (std::size_t c = 0; c < calls.size(); ++c) {
        if (calls[c].keys->empty()) {
          out[c] = absl::InvalidArgumentError("script call without keys");
          continue;
        }
        auto target = target_of(calls[c].keys->front(), by_slot, deadline);
        if (!target.ok()) {
          out[c] = target.status();
          continue;
        }
        pending.push_back(Pending{.call = c, .target = *std::move(target)});
      }
    }
    std::vector<std::string> numkeys;
    numkeys.reserve(calls.size());
    for (const Call& c : calls) numkeys.push_back(absl::StrCat(c.keys->size()));
    std::string sha;
    while (!pending.empty()) {
      // One group per server. Leases are taken in one global order (by pool address), so
      // that threads each holding several connections never wait on each other in a
      // cycle.
      std::stable_sort(pending.begin(), pending.end(), [](const Pending& a, const Pending& b) {
        return std::less<>{}(a.target.get(), b.target.get());
      });
      struct Group {
        std::size_t begin, end;
        std::optional<ConnectionPool::Lease> lease;
        std::size_t replies = 0;
        std::string node_arg;  // the node's guards (guards_.any())
        Nanos sent{0};         // the monotonic time of the write
      };
      std::vector<Group> groups;
      for (std::size_t i = 0; i < pending.size(); ++i) {
        if (i == 0 || pending[i].target != pending[i - 1].target)
          groups.push_back({i, i, {}, 0, {}, Nanos{0}});
        groups.back().end = i + 1;
      }
      // A server that fails (transport, deadline, breaker) fails its group's calls; on a
      // cluster its slots may have moved (a failover): the map is reloaded soon.
      auto fail = [&](const Group& g, const absl::Status& s) {
        for (std::size_t i = g.begin; i < g.end; ++i) out[pending[i].call] = s;
        if (cluster_ != nullptr) cluster_->note_failure(*pending[g.begin].target);
      };
      for (std::size_t gi = 0; gi < groups.size(); ++gi) {
        Group& g = groups[gi];
        // Each server's write gets its share of the time left: one that must be connected
        // again (a connect and its handshake, a round trip) and does not answer cannot
        // take the time of the servers written after it.
        const Deadline mine = deadline.share(static_cast<int>(groups.size() - gi));
        auto lease = pending[g.begin].target->acquire(mine);
        if (!lease.ok()) {
          fail(g, lease.status());
          continue;
        }
        if (sha.empty()) {
          auto loaded = this->sha(**lease, mine);
          if (!loaded.ok()) {
            fail(g, loaded.status());
            continue;
          }
          sha = *std::move(loaded);
        }
        std::vector<std::vector<std::string_view>> cmds;
        cmds.reserve(g.end - g.begin);
        if (guards_.any()) {
          // Connected first: a connect that finds another server records the failover
          // before the argument that carries it is made.
          if (auto s = (*lease)->connect(mine); !s.ok()) {
            fail(g, s);
            continue;
          }
          const ConnectionPool& node = *pending[g.begin].target;
          g.node_arg = guards_.argument(&node, node.node_watch(), g.sent);
        }
        for (std::size_t i = g.begin; i < g.end; ++i) {
          const Pending& p = pending[i];
          if (p.asking) cmds.push_back({"ASKING"});
          cmds.push_back(script_argv(p.eval ? "EVAL" : "EVALSHA", p.eval ? text_ : sha,
                                     numkeys[p.call], *calls[p.call].keys, *calls[p.call].args));
          if (guards_.any()) cmds.back().push_back(g.node_arg);
        }
        if (durability_.replicas > 0) cmds.push_back({wait_argv_[0], wait_argv_[1], wait_argv_[2]});
        if (auto s = (*lease)->send(cmds, mine); !s.ok()) {
          fail(g, s);
          continue;
        }
        if (cluster_ != nullptr) cluster_->note_pipeline();
        g.replies = cmds.size();
        g.lease.emplace(*std::move(lease));
      }
      std::vector<Pending> again;
      bool refresh = false;
      std::chrono::microseconds wait{0};  // before the next round (after -TRYAGAIN)
      for (Group& g : groups) {
        if (!g.lease.has_value()) continue;
        auto replies = (*g.lease)->receive(g.replies, deadline);
        g.lease.reset();
        if (!replies.ok()) {
          fail(g, replies.status());
          continue;
        }
        // The calls of this write whose script ran (a reply that is not an error), when
        // WAIT says the write is not durable.
        const absl::Status durable =
            durable_status(durability_, *replies, pending[g.begin].target->config());
        auto done = [&](std::size_t call, Reply& r) {
          if (!durable.ok() && r->type != REDIS_REPLY_ERROR) {
            out[call] = durable;
          } else {
            out[call] = std::move(r);
          }
        };
        std::size_t k = 0;
        for (std::size_t i = g.begin; i < g.end; ++i) {
          Pending p = pending[i];
          if (p.asking) ++k;  // ASKING's +OK
          Reply& r = (*replies)[k++];
          if (guards_.any()) guards_.observe(p.target.get(), p.target->node_watch(), *r, g.sent);
          const detail::FollowUp next =
              detail::follow_up(p, *r, cluster_.get(), deadline, calls[p.call].keys->front());
          if (next.kind == detail::FollowUp::kAgain) {
            wait = std::max(wait, next.wait);
            refresh = refresh || next.refresh;
            again.push_back(std::move(p));
          } else if (next.kind == detail::FollowUp::kFailed) {
            out[p.call] = next.failure;
          } else {
            done(p.call, r);
          }
        }
      }
      groups.clear();  // every lease back before the refresh asks a node
      if (refresh) (void)cluster_->refresh(deadline);
      if (wait.count() > 0) std::this_thread::sleep_for(wait);
      pending.clear();
      for (Pending& p : again) {
        if (p.reroute) {
          p.reroute = false;
          auto pool = cluster_->for_slot(slot_of(p.call), deadline);
          if (!pool.ok()) {
            out[p.call] = pool.status();
            continue;
          }
          p.target = *pool;
        }
        pending.push_back(std::move(p));
      }
    }
    return out;
  }

  const std::string& text() const { return text_; }

  // The breakers of the nodes and the in-flight guard, counted (breaker.hpp).
  FailFastStats fail_fast_stats() const {
    FailFastStats out;
    if (cluster_ != nullptr) {
      out = cluster_->breaker_stats();
    } else if (pool_ != nullptr) {
      out.breakers = pool_->breaker_stats();
      out.open_nodes = out.breakers.open ? 1 : 0;
    }
    if (limits_.in_flight != nullptr) out.in_flight = limits_.in_flight->stats();
    return out;
  }

  // The failovers and clock refusals its nodes' connections saw (node_watch.hpp), summed.
  NodeWatchStats node_watch_stats() const {
    if (cluster_ != nullptr) return cluster_->node_watch_stats();
    return pool_ != nullptr ? pool_->node_watch().stats() : NodeWatchStats{};
  }

  // The budget of one call (CallLimits::deadline, or the connections').
  std::chrono::microseconds deadline() const {
    if (cluster_ != nullptr) return call_deadline(limits_, cluster_->config());
    return pool_ != nullptr ? call_deadline(limits_, pool_->config()) : kDefaultDeadline;
  }

  // The script's sha, loading it through `conn` (SCRIPT LOAD) on first use, within
  // `deadline` (default: a fresh one of the connection's). For callers that pipeline
  // EVALSHAs themselves.
  absl::StatusOr<std::string> sha(Connection& conn) {
    return sha(conn, Deadline::after(conn.config().deadline));
  }
  absl::StatusOr<std::string> sha(Connection& conn, const Deadline& deadline) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!sha_.empty()) return sha_;
    }
    auto reply = conn.command({"SCRIPT", "LOAD", text_}, deadline);
    if (!reply.ok()) return reply.status();
    if (auto s = error_status(**reply); !s.ok()) return s;
    if ((*reply)->type != REDIS_REPLY_STRING) {
      return absl::UnavailableError("malformed reply to SCRIPT LOAD: not a string");
    }
    std::string sha(reply_string(**reply));
    std::lock_guard<std::mutex> lock(mu_);
    sha_ = sha;
    return sha;
  }

 private:
  // The server of a call whose first key is `key`: the pool on a standalone server, the
  // node of the key's slot on a cluster (looked up once per slot in `seen`).
  absl::StatusOr<std::shared_ptr<ConnectionPool>> target_of(
      const std::string& key, std::map<int, std::shared_ptr<ConnectionPool>>& seen,
      const Deadline& deadline) const {
    if (cluster_ == nullptr) {
      if (pool_ == nullptr) return absl::InvalidArgumentError("script: no pool and no cluster");
      return pool_;
    }
    const int slot = key_slot(key);
    if (auto it = seen.find(slot); it != seen.end()) return it->second;
    auto pool = cluster_->for_slot(slot, deadline);
    if (!pool.ok()) return pool.status();
    seen.emplace(slot, *pool);
    return *pool;
  }

  const std::string text_;
  const std::shared_ptr<ConnectionPool> pool_;
  const std::shared_ptr<ClusterPool> cluster_;
  const Durability durability_;
  const CallLimits limits_;
  NodeGuardState guards_;
  const std::string wait_argv_[3];  // WAIT replicas timeout
  std::mutex mu_;                   // std::mutex: see ConnectionPool
  std::string sha_;                 // guarded by mu_
};

}  // namespace quota::redis
