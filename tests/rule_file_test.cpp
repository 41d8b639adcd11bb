#include "quota/rules/rule_file.hpp"

#include <catch2/catch.hpp>

TEST_CASE("smoke") {
  auto s = quota::rules::parse_rules("routes: [{name: read}]\nrules: []\n", "f.yaml");
  REQUIRE(s.ok());
}
