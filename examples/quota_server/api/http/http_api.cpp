// examples/quota_server/api/http/http_api.cpp — the definitions of http_api.hpp:
// quota-server's HTTP endpoints.
#include "api/http/http_api.hpp"

#include <httplib.h>

#include <chrono>
#include <cstdio>
#include <optional>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "api/http/http_errors.hpp"
#include "backend/redis_memory.hpp"
#include "quota/clock.hpp"
#include "quota/gateway/fair_share/fair_metrics.hpp"
#include "quota/gateway/leases/lease_metrics.hpp"
#include "quota/gateway/metrics.hpp"
#include "quota/http.hpp"

namespace quota::server {

absl::StatusOr<FlatObject> body_object(std::string_view body) {
  if (body.size() > kMaxJsonBytes) {
    return absl::InvalidArgumentError(
        absl::StrFormat("body is %d bytes; at most %d are accepted", body.size(), kMaxJsonBytes));
  }
  return parse_flat_object(body);
}

absl::StatusOr<CheckRequest> check_request_of(std::string_view body,
                                              std::int64_t* expected_version) {
  auto object = body_object(body);
  if (!object.ok()) return object.status();
  CheckRequest req;
  for (const auto& [key, v] : *object) {
    const auto want = [&](JsonValue::Kind kind, const char* what) {
      return v.kind == kind ? absl::OkStatus()
                            : absl::InvalidArgumentError(
                                  absl::StrFormat("member \"%s\": expected %s", key, what));
    };
    std::string* text = key == "tenant"       ? &req.tenant
                        : key == "plan"       ? &req.plan
                        : key == "user"       ? &req.user
                        : key == "route"      ? &req.route
                        : key == "attempt_id" ? &req.attempt_id
                                              : nullptr;
    if (text != nullptr) {
      if (auto s = want(JsonValue::kString, "a string"); !s.ok()) return s;
      *text = v.string;
    } else if (key == "cost" || key == "estimate" || key == "prompt_tokens" ||
               key == "max_output") {
      if (auto s = want(JsonValue::kInteger, "an integer"); !s.ok()) return s;
      (key == "cost"            ? req.cost
       : key == "estimate"      ? req.estimate
       : key == "prompt_tokens" ? req.prompt_tokens
                                : req.max_output) = v.integer;
    } else if (key == "rule_version") {
      if (auto s = want(JsonValue::kInteger, "an integer"); !s.ok()) return s;
      if (v.integer < 0) return absl::InvalidArgumentError("member \"rule_version\": must be >= 0");
      *expected_version = v.integer;
    } else {
      return absl::InvalidArgumentError(absl::StrFormat(
          "unknown member \"%s\" (expected tenant, route, cost, attempt_id, rule_version, plan, "
          "user, estimate, prompt_tokens, max_output)",
          key));
    }
  }
  return req;
}

absl::StatusOr<SettleRequest> settle_request_of(std::string_view body) {
  auto object = body_object(body);
  if (!object.ok()) return object.status();
  SettleRequest req;
  bool ticket = false, actual = false;
  for (const auto& [key, v] : *object) {
    if (key == "tenant" && v.kind == JsonValue::kString) {
      req.tenant = v.string;
    } else if (key == "ticket" && v.kind == JsonValue::kString) {
      ticket = absl::SimpleAtoi(v.string, &req.ticket) && req.ticket != 0;
      if (!ticket) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "member \"ticket\": expected a ticket's decimal digits, got \"%s\"", v.string));
      }
    } else if (key == "actual" && v.kind == JsonValue::kInteger) {
      req.actual = v.integer;
      actual = true;
    } else if (key == "tenant" || key == "ticket" || key == "actual") {
      return absl::InvalidArgumentError(absl::StrFormat(
          "member \"%s\": expected %s", key, key == "actual" ? "an integer" : "a string"));
    } else {
      return absl::InvalidArgumentError(
          absl::StrFormat("unknown member \"%s\" (expected tenant, ticket, actual)", key));
    }
  }
  if (req.tenant.empty()) return absl::InvalidArgumentError("tenant is missing");
  if (!ticket) return absl::InvalidArgumentError("ticket is missing");
  if (!actual) return absl::InvalidArgumentError("actual is missing");
  return req;
}

