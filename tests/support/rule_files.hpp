// tests/support/rule_files.hpp — rule file text on disk, and a registry to reload into,
// for the rule file tests.
#pragma once

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <string_view>

#include <unistd.h>
#include <catch2/catch.hpp>

#include "absl/status/status.h"
#include "quota/gateway/rules/rule_registry.hpp"
#include "quota/gateway/rules/rules.hpp"
#include "quota/rules/rule_file.hpp"

namespace quota::testing {

// A file holding `text` under the system's temporary directory, removed with the object.
class TempRuleFile {
 public:
  explicit TempRuleFile(std::string_view text) {
    static int counter = 0;
    path_ = (std::filesystem::temp_directory_path() / ("quota-rules-" + std::to_string(::getpid()) +
                                                       "-" + std::to_string(counter++) + ".yaml"))
                .string();
    write(text);
  }
  ~TempRuleFile() { std::filesystem::remove(path_); }
  TempRuleFile(const TempRuleFile&) = delete;
  TempRuleFile& operator=(const TempRuleFile&) = delete;

  void write(std::string_view text) const {
    std::ofstream out(path_, std::ios::binary | std::ios::trunc);
    out << text;
    REQUIRE(out.good());
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// A registry holding a valid set of `version` (routes read and create, one tenant rule).
inline std::unique_ptr<gateway::RuleRegistry> registry_at(std::uint64_t version) {
  const std::string text = "version: " + std::to_string(version) +
                           "\nroutes: [{name: read}, {name: create, cost: 5}]\n"
                           "rules:\n"
                           "  - {name: free, level: tenant, plan: free, route: read,\n"
                           "     token_bucket: {rate: 10/s, burst: 20}}\n";
  auto set = rules::load_rules(text, "initial.yaml");
  REQUIRE(set.ok());
  return std::make_unique<gateway::RuleRegistry>(*set);
}

inline std::string message(const absl::Status& s) { return std::string(s.message()); }

}  // namespace quota::testing
