// A user's Catch2 test of a rule file with the installed testing kit (docs/testing.md):
// a burst of reads replayed through the file, the contract (10/s, burst 5) asserted with
// the kit's matcher. QUOTA_RULES names the rule file; on a loosened file it fails, naming
// the key and the requests of the interval that breaks the contract.
#define CATCH_CONFIG_MAIN
#include "quota/testing/catch2.hpp"

#include <chrono>
#include <cstdlib>

#include "quota/rules/rule_file.hpp"
#include "quota/store/local_store.hpp"

using namespace std::chrono_literals;

TEST_CASE("plan free's reads keep the contract of 10/s with a burst of 5") {
  const char* file = std::getenv("QUOTA_RULES");
  REQUIRE(file != nullptr);
  auto rules = quota::rules::load_rule_file(file);
  REQUIRE(rules.ok());
  quota::LocalStore<quota::gateway::KeyPolicy> store;
  quota::gateway::RuleRegistry registry(*rules);
  quota::gateway::Gateway gateway(store, registry);

  quota::testing::EnvelopeBook book(*rules);
  book.expect("free-read", {quota::testing::Envelope::Bucket{.rate = {10, 1s}, .burst = 5}});
  const auto trace =
      quota::testing::every({.tenant = "acme", .plan = "free", .route = "read"}, 30, 1ms);
  quota::testing::replay(gateway, trace, [&](const auto& r, const auto& d) {
    REQUIRE(d.ok());
    REQUIRE(book.record(r, d).ok());
  });
  CHECK_THAT(book, quota::testing::EnvelopesHold());
}