absl::StatusOr<ReserveRequest> reserve_request_of(std::string_view body) {
  auto object = body_object(body);
  if (!object.ok()) return object.status();
  ReserveRequest req;
  for (const auto& [key, v] : *object) {
    const bool text = key == "rule" || key == "tenant";
    if (!text && key != "units" && key != "seconds") {
      return absl::InvalidArgumentError(
          absl::StrFormat("unknown member \"%s\" (expected rule, tenant, units, seconds)", key));
    }
    if (v.kind != (text ? JsonValue::kString : JsonValue::kInteger)) {
      return absl::InvalidArgumentError(
          absl::StrFormat("member \"%s\": expected %s", key, text ? "a string" : "an integer"));
    }
    if (key == "rule") req.rule = v.string;
    if (key == "tenant") req.tenant = v.string;
    if (key == "units") req.units = v.integer;
    if (key == "seconds") req.seconds = v.integer;
  }
  if (req.rule.empty()) return absl::InvalidArgumentError("rule is missing");
  if (req.tenant.empty()) return absl::InvalidArgumentError("tenant is missing");
  if (req.seconds < 1 || req.seconds > 86'400) {
    return absl::InvalidArgumentError(
        absl::StrFormat("seconds %d is outside [1, 86400]", req.seconds));
  }
  return req;
}

bool bearer_matches(const httplib::Request& req, const std::string& token) {
  const std::string got = req.get_header_value("Authorization");
  const std::string want = "Bearer " + token;
  unsigned diff = got.size() == want.size() ? 0u : 1u;
  for (std::size_t i = 0; i < want.size(); ++i) {
    diff |= static_cast<unsigned char>(want[i]) ^
            static_cast<unsigned char>(i < got.size() ? got[i] : 0);
  }
  return diff == 0;
}

namespace detail {

std::string decision_body(const Checked& c) {
  const Decision& d = c.result.decision;
  return absl::StrCat(
      "{\"allowed\":", d.allowed ? "true" : "false",
      ",\"remaining\":", d.remaining < 0 ? 0 : d.remaining,
      ",\"retry_after_ms\":", d.allowed ? 0 : ceil_ms(d.retry_after),
      ",\"reset_after_ms\":", ceil_ms(d.reset_after), ",\"rule\":", json_quote(c.result.rule),
      ",\"applied_rule_version\":", d.version, ",\"reason\":", json_quote(to_string(d.reason)),
      c.ticket ? absl::StrCat(",\"ticket\":\"", *c.ticket, "\"") : std::string(), "}\n");
}

// A settle's error: as every API's (http_errors.hpp), except 410 for an expired ticket
// (Checker::settle: DeadlineExceeded means only that).
void set_settle_error(httplib::Response& res, const absl::Status& s) {
  if (s.code() != absl::StatusCode::kDeadlineExceeded) return set_error(res, s);
  res.status = 410;
  set_error_body(res, s);
}

// A header --auth-headers does not name, present in an auth subrequest: ignored, and
// noted once per header on stderr (the gateway passes its client's headers on, or sets
// one the operator forgot to name).
void note_ignored(const httplib::Request& req, const char* header, bool read) {
  static std::atomic<unsigned> noted{0};
  static constexpr const char* kNames[] = {"X-Quota-Route", "X-Quota-Plan", "X-Quota-User",
                                           "X-Quota-Cost", "X-Quota-Attempt-Id"};
  if (read || !req.has_header(header)) return;
  unsigned bit = 0;
  while (bit < 5 && std::string_view(kNames[bit]) != header) ++bit;
  if ((noted.fetch_or(1u << bit) & (1u << bit)) != 0) return;
  std::fprintf(stderr,
               "quota-server: note: GET /v1/auth ignores header %s: --auth-headers does not "
               "name it (docs/deploying.md)\n",
               header);
}

// The X-Quota-* headers of an auth subrequest that `auth` names, as a CheckRequest.
absl::StatusOr<CheckRequest> auth_request_of(const httplib::Request& req, const AuthHeaders& auth) {
  const auto read = [&](const char* header, bool named) {
    note_ignored(req, header, named);
    return named ? req.get_header_value(header) : std::string();
  };
  CheckRequest c{.tenant = req.get_header_value("X-Quota-Tenant"),
                 .plan = read("X-Quota-Plan", auth.plan),
                 .user = read("X-Quota-User", auth.user),
                 .route = read("X-Quota-Route", auth.route),
                 .cost = std::nullopt,
                 .attempt_id = read("X-Quota-Attempt-Id", auth.attempt_id)};
  if (c.tenant.empty()) return absl::InvalidArgumentError("header X-Quota-Tenant is missing");
  note_ignored(req, "X-Quota-Cost", auth.cost);
  if (auth.cost && req.has_header("X-Quota-Cost")) {
    std::int64_t cost = 0;
    const std::string v = req.get_header_value("X-Quota-Cost");
    if (!absl::SimpleAtoi(v, &cost)) {
      return absl::InvalidArgumentError(
          absl::StrFormat("header X-Quota-Cost: expected an integer, got \"%s\"", v));
    }
    c.cost = cost;
  }
  return c;
}

// An auth subrequest's answer that is not "admitted" nor "cannot decide": 403, with the
// status the gateway should answer its client in X-Quota-Status (see the top of
// http_api.hpp). Errors keep their JSON body.
void set_auth_refusal(httplib::Response& res, int client_status) {
  res.status = 403;
  res.set_header("X-Quota-Status", std::to_string(client_status));
}

void set_auth_error(httplib::Response& res, const absl::Status& s) {
  const int status = http_status_of(s);
  if (status == 400 || status == 404) {
    res.set_content(error_body(s), "application/json");
    return set_auth_refusal(res, status == 400 ? 400 : 403);
  }
  set_error(res, s);
}

}  // namespace detail

