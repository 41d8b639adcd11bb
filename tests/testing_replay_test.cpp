// Tests for quota/testing/trace.hpp and quota/testing/replay.hpp: trace lines read and
// refused with their line, a trace replayed through a Gateway in virtual time, and the
// envelope book's verdicts — a rule's own envelope holds, a tighter one asserted for it
// breaks on the interval the admissions exceed it; the Catch2 matcher says both; a
// Limiter replayed on its ManualClock, its policy's envelope checked the same way.
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "quota/store/local_store.hpp"
#include "quota/testing/catch2.hpp"
#include "quota/testing/replay.hpp"
#include "quota/testing/trace.hpp"
#include "support/replay_rules.hpp"

using namespace std::chrono_literals;
using quota::Nanos;
using quota::testing::EnvelopeBook;
using quota::testing::TraceRequest;

using quota::testing::burst_rules;

namespace {

int run(std::shared_ptr<const quota::gateway::RuleSet> rules, EnvelopeBook& book,
        const std::vector<TraceRequest>& trace) {
  REQUIRE(rules != nullptr);
  const int admitted = quota::testing::replay_into(rules, book, trace);
  REQUIRE(admitted >= 0);
  return admitted;
}

}  // namespace

TEST_CASE("trace lines: fields, an optional cost, errors naming the line") {
  auto r = quota::testing::parse_trace_line("1500,acme,free,bob,read,3", "t.csv", 2);
  REQUIRE(r.ok());
  CHECK(r->time == Nanos{1500});
  CHECK((r->tenant == "acme" && r->plan == "free" && r->user == "bob" && r->route == "read"));
  CHECK(r->cost == 3);
  CHECK(quota::testing::parse_trace_line("0,acme,free,,read", "t.csv", 3)->cost == 0);
  CHECK(quota::testing::parse_trace_line("0,acme,free,read", "t.csv", 4).status().message() ==
        "t.csv:4: expected time_ns,tenant,plan,user,route[,cost], got 4 fields");
  CHECK(quota::testing::parse_trace_line("-1,a,b,,c", "t.csv", 5).status().message() ==
        "t.csv:5: time '-1' is not a whole number of ns >= 0");
  CHECK(quota::testing::parse_trace_line("0,a,b,,c,0", "t.csv", 6).status().message() ==
        "t.csv:6: cost '0' is not a whole number of units >= 1");
}

TEST_CASE("a trace file is read line by line; a time that goes back is refused") {
  std::FILE* f = std::tmpfile();
  REQUIRE(f != nullptr);
  std::fputs("time_ns,tenant,plan,user,route\r\n# a comment\n\n5,a,free,,read\n3,a,free,,read", f);
  std::rewind(f);
  quota::testing::TraceReader in(f, "t.csv");
  auto first = in.next();
  REQUIRE(first.ok());
  REQUIRE(*first != nullptr);
  CHECK((*first)->time == Nanos{5});
  CHECK(in.line() == 4);
  auto second = in.next();
  CHECK(second.status().message() == "t.csv:5: time 3 ns is earlier than the line before (5 ns)");
  std::fclose(f);
}

TEST_CASE("a rule's own envelope holds over a replay; a tighter one asserted breaks") {
  const auto trace =
      quota::testing::every({.tenant = "acme", .plan = "free", .route = "read"}, 30, 1ms);
  EnvelopeBook own(burst_rules(20));
  CHECK(run(burst_rules(20), own, trace) == 20);
  auto v = own.verdicts();
  REQUIRE(v.size() == 1);
  CHECK(v[0].holds);
  CHECK(v[0].admitted == 20);
  CHECK(v[0].denied == 10);
  CHECK(v[0].keys == 1);

  // The loose rule's admissions against burst 5: broken over the first 20 requests.
  EnvelopeBook tight(burst_rules(20));
  tight.expect("free-read", {quota::testing::Envelope::Bucket{.rate = {10, 1s}, .burst = 5}});
  run(burst_rules(20), tight, trace);
  v = tight.verdicts();
  REQUIRE(v.size() == 1);
  CHECK_FALSE(v[0].holds);
  CHECK(v[0].worst.find("key {acme}read") == 0);
  CHECK(v[0].worst.find("lines 1..20") != std::string::npos);
  CHECK(v[0].text.find("VIOLATED") != std::string::npos);
}

TEST_CASE("the Catch2 matcher passes a book that holds and fails one that does not") {
  const auto trace =
      quota::testing::every({.tenant = "acme", .plan = "free", .route = "read"}, 30, 1ms);
  EnvelopeBook tight(burst_rules(5));
  run(burst_rules(5), tight, trace);
  CHECK_THAT(tight, quota::testing::EnvelopesHold());
  // A rule loosened to burst 20, held to the contract of burst 5.
  EnvelopeBook loosened(burst_rules(20));
  loosened.expect("free-read", {quota::testing::Envelope::Bucket{.rate = {10, 1s}, .burst = 5}});
  run(burst_rules(20), loosened, trace);
  CHECK_FALSE(quota::testing::EnvelopesHold().match(loosened));
  CHECK(Catch::StringMaker<EnvelopeBook>::convert(loosened).find("lines 1..20") !=
        std::string::npos);
}

TEST_CASE("a Limiter replays a trace on its ManualClock; its envelope is checked as a rule's") {
  const quota::TokenBucket loose{.rate = {10, 1s}, .burst = 20};
  auto limiter =
      quota::Limiter<quota::TokenBucket, quota::LocalStore, quota::ManualClock>::create(loose);
  REQUIRE(limiter.ok());
  auto trace = quota::testing::every({.tenant = "acme", .plan = "free", .route = "read"}, 30, 1ms);
  trace.push_back({.time = 200ms, .tenant = "beta", .route = "read", .cost = 3});
  EnvelopeBook book;  // no rule set: decisions of one budget
  book.expect("reads", {quota::testing::Envelope::Bucket{.rate = {10, 1s}, .burst = 5}});
  std::vector<std::string> keys;
  quota::testing::replay(
      *limiter, trace, [](const TraceRequest& r) { return r.tenant + ":" + r.route; },
      [&](const TraceRequest& r, const std::string& key, const auto& d) {
        REQUIRE(d.ok());
        CHECK(limiter->clock().now() == r.time);  // decided at the request's own time
        keys.push_back(key);
        REQUIRE(book.record("reads", limiter->policy(), key, r.cost > 0 ? r.cost : 1, r, d).ok());
      });
  CHECK(keys.front() == "acme:read");
  CHECK(keys.back() == "beta:read");
  const auto v = book.verdicts();
  REQUIRE(v.size() == 1);
  CHECK(v[0].admitted == 21);  // acme's burst of 20, beta's one request
  CHECK(v[0].admitted_units == 23);
  CHECK(v[0].denied == 10);
  CHECK(v[0].keys == 2);
  CHECK_FALSE(v[0].holds);  // burst 20 against the asserted 5
  CHECK(v[0].worst.find("key acme:read") == 0);
  CHECK(v[0].worst.find("lines 1..20") != std::string::npos);
  CHECK_FALSE(quota::testing::EnvelopesHold().match(book));
}
