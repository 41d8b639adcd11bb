// examples/quota_server/api/http/json.hpp — a strict reader for one flat JSON object, and JSON
// string quoting: what the HTTP check API needs (and quota_replay's JSON lines), with no
// JSON library.
//
// parse_flat_object() accepts exactly one object (RFC 8259) whose values are strings,
// integers, true/false or null — nothing nested — surrounded by optional whitespace, and
// refuses everything else with InvalidArgument naming the byte offset and what was
// expected: a nested object or array, a number with a fraction or exponent (a cost is a
// whole number of units, never rounded), an integer outside int64, a leading zero, a
// duplicate key, an invalid escape, a raw control character or invalid surrogate in a
// string, trailing text. Strings are returned as UTF-8 (\uXXXX escapes decoded, surrogate
// pairs joined); other bytes are passed through as they are. Size limits are the
// caller's (the server refuses a body over 8 KiB before parsing). Recursion: none.
//
// Thread safety: pure functions.
//
//   auto o = quota::server::parse_flat_object(R"({"tenant":"acme","cost":3})");
//   // o->at(0) = {"tenant", {.kind = kString, .string = "acme"}}, o->at(1): kInteger 3
//   std::string s = quota::server::json_quote("a\"b");   // "\"a\\\"b\""
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_format.h"

namespace quota::server {

struct JsonValue {
  enum Kind { kString, kInteger, kBool, kNull };
  Kind kind = kNull;
  std::string string{};
  std::int64_t integer = 0;
  bool boolean = false;
};

// The members in the order written.
using FlatObject = std::vector<std::pair<std::string, JsonValue>>;

inline absl::StatusOr<FlatObject> parse_flat_object(std::string_view text);

// `s` as a JSON string: quotes, `"` `\` and control characters escaped (\n, \t, ... or
// \u00XX); other bytes as they are.
inline std::string json_quote(std::string_view s) {
  std::string out = "\"";
  for (const char ch : s) {
    const auto u = static_cast<unsigned char>(ch);
    switch (ch) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (u < 0x20) {
          out += absl::StrFormat("\\u%04x", u);
        } else {
          out.push_back(ch);
        }
    }
  }
  out.push_back('"');
  return out;
}

// Implementation details follow.

namespace detail {

class FlatReader {
 public:
  explicit FlatReader(std::string_view text) : s_(text) {}

  absl::StatusOr<FlatObject> object() {
    FlatObject out;
    skip_space();
    if (!eat('{')) return error("expected '{' (a JSON object)");
    skip_space();
    if (eat('}')) return finish(std::move(out));
    while (true) {
      skip_space();
      if (peek() != '"') return error("expected a member name (a string)");
      auto key = string();
      if (!key.ok()) return key.status();
      for (const auto& [k, v] : out) {
        if (k == *key) return error(absl::StrFormat("member \"%s\" given twice", *key));
      }
      skip_space();
      if (!eat(':')) return error("expected ':'");
      skip_space();
      auto value = this->value(*key);
      if (!value.ok()) return value.status();
      out.emplace_back(*std::move(key), *std::move(value));
      skip_space();
      if (eat(',')) continue;
      if (eat('}')) return finish(std::move(out));
      return error("expected ',' or '}'");
    }
  }

 private:
  absl::StatusOr<FlatObject> finish(FlatObject out) {
    skip_space();
    if (i_ != s_.size()) return error("unexpected text after the object");
    return out;
  }

  absl::StatusOr<JsonValue> value(const std::string& key) {
    JsonValue v;
    const char c = peek();
    if (c == '"') {
      auto s = string();
      if (!s.ok()) return s.status();
      v.kind = JsonValue::kString;
      v.string = *std::move(s);
    } else if (c == '-' || (c >= '0' && c <= '9')) {
      auto n = integer(key);
      if (!n.ok()) return n.status();
      v.kind = JsonValue::kInteger;
      v.integer = *n;
    } else if (word("true")) {
      v.kind = JsonValue::kBool;
      v.boolean = true;
    } else if (word("false")) {
      v.kind = JsonValue::kBool;
    } else if (word("null")) {
      v.kind = JsonValue::kNull;
    } else if (c == '{' || c == '[') {
      return error(
          absl::StrFormat("member \"%s\": nested objects and arrays are not accepted", key));
    } else {
      return error(absl::StrFormat(
          "member \"%s\": expected a string, an integer, true, false or null", key));
    }
    return v;
  }

