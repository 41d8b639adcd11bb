// quota_server_shared_rules_digest_test — the digest of a published rule set and the
// heartbeat's text (shared_rules.hpp), without Redis: the digest is FNV-1a 64 of the
// format, a newline and the text (values computed outside this code), shown as 16 hex
// digits; a heartbeat's address and digests read back as written, and a heartbeat
// written before digests existed reads as "no digest".
#include <catch2/catch.hpp>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "rules/shared_rules.hpp"

namespace {

using quota::server::digest_hex;
using quota::server::Heartbeat;
using quota::server::rules_digest;

// The words of a heartbeat value after APPLIED_VERSION TIME_MS, read into a Heartbeat.
Heartbeat read_rest(const std::string& rest) {
  const std::vector<std::string> words = absl::StrSplit(rest, ' ', absl::SkipEmpty());
  Heartbeat beat;
  quota::server::detail::read_heartbeat_rest(words, beat);
  return beat;
}

}  // namespace

TEST_CASE("rules_digest is FNV-1a 64 of the format, a newline and the text", "[digest]") {
  // FNV-1a 64 of "quota\nversion: 1\n", computed independently.
  CHECK(rules_digest("quota", "version: 1\n") == 0x3a8b6da135ddc330ull);
  // Of "" (the format and text empty but for the newline) it is FNV-1a 64 of "\n".
  CHECK(rules_digest("", "") == 0xaf63c74c8601c8ddull);
  // The format is part of what is digested: one text read as another format is other rules.
  CHECK(rules_digest("envoy", "version: 1\n") != rules_digest("quota", "version: 1\n"));
  CHECK(rules_digest("quota", "version: 1\n") != rules_digest("quota", "version: 1 \n"));
}

TEST_CASE("digest_hex: 16 lowercase hex digits, none for 0", "[digest]") {
  CHECK(digest_hex(0x00ab00000000000full) == "00ab00000000000f");
  CHECK(digest_hex(0x3a8b6da135ddc330ull) == "3a8b6da135ddc330");
  CHECK(digest_hex(0) == "none");
}

TEST_CASE("parse_digest: 16 hex digits or empty; anything else is refused", "[digest]") {
  using quota::server::detail::parse_digest;
  std::uint64_t d = 7;
  CHECK(parse_digest("", &d));
  CHECK(d == 0);
  CHECK(parse_digest("3a8b6da135ddc330", &d));
  CHECK(d == 0x3a8b6da135ddc330ull);
  CHECK_FALSE(parse_digest("3a8b6da135ddc33", &d));    // 15 digits
  CHECK_FALSE(parse_digest("3a8b6da135ddc33g", &d));   // not hex
  CHECK_FALSE(parse_digest("0000000000000000", &d));   // 0 means none, never stored
  CHECK_FALSE(parse_digest("3a8b6da135ddc3300", &d));  // 17 digits
}

TEST_CASE("a heartbeat's address and digests read back as written", "[digest]") {
  Heartbeat beat{.id = "gw-1",
                 .applied = 3,
                 .address = "10.0.0.7:8080",
                 .digest = 0x0ff563716c0ab514ull,
                 .refused = {.version = 1, .digest = 0x199b18cd5a14c3e4ull}};
  const std::string rest = quota::server::detail::heartbeat_rest(beat);
  CHECK(rest == "10.0.0.7:8080 digest=0ff563716c0ab514 refused=1:199b18cd5a14c3e4");
  const Heartbeat back = read_rest(rest);
  CHECK(back.address == beat.address);
  CHECK(back.digest == beat.digest);
  CHECK(back.refused == beat.refused);

  beat.refused = {};
  CHECK(quota::server::detail::heartbeat_rest(beat) == "10.0.0.7:8080 digest=0ff563716c0ab514");
  CHECK(read_rest(quota::server::detail::heartbeat_rest(beat)).refused.version == 0);
}

TEST_CASE("a heartbeat without digests, or with words this server does not know", "[digest]") {
  // Written before digests existed: the address only.
  const Heartbeat old = read_rest("10.0.0.7:8080");
  CHECK(old.address == "10.0.0.7:8080");
  CHECK(old.digest == 0);
  CHECK(old.refused.version == 0);
  // A later server's word is skipped; a malformed refusal reads as none.
  const Heartbeat later = read_rest("10.0.0.7:8080 zone=eu digest=0ff563716c0ab514 refused=x:y");
  CHECK(later.address == "10.0.0.7:8080");
  CHECK(later.digest == 0x0ff563716c0ab514ull);
  CHECK(later.refused.version == 0);
}
