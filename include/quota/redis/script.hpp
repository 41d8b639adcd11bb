// quota/redis/script.hpp — runs one Lua script on Redis, standalone or Cluster.
//
// `Script::run(keys, args)` sends `EVALSHA <sha> numkeys keys... args...` to the server
// (or, on a cluster, to the node serving the first key's slot) and returns its reply:
//   - the script is loaded with SCRIPT LOAD on first use and its sha cached;
//   - on `NOSCRIPT` (after a flush, restart or failover) it is sent once more with EVAL
//     and the script's text, which loads and runs it in one command — only on that error;
//   - on a cluster, `MOVED` refreshes the slot map and retries on the named node, `ASK`
//     retries there once after `ASKING` (the map unchanged), at most kMaxRedirects hops;
//     `TRYAGAIN` (a call of several keys whose slot is half migrated: nothing ran) is
//     sent again to the slot's owner after a short backoff, as the cluster's
//     TryAgainPolicy allows, then kUnavailable naming TRYAGAIN (cluster.hpp).
// Transport failures and deadlines are kUnavailable from the connection; error replies
// are returned as replies, for the caller to interpret. `Script::run_many(calls)` sends
// several calls in one pipelined write per server, each then followed up as `run` would.
//
// Thread safety: every method may be called from any thread.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <memory>
#include <mutex>
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
#include "quota/redis/cluster.hpp"
#include "quota/redis/connection.hpp"

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
         std::shared_ptr<ClusterPool> cluster)
      : text_(std::move(text)), pool_(std::move(pool)), cluster_(std::move(cluster)) {}

  absl::StatusOr<Reply> run(const std::vector<std::string>& keys,
                            const std::vector<std::string>& args) {
    if (keys.empty()) return absl::InvalidArgumentError("script call without keys");
    const std::string numkeys = absl::StrCat(keys.size());
    auto argv = [&](std::string_view cmd, std::string_view script) {
      return script_argv(cmd, script, numkeys, keys, args);
    };
    std::shared_ptr<ConnectionPool> target = pool_;
    const int slot = key_slot(keys.front());
    if (cluster_ != nullptr) {
      auto pool = cluster_->for_slot(slot);
      if (!pool.ok()) return pool.status();
      target = *pool;
    }
    if (target == nullptr) return absl::InvalidArgumentError("script: no pool and no cluster");
    bool asking = false;
    const auto start = std::chrono::steady_clock::now();
    int retries = 0;  // after -TRYAGAIN
    for (int hop = 0; hop <= kMaxRedirects;) {
      auto lease = target->acquire();
      if (!lease.ok()) return lease.status();
      auto send = [&](const std::vector<std::string_view>& v) -> absl::StatusOr<Reply> {
        if (!asking) return (*lease)->command(v);
        auto replies = (*lease)->pipeline({{"ASKING"}, v});
        if (!replies.ok()) return replies.status();
        return std::move((*replies)[1]);
      };
      auto sha = this->sha(**lease);
      if (!sha.ok()) return sha.status();
      auto reply = send(argv("EVALSHA", *sha));
      if (!reply.ok()) return reply.status();
      if (is_error(**reply, "NOSCRIPT")) {
        reply = send(argv("EVAL", text_));
        if (!reply.ok()) return reply.status();
      }
      if (cluster_ == nullptr) return reply;
      if (is_error(**reply, "TRYAGAIN")) {
        // Nothing ran: send it again to the slot's owner (not with ASKING: the importing
        // node said TRYAGAIN when it lacks some keys), after a short wait.
        cluster_->note_tryagain();
        const auto delay = cluster_->tryagain_delay(retries, start);
        if (!delay.has_value()) return ClusterPool::tryagain_error(**reply, slot, retries, start);
        { auto returned = std::move(*lease); }
        std::this_thread::sleep_for(*delay);
        ++retries;
        auto pool = cluster_->for_slot(slot);
        if (!pool.ok()) return pool.status();
        target = *pool;
        asking = false;
        continue;
      }
      Redirect rd;
      if (!parse_redirect(**reply, rd)) return reply;
      ++hop;
      cluster_->note_redirect(rd.ask);
      target = cluster_->node(rd.host, rd.port);
      asking = rd.ask;
      if (!rd.ask) {
        // The connection goes back first: the refresh leases one of its own, and a
        // thread holding two at once could wait on another doing the same.
        { auto returned = std::move(*lease); }
        (void)cluster_->refresh();
      }
    }
    return absl::UnavailableError(absl::StrFormat(
        "redis cluster: more than %d redirections for key %s", kMaxRedirects, keys.front()));
  }

  // A script call's keys and arguments, viewed: they must outlive run_many.
  struct Call {
    const std::vector<std::string>* keys;
    const std::vector<std::string>* args;
  };

  // Several calls in one pipelined write per server (per node, on a cluster: one after
  // the other), each as `run` would run it: a call whose reply says the script did not
  // run there (NOSCRIPT; on a cluster MOVED, ASK or TRYAGAIN) is then sent alone with
  // `run`. A transport failure fails every call of that write (kUnavailable: the caller
  // cannot tell which ran). One result per call, in order.
  std::vector<absl::StatusOr<Reply>> run_many(std::span<const Call> calls) {
    std::vector<absl::StatusOr<Reply>> out;
    out.reserve(calls.size());
    for (std::size_t i = 0; i < calls.size(); ++i) {
      out.emplace_back(absl::UnknownError("script call not sent"));
    }
    // The calls per server, in order.
    std::vector<std::pair<std::shared_ptr<ConnectionPool>, std::vector<std::size_t>>> writes;
    for (std::size_t i = 0; i < calls.size(); ++i) {
      if (calls[i].keys->empty()) {
        out[i] = absl::InvalidArgumentError("script call without keys");
        continue;
      }
      std::shared_ptr<ConnectionPool> target = pool_;
      if (cluster_ != nullptr) {
        auto pool = cluster_->for_slot(key_slot(calls[i].keys->front()));
        if (!pool.ok()) {
          out[i] = pool.status();
          continue;
        }
        target = *pool;
      }
      if (target == nullptr) {
        out[i] = absl::InvalidArgumentError("script: no pool and no cluster");
        continue;
      }
      auto w = std::find_if(writes.begin(), writes.end(),
                            [&](const auto& x) { return x.first == target; });
      if (w == writes.end()) w = writes.insert(writes.end(), {target, {}});
      w->second.push_back(i);
    }
    for (const auto& [target, idx] : writes) {
      std::vector<std::size_t> alone;
      {
        auto lease = target->acquire();
        auto fail_all = [&](const absl::Status& s) {
          for (std::size_t i : idx) out[i] = s;
        };
        if (!lease.ok()) {
          fail_all(lease.status());
          continue;
        }
        auto sha = this->sha(**lease);
        if (!sha.ok()) {
          fail_all(sha.status());
          continue;
        }
        std::vector<std::string> numkeys;
        numkeys.reserve(idx.size());
        std::vector<std::vector<std::string_view>> cmds;
        cmds.reserve(idx.size());
        for (std::size_t i : idx) {
          numkeys.push_back(absl::StrCat(calls[i].keys->size()));
          cmds.push_back(
              script_argv("EVALSHA", *sha, numkeys.back(), *calls[i].keys, *calls[i].args));
        }
        auto replies = (*lease)->pipeline(cmds);
        if (!replies.ok()) {
          fail_all(replies.status());
          continue;
        }
        for (std::size_t j = 0; j < idx.size(); ++j) {
          Reply& r = (*replies)[j];
          Redirect rd;
          if (is_error(*r, "NOSCRIPT") ||
              (cluster_ != nullptr && (is_error(*r, "TRYAGAIN") || parse_redirect(*r, rd)))) {
            alone.push_back(idx[j]);
          } else {
            out[idx[j]] = std::move(r);
          }
        }
      }  // the connection goes back before `run` leases one
      for (std::size_t i : alone) out[i] = run(*calls[i].keys, *calls[i].args);
    }
    return out;
  }

  const std::string& text() const { return text_; }

  // The script's sha, loading it through `conn` (SCRIPT LOAD) on first use. For callers
  // that pipeline EVALSHAs themselves.
  absl::StatusOr<std::string> sha(Connection& conn) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!sha_.empty()) return sha_;
    }
    auto reply = conn.command({"SCRIPT", "LOAD", text_});
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
  const std::string text_;
  const std::shared_ptr<ConnectionPool> pool_;
  const std::shared_ptr<ClusterPool> cluster_;
  std::mutex mu_;    // std::mutex: see ConnectionPool
  std::string sha_;  // guarded by mu_
};

}  // namespace quota::redis
