// examples/quota_server/api/grpc/descriptors.hpp — Envoy's RLS v3 request as quota checks, and the
// checks' outcomes as Envoy's response.
//
// The mapping (docs/service.md, "Descriptors"):
//   - `domain` must equal the server's --domain; an empty or other domain is an error.
//   - at least one descriptor; each becomes one CheckRequest, decided in request order.
//   - entries, by key (each at most once, values non-empty): `tenant` (required),
//     `plan` (else --default-plan), `user` (optional: user-level rules), `route` (a route
//     class of the rule file; else --default-route). Any other key is an error: a
//     descriptor quota-server does not understand is never silently allowed.
//   - cost: the descriptor's own `hits_addend` if set, else the request's `hits_addend`
//     if > 0, else none (every budget pays what the rule file says). How a cost is paid:
//     checker.hpp. A cost outside [1, --max-cost] is an error.
//   - a per-request `limit` override is an error (the rule file decides the limits).
// Every descriptor is resolved before any is decided, so a bad one deducts nothing; the
// error is INVALID_ARGUMENT ("descriptors[1]: unknown route class \"x\" ...").
//
// The response: a status per descriptor, in request order — OVER_LIMIT when its
// decision denies (an enforcing limit over budget, or over a per-request cap), else OK;
// current_limit the deciding rule's rate (envoy_limit(), below) and name;
// limit_remaining the decision's remaining units (clamped to uint32); duration_until_reset
// its reset_after (absent when the budget never resets). overall_code is OVER_LIMIT when
// any status is. response_headers_to_add: Retry-After (on OVER_LIMIT), RateLimit-Policy and
// RateLimit (quota/http.hpp) of the first denied descriptor, else of the one with the
// least remaining. As in envoyproxy/ratelimit, descriptors are independent: one admitted
// keeps its deduction when another is over the limit.
//
// Thread safety: pure functions.
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "backend/checker.hpp"
#include "envoy/service/ratelimit/v3/rls.pb.h"
#include "quota/http.hpp"

