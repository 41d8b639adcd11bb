// verify_log — check a log of admitted requests against a rate limit's envelope.
//
//   verify_log token-bucket --rate 100/1s --burst 20 [--extra 0] FILE
//   verify_log window --limit 100 --window 60s FILE
//
// FILE (or `-` for stdin) is CSV, one admitted request per line: `time_ns,cost` (one
// budget) or `time_ns,key,cost` (one budget per key; the first data line decides which).
// Times are integer nanoseconds, non-decreasing per key; costs whole units. Empty lines,
// lines starting with '#' and a header line starting with "time" are skipped. Keys may
// not contain ',' (no quoting).
//
// For every key it prints the verdict of quota/verify/envelope.hpp, exact and with the
// witness interval as line numbers. Exit status: 0 every key conforms, 1 some key
// violates the envelope, 2 bad usage or a malformed line (the line number and what was
// expected go to stderr).
//
// Rates are `UNITS/PERIOD` with PERIOD a positive integer and a unit in ns, us, ms, s,
// m, h (`100/1s`, `1000/60s`, `5/250ms`; `100/s` means `100/1s`); windows are a period
// (`60s`, `500ms`).
//
// Speed: the input is read in 1 MiB blocks and parsed by hand (no iostreams), keys are
// looked up without allocating; 10^7 lines take a few seconds (see the README of this
// directory... or run it: `time verify_log token-bucket --rate 100/1s --burst 20 big.csv`).
#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "quota/units.hpp"
#include "quota/verify/envelope.hpp"

namespace {

constexpr int kConforms = 0;
constexpr int kViolated = 1;
constexpr int kBadInput = 2;

const char kUsage[] =
    "usage: verify_log token-bucket --rate UNITS/PERIOD --burst B [--extra E] FILE\n"
    "       verify_log window --limit N --window PERIOD FILE\n"
    "FILE is CSV 'time_ns,cost' or 'time_ns,key,cost' ('-' for stdin).\n"
    "PERIOD: integer + ns|us|ms|s|m|h, e.g. 1s, 60s, 250ms. Exit: 0 ok, 1 violation, 2 error.\n";

[[noreturn]] void die_usage(const std::string& why) {
  std::fprintf(stderr, "verify_log: %s\n%s", why.c_str(), kUsage);
  std::exit(kBadInput);
}

std::optional<std::int64_t> parse_int(std::string_view s) {
  std::int64_t v = 0;
  if (s.empty()) return std::nullopt;
  const auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || ptr != s.data() + s.size()) return std::nullopt;
  return v;
}

// "250ms" -> 250,000,000 ns; a missing number means 1 ("s" = "1s").
std::optional<quota::Nanos> parse_period(std::string_view s) {
  std::size_t digits = 0;
  while (digits < s.size() && s[digits] >= '0' && s[digits] <= '9') ++digits;
  std::int64_t n = 1;
  if (digits > 0) {
    auto v = parse_int(s.substr(0, digits));
    if (!v) return std::nullopt;
    n = *v;
  }
  const std::string_view unit = s.substr(digits);
  std::int64_t scale = 0;
  if (unit == "ns")
    scale = 1;
  else if (unit == "us")
    scale = 1'000;
  else if (unit == "ms")
    scale = 1'000'000;
  else if (unit == "s")
    scale = 1'000'000'000;
  else if (unit == "m")
    scale = 60'000'000'000;
  else if (unit == "h")
    scale = 3'600'000'000'000;
  else
    return std::nullopt;
  std::int64_t ns = 0;
  if (n <= 0 || __builtin_mul_overflow(n, scale, &ns)) return std::nullopt;
  return quota::Nanos{ns};
}

std::optional<quota::Rate> parse_rate(std::string_view s) {
  const auto slash = s.find('/');
  if (slash == std::string_view::npos) return std::nullopt;
  auto units = parse_int(s.substr(0, slash));
  auto per = parse_period(s.substr(slash + 1));
  if (!units || !per) return std::nullopt;
  return quota::Rate{.units = *units, .per = *per};
}

using Verifier = std::variant<quota::verify::TokenBucketVerifier, quota::verify::WindowVerifier>;

struct Config {
  bool token_bucket = true;
  quota::Rate rate;
  std::int64_t burst = -1, extra = 0, limit = -1;
  quota::Nanos window{0};
  std::string file;
};

