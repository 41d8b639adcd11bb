// quota/redis/transport/script_follow_up.hpp — what a reply to a script call asks next.
//
// Script::run_many (script.hpp) sends its calls in rounds. After each round it asks
// follow_up() what a call's reply means: the call's result (the script ran, or answered
// an error of its own), a failure to report, or the call again in the next round —
//   - NOSCRIPT: once, with EVAL and the script's text;
//   - on a cluster, MOVED (the slot map to be refreshed) and ASK (with ASKING first, the
//     map unchanged): to the named node, at most kMaxRedirects hops per call;
//   - on a cluster, TRYAGAIN (several keys, the slot half migrated): to the slot's owner
//     in the map, after the backoff of the cluster's TryAgainPolicy; past its retries a
//     failure naming TRYAGAIN.
// A PendingCall carries what the rounds learned about a call (where it goes, whether with
// ASKING or EVAL, the hops and retries so far).
//
// Guarantees: a reply that says the script ran is never sent again; every follow-up is
// bounded (one EVAL, kMaxRedirects hops, the TryAgainPolicy's retries within the call's
// deadline); CLUSTERDOWN, TRYAGAIN and redirections are counted on the ClusterPool.
//
// Thread safety: follow_up touches only its PendingCall and the ClusterPool's counters and
// node table (thread-safe); a PendingCall belongs to one run_many.
//
//   detail::PendingCall p{.call = 0, .target = pool};
//   const detail::FollowUp next = detail::follow_up(p, *reply, cluster, deadline, key);
//   if (next.kind == detail::FollowUp::kAgain) { /* send p in the next round */ }
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <string_view>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "quota/redis/transport/cluster.hpp"
#include "quota/redis/transport/connection_pool.hpp"
#include "quota/redis/transport/reply.hpp"

namespace quota::redis::detail {

// One script call on its way through run_many's rounds.
struct PendingCall {
  std::size_t call;
  std::shared_ptr<ConnectionPool> target;
  bool asking = false;   // send ASKING first (after -ASK)
  bool eval = false;     // EVAL with the script's text (after -NOSCRIPT)
  int hops = 0;          // redirections followed
  int retries = 0;       // sent again after -TRYAGAIN
  bool reroute = false;  // target: the slot's owner in the map (after -TRYAGAIN)
};

// What run_many does with a call after its reply.
struct FollowUp {
  enum Kind {
    kResult,  // the reply is the call's result
    kAgain,   // send the call (as updated) in the next round
    kFailed,  // `failure` is the call's result
  };
  Kind kind = kResult;
  absl::Status failure = absl::OkStatus();
  std::chrono::microseconds wait{0};  // kAgain after TRYAGAIN: the next round starts after it
  bool refresh = false;               // kAgain after MOVED: refresh the slot map first
};

// The follow-up of reply `r` to call `p` (updated in place for kAgain); `cluster` null on
// a standalone server; `first_key`: the call's first key; `deadline`: the call's.
inline FollowUp follow_up(PendingCall& p, const redisReply& r, ClusterPool* cluster,
                          const Deadline& deadline, std::string_view first_key) {
  if (!p.eval && is_error(r, "NOSCRIPT")) {
    p.eval = true;
    return {.kind = FollowUp::kAgain};
  }
  if (cluster == nullptr) return {};
  if (is_error(r, "CLUSTERDOWN")) cluster->note_clusterdown();
  if (is_error(r, "TRYAGAIN")) {
    cluster->note_tryagain();
    const auto delay = cluster->tryagain_delay(p.retries, deadline);
    if (!delay.has_value()) {
      return {.kind = FollowUp::kFailed,
              .failure = ClusterPool::tryagain_error(r, key_slot(first_key), p.retries,
                                                     deadline.at() - deadline.budget())};
    }
    ++p.retries;
    p.reroute = true;
    p.asking = false;
    return {.kind = FollowUp::kAgain, .wait = *delay};
  }
  Redirect rd;
  if (parse_redirect(r, rd)) {
    cluster->note_redirect(rd.ask);
    if (p.hops >= kMaxRedirects) {
      return {
          .kind = FollowUp::kFailed,
          .failure = absl::UnavailableError(absl::StrFormat(
              "redis cluster: more than %d redirections for key %s", kMaxRedirects, first_key))};
    }
    ++p.hops;
    p.target = cluster->node(rd.host, rd.port);
    p.asking = rd.ask;
    p.eval = false;
    return {.kind = FollowUp::kAgain, .refresh = !rd.ask};
  }
  return {};
}

}  // namespace quota::redis::detail
