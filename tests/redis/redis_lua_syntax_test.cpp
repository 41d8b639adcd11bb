// Every Lua script quota sends to Redis, as Redis receives it (every shared snippet and
// macro spliced in), is written to the build tree ($QUOTA_LUA_OUT/<name>.lua) and parsed
// by Lua 5.1's own compiler, `luac5.1 -p` ($QUOTA_LUAC; Debian's lua5.1), the language
// Redis runs. A script that does not parse fails here with luac's message and line, not
// as an ERR reply from a server in some other test. No macro may be left unexpanded
// (`@name(`). The checker is shown to fail on a script with a syntax error.
//
// Needs no server: registered with the others in CMakeLists.txt when luac5.1 is found.
#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
#include <string>
#include <utility>
#include <vector>

#include <catch2/catch.hpp>

#include "quota/redis/fair_asks_exchange.hpp"
#include "quota/redis/grant_ledger.hpp"
#include "quota/redis/redis_store.hpp"
#include "quota/redis/twin/gateway.hpp"
#include "quota/redis/twin/gateway_attempts.hpp"
#include "quota/region/pool_script.hpp"

namespace {

struct Parsed {
  int status = -1;
  std::string output;  // luac's messages (stdout and stderr)
};

std::string env_or_fail(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') FAIL(name << " is not set (tests/redis/CMakeLists.txt sets it)");
  return v;
}

// Writes `text` to $QUOTA_LUA_OUT/<name>.lua and runs `luac5.1 -p` on it.
Parsed parse(const std::string& name, const std::string& text) {
  const std::filesystem::path dir = env_or_fail("QUOTA_LUA_OUT");
  std::filesystem::create_directories(dir);
  const std::filesystem::path file = dir / (name + ".lua");
  {
    std::ofstream out(file, std::ios::binary | std::ios::trunc);
    out << text;
    REQUIRE(out.good());
  }
  const std::string cmd = "'" + env_or_fail("QUOTA_LUAC") + "' -p '" + file.string() + "' 2>&1";
  Parsed p;
  FILE* pipe = popen(cmd.c_str(), "r");
  REQUIRE(pipe != nullptr);
  std::array<char, 512> buf{};
  for (std::size_t n; (n = std::fread(buf.data(), 1, buf.size(), pipe)) > 0;) {
    p.output.append(buf.data(), n);
  }
  const int raw = pclose(pipe);
  p.status = WIFEXITED(raw) ? WEXITSTATUS(raw) : -1;
  return p;
}

// Every script a store of quota::redis or quota::region loads on a server.
std::vector<std::pair<std::string, std::string>> scripts() {
  using namespace quota::redis;
  return {
      {"token_bucket", LuaTwin<quota::TokenBucket>::script()},
      {"fixed_window", LuaTwin<quota::FixedWindow>::script()},
      {"sliding_log", LuaTwin<quota::SlidingLog>::script()},
      {"sliding_window_estimate", LuaTwin<quota::SlidingWindowEstimate>::script()},
      {"gateway", kGatewayLua},
      {"gateway_attempt", kGatewayAttemptLua},
      {"fair_asks", kFairAsksLua},
      {"grant_record", kGrantRecordLua},
      {"grant_list", kGrantListLua},
      {"grant_revoke", kRevokeLua},
      {"grant_revoked", kRevokedLua},
      {"regional_pool", quota::region::pool_lua()},
  };
}

}  // namespace

TEST_CASE("lua: every script Redis runs parses as Lua 5.1, its macros all expanded") {
  const std::regex macro(R"(@[A-Za-z_][A-Za-z_0-9]*\()");
  for (const auto& [name, text] : scripts()) {
    INFO("script " << name << " ($QUOTA_LUA_OUT/" << name << ".lua)");
    REQUIRE_FALSE(text.empty());
    const Parsed p = parse(name, text);
    INFO("luac5.1 -p: " << p.output);
    CHECK(p.status == 0);
    std::smatch m;
    const bool left = std::regex_search(text, m, macro);
    INFO("unexpanded macro: " << (left ? m.str() : std::string()));
    CHECK_FALSE(left);
  }
}

TEST_CASE("lua: the check fails on a script that does not parse, naming its line") {
  const Parsed p = parse("broken_on_purpose", "local a = 1\nlocal b = = 2\nreturn a + b\n");
  CHECK(p.status != 0);
  CHECK(p.output.find("broken_on_purpose.lua:2:") != std::string::npos);
}
