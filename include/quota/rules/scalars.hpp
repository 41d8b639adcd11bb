// quota/rules/scalars.hpp — the scalar syntax of rule files: integers, durations, rates.
//
// What a rule file writes for a number, a duration or a rate, parsed exactly (integers
// only, no floating point): integers are whole numbers in int64, with optional `_`
// between digits (`1_000_000`); durations are `<integer><ns|us|ms|s|min|h|d>` (`60s`,
// `30d`), at most 2^63 - 1 ns; percentages are `10%` or `72.5%` (in permille); rates are
// `<units>/<period>` with the period a unit or a duration (`100/s`, `1000000/1min`, `20/100ms`);
// ratios are `<integer>` or `<integer>/<integer>` (`2`, `3/2`).
// Anything else — `1.5`, `1e3`, `10` for a duration, an overflow — is InvalidArgument with a
// message that quotes the text, never a rounded or wrapped value. Needs no YAML: quota::quota is
// enough.
//
// Thread safety: pure functions.
//
//   quota::rules::parse_rate("1000000/1min");  // Rate{.units = 1'000'000, .per = 1min}
//   quota::rules::parse_duration("250ms");      // 250'000'000 ns
//   quota::rules::parse_integer("7", 1, 5);     // InvalidArgument: out of range
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <utility>

#include "absl/numeric/int128.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "quota/units.hpp"

namespace quota::rules {

namespace detail {

// Debian's abseil has its own string_view: these convert at the boundary.
inline absl::string_view sv(std::string_view s) { return absl::string_view(s.data(), s.size()); }
inline std::string_view sv(absl::string_view s) { return std::string_view(s.data(), s.size()); }

template <class Range>
std::string join(const Range& names, std::string_view separator) {
  std::string out;
  for (std::string_view n : names) absl::StrAppend(&out, out.empty() ? "" : sv(separator), sv(n));
  return out;
}

inline constexpr std::array<std::pair<std::string_view, std::int64_t>, 7> kDurationUnits{{
    {"ns", 1},
    {"us", 1'000},
    {"ms", 1'000'000},
    {"s", 1'000'000'000},
    {"min", 60'000'000'000},
    {"h", 3'600'000'000'000},
    {"d", 86'400'000'000'000},
}};

// The nanoseconds of a unit name, or 0 for an unknown one.
inline std::int64_t unit_nanos(std::string_view unit) {
  for (const auto& [name, ns] : kDurationUnits) {
    if (name == unit) return ns;
  }
  return 0;
}

}  // namespace detail

// "-12", "1_000_000": an optional sign, digits, single '_' between digits. InvalidArgument
// for anything else (1.5, 1e3, 0x10) and for a value outside [lo, hi].
inline absl::StatusOr<std::int64_t> parse_integer(
    std::string_view text, std::int64_t lo = std::numeric_limits<std::int64_t>::min(),
    std::int64_t hi = std::numeric_limits<std::int64_t>::max()) {
  std::string_view s = text;
  const bool negative = !s.empty() && s.front() == '-';
  if (!s.empty() && (s.front() == '-' || s.front() == '+')) s.remove_prefix(1);
  auto digit = [](char c) { return c >= '0' && c <= '9'; };
  bool ok = !s.empty() && digit(s.front()) && digit(s.back());
  absl::int128 v = 0;
  for (std::size_t i = 0; ok && i < s.size(); ++i) {
    if (s[i] == '_') {
      ok = digit(s[i + 1]);  // s.back() is a digit, so s[i + 1] exists
    } else if (!digit(s[i])) {
      ok = false;
    } else if (v <= absl::int128(std::numeric_limits<std::int64_t>::max()) + 1) {
      v = v * 10 + (s[i] - '0');  // stops growing once out of range: no int128 overflow
    }
  }
  if (!ok) {
    return absl::InvalidArgumentError(
        absl::StrFormat("expected an integer (whole number), got \"%s\"", detail::sv(text)));
  }
  if (negative) v = -v;
  if (v < absl::int128(std::numeric_limits<std::int64_t>::min()) ||
      v > absl::int128(std::numeric_limits<std::int64_t>::max())) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s does not fit in a 64-bit integer", detail::sv(text)));
  }
  if (v < absl::int128(lo) || v > absl::int128(hi)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s is out of range: it must be in [%d, %d]", detail::sv(text), lo, hi));
  }
  return static_cast<std::int64_t>(v);
}

// "<integer><ns|us|ms|s|min|h|d>", at least 0 and at most 2^63 - 1 ns.
inline absl::StatusOr<Nanos> parse_duration(std::string_view text) {
  const std::size_t split = text.find_first_not_of("0123456789_");
  const std::int64_t unit =
      split == std::string_view::npos ? 0 : detail::unit_nanos(text.substr(split));
  auto count = parse_integer(text.substr(0, split), 0);
  if (split == 0 || unit == 0 || !count.ok()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("expected a duration <integer><ns|us|ms|s|min|h|d> such as 60s, got \"%s\"",
                        detail::sv(text)));
  }
  const absl::int128 ns = absl::int128(*count) * unit;
  if (ns > absl::int128(std::numeric_limits<std::int64_t>::max())) {
    return absl::InvalidArgumentError(
        absl::StrFormat("duration %s exceeds 2^63-1 ns (~292 years)", detail::sv(text)));
  }
  return Nanos{static_cast<std::int64_t>(ns)};
}

// "<units>/<period>": 100/s, 1000000/1min, 20/100ms. units >= 0, period > 0.
inline absl::StatusOr<Rate> parse_rate(std::string_view text) {
  const std::size_t slash = text.find('/');
  const auto bad = [&] {
    return absl::InvalidArgumentError(absl::StrFormat(
        "expected a rate <units>/<period> such as 100/s, 1000000/1min or 20/100ms, got \"%s\"",
        detail::sv(text)));
  };
  if (slash == std::string_view::npos) return bad();
  auto units = parse_integer(text.substr(0, slash));
  if (!units.ok()) return bad();
  if (*units < 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("rate %s: the units must not be negative", detail::sv(text)));
  }
  const std::string_view period = text.substr(slash + 1);
  Nanos per{detail::unit_nanos(period)};  // a bare unit: one of it
  if (per.count() == 0) {
    auto d = parse_duration(period);
    if (!d.ok()) return bad();
    per = *d;
  }
  if (per.count() == 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("rate %s: the period must be positive", detail::sv(text)));
  }
  return Rate{.units = *units, .per = per};
}