Config parse_args(int argc, char** argv) {
  if (argc < 2) die_usage("missing mode");
  Config c;
  const std::string_view mode = argv[1];
  if (mode == "token-bucket")
    c.token_bucket = true;
  else if (mode == "window")
    c.token_bucket = false;
  else if (mode == "-h" || mode == "--help") {
    std::fputs(kUsage, stdout);
    std::exit(kConforms);
  } else
    die_usage(
        absl::StrFormat("unknown mode '%s' (expected token-bucket or window)", std::string(mode)));
  bool have_rate = false, have_window = false, have_file = false;
  for (int i = 2; i < argc; ++i) {
    const std::string_view a = argv[i];
    auto value = [&]() -> std::string_view {
      if (i + 1 >= argc) die_usage(absl::StrFormat("%s needs a value", std::string(a)));
      return argv[++i];
    };
    auto integer = [&](std::string_view name) {
      const std::string_view v = value();
      auto n = parse_int(v);
      if (!n)
        die_usage(
            absl::StrFormat("%s expects an integer, got '%s'", std::string(name), std::string(v)));
      return *n;
    };
    if (c.token_bucket && a == "--rate") {
      const std::string_view v = value();
      auto r = parse_rate(v);
      if (!r)
        die_usage(
            absl::StrFormat("--rate expects UNITS/PERIOD like 100/1s, got '%s'", std::string(v)));
      c.rate = *r;
      have_rate = true;
    } else if (c.token_bucket && a == "--burst") {
      c.burst = integer(a);
    } else if (c.token_bucket && a == "--extra") {
      c.extra = integer(a);
    } else if (!c.token_bucket && a == "--limit") {
      c.limit = integer(a);
    } else if (!c.token_bucket && a == "--window") {
      const std::string_view v = value();
      auto w = parse_period(v);
      if (!w)
        die_usage(absl::StrFormat("--window expects a period like 60s, got '%s'", std::string(v)));
      c.window = *w;
      have_window = true;
    } else if ((a.size() > 1 && a[0] == '-') || have_file) {
      die_usage(absl::StrFormat("unexpected argument '%s'", std::string(a)));
    } else {
      c.file = std::string(a);
      have_file = true;
    }
  }
  if (!have_file) die_usage("missing FILE (use - for stdin)");
  if (c.token_bucket) {
    if (!have_rate) die_usage("missing --rate");
    if (c.burst < 0) die_usage("missing --burst");
    if (auto s = quota::verify::TokenBucketVerifier::check_params(c.rate, c.burst, c.extra);
        !s.ok())
      die_usage(std::string(s.message()));
  } else {
    if (!have_window) die_usage("missing --window");
    if (c.limit < 0) die_usage("missing --limit");
    if (auto s = quota::verify::WindowVerifier::check_params(c.limit, c.window); !s.ok())
      die_usage(std::string(s.message()));
  }
  return c;
}

[[noreturn]] void die_line(std::uint64_t line, const std::string& what) {
  std::fprintf(stderr, "verify_log: line %llu: %s\n", static_cast<unsigned long long>(line),
               what.c_str());
  std::exit(kBadInput);
}

class Checker {
 public:
  explicit Checker(const Config& c) : config_(c) {}

  void line(std::uint64_t number, std::string_view text) {
    if (!text.empty() && text.back() == '\r') text.remove_suffix(1);
    if (text.empty() || text[0] == '#') return;
    if (!seen_data_ && text.substr(0, 4) == "time") return;  // a header line
    // Split into 2 or 3 fields.
    std::string_view f[3];
    int n = 0;
    std::size_t start = 0;
    for (;;) {
      const std::size_t comma = text.find(',', start);
      if (n == 3) die_line(number, expected("more than 3 fields"));
      f[n++] =
          text.substr(start, comma == std::string_view::npos ? text.size() - start : comma - start);
      if (comma == std::string_view::npos) break;
      start = comma + 1;
    }
    if (n < 2) die_line(number, expected("1 field"));
    if (!seen_data_) {
      keyed_ = (n == 3);
      seen_data_ = true;
    } else if (keyed_ != (n == 3)) {
      die_line(number, expected(absl::StrFormat("%d fields after %s lines", n,
                                                keyed_ ? "time_ns,key,cost" : "time_ns,cost")));
    }
    auto time = parse_int(f[0]);
    if (!time)
      die_line(number,
               expected(absl::StrFormat("time_ns '%s' (not an integer)", std::string(f[0]))));
    const std::string_view cost_text = f[n - 1];
    auto cost = parse_int(cost_text);
    if (!cost || *cost < 0 || *cost > quota::kMaxUnits)
      die_line(number, absl::StrFormat("cost '%s': expected an integer in [0, %d] units",
                                       std::string(cost_text), quota::kMaxUnits));
    const std::string_view key = keyed_ ? f[1] : std::string_view("(all)");
    if (keyed_ && key.empty()) die_line(number, expected("an empty key"));
    Verifier& v = find(key);
    const quota::verify::AdmittedEvent e{.time_ns = *time, .cost = *cost};
    const absl::Status s = std::visit([&](auto& x) { return x.add(e, number); }, v);
    if (!s.ok()) {
      die_line(number, absl::StrFormat("key '%s': time %d ns is earlier than this key's "
                                       "previous time; times must be non-decreasing per key",
                                       std::string(key), *time));
    }
  }

