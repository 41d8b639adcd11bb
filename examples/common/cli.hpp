// examples/common/cli.hpp — the command lines of the examples and benchmarks, on abseil
// flags, with one set of rules and exit codes for every binary:
//
//   --help (or -h)          prints the program's usage to stdout, exit 0
//   an unknown flag         "<program>: unknown flag '--frobnicate' (see --help)", exit 2
//   a missing or bad value  "<program>: --gateways expects an integer in [1, 256], got
//                           'many'", exit 2
//
// Flags are ABSL_FLAGs, spelled on the command line with dashes for the underscores of
// their names (ABSL_FLAG(int64_t, lease_q, ...) is --lease-q; --lease_q works too), as
// "--name=value" or "--name value"; a bool flag alone is true. cli::parse checks every
// argument against the registered flags (absl::FindCommandLineFlag) and every value
// against its Check (or, without one, against its type) BEFORE absl::ParseCommandLine
// sees them, so absl's own error path (exit 1) is never taken. Example:
//
//   ABSL_FLAG(std::int64_t, gateways, 8, "gateway threads");
//   int main(int argc, char** argv) {
//     quota::cli::parse({.name = "gateway_sim", .usage = kUsage,
//                        .checks = {quota::cli::integer("gateways", 1, 256)}},
//                       argc, argv);
//     const auto g = absl::GetFlag(FLAGS_gateways);
//
// The examples' and benchmarks' CMakeLists put examples/ on the include path and link
// the quota_cli target (cmake/QuotaCli.cmake): #include "common/cli.hpp".
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/flags/commandlineflag.h"
#include "absl/flags/parse.h"
#include "absl/flags/reflection.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"

namespace quota::cli {

namespace detail {
// (Debian's abseil has its own string_view, not std's.)
inline absl::string_view absl_view(std::string_view v) { return {v.data(), v.size()}; }
}  // namespace detail

// How one flag's value is checked: ok(value) or "--<flag> expects <expects>, got '<value>'".
struct Check {
  std::string flag;     // the flag's abseil name ("lease_q")
  std::string expects;  // "an integer in [1, 256]"
  std::function<bool(std::string_view)> ok;
};

// An integer in [lo, hi].
inline Check integer(std::string flag, std::int64_t lo, std::int64_t hi) {
  return {std::move(flag), absl::StrFormat("an integer in [%d, %d]", lo, hi),
          [lo, hi](std::string_view v) {
            std::int64_t n = 0;
            return absl::SimpleAtoi(detail::absl_view(v), &n) && n >= lo && n <= hi;
          }};
}

// A number in [lo, hi].
inline Check real(std::string flag, double lo, double hi) {
  return {std::move(flag), absl::StrFormat("a number in [%g, %g]", lo, hi),
          [lo, hi](std::string_view v) {
            double d = 0;
            return absl::SimpleAtod(detail::absl_view(v), &d) && d >= lo && d <= hi;
          }};
}

// Splits "HOST:PORT" (the port after the last colon, in [1, 65535]). False when `s` is
// not of that form.
inline bool parse_host_port(std::string_view s, std::string* host, int* port) {
  const auto colon = s.rfind(':');
  int p = 0;
  if (colon == std::string_view::npos ||
      !absl::SimpleAtoi(detail::absl_view(s.substr(colon + 1)), &p) || p <= 0 || p > 65535) {
    return false;
  }
  *host = std::string(s.substr(0, colon));
  *port = p;
  return true;
}

// HOST:PORT with a port in [1, 65535]; `also` is one more word accepted as it is ("local").
inline Check host_port(std::string flag, std::string also = {}) {
  std::string expects = "HOST:PORT with a port in [1, 65535]";
  if (!also.empty()) expects += " or '" + also + "'";
  return {std::move(flag), std::move(expects), [also](std::string_view v) {
            std::string host;
            int port = 0;
            return (!also.empty() && v == also) || parse_host_port(v, &host, &port);
          }};
}

// Any value that `ok` accepts, described as `expects`.
inline Check custom(std::string flag, std::string expects,
                    std::function<bool(std::string_view)> ok) {
  return {std::move(flag), std::move(expects), std::move(ok)};
}

struct Program {
  const char* name;   // for messages: "<name>: ..."
  const char* usage;  // printed for --help
  std::vector<Check> checks;
  bool positional = false;       // arguments that are not flags are allowed (else an error)
  bool benchmark_flags = false;  // --benchmark_* arguments go to Args::benchmark, unchecked
};

struct Args {
  std::vector<char*> positional;   // argv[0], then the arguments that are not flags
  std::vector<char*> benchmark;    // argv[0], then the --benchmark_* arguments
  std::vector<std::string> given;  // the abseil names of the flags on the command line