// "<integer>" or "<integer>/<integer>" (`2`, `3/2`) as {numerator, denominator}, each in
// [1, max_part]; an integer's denominator is 1. Nothing is reduced or rounded.
inline absl::StatusOr<std::pair<std::int64_t, std::int64_t>> parse_ratio(std::string_view text,
                                                                         std::int64_t max_part) {
  const auto bad = [&] {
    return absl::InvalidArgumentError(absl::StrFormat(
        "expected an integer or a ratio such as 3/2, each part in [1, %d], got \"%s\"", max_part,
        detail::sv(text)));
  };
  const std::size_t slash = text.find('/');
  auto numerator = parse_integer(text.substr(0, slash), 1, max_part);
  if (!numerator.ok()) return bad();
  if (slash == std::string_view::npos) return std::pair{*numerator, std::int64_t{1}};
  auto denominator = parse_integer(text.substr(slash + 1), 1, max_part);
  if (!denominator.ok()) return bad();
  return std::pair{*numerator, *denominator};
}

// "<digits>%" or "<digits>.<digit>%" (10%, 72.5%), in permille: 100, 725. Exact: no
// more than one decimal (a permille), no sign, at most 100%.
inline absl::StatusOr<std::int64_t> parse_percent(std::string_view text) {
  const auto bad = [&] {
    return absl::InvalidArgumentError(absl::StrFormat(
        "expected a percentage such as 10%% or 72.5%% (0%% to 100%%, at most one decimal), "
        "got \"%s\"",
        detail::sv(text)));
  };
  if (text.empty() || text.back() != '%') return bad();
  std::string_view n = text.substr(0, text.size() - 1);
  std::int64_t tenths = 0;
  if (const std::size_t dot = n.find('.'); dot != std::string_view::npos) {
    if (dot + 2 != n.size() || n[dot + 1] < '0' || n[dot + 1] > '9') return bad();
    tenths = n[dot + 1] - '0';
    n = n.substr(0, dot);
  }
  if (n.empty() || n.find_first_not_of("0123456789") != std::string_view::npos) return bad();
  auto whole = parse_integer(n, 0, 100);
  if (!whole.ok() || *whole * 10 + tenths > 1000) return bad();
  return *whole * 10 + tenths;
}

}  // namespace quota::rules
