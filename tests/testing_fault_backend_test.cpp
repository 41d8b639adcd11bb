// Tests for quota/testing/fault_backend.hpp: a Gateway over a FaultBackend answers by the
// route's fail mode while the backend is down, returns other errors as they are, fails
// exactly the chosen calls, and waits when told to be slow.
#include "quota/testing/fault_backend.hpp"

#include <catch2/catch.hpp>
#include <chrono>

#include "quota/gateway/gateway.hpp"
#include "quota/store/local_store.hpp"
#include "support/replay_rules.hpp"

using namespace std::chrono_literals;
using quota::Nanos;

namespace {

using Store = quota::LocalStore<quota::gateway::KeyPolicy>;

struct Faulty {
  Faulty()
      : inner(store),
        faulty(inner),
        registry(quota::testing::burst_rules(100)),
        g(faulty, registry) {}
  absl::StatusOr<quota::gateway::Result> read(Nanos now) {
    return g.decide({.who = {.tenant = "acme", .plan = "free"}, .route = "read"}, now);
  }
  Store store;
  quota::gateway::StoreBackend<Store> inner;
  quota::testing::FaultBackend<quota::gateway::StoreBackend<Store>> faulty;
  quota::gateway::RuleRegistry registry;
  quota::gateway::Gateway g;
};

}  // namespace

TEST_CASE("a backend that is down: the route's fail mode; another error: returned") {
  Faulty f;
  REQUIRE(f.read(Nanos{0})->decision.allowed);
  f.faulty.fail(absl::UnavailableError("down"));
  auto down = f.read(Nanos{1});
  REQUIRE(down.ok());
  CHECK_FALSE(down->decision.allowed);
  CHECK(down->decision.reason == quota::Reason::kUnavailable);  // fail closed: 503
  f.faulty.fail(absl::DataLossError("a reply that does not parse"));
  CHECK(f.read(Nanos{2}).status().code() == absl::StatusCode::kDataLoss);
  f.faulty.heal();
  CHECK(f.read(Nanos{3})->decision.allowed);
  CHECK(f.faulty.calls() == 4);
  CHECK(f.faulty.failed() == 2);
}

TEST_CASE("only the chosen calls fail; a slow backend waits") {
  Faulty f;
  f.faulty.fail_calls(2, 3, absl::UnavailableError("a blip"));
  CHECK(f.read(Nanos{0})->decision.allowed);
  CHECK(f.read(Nanos{1})->decision.reason == quota::Reason::kUnavailable);
  CHECK(f.read(Nanos{2})->decision.reason == quota::Reason::kUnavailable);
  CHECK(f.read(Nanos{3})->decision.allowed);
  CHECK(f.faulty.failed() == 2);
  f.faulty.slow(20ms);
  const auto start = std::chrono::steady_clock::now();
  CHECK(f.read(Nanos{4})->decision.allowed);
  CHECK(std::chrono::steady_clock::now() - start >= 20ms);  // a lower bound only
}
