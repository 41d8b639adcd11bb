// A user's GoogleTest test of a rule file with the installed testing kit (docs/testing.md):
// a burst of reads replayed through the file, the contract (10/s, burst 5) asserted with
// the kit's assertion. QUOTA_RULES names the rule file; on a loosened file it fails,
// naming the key and the requests of the interval that breaks the contract.
#include "quota/testing/gtest.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>

#include "quota/rules/rule_file.hpp"
#include "quota/store/local_store.hpp"

using namespace std::chrono_literals;

TEST(FreePlan, ReadsKeepTheContract) {
  const char* file = std::getenv("QUOTA_RULES");
  ASSERT_NE(file, nullptr);
  auto rules = quota::rules::load_rule_file(file);
  ASSERT_TRUE(rules.ok()) << rules.status();
  quota::LocalStore<quota::gateway::KeyPolicy> store;
  quota::gateway::RuleRegistry registry(*rules);
  quota::gateway::Gateway gateway(store, registry);

  quota::testing::EnvelopeBook book(*rules);
  book.expect("free-read", {quota::testing::Envelope::Bucket{.rate = {10, 1s}, .burst = 5}});
  const auto trace =
      quota::testing::every({.tenant = "acme", .plan = "free", .route = "read"}, 30, 1ms);
  quota::testing::replay(gateway, trace, [&](const auto& r, const auto& d) {
    ASSERT_TRUE(d.ok());
    ASSERT_TRUE(book.record(r, d).ok());
  });
  EXPECT_TRUE(quota::testing::EnvelopesHold(book));
}
