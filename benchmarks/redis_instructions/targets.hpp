// benchmarks/redis_instructions/targets.hpp — redis_instructions_bench's rows and the
// targets it reports from them: each target's ratio computed once, then printed and, with
// --json, written beside the rows. (Part of redis_instructions_bench: see the top of
// benchmarks/redis_instructions_bench.cpp for the rows and the issues the targets are from.)
#pragma once

#include <cstdio>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

namespace quota::bench {

// One measured workload: server instructions per script call and per decision.
struct InstructionRow {
  std::string name;
  long long calls = 0;
  int decisions_per_call = 1;
  double per_call = 0;
  double per_decision() const { return per_call / decisions_per_call; }
};

// A ratio of two rows' instructions per decision; 0 when either row was not measured.
// `at_least`: met when the ratio is >= target, else when it is <= target; no target: only
// reported.
struct InstructionTarget {
  const char* json_name;
  const char* text;
  double value = 0;
  std::optional<double> target{};
  bool at_least = false;
  bool met() const {
    return target && value > 0 && (at_least ? value >= *target : value <= *target);
  }
};

inline std::vector<InstructionTarget> instruction_targets(const std::vector<InstructionRow>& rows) {
  auto per_decision = [&](const char* name) {
    for (const InstructionRow& r : rows) {
      if (r.name == name) return r.per_decision();
    }
    return 0.0;
  };
  auto ratio = [&](const char* over, const char* under) {
    const double a = per_decision(over), b = per_decision(under);
    return a > 0 && b > 0 ? a / b : 0.0;
  };
  return {
      {"b16_per_core_vs_naive_instructions",
       "decisions per Redis core vs the straightforward script, batches of 16",
       ratio("naive-lua d1", "quota b16"), 2.0, true},
      {"d1_per_core_vs_naive_instructions",
       "decisions per Redis core vs the straightforward script, one per call",
       ratio("naive-lua d1", "quota d1")},
      {"gateway_3_limits_vs_1_limit_instructions", "3 limits of one tenant in one call vs 1 limit",
       ratio("gateway 3lim", "gateway 1lim"), 1.5},
      {"gateway_1_limit_vs_naive_instructions",
       "the gateway's 1-limit decision vs the straightforward script",
       ratio("gateway 1lim", "naive-lua d1"), 1.0},
      {"sketch_3_limits_vs_1_limit_instructions", "the sketch of one key per scope: 3 limits vs 1",
       ratio("sketch 3lim", "sketch 1lim")},
  };
}

// Prints each target measured; with `json_path`, writes the rows and the targets there.
inline void report_targets(const std::vector<InstructionRow>& rows, int keys, int errors,
                           const std::string& json_path) {
  const std::vector<InstructionTarget> targets = instruction_targets(rows);
  for (const InstructionTarget& t : targets) {
    if (t.value == 0) continue;
    std::printf("%s: %.2fx", t.text, t.value);
    if (t.target) {
      std::printf(" (target %s %.1f: %s)", t.at_least ? ">=" : "<=", *t.target,
                  t.met() ? "met" : "not met");
    }
    std::printf("\n");
  }
  std::printf("errors %d\n", errors);
  if (json_path.empty()) return;
  std::ofstream out(json_path);
  out << "{\n  \"context\": {\"tool\": \"callgrind --toggle-collect=processInputBuffer\", "
         "\"keys\": "
      << keys << ", \"errors\": " << errors << "},\n  \"benchmarks\": [";
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const InstructionRow& r = rows[i];
    out << (i ? "," : "") << "\n    {\"name\": \"" << r.name
        << "\", \"run_type\": \"iteration\", \"iterations\": " << r.calls
        << ", \"instructions_per_call\": " << r.per_call
        << ", \"instructions_per_decision\": " << r.per_decision() << "}";
  }
  out << "\n  ],\n  \"targets\": [";
  for (std::size_t i = 0; i < targets.size(); ++i) {
    const InstructionTarget& t = targets[i];
    out << (i ? "," : "") << "\n    {\"name\": \"" << t.json_name << "\", \"value\": " << t.value;
    if (t.target) {
      out << ", \"target\": " << *t.target << ", \"met\": " << (t.met() ? "true" : "false");
    }
    out << "}";
  }
  out << "\n  ]\n}\n";
}

}  // namespace quota::bench
