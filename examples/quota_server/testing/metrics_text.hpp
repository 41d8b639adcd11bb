// examples/quota_server/testing/metrics_text.hpp — one sample of Prometheus text, for tests.
//
// metric_value(text, series) finds the line "<series> <value>" (series: the name with its
// labels exactly as rendered, e.g. quota_near_limit_total{rule="r"}) and returns its value;
// -1 when the series is absent. fair_sample(text, family, extra) finds the sample of a
// quota_fair_share_* `family` for rule "provider" whose labels contain `extra` (or, with
// `extra` empty, that has no label but rule and budget); -1 when absent.
//
// Thread safety: pure.
//
//   double v = quota::testing::metric_value(body, "quota_rule_version");
//   double d = quota::testing::fair_sample(body, "quota_fair_share_denials_total",
//                                          "reason=\"over_share\"");
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

inline double fair_sample(const std::string& text, const std::string& family,
                          const std::string& extra = "") {
  const std::string prefix = "\n" + family + "{rule=\"provider\",budget=\"";
  for (std::size_t at = text.find(prefix); at != std::string::npos;
       at = text.find(prefix, at + 1)) {
    const std::size_t close = text.find("} ", at);
    if (close == std::string::npos) return -1;
    const std::string labels = text.substr(at + prefix.size(), close - at - prefix.size());
    if (!extra.empty() && labels.find(extra) == std::string::npos) continue;
    if (extra.empty() && labels.find(',') != std::string::npos) continue;
    return std::strtod(text.c_str() + close + 2, nullptr);
  }
  return -1;
}

}  // namespace quota::testing
