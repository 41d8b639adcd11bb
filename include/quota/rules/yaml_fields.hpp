// quota/rules/yaml_fields.hpp — walking a YAML tree field by field, with located errors.
//
// The generic half of the rule file parser (rule_parser.hpp holds the schema): Field is one
// YAML value with its field path (`rules[2].token_bucket.burst`) and its 1-based position;
// FieldReader lists a mapping's fields (an unknown key or a key given twice is an error),
// a sequence's items, and reads plain scalars — integers, booleans, durations, rates
// (scalars.hpp) and one-of names — refusing a wrong type with what it expected and what it
// got. Every error reads `<file>:<line>:<column>: <field path>: <message>` (located()) and
// is thrown as a Failure; the caller catches it at its one entry point. Needs yaml-cpp:
// link quota::rules. Everything here is in quota::rules::detail.
//
// Thread safety: a FieldReader is immutable (it holds only the file name) and keeps no
// state between calls; describe() and located() are pure functions.
//
//   detail::FieldReader in("rules.yaml");
//   static constexpr std::array<std::string_view, 2> kAllowed{"rate", "burst"};
//   for (const detail::Field& f : in.fields(node, "token_bucket", kAllowed)) {
//     if (f.key == "burst") burst = in.integer(f, 0);  // throws Failure: "rules.yaml:3:10: ..."
//   }
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <yaml-cpp/yaml.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "quota/rules/scalars.hpp"
#include "quota/units.hpp"

namespace quota::rules::detail {

// A position in the file, 1-based.
struct Position {
  int line = 1;
  int column = 1;
};

inline Position position(const YAML::Mark& m) {
  if (m.is_null()) return {};
  return {.line = m.line + 1, .column = m.column + 1};
}

inline absl::Status located(std::string_view file, Position at, std::string_view path,
                            std::string_view message,
                            absl::StatusCode code = absl::StatusCode::kInvalidArgument) {
  return absl::Status(code, absl::StrFormat("%s:%d:%d: %s: %s", sv(file), at.line, at.column,
                                            sv(path), sv(message)));
}

// A located error, thrown by FieldReader. yaml-cpp reports syntax errors by exception too,
// so a parser's entry point catches both in one place and no reader function forwards one.
struct Failure {
  absl::Status status;
};

// One value with its path and position (the value's; its key's when it is empty).
struct Field {
  std::string key;
  Position key_at;
  YAML::Node node;
  std::string path;
  Position at;
};

// What a value is, for "expected X, got Y": `a mapping`, `"20"`, `the quoted string "20"`.
inline std::string describe(const YAML::Node& n) {
  if (n.IsMap()) return "a mapping";
  if (n.IsSequence()) return "a sequence";
  if (!n.IsScalar()) return "nothing";
  if (n.Tag() == "!") return absl::StrFormat("the quoted string \"%s\"", n.Scalar());
  return absl::StrFormat("\"%s\"", n.Scalar());
}

// Reads the fields of one file (`file` is used only in messages). Every function either
// returns what it was asked for or throws a Failure located at the field at fault.
class FieldReader {
 public:
  explicit FieldReader(std::string_view file) : file_(file) {}

  [[noreturn]] void fail(Position at, std::string_view path, std::string_view message) const {
    throw Failure{located(file_, at, path, message)};
  }

  [[noreturn]] void wrong_type(const Field& f, std::string_view expected) const {
    fail(f.at, f.path, absl::StrCat("expected ", sv(expected), ", got ", describe(f.node)));
  }

  // The entries of a mapping, in order; a key not in `allowed` or given twice is an error.
  std::vector<Field> fields(const YAML::Node& map, const std::string& path,
                            std::span<const std::string_view> allowed) const {
    std::vector<Field> out;
    for (auto it = map.begin(); it != map.end(); ++it) {
      const Position key_at = position(it->first.Mark());
      const std::string key = it->first.IsScalar() ? it->first.Scalar() : describe(it->first);
      const std::string field_path = path.empty() ? key : absl::StrCat(path, ".", key);
      if (!it->first.IsScalar() ||
          std::find(allowed.begin(), allowed.end(), key) == allowed.end()) {
        fail(key_at, field_path,
             absl::StrFormat("unknown field \"%s\"; allowed: %s", key, join(allowed, ", ")));
      }
      for (const Field& seen : out) {
        if (seen.key == key) {
          fail(key_at, field_path,
               absl::StrFormat("field given twice (first at line %d)", seen.key_at.line));
        }
      }
      // An empty value's mark is where the next token starts: point at its key instead.
      const Position at = it->second.IsNull() ? key_at : position(it->second.Mark());
      out.push_back({key, key_at, it->second, field_path, at});
    }
    return out;
  }