  bool has(std::string_view flag) const {
    for (const std::string& g : given) {
      if (g == flag) return true;
    }
    return false;
  }
};

// Prints "<program>: <message>" to stderr and exits 2.
[[noreturn]] inline void usage_error(const char* program, const std::string& message) {
  std::fprintf(stderr, "%s: %s\n", program, message.c_str());
  std::exit(2);
}

namespace detail {

// The command-line spelling of an abseil name: "lease_q" -> "--lease-q".
inline std::string spelling(std::string_view name) {
  std::string s = "--";
  for (char c : name) s += c == '_' ? '-' : c;
  return s;
}

template <class Int>
bool whole(std::string_view v) {
  Int n{};
  return absl::SimpleAtoi(detail::absl_view(v), &n);
}

// The check by type for a flag without a Check; "" expects means any value.
inline Check by_type(const absl::CommandLineFlag& f) {
  const std::string name(f.Name());
  if (f.IsOfType<std::int64_t>()) return {name, "an integer", whole<std::int64_t>};
  if (f.IsOfType<std::int32_t>()) return {name, "an integer", whole<std::int32_t>};
  if (f.IsOfType<std::uint64_t>()) return {name, "an integer >= 0", whole<std::uint64_t>};
  if (f.IsOfType<std::uint32_t>()) return {name, "an integer >= 0", whole<std::uint32_t>};
  if (f.IsOfType<double>()) {
    return {name, "a number", [](std::string_view v) {
              double d = 0;
              return absl::SimpleAtod(detail::absl_view(v), &d);
            }};
  }
  if (f.IsOfType<bool>()) {
    return {name, "true or false", [](std::string_view v) {
              bool b = false;
              return absl::SimpleAtob(detail::absl_view(v), &b);
            }};
  }
  return {name, "", [](std::string_view) { return true; }};
}

// abseil's own flags (usage and flag files): not flags of these programs.
inline bool builtin(std::string_view name) {
  for (const char* b : {"helpfull", "helpshort", "helppackage", "helpon", "helpmatch", "version",
                        "only_check_args", "flagfile", "fromenv", "tryfromenv", "undefok"}) {
    if (name == b) return true;
  }
  return false;
}

}  // namespace detail

// Checks argv (see the top of this file), exits 0 after --help and 2 on a usage error,
// then sets the flags with absl::ParseCommandLine. Returns the rest of the arguments.
inline Args parse(const Program& program, int argc, char** argv) {
  Args args;
  args.positional.push_back(argv[0]);
  args.benchmark.push_back(argv[0]);
  // What absl parses: --name=value for every flag, then "--" and the positional ones.
  std::vector<std::string> normalized;
  std::vector<char*> rest;
  bool only_positional = false;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (only_positional || arg == "-" || arg.empty() || arg[0] != '-') {
      if (!program.positional) {
        usage_error(program.name, absl::StrFormat("unexpected argument '%s' (see --help)", arg));
      }
      rest.push_back(argv[i]);
      continue;
    }
    if (arg == "--") {
      only_positional = true;
      continue;
    }
    if (arg == "-h" || arg == "--help" || arg == "--helpfull" || arg == "--helpshort") {
      std::fputs(program.usage, stdout);
      std::exit(0);
    }
    if (program.benchmark_flags && arg.rfind("--benchmark_", 0) == 0) {
      args.benchmark.push_back(argv[i]);
      continue;
    }
    const auto eq = arg.find('=');
    const std::string typed = arg.substr(0, eq);  // as typed, for messages
    if (typed.rfind("--", 0) != 0) {
      usage_error(program.name, absl::StrFormat("unknown flag '%s' (see --help)", typed));
    }
    std::string name = typed.substr(2);
    for (char& c : name) c = c == '-' ? '_' : c;
    const absl::CommandLineFlag* flag =
        detail::builtin(name) ? nullptr : absl::FindCommandLineFlag(name);
    bool negated = false;  // --nofoo for a bool foo (abseil's spelling)
    if (flag == nullptr && name.rfind("no", 0) == 0 && !detail::builtin(name.substr(2))) {
      flag = absl::FindCommandLineFlag(name.substr(2));
      negated = flag != nullptr && flag->IsOfType<bool>() && eq == std::string::npos;
      if (!negated) flag = nullptr;
    }
    if (flag == nullptr || flag->IsRetired()) {
      usage_error(program.name, absl::StrFormat("unknown flag '%s' (see --help)", typed));
    }
    std::string value;
    if (eq != std::string::npos) {
      value = arg.substr(eq + 1);
    } else if (flag->IsOfType<bool>()) {
      value = negated ? "false" : "true";
    } else if (i + 1 < argc) {
      value = argv[++i];
    } else {
      usage_error(program.name, absl::StrFormat("%s needs a value (see --help)", typed));
    }
    const std::string real_name(flag->Name());
    Check check = detail::by_type(*flag);
    for (const Check& c : program.checks) {
      if (c.flag == real_name) check = c;
    }
    if (!check.ok(value)) {
      usage_error(program.name, absl::StrFormat("%s expects %s, got '%s'",
                                                detail::spelling(real_name), check.expects, value));
    }
    normalized.push_back("--" + real_name + "=" + value);
    args.given.push_back(real_name);
  }
  std::vector<char*> for_absl{argv[0]};
  for (std::string& s : normalized) for_absl.push_back(s.data());
  absl::ParseCommandLine(static_cast<int>(for_absl.size()), for_absl.data());
  args.positional.insert(args.positional.end(), rest.begin(), rest.end());
  return args;
}

}  // namespace quota::cli