namespace quota::server {

namespace rls = envoy::service::ratelimit::v3;

// A rate as Envoy's RateLimit: the smallest unit U of SECOND, MINUTE, HOUR, DAY, WEEK
// that is at least `rate.per` (WEEK for longer periods), and requests_per_unit =
// floor(units · U / per), clamped to uint32. Exact when `per` divides U (100/s → 100 per
// SECOND, 1000/60s → 1000 per MINUTE); 10/10s → 60 per MINUTE.
struct EnvoyLimit {
  std::uint32_t requests_per_unit = 0;
  rls::RateLimitResponse::RateLimit::Unit unit = rls::RateLimitResponse::RateLimit::UNKNOWN;
};

inline EnvoyLimit envoy_limit(const RateInfo& rate) {
  using Unit = rls::RateLimitResponse::RateLimit;
  constexpr std::int64_t kS = 1'000'000'000;
  const std::pair<std::int64_t, Unit::Unit> units[] = {{kS, Unit::SECOND},
                                                       {60 * kS, Unit::MINUTE},
                                                       {3600 * kS, Unit::HOUR},
                                                       {86400 * kS, Unit::DAY},
                                                       {7 * 86400 * kS, Unit::WEEK}};
  if (rate.per.count() <= 0 || rate.units < 0) return {};
  auto chosen = units[4];
  for (const auto& u : units) {
    if (rate.per.count() <= u.first) {
      chosen = u;
      break;
    }
  }
  const absl::int128 n = absl::int128(rate.units) * chosen.first / rate.per.count();
  const absl::int128 cap = std::numeric_limits<std::uint32_t>::max();
  return {.requests_per_unit = static_cast<std::uint32_t>(n > cap ? cap : n),
          .unit = chosen.second};
}

// The most descriptors one call may carry: each is a decision, and one call is one
// request of the gateway's (Envoy sends one descriptor per rate_limits action).
inline constexpr int kMaxDescriptors = 64;

// InvalidArgument for a call without descriptors or with more than kMaxDescriptors.
inline absl::Status check_descriptor_count(const rls::RateLimitRequest& req) {
  if (req.descriptors_size() == 0) return absl::InvalidArgumentError("no descriptors");
  if (req.descriptors_size() > kMaxDescriptors) {
    return absl::InvalidArgumentError(absl::StrFormat("%d descriptors; one call carries at most %d",
                                                      req.descriptors_size(), kMaxDescriptors));
  }
  return absl::OkStatus();
}

// The checks of `req` (see the top of this file), resolved and validated by `checker`;
// InvalidArgument (or NotFound: no tenant rule) naming the descriptor and field.
inline absl::StatusOr<std::vector<CheckRequest>> map_request(const rls::RateLimitRequest& req,
                                                             const Checker& checker,
                                                             std::string_view domain) {
  if (req.domain().empty()) return absl::InvalidArgumentError("domain is empty");
  if (req.domain() != domain) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "unknown domain \"%s\" (this server answers for \"%s\")", req.domain(), domain));
  }
  if (auto s = check_descriptor_count(req); !s.ok()) return s;
  std::vector<CheckRequest> out;
  out.reserve(static_cast<std::size_t>(req.descriptors_size()));
  for (int i = 0; i < req.descriptors_size(); ++i) {
    const auto& d = req.descriptors(i);
    const auto fail = [&](const std::string& what) {
      return absl::InvalidArgumentError(absl::StrFormat("descriptors[%d]: %s", i, what));
    };
    if (d.has_limit()) {
      return fail("a per-request limit override is not supported (the rule file decides)");
    }
    CheckRequest c;
    for (int j = 0; j < d.entries_size(); ++j) {
      const auto& e = d.entries(j);
      std::string* field = e.key() == "tenant"  ? &c.tenant
                           : e.key() == "plan"  ? &c.plan
                           : e.key() == "user"  ? &c.user
                           : e.key() == "route" ? &c.route
                                                : nullptr;
      if (field == nullptr) {
        return fail(absl::StrFormat(
            "unknown entry key \"%s\" (expected tenant, plan, user or route)", e.key()));
      }
      if (!field->empty()) return fail(absl::StrFormat("entry \"%s\" given twice", e.key()));
      if (e.value().empty())
        return fail(absl::StrFormat("entry \"%s\" has an empty value", e.key()));
      *field = e.value();
    }
    if (d.has_hits_addend()) {
      const std::uint64_t h = d.hits_addend().value();
      const std::uint64_t max = std::numeric_limits<std::int64_t>::max();
      c.cost = static_cast<std::int64_t>(std::min(h, max));
    } else if (req.hits_addend() > 0) {
      c.cost = static_cast<std::int64_t>(req.hits_addend());
    }
    if (c.tenant.empty()) return fail("entry \"tenant\" is missing");
    auto resolved = checker.resolve(std::move(c));
    if (!resolved.ok()) {
      return absl::Status(resolved.status().code(),
                          absl::StrFormat("descriptors[%d]: %s", i, resolved.status().message()));
    }
    out.push_back(*std::move(resolved));
  }
  return out;
}

// limit_remaining of a descriptor whose limit is `unlimited` (envoyproxy/ratelimit's).
inline constexpr std::int64_t kUnlimitedRemaining = std::numeric_limits<std::uint32_t>::max();

// A request descriptor for envoyproxy/ratelimit rules: its entries and its cost.
struct EnvoyDescriptor {
  std::vector<std::pair<std::string, std::string>> entries;
  std::int64_t cost = 1;
};

