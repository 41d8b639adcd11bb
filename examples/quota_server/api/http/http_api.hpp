// examples/quota_server/api/http/http_api.hpp — quota-server's HTTP endpoints (cpp-httplib).
//
//   POST /v1/check   JSON {tenant, route, cost, attempt_id, rule_version} (plus plan, user;
//                    or an estimate instead of cost; or, on a route with a prompt_factor,
//                    prompt_tokens and max_output: the route's estimate of them)
//                    → 200 {allowed, remaining, retry_after_ms, reset_after_ms, rule,
//                    applied_rule_version, reason} for every decision the rules made
//                    (allowed or not); 503 with that body when the store cannot decide
//                    and the route fails closed; 400 {error, message} for a body over
//                    kMaxJsonBytes, malformed JSON (json.hpp), an unknown member, a member
//                    of the wrong type, or a request checker.hpp refuses; 404 when no
//                    tenant rule applies. An error deducts nothing. The caller of this
//                    API is trusted: every member is taken as sent. With an `estimate`
//                    (units), or prompt_tokens and max_output on a route with a
//                    prompt_factor, an admitted check also returns "ticket" (a string)
//   POST /v1/settle  JSON {tenant, ticket, actual} → 200 {estimate, actual, surplus,
//                    deficit}: the surplus given back, a deficit recorded (checker.hpp
//                    settle); once per ticket, at any server on the same Redis. 404 a
//                    ticket the tenant does not have (unknown, or another tenant's), 409
//                    settled already, 410 expired (the estimate stays spent), 400 bad
//                    input — none changes anything; 503 the store could not settle it
//                    now (retry).
//   POST /v1/admin/reserve  with --admin-token-file and "Authorization: Bearer <token>":
//                    JSON {rule, tenant, units, seconds} releases `units` of a global
//                    fair-share rule's reserve to the tenant for `seconds` at this server
//                    (gateway.hpp release_reserve) → 200 echoing it, logged on stderr;
//                    401 without the token, 404 when off or for an unknown rule, 400 bad
//                    input, 409 when the reserve left is short
//   GET  /v1/auth    nginx auth_request: the X-Quota-* request headers --auth-headers
//                    names (auth_headers.hpp; by default X-Quota-Tenant and
//                    X-Quota-Route; others are ignored) → 204 admitted
//                    (RateLimit-Policy, RateLimit); 403 otherwise, with X-Quota-Status
//                    naming the answer the gateway should give its client: 429 over the
//                    limit (Retry-After, RateLimit-Policy, RateLimit: quota/http.hpp),
//                    400 bad input, 403 no tenant rule for the identity — auth_request
//                    passes 401 and 403 on and turns any other status into 500, so a
//                    client's error must travel in a 403 to reach its client as one.
//                    503 when the store cannot decide (nginx: 500, answered 503).
//   GET  /healthz    200 while the process serves HTTP
//   GET  /readyz     200 once every listener is up and the budget store can decide
//                    (Checker::store_ready: a probe on Redis at most once a second); 503
//                    before, while draining, and while the store cannot decide
//   GET  /metrics    Prometheus text: quota_decisions_total{rule,route,level,outcome}
//                    (quota/gateway/metrics.hpp), quota_server_requests_total{api,answer},
//                    with Redis quota_lease_*{level} (quota/gateway/leases/lease_metrics.hpp)
//                    the failovers seen (quota_redis_failovers_seen_total) and each
//                    primary's memory (quota_redis_used_memory_bytes, _maxmemory_bytes),
//                    quota_rule_version, the decision-latency histogram, near-limit,
//                    Redis errors by kind (decision_stats.hpp), what the HTTP listener
//                    refused (http_listener.hpp) — labels from configuration only, except
//                    the top-K tenants (at most 20 series).
//
// `rule_version` in a check is the version the caller expects; the decision is made with
// the rules in force, and applied_rule_version says which (a caller ahead of the server
// sees a smaller number). times are whole milliseconds rounded up; retry_after_ms is 0
// when admitted and -1 when waiting never helps (a budget that never refills, a request
// over a per-request cap).
//
// Thread safety: the listener calls the handlers from its workers; Checker, ServerStats
// and Metrics are thread-safe, `ready` is atomic.
//
//   quota::server::HttpListener http({});
//   quota::server::add_http_api(http, {.checker = &checker, .stats = &stats,
//                                      .metrics = &metrics, .ready = &ready});
#pragma once

#include <httplib.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "api/http/http_listener.hpp"
#include "api/http/json.hpp"
#include "backend/checker.hpp"
#include "config/auth_headers.hpp"
#include "quota/gateway/metrics.hpp"
#include "stats/server_stats.hpp"

namespace quota::server {

// The largest body of POST /v1/check, the bound of HttpLimits::max_body_bytes too: one
// limit, answered 400 with a message whatever the Content-Type.
inline constexpr std::size_t kMaxJsonBytes = 8192;

struct HttpApi {
  Checker* checker = nullptr;
  ServerStats* stats = nullptr;
  const gateway::Metrics* metrics = nullptr;
  const std::atomic<bool>* ready = nullptr;
  AuthHeaders auth{};                      // what GET /v1/auth reads
  std::string admin_token{};               // the admin API's bearer token; empty: off
  const HttpListener* listener = nullptr;  // its refusals on /metrics; may be null
};

// A request body as one flat JSON object (json.hpp), at most kMaxJsonBytes.
absl::StatusOr<FlatObject> body_object(std::string_view body);

// The CheckRequest of a /v1/check body (see the top of this file); InvalidArgument
// naming the member otherwise. `rule_version` is returned through `expected_version`.
absl::StatusOr<CheckRequest> check_request_of(std::string_view body,
                                              std::int64_t* expected_version);

// A /v1/settle body: {tenant, ticket (its decimal digits, as a string), actual}.
struct SettleRequest {
  std::string tenant;
  gateway::TicketId ticket = 0;
  std::int64_t actual = 0;
};

absl::StatusOr<SettleRequest> settle_request_of(std::string_view body);

// A /v1/admin/reserve body: {rule, tenant, units, seconds}.
struct ReserveRequest {
  std::string rule;
  std::string tenant;
  std::int64_t units = 0;
  std::int64_t seconds = 0;
};

absl::StatusOr<ReserveRequest> reserve_request_of(std::string_view body);

// Whether `req` carries "Authorization: Bearer <token>" (compared in constant time).
bool bearer_matches(const httplib::Request& req, const std::string& token);

// What the HTTP listener refused, as Prometheus counters.
std::string render_listener(const HttpListener& l);

// Registers the endpoints (see the top of this file) on `server`.
void add_http_api(httplib::Server& server, HttpApi api);

}  // namespace quota::server