std::string render_listener(const HttpListener& l) {
  const HttpListener::Counters c = l.counters();
  return absl::StrFormat(
      "# HELP quota_server_http_refused_total HTTP connections and requests the listener "
      "refused, by reason\n# TYPE quota_server_http_refused_total counter\n"
      "quota_server_http_refused_total{reason=\"connections\"} %d\n"
      "quota_server_http_refused_total{reason=\"body_size\"} %d\n"
      "quota_server_http_refused_total{reason=\"request_timeout\"} %d\n"
      "quota_server_http_refused_total{reason=\"idle\"} %d\n"
      "# HELP quota_server_http_connections open HTTP connections\n"
      "# TYPE quota_server_http_connections gauge\nquota_server_http_connections %d\n",
      c.connections_refused, c.bodies_refused, c.requests_timed_out, c.idle_closed,
      l.open_connections());
}

void add_http_api(httplib::Server& server, HttpApi api) {
  server.Post("/v1/check", [api](const httplib::Request& req, httplib::Response& res) {
    const TimedCall timed(*api.stats);
    std::int64_t expected_version = -1;
    auto parsed = check_request_of(req.body, &expected_version);
    const Checker::Pin pin = api.checker->pin();  // one rule set for the whole call
    if (parsed.ok()) parsed = api.checker->resolve(*std::move(parsed));
    if (!parsed.ok()) {
      api.stats->count(Api::kCheck, answer_of(parsed.status()));
      return detail::set_error(res, parsed.status());
    }
    // A check that names the rule version it expects is decided only under that version.
    if (expected_version >= 0 &&
        static_cast<std::uint64_t>(expected_version) != api.checker->rule_version()) {
      const absl::Status s = absl::FailedPreconditionError(
          absl::StrFormat("rule_version %d expected; version %d is in force (nothing deducted)",
                          expected_version, api.checker->rule_version()));
      api.stats->count(Api::kCheck, answer_of(s));
      return detail::set_error(res, s);
    }
    auto c = api.checker->check(pin, *parsed, SteadyClock{}.now());
    if (!c.ok()) {
      api.stats->count(Api::kCheck, answer_of(c.status()));
      return detail::set_error(res, c.status());
    }
    api.stats->observe(*parsed, *c);
    const Decision& d = c->result.decision;
    const bool unavailable = d.reason == Reason::kUnavailable;
    api.stats->count(Api::kCheck, unavailable ? Answer::kUnavailable
                                  : d.allowed ? Answer::kOk
                                              : Answer::kOverLimit);
    res.status = unavailable ? 503 : 200;
    if (unavailable) res.set_header("Retry-After", "1");
    res.set_content(detail::decision_body(*c), "application/json");
  });

  server.Post("/v1/settle", [api](const httplib::Request& req, httplib::Response& res) {
    const TimedCall timed(*api.stats);
    auto parsed = settle_request_of(req.body);
    if (!parsed.ok()) {
      api.stats->count(Api::kSettle, answer_of(parsed.status()));
      return detail::set_error(res, parsed.status());
    }
    auto settled =
        api.checker->settle(parsed->tenant, parsed->ticket, parsed->actual, SteadyClock{}.now());
    api.stats->count_settle(settled);
    if (!settled.ok()) {
      api.stats->count(Api::kSettle, answer_of(settled.status()));
      return detail::set_settle_error(res, settled.status());
    }
    api.stats->count(Api::kSettle, Answer::kOk);
    res.set_content(
        absl::StrCat("{\"estimate\":", settled->estimate, ",\"actual\":", settled->actual,
                     ",\"surplus\":", settled->surplus, ",\"deficit\":", settled->deficit, "}\n"),
        "application/json");
  });

  // The admin API: with --admin-token-file, a caller with its bearer token releases a
  // fair-share reserve to a tenant; each release is logged on stderr.
  server.Post("/v1/admin/reserve", [api](const httplib::Request& req, httplib::Response& res) {
    if (api.admin_token.empty()) {
      res.status = 404;
      return detail::set_error_body(
          res, absl::NotFoundError("the admin API is off: start with --admin-token-file"));
    }
    if (!bearer_matches(req, api.admin_token)) {
      std::fprintf(stderr, "quota-server: admin: refused a call without the token from %s\n",
                   req.remote_addr.c_str());
      res.status = 401;
      res.set_header("WWW-Authenticate", "Bearer");
      return detail::set_error_body(
          res, absl::UnauthenticatedError("Authorization: Bearer <--admin-token-file> needed"));
    }
    auto parsed = reserve_request_of(req.body);
    absl::Status s = parsed.status();
    if (parsed.ok()) {
      s = api.checker->release_reserve(parsed->rule, parsed->tenant, parsed->units,
                                       std::chrono::seconds(parsed->seconds), SteadyClock{}.now());
    }
    if (!s.ok()) return detail::set_error(res, s);
    std::fprintf(stderr,
                 "quota-server: admin: reserve of rule \"%s\": %lld units released to tenant "
                 "\"%s\" for %lld s (from %s)\n",
                 parsed->rule.c_str(), static_cast<long long>(parsed->units),
                 parsed->tenant.c_str(), static_cast<long long>(parsed->seconds),
                 req.remote_addr.c_str());
    res.set_content(absl::StrCat("{\"rule\":", json_quote(parsed->rule), ",\"tenant\":",
                                 json_quote(parsed->tenant), ",\"units\":", parsed->units,
                                 ",\"seconds\":", parsed->seconds, "}\n"),
                    "application/json");
  });

  server.Get("/v1/auth", [api](const httplib::Request& req, httplib::Response& res) {
    const TimedCall timed(*api.stats);
    auto parsed = detail::auth_request_of(req, api.auth);
    const Checker::Pin pin = api.checker->pin();  // one rule set for the whole call
    if (parsed.ok()) parsed = api.checker->resolve(*std::move(parsed));
    if (!parsed.ok()) {
      api.stats->count(Api::kAuth, answer_of(parsed.status()));
      return detail::set_auth_error(res, parsed.status());
    }
    auto c = api.checker->check(pin, *parsed, SteadyClock{}.now());
    if (!c.ok()) {
      api.stats->count(Api::kAuth, answer_of(c.status()));
      return detail::set_auth_error(res, c.status());
    }
    api.stats->observe(*parsed, *c);
    const Decision& d = c->result.decision;
    if (d.reason == Reason::kUnavailable) {
      api.stats->count(Api::kAuth, Answer::kUnavailable);
      res.status = 503;
      res.set_header("Retry-After", "1");
      return;
    }
    api.stats->count(Api::kAuth, d.allowed ? Answer::kOk : Answer::kOverLimit);
    if (d.allowed) {
      res.status = 204;
    } else {
      detail::set_auth_refusal(res, 429);
    }
    if (c->policy) {
      for (const http::Header& h : http::answer(d, *c->policy).headers) {
        res.set_header(h.name, h.value);
      }
    }
  });

  // A known path asked with another method: 405 naming the one it takes.
  const auto only = [](const char* method) {
    return [method](const httplib::Request& req, httplib::Response& res) {
      res.status = 405;
      res.set_header("Allow", method);
      detail::set_error_body(res, absl::InvalidArgumentError(absl::StrFormat(
                                      "%s %s: this path takes %s", req.method, req.path, method)));
    };
  };
  const std::pair<const char*, const char*> known[] = {
      {"/v1/check", "POST"}, {"/v1/settle", "POST"}, {"/v1/admin/reserve", "POST"},
      {"/json", "POST"},     {"/v1/auth", "GET"},    {"/healthz", "GET"},
      {"/readyz", "GET"},    {"/metrics", "GET"}};
  for (const auto& [path, method] : known) {
    if (std::string_view(method) == "POST") {
      server.Get(path, only(method));
    } else {
      server.Post(path, only(method));
    }
    server.Put(path, only(method));
    server.Delete(path, only(method));
    server.Patch(path, only(method));
  }

  server.Get("/healthz", [](const httplib::Request&, httplib::Response& res) {
    res.set_content("ok\n", "text/plain");
  });
  // Ready: every listener up, not draining, and the budget store able to decide (a
  // Redis that cannot: 503 naming why, until it can).
  server.Get("/readyz", [api](const httplib::Request&, httplib::Response& res) {
    if (!api.ready->load(std::memory_order_acquire)) {
      res.status = 503;
      return res.set_content("not ready: starting or draining\n", "text/plain");
    }
    const absl::Status store = api.checker->store_ready(SteadyClock{}.now());
    res.status = store.ok() ? 200 : 503;
    res.set_content(
        store.ok()
            ? std::string("ready\n")
            : absl::StrCat("not ready: the budget store cannot decide: ", store.message(), "\n"),
        "text/plain");
  });
  server.Get("/metrics", [api](const httplib::Request&, httplib::Response& res) {
    std::string text =
        gateway::render_prometheus(*api.metrics) + api.stats->render(api.checker->rule_version());
    // Budgets in Redis: the lease counters, one series per level (redis_leases.hpp).
    if (const auto* leases = api.checker->lease_metrics()) {
      text += gateway::render_prometheus(*leases);
    }
    if (const auto memory = api.checker->redis_memory(); !memory.empty()) {
      text +=
          "# HELP quota_redis_used_memory_bytes Memory the budget store's primary uses "
          "(INFO memory used_memory).\n# TYPE quota_redis_used_memory_bytes gauge\n";
      for (const RedisMemory& m : memory) {
        absl::StrAppend(&text, "quota_redis_used_memory_bytes{node=\"",
                        gateway::detail::prom_escape(m.node), "\"} ", m.used, "\n");
      }
      text +=
          "# HELP quota_redis_maxmemory_bytes The primary's maxmemory (0: no limit).\n"
          "# TYPE quota_redis_maxmemory_bytes gauge\n";
      for (const RedisMemory& m : memory) {
        absl::StrAppend(&text, "quota_redis_maxmemory_bytes{node=\"",
                        gateway::detail::prom_escape(m.node), "\"} ", m.max, "\n");
      }
    }
    if (const auto nodes = api.checker->redis_nodes()) {
      absl::StrAppend(
          &text,
          "# HELP quota_redis_failovers_seen_total Failovers this server's Redis connections saw "
          "(a node with another identity at a reconnect).\n"
          "# TYPE quota_redis_failovers_seen_total counter\nquota_redis_failovers_seen_total ",
          nodes->failovers,
          "\n# HELP quota_redis_last_failover_timestamp_seconds Server time of the latest "
          "failover seen (0: none).\n"
          "# TYPE quota_redis_last_failover_timestamp_seconds gauge\n"
          "quota_redis_last_failover_timestamp_seconds ",
          nodes->failover_at ? nodes->failover_at->count() / 1'000'000'000 : 0, "\n");
    }
    if (const auto up = api.checker->revocations_subscribed()) {
      text +=
          "# HELP quota_lease_revocations_subscribed 1 while the subscription to lease "
          "revocations is up; 0: a revoke: at_once change reaches this server within one "
          "lease expiry\n# TYPE quota_lease_revocations_subscribed gauge\n"
          "quota_lease_revocations_subscribed ";
      text += *up ? "1\n" : "0\n";
    }
    text += gateway::render_prometheus(api.checker->fair_shares());
    text += gateway::render_prometheus(api.checker->reserve_releases(), SteadyClock{}.now());
    if (api.listener != nullptr) text += render_listener(*api.listener);
    res.set_content(std::move(text), "text/plain; version=0.0.4");
  });
}

}  // namespace quota::server
