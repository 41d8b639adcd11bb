// Built against the installed package by the consumer_installed_package test when quota
// was installed with quota::rules. Exits 0 only if a rule file loads into a RuleSet.
#include <cstdio>
#include <string>

#include "quota/rules/rule_file.hpp"

int main() {
  auto set = quota::rules::load_rules(
      "version: 2\nroutes: [{name: read}]\n"
      "rules: [{name: free, level: tenant, plan: free, route: read,\n"
      "         token_bucket: {rate: 10/s, burst: 20}}]\n",
      "consumer.yaml");
  if (!set.ok()) {
    std::printf("%s\n", std::string(set.status().message()).c_str());
    return 1;
  }
  std::printf("loaded rule set version %d\n", static_cast<int>((*set)->version()));
  return (*set)->version() == 2 ? 0 : 1;
}
