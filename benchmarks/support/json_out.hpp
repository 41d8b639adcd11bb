// benchmarks/support/json_out.hpp — JSON files shaped like google-benchmark's, for the
// benchmarks that run their own rows rather than google-benchmark's loop (redis_bench,
// gateway_redis_bench): string escaping, numbers, the context every file carries, and a
// writer of rows. The shape:
//
//   {"context": {"date": ..., "host_name": ..., ...},
//    "benchmarks": [{"name", "run_name", "run_type": "iteration", "repetitions": 1,
//                    "threads", "iterations", "real_time", "cpu_time", "time_unit": "us",
//                    counter: value, ...}, ...]}
//
// Not thread-safe: one caller, in main.
#pragma once

#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <map>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace quota::bench {

// `in` as the inside of a JSON string: quotes and backslashes escaped, control bytes as
// \u00XX.
inline std::string json_escape(const std::string& in) {
  std::string out;
  for (char c : in) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(c));
      out += buf;
    } else {
      out += c;
    }
  }
  return out;
}

// `v` as a JSON number (6 significant digits), or null when it is not finite (JSON has no
// NaN or infinity).
inline std::string json_number(double v) {
  if (!std::isfinite(v)) return "null";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.6g", v);
  return buf;
}

// The context every file carries: the date (UTC), host name, executable and CPU count.
// Callers add their own entries (server version, seconds per row, ...).
inline std::map<std::string, std::string> json_context(const std::string& executable) {
  char host[256] = {};
  (void)::gethostname(host, sizeof host - 1);
  const auto now = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  std::tm utc{};
  ::gmtime_r(&now, &utc);
  char date[64];
  std::strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", &utc);
  return {{"date", date},
          {"host_name", host},
          {"executable", executable},
          {"num_cpus", std::to_string(std::thread::hardware_concurrency())}};
}

// One row of "benchmarks": a measured workload at some thread count.
struct JsonRow {
  std::string name;  // e.g. "gw_1_level/threads:8"
  int threads = 1;
  double iterations = 0;    // calls made
  double real_time_us = 0;  // per call (written as real_time and cpu_time, in µs)
  std::vector<std::pair<std::string, double>> counters;  // in this order
};

// Writes `context` and `rows` to `path`; false when the file could not be written.
inline bool write_benchmark_json(const std::string& path,
                                 const std::map<std::string, std::string>& context,
                                 const std::vector<JsonRow>& rows) {
  std::ofstream out(path);
  out << "{\n  \"context\": {";
  bool first = true;
  for (const auto& [k, v] : context) {
    out << (first ? "\n" : ",\n") << "    \"" << json_escape(k) << "\": \"" << json_escape(v)
        << "\"";
    first = false;
  }
  out << "\n  },\n  \"benchmarks\": [";
  first = true;
  for (const JsonRow& row : rows) {
    out << (first ? "\n" : ",\n") << "    {\"name\": \"" << json_escape(row.name)
        << "\", \"run_name\": \"" << json_escape(row.name)
        << "\", \"run_type\": \"iteration\", \"repetitions\": 1, \"threads\": " << row.threads
        << ", \"iterations\": " << json_number(row.iterations)
        << ", \"real_time\": " << json_number(row.real_time_us)
        << ", \"cpu_time\": " << json_number(row.real_time_us) << ", \"time_unit\": \"us\"";
    for (const auto& [k, v] : row.counters) {
      out << ", \"" << json_escape(k) << "\": " << json_number(v);
    }
    out << "}";
    first = false;
  }
  out << "\n  ]\n}\n";
  out.close();
  return static_cast<bool>(out);
}

}  // namespace quota::bench
