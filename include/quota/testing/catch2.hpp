// quota/testing/catch2.hpp — Catch2 (v2) matchers for rate-policy tests; include it only
// from tests built with Catch2 (quota/testing/gtest.hpp is GoogleTest's).
//
// EnvelopesHold() matches an EnvelopeBook (replay.hpp) whose every rule kept its envelope;
// a failure prints each rule's verdict line, the breaking key and its interval included.
//
// Thread safety: as the book's.
//
//   quota::testing::replay(gateway, trace, [&](auto& r, auto& d) { book.record(r, d); });
//   CHECK_THAT(book, quota::testing::EnvelopesHold());
//   // ... rule free-read: 20 admitted ...: VIOLATED; key {acme}read: ...; lines 1..20
#pragma once

#include <catch2/catch.hpp>
#include <string>

#include "quota/testing/replay.hpp"

namespace quota::testing {

class EnvelopesHoldMatcher : public Catch::MatcherBase<EnvelopeBook> {
 public:
  bool match(const EnvelopeBook& book) const override {
    for (const RuleVerdict& v : book.verdicts()) {
      if (!v.holds) return false;
    }
    return true;
  }
  std::string describe() const override { return "keeps every rule's envelope"; }
};

inline EnvelopesHoldMatcher EnvelopesHold() { return {}; }

}  // namespace quota::testing

namespace Catch {
template <>
struct StringMaker<quota::testing::EnvelopeBook> {
  static std::string convert(const quota::testing::EnvelopeBook& book) {
    std::string out;
    for (const auto& v : book.verdicts()) out += "\n  " + v.text;
    return out.empty() ? "(no decisions)" : out;
  }
};
}  // namespace Catch
