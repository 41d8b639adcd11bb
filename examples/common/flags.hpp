// examples/common/flags.hpp — the command-line flags of the examples (gateway_sim,
// http_gateway): "--name=value" or "--name value", numbers checked against a range, and
// HOST:PORT, with the same usage messages everywhere. The examples' CMakeLists put
// examples/ on the include path: #include "common/flags.hpp".
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"

namespace quota::examples {

// One flag with its value.
struct Flag {
  std::string name;  // "--name"
  std::string value;
};

// Reads the flag at argv[i]: "--name=value", or "--name value" (then i moves past the
// value). Returns "" or a usage error.
inline std::string read_flag(int argc, char** argv, int& i, Flag& flag) {
  const std::string arg = argv[i];
  if (arg.rfind("--", 0) != 0) return absl::StrFormat("unexpected argument '%s'", arg);
  if (const auto eq = arg.find('='); eq != std::string::npos) {
    flag.name = arg.substr(0, eq);
    flag.value = arg.substr(eq + 1);
    return "";
  }
  flag.name = arg;
  if (i + 1 >= argc) return absl::StrFormat("%s needs a value (see --help)", flag.name);
  flag.value = argv[++i];
  return "";
}

// Sets *out to the flag's value, an integer in [lo, hi]. Returns "" or a usage error
// (and leaves *out alone).
inline std::string flag_integer(const Flag& flag, std::int64_t* out, std::int64_t lo,
                                std::int64_t hi) {
  std::int64_t v = 0;
  if (!absl::SimpleAtoi(flag.value, &v) || v < lo || v > hi) {
    return absl::StrFormat("%s expects an integer in [%d, %d], got '%s'", flag.name, lo, hi,
                           flag.value);
  }
  *out = v;
  return "";
}

// Sets *out to the flag's value, a number in [lo, hi]. Returns "" or a usage error (and
// leaves *out alone).
inline std::string flag_real(const Flag& flag, double* out, double lo, double hi) {
  double v = 0;
  if (!absl::SimpleAtod(flag.value, &v) || !(v >= lo && v <= hi)) {
    return absl::StrFormat("%s expects a number in [%g, %g], got '%s'", flag.name, lo, hi,
                           flag.value);
  }
  *out = v;
  return "";
}

// Splits "HOST:PORT" (the port after the last colon, in [1, 65535]). False when `s` is
// not of that form.
inline bool parse_host_port(const std::string& s, std::string* host, int* port) {
  const auto colon = s.rfind(':');
  int p = 0;
  if (colon == std::string::npos || !absl::SimpleAtoi(s.substr(colon + 1), &p) || p <= 0 ||
      p > 65535) {
    return false;
  }
  *host = s.substr(0, colon);
  *port = p;
  return true;
}

// Parses the command line into `options` with parse(argc, argv, options, &help), which
// returns "" or a usage error and sets help for --help. Returns the exit status when the
// program should stop here: 2 after printing "<program>: <error>" to stderr, 0 after
// printing `usage` to stdout for --help; -1 to go on.
template <class Options, class Parse>
int parse_command_line(const char* program, const char* usage, int argc, char** argv,
                       Options& options, Parse&& parse) {
  bool help = false;
  if (const std::string err = parse(argc, argv, options, &help); !err.empty()) {
    std::fprintf(stderr, "%s: %s\n", program, err.c_str());
    return 2;
  }
  if (help) {
    std::fputs(usage, stdout);
    return 0;
  }
  return -1;
}

}  // namespace quota::examples
