// json_test — the strict flat-object reader and the quoting of json.hpp: what it accepts,
// and each thing it refuses with an error naming it.
#include <catch2/catch.hpp>
#include <string>

#include "api/http/json.hpp"

using quota::server::FlatObject;
using quota::server::json_quote;
using quota::server::JsonValue;
using quota::server::parse_flat_object;

TEST_CASE("a flat object with every accepted kind of value") {
  auto o = parse_flat_object(
      " {\"tenant\" : \"acme\",\"cost\":3, \"neg\":-9223372036854775808,"
      "\"max\":9223372036854775807,\"t\":true,\"f\":false,\"n\":null,\"zero\":0}\n");
  REQUIRE(o.ok());
  REQUIRE(o->size() == 8);
  CHECK((*o)[0].first == "tenant");
  CHECK((*o)[0].second.kind == JsonValue::kString);
  CHECK((*o)[0].second.string == "acme");
  CHECK((*o)[1].second.kind == JsonValue::kInteger);
  CHECK((*o)[1].second.integer == 3);
  CHECK((*o)[2].second.integer == std::numeric_limits<std::int64_t>::min());
  CHECK((*o)[3].second.integer == std::numeric_limits<std::int64_t>::max());
  CHECK((*o)[4].second.kind == JsonValue::kBool);
  CHECK((*o)[4].second.boolean);
  CHECK_FALSE((*o)[5].second.boolean);
  CHECK((*o)[6].second.kind == JsonValue::kNull);
  CHECK((*o)[7].second.integer == 0);
  auto empty = parse_flat_object("{}");
  REQUIRE(empty.ok());
  CHECK(empty->empty());
}

TEST_CASE("string escapes are decoded, surrogate pairs joined into UTF-8") {
  auto o = parse_flat_object(R"({"s":"a\"b\\c\/d\n\t\r\b\f","u":"\u00e9\u20ac\ud83d\ude00"})");
  REQUIRE(o.ok());
  CHECK((*o)[0].second.string == "a\"b\\c/d\n\t\r\b\f");
  CHECK((*o)[1].second.string == "\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80");
}

TEST_CASE("everything else is refused, naming what is wrong") {
  const std::pair<std::string, std::string> cases[] = {
      {"", "expected '{'"},
      {"[1]", "expected '{'"},
      {"{\"a\":1", "expected ',' or '}'"},
      {"{\"a\":1,}", "expected a member name"},
      {"{\"a\" 1}", "expected ':'"},
      {"{a:1}", "expected a member name"},
      {"{\"a\":{\"b\":1}}", "member \"a\": nested objects and arrays are not accepted"},
      {"{\"a\":[1]}", "nested objects and arrays"},
      {"{\"a\":1.5}", "member \"a\": expected a whole number"},
      {"{\"a\":1e3}", "expected a whole number"},
      {"{\"a\":9223372036854775808}", "member \"a\": integer out of range"},
      {"{\"a\":-9223372036854775809}", "integer out of range"},
      {"{\"a\":012}", "a leading zero is not allowed"},
      {"{\"a\":-}", "expected a digit"},
      {"{\"a\":1,\"a\":2}", "member \"a\" given twice"},
      {"{\"a\":\"x\\q\"}", "invalid escape '\\q'"},
      {"{\"a\":\"x\ny\"}", "raw control character"},
      {"{\"a\":\"\\ud83d\"}", "high surrogate without its low surrogate"},
      {"{\"a\":\"\\ude00\"}", "low surrogate without its high surrogate"},
      {"{\"a\":\"\\u12G4\"}", "expected 4 hex digits"},
      {"{\"a\":\"abc", "unterminated string"},
      {"{\"a\":tru}", "expected a string, an integer, true, false or null"},
      {"{\"a\":1} x", "unexpected text after the object"},
      {"{\"a\":1}{}", "unexpected text after the object"},
  };
  for (const auto& [text, message] : cases) {
    INFO(text);
    auto o = parse_flat_object(text);
    REQUIRE_FALSE(o.ok());
    CHECK(o.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK_THAT(std::string(o.status().message()), Catch::Matchers::Contains(message));
  }
}

TEST_CASE("the error names the byte offset") {
  // Byte 12 is the "." of 2.0.
  auto o = parse_flat_object("{\"a\":1,\"b\":2.0}");
  REQUIRE_FALSE(o.ok());
  CHECK_THAT(std::string(o.status().message()), Catch::Matchers::StartsWith("JSON at byte 12:"));
}

TEST_CASE("json_quote escapes what JSON requires and round-trips") {
  CHECK(json_quote("plain") == "\"plain\"");
  CHECK(json_quote("a\"b\\c\n\x01") == "\"a\\\"b\\\\c\\n\\u0001\"");
  const std::string tricky = "q\"\\\t\r\x1f end";
  auto o = parse_flat_object("{\"k\":" + json_quote(tricky) + "}");
  REQUIRE(o.ok());
  CHECK((*o)[0].second.string == tricky);
}
