// GoogleTest over the testing kit (quota/testing/gtest.hpp): a tenant's reads replayed
// through its rule, the envelope asserted — kept by the rule as written, broken (with the
// interval in the failure's text) by the rule loosened from burst 5 to 20.
#include "quota/testing/gtest.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <string>

#include "support/replay_rules.hpp"

using namespace std::chrono_literals;

namespace {

std::vector<quota::testing::TraceRequest> reads() {
  return quota::testing::every({.tenant = "acme", .plan = "free", .route = "read"}, 30, 1ms);
}

TEST(EnvelopesHold, TheRuleAsWrittenKeepsItsEnvelope) {
  const auto rules = quota::testing::burst_rules(5);
  ASSERT_NE(rules, nullptr);
  quota::testing::EnvelopeBook book(rules);
  EXPECT_EQ(quota::testing::replay_into(rules, book, reads()), 5);
  EXPECT_TRUE(quota::testing::EnvelopesHold(book));
}

TEST(EnvelopesHold, ALoosenedRuleBreaksTheContract) {
  const auto loosened = quota::testing::burst_rules(20);
  ASSERT_NE(loosened, nullptr);
  quota::testing::EnvelopeBook book(loosened);
  book.expect("free-read", {quota::testing::Envelope::Bucket{.rate = {10, 1s}, .burst = 5}});
  EXPECT_EQ(quota::testing::replay_into(loosened, book, reads()), 20);
  const ::testing::AssertionResult r = quota::testing::EnvelopesHold(book);
  EXPECT_FALSE(r);
  EXPECT_NE(std::string(r.message()).find("key {acme}read"), std::string::npos);
  EXPECT_NE(std::string(r.message()).find("lines 1..20"), std::string::npos);
}

}  // namespace
