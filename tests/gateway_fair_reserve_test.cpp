// The reserve of a fair-share budget released by an operator to one tenant
// (Gateway::release_reserve, quota/gateway/fair_share/fair_limits.hpp), in process: a
// tenant paused beside another gets exactly the released units more, no more; the releases
// of a budget add up to at most its reserve; what is asked wrongly is refused naming why
// and changes nothing; a release ends at its time, and what it admitted leaves use with
// its period; Σ in use never passes the budget.
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdint>
#include <string>

#include "absl/strings/match.h"
#include "quota/gateway/gateway.hpp"
#include "quota/store/local_store.hpp"
#include "support/gateway_rules.hpp"

namespace fair_reserve_test {

using namespace std::chrono_literals;
using quota::Nanos;
using quota::Reason;
using quota::gateway::FairShareSpec;
using quota::gateway::Gateway;
using quota::gateway::KeyPolicy;
using quota::gateway::Request;
using quota::gateway::RuleRegistry;

Request call(const char* tenant) {
  return {.who = {.tenant = tenant, .plan = "free"}, .route = "call", .cost = 1};
}

// Decides 1-unit calls of `tenant` at `now` until one is refused (at most 1000): how many
// were admitted, and the refusal's reason.
std::pair<int, Reason> admit_all(Gateway& gw, const char* tenant, Nanos now) {
  for (int n = 0; n < 1000; ++n) {
    auto d = gw.decide(call(tenant), now);
    REQUIRE(d.ok());
    if (!d->decision.allowed) return {n, d->decision.reason};
  }
  FAIL("never refused");
  return {0, Reason::kAllowed};
}

TEST_CASE("a released reserve admits exactly its units beyond the tenant's share") {
  // 100 units per 10 s period: a reserve of 10 %, paused above 90 % in use.
  RuleRegistry registry(quota::testing::build(quota::testing::fair_share_spec(
      "provider", FairShareSpec{.enabled = true, .period = 10s, .budget = 100})));
  quota::LocalStore<KeyPolicy> store;
  Gateway gw(store, registry);
  const Nanos t0{1s};
  // Two tenants (a tenant alone may use the whole budget: nobody to keep a reserve for):
  // with globex's 1 unit in use, acme draws up to the pause level, the reserve held back.
  REQUIRE(gw.decide(call("globex"), t0)->decision.allowed);
  CHECK(admit_all(gw, "acme", t0) == std::pair<int, Reason>{89, Reason::kPaused});

  // Wrong asks are refused naming why, and release nothing.
  const auto refused = [&](const char* rule, const char* tenant, std::int64_t units, Nanos until,
                           absl::StatusCode code, const char* why) {
    INFO(rule << " " << tenant << " " << units);
    auto s = gw.release_reserve(rule, tenant, units, until, t0);
    CHECK(s.code() == code);
    CHECK(absl::StrContains(s.message(), why));
  };
  refused("nope", "acme", 5, t0 + 5s, absl::StatusCode::kNotFound, "no global rule \"nope\"");
  refused("tenant", "acme", 5, t0 + 5s, absl::StatusCode::kNotFound, "with fair_share");
  refused("provider", "acme", 0, t0 + 5s, absl::StatusCode::kInvalidArgument, "at least 1");
  refused("provider", "acme", 5, t0, absl::StatusCode::kInvalidArgument, "end after now");
  refused("provider", "a{b", 5, t0 + 5s, absl::StatusCode::kInvalidArgument, "tenant");
  refused("provider", "acme", 11, t0 + 5s, absl::StatusCode::kFailedPrecondition,
          "11 units asked, 10 of its reserve of 10 left");
  CHECK(gw.reserve_releases().empty());
  CHECK(admit_all(gw, "acme", t0).first == 0);

  // Released: exactly 10 more, then paused again; the whole budget in use, no more.
  REQUIRE(gw.release_reserve("provider", "acme", 10, t0 + 5s, t0).ok());
  CHECK(admit_all(gw, "acme", t0 + 1s) == std::pair<int, Reason>{10, Reason::kPaused});
  REQUIRE(gw.fair_shares().size() == 1);
  CHECK(gw.fair_shares()[0].units_in_use == 90);  // the shares'; the reserve's 10 beside them
  auto releases = gw.reserve_releases();
  REQUIRE(releases.size() == 1);
  CHECK(releases[0].rule == "provider");
  CHECK(releases[0].tenant == "acme");
  CHECK(releases[0].units == 10);
  CHECK(releases[0].in_use == 10);

  // The reserve is all released: another tenant gets none of it until acme's is smaller.
  refused("provider", "globex", 1, t0 + 5s, absl::StatusCode::kFailedPrecondition,
          "0 of its reserve of 10 left");
  REQUIRE(gw.release_reserve("provider", "acme", 6, t0 + 5s, t0 + 1s).ok());  // replaces
  REQUIRE(gw.release_reserve("provider", "globex", 4, t0 + 5s, t0 + 1s).ok());
  refused("provider", "globex", 5, t0 + 5s, absl::StatusCode::kFailedPrecondition,
          "4 of its reserve of 10 left");

  // Ended at t0 + 5 s: acme admits nothing more from it while its share is spent.
  CHECK(admit_all(gw, "acme", t0 + 6s).first == 0);
  // A period after they were admitted, every unit has left use: acme draws from its share
  // again, and the ended releases, with nothing in use, are forgotten at the next release.
  CHECK(admit_all(gw, "acme", t0 + 12s).first > 0);
  REQUIRE(gw.release_reserve("provider", "globex", 10, t0 + 20s, t0 + 12s).ok());
  releases = gw.reserve_releases();
  REQUIRE(releases.size() == 1);
  CHECK(releases[0].tenant == "globex");
}

}  // namespace fair_reserve_test