  absl::StatusOr<std::int64_t> integer(const std::string& key) {
    const std::size_t start = i_;
    const bool negative = eat('-');
    if (!(peek() >= '0' && peek() <= '9')) return error("expected a digit");
    if (peek() == '0' && i_ + 1 < s_.size() && s_[i_ + 1] >= '0' && s_[i_ + 1] <= '9') {
      return error(absl::StrFormat("member \"%s\": a leading zero is not allowed", key));
    }
    // Accumulated negatively: INT64_MIN has no positive twin.
    std::int64_t n = 0;
    constexpr std::int64_t kMin = std::numeric_limits<std::int64_t>::min();
    while (peek() >= '0' && peek() <= '9') {
      const int d = s_[i_++] - '0';
      if (n < (kMin + d) / 10) {
        i_ = start;
        return error(absl::StrFormat("member \"%s\": integer out of range (int64)", key));
      }
      n = n * 10 - d;
    }
    if (peek() == '.' || peek() == 'e' || peek() == 'E') {
      return error(
          absl::StrFormat("member \"%s\": expected a whole number (no fraction or exponent)", key));
    }
    if (!negative) {
      if (n == kMin) {
        i_ = start;
        return error(absl::StrFormat("member \"%s\": integer out of range (int64)", key));
      }
      n = -n;
    }
    return n;
  }

  absl::StatusOr<std::string> string() {
    eat('"');
    std::string out;
    while (true) {
      if (i_ >= s_.size()) return error("unterminated string");
      const char c = s_[i_++];
      if (c == '"') return out;
      if (static_cast<unsigned char>(c) < 0x20) {
        --i_;
        return error("raw control character in a string (escape it)");
      }
      if (c != '\\') {
        out.push_back(c);
        continue;
      }
      if (i_ >= s_.size()) return error("unterminated escape");
      const char e = s_[i_++];
      switch (e) {
        case '"':
        case '\\':
        case '/':
          out.push_back(e);
          break;
        case 'b':
          out.push_back('\b');
          break;
        case 'f':
          out.push_back('\f');
          break;
        case 'n':
          out.push_back('\n');
          break;
        case 'r':
          out.push_back('\r');
          break;
        case 't':
          out.push_back('\t');
          break;
        case 'u': {
          auto cp = hex4();
          if (!cp.ok()) return cp.status();
          std::uint32_t code = *cp;
          if (code >= 0xD800 && code <= 0xDBFF) {
            if (!(eat('\\') && eat('u')))
              return error("a high surrogate without its low surrogate");
            auto low = hex4();
            if (!low.ok()) return low.status();
            if (*low < 0xDC00 || *low > 0xDFFF) return error("invalid low surrogate");
            code = 0x10000 + ((code - 0xD800) << 10) + (*low - 0xDC00);
          } else if (code >= 0xDC00 && code <= 0xDFFF) {
            return error("a low surrogate without its high surrogate");
          }
          append_utf8(out, code);
          break;
        }
        default:
          --i_;
          return error(absl::StrFormat("invalid escape '\\%c'", e));
      }
    }
  }

  absl::StatusOr<std::uint32_t> hex4() {
    std::uint32_t v = 0;
    for (int k = 0; k < 4; ++k) {
      const char c = peek();
      int d = -1;
      if (c >= '0' && c <= '9') d = c - '0';
      if (c >= 'a' && c <= 'f') d = c - 'a' + 10;
      if (c >= 'A' && c <= 'F') d = c - 'A' + 10;
      if (d < 0) return error("expected 4 hex digits after \\u");
      ++i_;
      v = v * 16 + static_cast<std::uint32_t>(d);
    }
    return v;
  }

  static void append_utf8(std::string& out, std::uint32_t cp) {
    if (cp < 0x80) {
      out.push_back(static_cast<char>(cp));
    } else if (cp < 0x800) {
      out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
      out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    } else if (cp < 0x10000) {
      out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
      out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
      out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    } else {
      out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
      out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
      out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
      out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    }
  }

  bool word(std::string_view w) {
    if (s_.substr(i_, w.size()) != w) return false;
    i_ += w.size();
    return true;
  }
  char peek() const { return i_ < s_.size() ? s_[i_] : '\0'; }
  bool eat(char c) {
    if (peek() != c || i_ >= s_.size()) return false;
    ++i_;
    return true;
  }
  void skip_space() {
    while (i_ < s_.size() &&
           (s_[i_] == ' ' || s_[i_] == '\t' || s_[i_] == '\n' || s_[i_] == '\r')) {
      ++i_;
    }
  }
  absl::Status error(const std::string& what) const {
    return absl::InvalidArgumentError(absl::StrFormat("JSON at byte %d: %s", i_, what));
  }

  std::string_view s_;
  std::size_t i_ = 0;
};

}  // namespace detail

inline absl::StatusOr<FlatObject> parse_flat_object(std::string_view text) {
  return detail::FlatReader(text).object();
}

}  // namespace quota::server
