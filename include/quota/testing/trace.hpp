// quota/testing/trace.hpp — a request trace, for testing rate policies: who asked for
// what, and when.
//
// A TraceRequest is one request as a gateway derived it: its time on a virtual clock, the
// tenant, plan and optional user, the route class and an optional cost (0: the rule
// file's). A trace is a vector of them in non-decreasing time. Build one in code
// (`every()` spreads n copies of a request over time), or read one from CSV with
// TraceReader, one line at a time (memory does not grow with the trace):
//
//   time_ns,tenant,plan,user,route[,cost]
//
// A header line starting with "time", empty lines and lines starting with '#' are
// skipped; the user may be empty. An error names the line: "trace.csv:7: cost 'x' is
// not a whole number of units >= 1", or a time earlier than the line before.
//
// Thread safety: TraceReader is one reader's; the rest are values and pure functions.
//
//   std::vector<quota::testing::TraceRequest> trace = quota::testing::every(
//       {.tenant = "acme", .plan = "free", .route = "read"}, 100, 10ms);  // 0, 10 ms, ...
//   quota::testing::TraceReader in(stdin, "-");
//   for (;;) {
//     auto r = in.next();  // an error names the line: r.status()
//     if (!r.ok() || *r == nullptr) break;
//     decide(**r);         // the reader's request, until the next call
//   }
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "quota/units.hpp"

namespace quota::testing {

struct TraceRequest {
  Nanos time{0};
  std::string tenant{};
  std::string plan{};
  std::string user{};
  std::string route{};
  std::int64_t cost = 0;  // whole units; 0: what the rule file says
};

// `n` copies of `r`, the first at r.time and each next `step` later.
inline std::vector<TraceRequest> every(const TraceRequest& r, int n, Nanos step) {
  std::vector<TraceRequest> out;
  out.reserve(static_cast<std::size_t>(std::max(n, 0)));
  for (int i = 0; i < n; ++i) {
    out.push_back(r);
    out.back().time = r.time + step * i;
  }
  return out;
}

// One CSV line (see the top of this file) into `r` (its strings' capacity reused); line
// `number` of `file` in errors ("trace.csv:7: ..."), and then `r` is unspecified.
inline absl::Status parse_trace_line(std::string_view line, std::string_view file,
                                     std::int64_t number, TraceRequest& r) {
  const auto where = [&] { return absl::StrFormat("%s:%d", file, number); };
  // Up to 6 fields, split without allocating.
  std::string_view f[7];
  std::size_t n = 0;
  for (std::size_t start = 0;;) {
    const std::size_t comma = line.find(',', start);
    if (n < 7) f[n] = line.substr(start, comma == std::string_view::npos ? comma : comma - start);
    ++n;
    if (comma == std::string_view::npos) break;
    start = comma + 1;
  }
  if (n != 5 && n != 6) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: expected time_ns,tenant,plan,user,route[,cost], got %d fields", where(), n));
  }
  const auto av = [](std::string_view v) { return absl::string_view(v.data(), v.size()); };
  std::int64_t t = 0;
  if (!absl::SimpleAtoi(av(f[0]), &t) || t < 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: time '%s' is not a whole number of ns >= 0", where(), f[0]));
  }
  r.time = Nanos(t);
  r.tenant = f[1];
  r.plan = f[2];
  r.user = f[3];
  r.route = f[4];
  r.cost = 0;
  if (n == 6 && !(absl::SimpleAtoi(av(f[5]), &r.cost) && r.cost >= 1)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: cost '%s' is not a whole number of units >= 1", where(), f[5]));
  }
  return absl::OkStatus();
}

// The same, into a new request.
inline absl::StatusOr<TraceRequest> parse_trace_line(std::string_view line, std::string_view file,
                                                     std::int64_t number) {
  TraceRequest r;
  if (auto s = parse_trace_line(line, file, number, r); !s.ok()) return s;
  return r;
}

// Reads a CSV trace from `file` (named `name` in errors) one request at a time.
class TraceReader {
 public:
  // How one line becomes a request (parse_trace_line; a tool may read other formats too,
  // e.g. quota_replay's JSON lines): the line, the file's name and the line's number.
  using LineParser = absl::Status (*)(std::string_view line, std::string_view file,
                                      std::int64_t number, TraceRequest& out);

  TraceReader(std::FILE* file, std::string name,
              LineParser parse = static_cast<LineParser>(&parse_trace_line))
      : file_(file), name_(std::move(name)), parse_(parse) {}

  // The next request, the reader's own until the next call; nullptr at the end of the
  // file; an error naming the line (a malformed line, a time before the previous one, a
  // read error).
  absl::StatusOr<const TraceRequest*> next() {
    std::string& text = text_;
    while (read_line(text)) {
      ++line_;
      if (text.empty() || text[0] == '#' || (line_ == 1 && text.rfind("time", 0) == 0)) continue;
      if (auto s = parse_(text, name_, line_, current_); !s.ok()) return s;
      if (current_.time < last_) {
        return absl::InvalidArgumentError(
            absl::StrFormat("%s:%d: time %d ns is earlier than the line before (%d ns)", name_,
                            line_, current_.time.count(), last_.count()));
      }
      last_ = current_.time;
      return &current_;
    }
    if (std::ferror(file_)) {
      return absl::DataLossError(absl::StrFormat("%s: read error after line %d", name_, line_));
    }
    return nullptr;
  }

  // The line of the last request returned (1-based).
  std::int64_t line() const { return line_; }

 private:
  // One line without its "\n" or "\r\n"; false at the end of the file. Reads in 64 KiB
  // blocks.
  bool read_line(std::string& out) {
    out.clear();
    bool any = false;
    for (;;) {
      if (pos_ == len_) {
        len_ = std::fread(buf_, 1, sizeof buf_, file_);
        pos_ = 0;
        if (len_ == 0) break;
      }
      any = true;
      const char* start = buf_ + pos_;
      const void* nl = std::memchr(start, '\n', len_ - pos_);
      const std::size_t n = nl == nullptr ? len_ - pos_ : static_cast<const char*>(nl) - start;
      out.append(start, n);
      pos_ += n;
      if (nl != nullptr) {
        ++pos_;
        break;
      }
    }
    if (!out.empty() && out.back() == '\r') out.pop_back();
    return any;
  }

  std::FILE* file_;
  std::string name_;
  LineParser parse_;
  TraceRequest current_;  // the request next() returned
  std::string text_;      // the line being read
  char buf_[1 << 16];
  std::size_t pos_ = 0, len_ = 0;
  std::int64_t line_ = 0;
  Nanos last_{0};
};

}  // namespace quota::testing
