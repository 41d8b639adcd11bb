// tests/support/printers.hpp — readable Catch2 output for quota's values.
#pragma once

#include <sstream>
#include <string>

#include <catch2/catch.hpp>

#include "quota/decision.hpp"

namespace Catch {
template <>
struct StringMaker<quota::Decision> {
  static std::string convert(const quota::Decision& d) {
    std::ostringstream out;
    out << "{" << (d.allowed ? "allowed" : "denied") << " reason=" << quota::to_string(d.reason)
        << " remaining=" << d.remaining << " retry_after=" << d.retry_after.count()
        << "ns reset_after=" << d.reset_after.count() << "ns version=" << d.version << "}";
    return out.str();
  }
};
}  // namespace Catch
