// examples/quota_server/testing/metrics_text.hpp — one sample of Prometheus text, for tests.
//
// metric_value(text, series) finds the line "<series> <value>" (series: the name with its
// labels exactly as rendered, e.g. quota_near_limit_total{rule="r"}) and returns its value;
// -1 when the series is absent.
//
// Thread safety: pure.
//
//   double v = quota::testing::metric_value(body, "quota_rule_version");
#pragma once

#include <cstdlib>
#include <string>

namespace quota::testing {

inline double metric_value(const std::string& text, const std::string& series) {
  const std::string needle = series + " ";
  for (std::size_t at = text.find(needle); at != std::string::npos;
       at = text.find(needle, at + 1)) {
    if (at != 0 && text[at - 1] != '\n') continue;
    return std::strtod(text.c_str() + at + needle.size(), nullptr);
  }
  return -1;
}

}  // namespace quota::testing