// The descriptors of `req` for envoyproxy/ratelimit rules of `domain`: the domain must
// match, there must be descriptors, each with entries whose keys are non-empty; no
// per-request limit override; the cost (as for quota's rules: the descriptor's
// hits_addend, else the request's if > 0, else 1) within [1, max_cost].
inline absl::StatusOr<std::vector<EnvoyDescriptor>> map_envoy_request(
    const rls::RateLimitRequest& req, std::string_view domain, std::int64_t max_cost) {
  if (req.domain().empty()) return absl::InvalidArgumentError("domain is empty");
  if (req.domain() != domain) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "unknown domain \"%s\" (this server answers for \"%s\")", req.domain(), domain));
  }
  if (auto s = check_descriptor_count(req); !s.ok()) return s;
  std::vector<EnvoyDescriptor> out;
  for (int i = 0; i < req.descriptors_size(); ++i) {
    const auto& d = req.descriptors(i);
    const auto fail = [i](std::string_view m) {
      return absl::InvalidArgumentError(absl::StrFormat("descriptors[%d]: %s", i, m));
    };
    if (d.entries_size() == 0) return fail("no entries");
    if (d.has_limit()) {
      return fail("a per-request limit override is not supported (the rule file decides)");
    }
    EnvoyDescriptor e;
    for (const auto& entry : d.entries()) {
      if (entry.key().empty()) return fail("an entry has an empty key");
      e.entries.emplace_back(entry.key(), entry.value());
    }
    std::uint64_t hits = 1;
    if (d.has_hits_addend()) {
      hits = d.hits_addend().value();
    } else if (req.hits_addend() > 0) {
      hits = req.hits_addend();
    }
    if (hits < 1 || hits > static_cast<std::uint64_t>(max_cost)) {
      return fail(absl::StrFormat("cost %d is outside [1, %d] (--max-cost)", hits, max_cost));
    }
    e.cost = static_cast<std::int64_t>(hits);
    out.push_back(std::move(e));
  }
  return out;
}

// Envoy's response for the decided checks, in request order (see the top of this file).
inline rls::RateLimitResponse build_response(const std::vector<Checked>& checked) {
  rls::RateLimitResponse out;
  out.set_overall_code(rls::RateLimitResponse::OK);
  const Checked* headline = nullptr;  // whose headers the response carries
  for (const Checked& c : checked) {
    const Decision& d = c.result.decision;
    auto* s = out.add_statuses();
    s->set_code(d.allowed ? rls::RateLimitResponse::OK : rls::RateLimitResponse::OVER_LIMIT);
    if (c.rate) {
      const EnvoyLimit limit = envoy_limit(*c.rate);
      s->mutable_current_limit()->set_requests_per_unit(limit.requests_per_unit);
      s->mutable_current_limit()->set_unit(limit.unit);
      s->mutable_current_limit()->set_name(c.result.rule);
    }
    const std::int64_t remaining =
        std::clamp<std::int64_t>(d.remaining, 0, std::numeric_limits<std::uint32_t>::max());
    s->set_limit_remaining(static_cast<std::uint32_t>(remaining));
    if (d.reset_after != kNever) {
      const std::int64_t ns = std::max<std::int64_t>(0, d.reset_after.count());
      s->mutable_duration_until_reset()->set_seconds(ns / 1'000'000'000);
      s->mutable_duration_until_reset()->set_nanos(static_cast<std::int32_t>(ns % 1'000'000'000));
    }
    if (!d.allowed) out.set_overall_code(rls::RateLimitResponse::OVER_LIMIT);
    if (!c.policy) continue;
    const bool denied_first =
        !d.allowed && (headline == nullptr || headline->result.decision.allowed);
    const bool least = d.allowed && headline != nullptr && headline->result.decision.allowed &&
                       d.remaining < headline->result.decision.remaining;
    if (headline == nullptr || denied_first || least) headline = &c;
  }
  if (headline != nullptr) {
    for (const http::Header& h :
         http::answer(headline->result.decision, *headline->policy).headers) {
      auto* v = out.add_response_headers_to_add();
      v->set_key(h.name);
      v->set_value(h.value);
    }
  }
  return out;
}

}  // namespace quota::server
