// Tests for Request::cost (quota/gateway/request.hpp) through Gateway::decide: a request's
// own cost is paid by the budgets the route pays by estimate, exactly as an estimate
// settled with the same units would be; a cost outside [1, kMaxUnits] is InvalidArgument
// naming the cost and deducts nothing; an attempt id replays only with the same cost.
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdint>
#include <optional>

#include "quota/gateway/gateway.hpp"
#include "quota/store/local_store.hpp"
#include "support/gateway_rules.hpp"

using namespace std::chrono_literals;
using quota::Nanos;
using quota::gateway::Gateway;
using quota::gateway::KeyPolicy;
using quota::gateway::Request;
using quota::gateway::RuleRegistry;
using quota::testing::build;

namespace {

Request read_request(std::optional<std::int64_t> cost) {
  return {.who = {.tenant = "acme", .plan = "free"}, .route = "read", .cost = cost};
}

}  // namespace

TEST_CASE("decide with a cost pays it, as an estimate settled with the same units does") {
  // Rate 0: no refill, so `remaining` is exactly what was paid.
  RuleRegistry by_cost(build(quota::testing::basic_spec(1, 0, 100)));
  RuleRegistry by_estimate(build(quota::testing::basic_spec(1, 0, 100)));
  quota::LocalStore<KeyPolicy> cost_store, estimate_store;
  Gateway cost_gw(cost_store, by_cost);
  Gateway estimate_gw(estimate_store, by_estimate);

  for (const std::int64_t c : {30, 7, 1, 80, 62}) {
    INFO("cost " << c);
    auto direct = cost_gw.decide(read_request(c), Nanos{0});
    REQUIRE(direct.ok());
    auto est = estimate_gw.acquire_estimate(read_request(std::nullopt), c, Nanos{0});
    REQUIRE(est.ok());
    if (est->ticket) REQUIRE(estimate_gw.settle("acme", *est->ticket, c, Nanos{0}).ok());
    CHECK(direct->decision.allowed == est->decision.allowed);
    CHECK(direct->decision.remaining == est->decision.remaining);
    CHECK(direct->rule == est->rule);
  }
  // 30 + 7 + 1 paid, 80 refused (62 left), 62 paid: nothing is left.
  auto last = cost_gw.decide(read_request(std::nullopt), Nanos{0});
  REQUIRE(last.ok());
  CHECK_FALSE(last->decision.allowed);
}

TEST_CASE("a cost outside [1, kMaxUnits] is InvalidArgument naming it; nothing is deducted") {
  RuleRegistry registry(build(quota::testing::basic_spec(1, 0, 100)));
  quota::LocalStore<KeyPolicy> store;
  Gateway gw(store, registry);
  for (const std::int64_t c : {std::int64_t{0}, std::int64_t{-5}, quota::kMaxUnits + 1}) {
    INFO("cost " << c);
    auto r = gw.decide(read_request(c), Nanos{0});
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK(std::string(r.status().message()).find("cost") != std::string::npos);
  }
  auto one = gw.decide(read_request(std::nullopt), Nanos{0});
  REQUIRE(one.ok());
  CHECK(one->decision.remaining == 99);
}

TEST_CASE("an attempt id replays with the same cost and refuses another cost") {
  RuleRegistry registry(build(quota::testing::basic_spec(1, 0, 100)));
  quota::LocalStore<KeyPolicy> store;
  Gateway gw(store, registry);
  Request req = read_request(40);
  req.attempt_id = "retry-1";
  auto first = gw.decide(req, Nanos{0});
  REQUIRE(first.ok());
  CHECK(first->decision.remaining == 60);
  auto again = gw.decide(req, 1s);
  REQUIRE(again.ok());
  CHECK(again->replayed);
  CHECK(again->decision.remaining == 60);
  req.cost = 41;
  CHECK(gw.decide(req, 2s).status().code() == absl::StatusCode::kInvalidArgument);
  auto plain = gw.decide(read_request(std::nullopt), 3s);
  REQUIRE(plain.ok());
  CHECK(plain->decision.remaining == 59);
}