  int finish() {
    std::vector<std::pair<std::string_view, const Verifier*>> keys;
    keys.reserve(verifiers_.size());
    for (const auto& [k, v] : verifiers_)
      keys.emplace_back(std::string_view(k.data(), k.size()), &v);
    std::sort(keys.begin(), keys.end());
    std::size_t violated = 0, events = 0;
    std::string out;
    for (const auto& [key, v] : keys) {
      if (const auto* tb = std::get_if<quota::verify::TokenBucketVerifier>(v)) {
        const auto r = tb->report();
        events += r.events;
        if (!r.holds()) ++violated;
        out += absl::StrFormat(
            "key %s: %s token-bucket rate %d/%dns burst %d extra %d: events %d, peak A-rT %s "
            "units, excess %s units (rounded up), smallest conforming burst %d%s; witness %s\n",
            std::string(key), r.holds() ? "OK" : "VIOLATION", r.rate.units, r.rate.per.count(),
            r.burst, r.extra, r.events, quota::verify::format_micro(r.peak_micro()),
            quota::verify::format_micro(r.excess_micro()), r.required_burst(),
            r.saturated ? " (saturated)" : "", witness(r.witness));
      } else {
        const auto r = std::get<quota::verify::WindowVerifier>(*v).report();
        events += r.events;
        if (!r.holds()) ++violated;
        out += absl::StrFormat(
            "key %s: %s window limit %d window %dns: events %d, peak %d units in one window, "
            "excess %d units; witness %s\n",
            std::string(key), r.holds() ? "OK" : "VIOLATION", r.limit, r.window.count(), r.events,
            r.peak, r.excess, witness(r.witness));
      }
    }
    out += absl::StrFormat("summary: %d keys, %d events, %d violating\n", keys.size(), events,
                           violated);
    std::fwrite(out.data(), 1, out.size(), stdout);
    return violated > 0 ? kViolated : kConforms;
  }

 private:
  static std::string expected(const std::string& got) {
    return "expected time_ns,cost or time_ns,key,cost (integers); got " + got;
  }

  static std::string witness(const quota::verify::Witness& w) {
    if (w.empty) return "none";
    return absl::StrFormat("lines %d..%d, t=%d..%d ns (span %d ns), admitted %d units", w.first_tag,
                           w.last_tag, w.first_time_ns, w.last_time_ns,
                           absl::int128(w.last_time_ns) - w.first_time_ns, w.admitted);
  }

  Verifier& find(std::string_view key) {
    const absl::string_view k(key.data(), key.size());
    // Most logs repeat the previous key; skip the hash lookup then.
    if (last_ != nullptr && last_key_ == key) return *last_;
    auto it = verifiers_.find(k);
    if (it == verifiers_.end()) {
      if (config_.token_bucket) {
        it = verifiers_
                 .try_emplace(std::string(key),
                              std::in_place_type<quota::verify::TokenBucketVerifier>, config_.rate,
                              config_.burst, config_.extra)
                 .first;
      } else {
        it = verifiers_
                 .try_emplace(std::string(key), std::in_place_type<quota::verify::WindowVerifier>,
                              config_.limit, config_.window)
                 .first;
      }
    }
    // node_hash_map semantics are not needed: last_ is refreshed on every miss.
    last_ = &it->second;
    last_key_.assign(key.data(), key.size());
    return *last_;
  }

  const Config& config_;
  bool seen_data_ = false;
  bool keyed_ = false;
  absl::flat_hash_map<std::string, Verifier> verifiers_;
  Verifier* last_ = nullptr;
  std::string last_key_;
};

}  // namespace

int main(int argc, char** argv) {
  const Config config = parse_args(argc, argv);
  std::FILE* in = stdin;
  if (config.file != "-") {
    in = std::fopen(config.file.c_str(), "rb");
    if (in == nullptr) {
      std::fprintf(stderr, "verify_log: cannot open '%s': %s\n", config.file.c_str(),
                   std::strerror(errno));
      return kBadInput;
    }
  }
  Checker checker(config);
  constexpr std::size_t kBlock = 1 << 20;
  std::vector<char> buf(kBlock);
  std::size_t held = 0;  // bytes of an unfinished line kept at the front of buf
  std::uint64_t line = 0;
  for (;;) {
    if (held == buf.size()) buf.resize(buf.size() * 2);  // a line longer than the buffer
    const std::size_t got = std::fread(buf.data() + held, 1, buf.size() - held, in);
    const std::size_t end = held + got;
    std::size_t start = 0;
    for (;;) {
      const void* nl = std::memchr(buf.data() + start, '\n', end - start);
      if (nl == nullptr) break;
      const std::size_t pos = static_cast<const char*>(nl) - buf.data();
      checker.line(++line, std::string_view(buf.data() + start, pos - start));
      start = pos + 1;
    }
    held = end - start;
    std::memmove(buf.data(), buf.data() + start, held);
    if (got == 0) {
      if (std::ferror(in)) {
        std::fprintf(stderr, "verify_log: read error on '%s'\n", config.file.c_str());
        return kBadInput;
      }
      if (held > 0) checker.line(++line, std::string_view(buf.data(), held));  // no final '\n'
      break;
    }
  }
  if (in != stdin) std::fclose(in);
  return checker.finish();
}
