// quota/testing/gtest.hpp — GoogleTest assertions for rate-policy tests; include it only
// from tests built with GoogleTest (quota/testing/catch2.hpp is Catch2's).
//
// EnvelopesHold(book) is an AssertionResult: success when every rule of the EnvelopeBook
// (replay.hpp) kept its envelope; else a failure listing each rule's verdict line, the
// breaking key and its interval included.
//
// Thread safety: as the book's.
//
//   quota::testing::replay(gateway, trace, [&](auto& r, auto& d) { book.record(r, d); });
//   EXPECT_TRUE(quota::testing::EnvelopesHold(book));
#pragma once

#include <gtest/gtest.h>

#include "quota/testing/replay.hpp"

namespace quota::testing {

inline ::testing::AssertionResult EnvelopesHold(const EnvelopeBook& book) {
  bool holds = true;
  std::string lines;
  for (const RuleVerdict& v : book.verdicts()) {
    holds = holds && v.holds;
    lines += "\n  " + v.text;
  }
  if (holds) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "an envelope is broken:" << lines;
}

}  // namespace quota::testing
