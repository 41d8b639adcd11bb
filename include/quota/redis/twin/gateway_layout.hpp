// quota/redis/twin/gateway_layout.hpp — the binary layouts the gateway script and its C++
// codec share, each defined once.
//
// The gateway script (twin/gateway.hpp) reads its head and each level's policy from packed
// arguments, and keeps a scope key as a header and records of fixed layout. Each layout is
// one `PackedLayout` here: a format as Lua's struct library reads it ('<', then per field
// 'B' one unsigned byte, 'iN' / 'IN' N bytes signed / unsigned, little-endian). The C++
// side packs with it (`pack<Layout>(out, values...)`, one value per field, checked at
// compile time) and the Lua side is given the same text: lua_macros.hpp splices each
// format into the script as a macro (`@head_format()`, `@policy_format()`,
// `@header_format()`, `@record_format()`, `@attempt_format()`), and the scope key's
// format byte as `@scope_format()`. So the two languages cannot disagree on a field.
//
// Guarantees: `bytes()` and `fields()` are the format's, at compile time; pack appends
// exactly bytes() bytes, each value's low bytes two's complement (a negative value reads
// back as itself in a signed field). Thread safety: constants and a pure function.
//
//   std::string head;
//   pack<kGatewayPolicy>(head, 1, burst, m, p, g, fill_s, fill_ns);  // 35 bytes
//   // Lua: local kind, cap, m, p, g, fs, fn = struct.unpack(@policy_format(), ARGV[2])
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace quota::redis {

struct PackedLayout {
  std::string_view format;

  // The width of field `i`, bytes; 0 past the last field.
  constexpr int width(std::size_t i) const {
    std::size_t field = 0;
    for (std::size_t k = 1; k < format.size(); ++k) {
      int w = 1;
      if (format[k] == 'i' || format[k] == 'I') w = format[++k] - '0';
      if (field++ == i) return w;
    }
    return 0;
  }
  constexpr std::size_t fields() const {
    std::size_t n = 0;
    while (width(n) != 0) ++n;
    return n;
  }
  constexpr std::size_t bytes() const {
    std::size_t n = 0;
    for (std::size_t i = 0; width(i) != 0; ++i) n += static_cast<std::size_t>(width(i));
    return n;
  }
  // The format as a Lua string literal.
  std::string lua() const { return "'" + std::string(format) + "'"; }
};

// A gateway call's head (ARGV[1], twin/gateway.hpp): time source, time (s, ns), op, TTL
// margin, rule-set version, units, whether a spent time is given and that time (s, ns),
// levels, keys.
inline constexpr PackedLayout kGatewayHead{"<Bi8I4Bi8i8i8Bi8I4BB"};
// A level's policy argument: kind, burst | limit, m | w, p | mode, g | 0, the time to fill
// or the window (s, ns).
inline constexpr PackedLayout kGatewayPolicy{"<BI5I7I7I7I4I4"};
// A scope key's header: the format byte (kGatewayScopeFormat), the records, the entries'
// bytes, the expiry as last set (server ms).
inline constexpr PackedLayout kGatewayScopeHeader{"<BBI2I6"};
// A record: tokens' units | the window's count, tokens' micro-units, the carry over p,
// the last time (s, ns), the debt's units and micro-units.
inline constexpr PackedLayout kGatewayRecord{"<i6I3I7i6I4I5I3"};
inline constexpr int kGatewayScopeFormat = 113;
// An attempt's arguments (twin/gateway_attempts.hpp): its record's TTL (ms), the claim's
// (ms), whether this call is the attempt's last.
inline constexpr PackedLayout kGatewayAttemptArgs{"<i8i8B"};

static_assert(kGatewayHead.bytes() == 53 && kGatewayHead.fields() == 12);
static_assert(kGatewayPolicy.bytes() == 35 && kGatewayPolicy.fields() == 7);

// A scope key's value (twin/gateway.hpp): the header, then a record per limit, then per
// record an entry of kGatewayEntryBytes plus its name's (name length, version, policy).
inline constexpr std::size_t kGatewayHeaderBytes = kGatewayScopeHeader.bytes();
inline constexpr std::size_t kGatewayRecordBytes = kGatewayRecord.bytes();
inline constexpr std::size_t kGatewayEntryBytes = 1 + 7 + kGatewayPolicy.bytes();
static_assert(kGatewayHeaderBytes == 10 && kGatewayRecordBytes == 34 && kGatewayEntryBytes == 43);

// Appends `values`, one per field of `L`, each in its field's width (known at compile
// time: a decision's head is packed without reading the format).
template <const PackedLayout& L, class... V>
void pack(std::string& out, V... values) {
  static_assert(sizeof...(V) == L.fields(), "one value per field of the layout");
  static constexpr std::array<int, sizeof...(V)> kWidths = [] {
    std::array<int, sizeof...(V)> w{};
    for (std::size_t i = 0; i < w.size(); ++i) w[i] = L.width(i);
    return w;
  }();
  std::size_t i = 0;
  auto put = [&](std::int64_t v) {
    const auto u = static_cast<std::uint64_t>(v);
    for (int b = 0; b < kWidths[i]; ++b) out.push_back(static_cast<char>((u >> (8 * b)) & 0xff));
    ++i;
  };
  (put(static_cast<std::int64_t>(values)), ...);
}

}  // namespace quota::redis
