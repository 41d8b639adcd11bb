// examples/quota_server/config/auth_headers.hpp — which X-Quota-* request headers GET /v1/auth
// reads (--auth-headers).
//
// An auth subrequest carries whatever headers reach quota-server: those the gateway sets
// itself and, unless the gateway drops them, those its client sent. A budget must key
// only on what the gateway derived, so quota-server reads only the headers the operator
// names: by default X-Quota-Tenant (from the gateway's authentication) and X-Quota-Route
// (from its location). X-Quota-Plan, -User, -Cost and -Attempt-Id are read only when
// named; a request that carries one not named is decided as if it were absent (the
// plan from --default-plan, the route's own cost, no attempt) and the server notes the
// header once on stderr. The shipped nginx config (testdata/nginx.conf.in) passes no
// client header to the subrequest at all; docs/deploying.md explains both sides.
//
// Thread safety: a value.
//
//   auto h = quota::server::auth_headers_of("tenant,route,cost");
//   // h->cost == true, h->plan == false
#pragma once

#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"

namespace quota::server {

struct AuthHeaders {
  bool tenant = true;  // always: a request without X-Quota-Tenant is refused
  bool route = true;
  bool plan = false;
  bool user = false;
  bool cost = false;
  bool attempt_id = false;
};

// The --auth-headers list ("tenant,route,plan,user,cost,attempt-id"): InvalidArgument for
// an unknown name or a list without tenant.
inline absl::StatusOr<AuthHeaders> auth_headers_of(std::string_view list) {
  AuthHeaders h{.tenant = false, .route = false};
  for (absl::string_view name :
       absl::StrSplit(absl::string_view(list.data(), list.size()), ',', absl::SkipWhitespace())) {
    bool* field = name == "tenant"       ? &h.tenant
                  : name == "route"      ? &h.route
                  : name == "plan"       ? &h.plan
                  : name == "user"       ? &h.user
                  : name == "cost"       ? &h.cost
                  : name == "attempt-id" ? &h.attempt_id
                                         : nullptr;
    if (field == nullptr) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "unknown header \"%s\" (tenant, route, plan, user, cost, attempt-id)", name));
    }
    *field = true;
  }
  if (!h.tenant) return absl::InvalidArgumentError("the list must name tenant");
  return h;
}

}  // namespace quota::server