  // The items of a sequence of `what`, with paths `<path>[i]`.
  std::vector<Field> sequence(const Field& f, std::string_view what) const {
    if (!f.node.IsSequence()) wrong_type(f, absl::StrCat("a sequence of ", sv(what)));
    std::vector<Field> out;
    for (std::size_t i = 0; i < f.node.size(); ++i) {
      const YAML::Node item = f.node[i];
      const Position at = item.IsNull() ? f.at : position(item.Mark());
      out.push_back({"", at, item, absl::StrFormat("%s[%d]", f.path, i), at});
    }
    return out;
  }

  // Each of `names` is a key of `got`, else "<path>.<name>: required field missing" at `at`.
  template <class... Required>
  void require(Position at, std::string_view path, std::span<const Field> got,
               Required... names) const {
    for (std::string_view name : {std::string_view(names)...}) {
      if (std::none_of(got.begin(), got.end(), [&](const Field& f) { return f.key == name; })) {
        fail(at, absl::StrCat(sv(path), ".", sv(name)), "required field missing");
      }
    }
  }

  // Scalars. Integers, booleans and names of kinds must be plain (unquoted) scalars; a
  // quoted "20" is a string, and saying so beats guessing.
  std::string_view plain(const Field& f, std::string_view expected) const {
    if (!f.node.IsScalar() || f.node.Tag() == "!") wrong_type(f, expected);
    return f.node.Scalar();
  }

  // Any scalar, quoted or not.
  std::string text(const Field& f) const {
    if (!f.node.IsScalar()) wrong_type(f, "a string");
    return f.node.Scalar();
  }

  // parse_integer() within [lo, hi].
  std::int64_t integer(const Field& f, std::int64_t lo = std::numeric_limits<std::int64_t>::min(),
                       std::int64_t hi = std::numeric_limits<std::int64_t>::max()) const {
    return check(f, parse_integer(plain(f, "an integer"), lo, hi));
  }

  // `true` or `false`, nothing else (no yes/no/on/off).
  bool boolean(const Field& f) const {
    const std::string_view s = plain(f, "true or false");
    if (s != "true" && s != "false") wrong_type(f, "true or false");
    return s == "true";
  }

  // parse_ratio(), each part in [1, max_part].
  std::pair<std::int64_t, std::int64_t> ratio(const Field& f, std::int64_t max_part) const {
    return check(f, parse_ratio(plain(f, "an integer or a ratio such as 3/2"), max_part));
  }

  // parse_duration().
  Nanos duration(const Field& f) const {
    return check(f, parse_duration(plain(f, "a duration such as 60s")));
  }

  // parse_rate(); a rate of 0 units is an error unless `allow_zero`.
  Rate rate(const Field& f, bool allow_zero) const {
    Rate r = check(f, parse_rate(plain(f, "a rate such as 100/s")));
    if (r.units == 0 && !allow_zero) {
      fail(f.at, f.path,
           absl::StrFormat("rate %s never refills: a rule's rate must be positive",
                           f.node.Scalar()));
    }
    return r;
  }

  // One of `choices`, else "expected a | b | c, got ...".
  template <std::size_t N>
  std::string_view one_of(const Field& f, const std::array<std::string_view, N>& choices) const {
    const std::string expected = join(choices, " | ");
    const std::string_view s = plain(f, expected);
    if (std::find(choices.begin(), choices.end(), s) == choices.end()) wrong_type(f, expected);
    return s;
  }

  // The value of `v`, or its error message located at `f`.
  template <class T>
  T check(const Field& f, absl::StatusOr<T> v) const {
    if (!v.ok()) fail(f.at, f.path, sv(v.status().message()));
    return *std::move(v);
  }

  const std::string& file() const { return file_; }

 private:
  std::string file_;
};

}  // namespace quota::rules::detail
