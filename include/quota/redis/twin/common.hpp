// quota/redis/twin/common.hpp — the parts every policy's Lua twin shares: the call
// layout, the reply, exact integer helpers and the state format version rule.
//
// Each RedisStore twin is one script: kLuaMath, its helpers (kLuaReach, kLuaPut), kLuaHead,
// its body, kLuaTail. The token bucket, fixed window and window estimate share one body,
// kLuaLoop, and fill in its sections with their transitions (detail::loop_script); their
// Lua text, and the sliding log's and the gateway's, names the shared arithmetic as
// macros (`@mod(...)`, detail::kLuaMacros), spliced in when the script is built. twin/call.hpp
// builds the keys and arguments below and parses the reply; a script runs atomically on the server
// (nothing interleaves), so a call's buckets are read, decided and written as one step. The Lua
// constants are pure text, the C++ helpers pure functions: thread-safe.
//
// KEYS[1..n]  bucket keys (one hash slot: one tenant; distinct in a batch)
// KEYS[n+1]   attempt key, when the attempt TTL is above 0
// ARGV[1]     the head, struct-packed '<BBBi8I4i8i8I4i8': caller time (1) or the
//             server's TIME (0); costs vary (1: one per bucket, below) or not (0);
//             parameter sets vary (1) or not (0); the caller's time (seconds, nanoseconds
//             in [0, 1e9)); TTL margin, ms; attempt TTL, ms (0: no attempt; -1: a batch
//             of independent decisions, each deducted when it alone allows); n; the cost
//             shared by every bucket
// ARGV[2..]   the parameter sets, one packed string each (the twin's pack_params): one
//             when they do not vary, else n; then, when the costs vary, n decimal costs;
//             then, with an attempt, its fingerprint (keys and costs; no newline)
// Reply: {replayed, time seconds, time nanoseconds, all allowed (1/0), then per bucket:
//         allowed (1/0: this bucket alone had enough), reason, remaining, retry_after ns
//         (-1 = never), reset_after ns (-1 = never)}; the token bucket's twin answers a
//         call without an attempt in a compact form (twin/token_bucket.hpp).
// Errors: "QUOTA_CORRUPT ..." (a key's state is not ours), "QUOTA_ATTEMPT_MISMATCH ...".
//
// The head replays a stored attempt and sets `sec`, `ns` (the time), `n`, `margin`,
// `server`, `batch`, `cost1`, `cstep`, `pstep`, `cbase`, `all`, and `seen`, `nwritten` and
// `fail` (a failed batch charges nothing). The body fills `out` (the reply); the tail
// stores an attempt's reply and returns `out`.
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_format.h"
#include "quota/policy/policy.hpp"
#include "quota/units.hpp"

namespace quota::redis {

// Numbers from decimal strings (TIME's reply, varying costs) are read as `s + 0`: Lua
// 5.1 converts the string with one strtod, where tonumber(s) is a function call that
// converts it twice.
//
// Exact integer arithmetic in Lua doubles, for every script of quota: idiv, the floor
// division and remainder of integers below 2^53 (the quotient of a floating division is
// off by at most one, and one correction step fixes it).
inline constexpr const char* kLuaMath = R"lua(
local floor = math.floor
local function idiv(a, b)
  local q = floor(a / b)
  local r = a - q * b
  if r < 0 then q = q - 1; r = r + b elseif r >= b then q = q + 1; r = r - b end
  return q, r
end
)lua";

// The token bucket's time to reach `need` micro-units from `tokens` with the carried
// remainder c (over p), at m/p micro-units per ns: ceil((need − tokens)·p − c) / m)
// nanoseconds, split so that no product reaches 2^53 (twin/token_bucket.hpp); 0 when
// already there, -1 (never) at rate 0. Needs kLuaMath.
inline constexpr const char* kLuaReach = R"lua(
local function reach(tokens, c, need, m, p)
  if tokens >= need then return 0 end
  if m == 0 then return -1 end
  -- idiv inlined (this runs for every decision): x % m is x - floor(x / m) * m, off by at
  -- most m, corrected in one step; then (x - r) / m is an exact quotient.
  local d = need - tokens
  if p == 1 and c == 0 then
    -- ceil(d / m): the general case below with nothing carried (a whole rate per ns)
    local r = d % m
    if r < 0 then r = r + m elseif r >= m then r = r - m end
    if r > 0 then return (d - r) / m + 1 end
    return d / m
  end
  local b = d % m
  if b < 0 then b = b + m elseif b >= m then b = b - m end
  local a = (d - b) / m
  local y = b * p - c
  if y > 0 then
    local r = y % m
    if r < 0 then r = r + m elseif r >= m then r = r - m end
    if r > 0 then return a * p + (y - r) / m + 1 end
    return a * p + y / m
  end
  y = -y
  local r = y % m
  if r < 0 then r = r + m elseif r >= m then r = r - m end
  return a * p - (y - r) / m
end
)lua";

inline constexpr const char* kLuaHead = R"lua(
-- A key's packed state: nil when the key does not exist; an error reply (second value)
-- when it holds anything but `bytes` bytes of a twin's state. Allocates nothing.
local function read_state(key, what, bytes)
  local raw = redis.pcall('GET', key)
  if type(raw) == 'table' then
    return nil, redis.error_reply('QUOTA_CORRUPT key ' .. key .. ' is not a quota ' .. what)
  end
  if raw and #raw ~= bytes then
    return nil, redis.error_reply('QUOTA_CORRUPT key ' .. key .. ': state is ' .. #raw ..
      ' bytes, expected ' .. bytes)
  end
  return raw
end
-- The call's head (ARGV[1], one packed string: a single struct.unpack where decimal
-- arguments would each cost an argument and a conversion): whether the time is the
-- caller's, whether the costs and the parameter sets vary per bucket (cstep, pstep: 0 or
-- 1), the caller's time, the TTL margin, the attempt TTL, n and the shared cost.
local caller, cstep, pstep, sec, ns, margin, attempt_ttl, n, cost1 =
  struct.unpack('<BBBi8I4i8i8I4i8', ARGV[1])
local server = caller == 0
-- bucket i's parameter set is ARGV[2 + pstep·(i-1)], its cost (when they vary)
-- ARGV[cbase + i - 1]; the attempt's fingerprint is ARGV[fpi]
local cbase = 3 + pstep * (n - 1)
local fpi = cbase + cstep * n
-- The states of KEYS[1..n], read at once: one MGET for several keys (a call costs the
-- server about as much as a decision's arithmetic; the keys of one call are distinct: the
-- store starts a new call at a repeated key). MGET answers nil also for a key holding
-- another type, so each such key is looked at again (read_state) before anything is
-- written. The values (false for a key that does not exist; for one key, GET's reply, an
-- error table for another type), or nil and the QUOTA_CORRUPT error.
local function read_states(what, bytes)
  if n == 1 then return {redis.pcall('GET', KEYS[1])} end
  local raws
  if n <= 4000 then
    raws = redis.call('MGET', unpack(KEYS, 1, n))
  else
    -- in slices: Lua unpacks at most about 8,000 values onto its stack
    raws = {}
    for lo = 1, n, 4000 do
      local part = redis.call('MGET', unpack(KEYS, lo, math.min(lo + 3999, n)))
      for j = 1, #part do raws[lo + j - 1] = part[j] end
    end
  end
  for i = 1, n do
    if not raws[i] then
      local _, corrupt = read_state(KEYS[i], what, bytes)
      if corrupt then return nil, corrupt end
    end
  end
  return raws
end
local batch = attempt_ttl < 0
if attempt_ttl > 0 then
  local prev = redis.call('GET', KEYS[n + 1])
  if prev then
    local fp, rest = string.match(prev, '^(.-)\n(.*)$')
    if fp ~= ARGV[fpi] then
      return redis.error_reply('QUOTA_ATTEMPT_MISMATCH attempt id reused with another key or cost')
    end
    local out = {1}
    for v in string.gmatch(rest, '%S+') do out[#out + 1] = tonumber(v) end
    return out
  end
end
if server then
  local t = redis.call('TIME')
  sec = t[1] + 0
  ns = (t[2] + 0) * 1000
end
local all = 1
-- A batch writes each bucket as soon as it is decided. A corrupt state found after some
-- were written fails the call, and `fail` first puts those back as they were read, so
-- that a failed call charges nothing: a twin keeps `seen[i]` (bucket i's state as read,
-- false when the key was missing; the twin creates the table) and `nwritten` (buckets
-- 1..nwritten written).
local seen, nwritten = nil, 0
local function fail(err)
  for j = 1, nwritten do
    if seen[j] then redis.call('SET', KEYS[j], seen[j], 'KEEPTTL') else redis.call('DEL', KEYS[j]) end
  end
  return err
end
)lua";

// put(out, i, ...): decision i's five reply fields, after the reply's four header fields
// (after kLuaHead, in the twins that answer in the full form only; the token bucket's
// writes them inline, sparing a closure per call).
inline constexpr const char* kLuaPut = R"lua(
local function put(out, i, ok, reason, rem, retry, reset)
  local k = 5 * i - 1
  out[k + 1] = ok; out[k + 2] = reason; out[k + 3] = rem; out[k + 4] = retry; out[k + 5] = reset
end
)lua";

// The loop of the twins that keep one fixed-size state per key (token bucket, fixed
// window, window estimate), after kLuaHead: detail::splice_lua fills its sections from a
// twin's body. The prologue declares state_what and state_bytes (read_states' arguments),
// state_long (a second valid length, or state_bytes again), `out` and the parameter
// locals; `params` unpacks parameter set `set` (when it differs from the previous
// bucket's); `state` declares the state's locals, `read` decodes them from `raw` (key
// `key`, of length `len`), `fresh` sets those of a missing key; `step` brings the state
// to the call's time and decides (@decide: ok, reason, retry); `write` writes it; `reply`
// puts its reply; `epilogue` ends the reply.
//
// One pass (decide, deduct, write) for one bucket or a batch of independent ones, each
// deducted when it alone allows. All-or-nothing over several buckets takes two: the first
// decides every bucket and writes none (out[4]: all allowed), the second decides each
// again from the same state and time (the same outcome), deducting only when all allow
// (`deduct`), and writes. One body for both, with no per-bucket function call or table.
inline constexpr const char* kLuaLoop = R"lua(
local pack, sunpack = struct.pack, struct.unpack
local rcall = redis.call
--@@ prologue
-- The states, read at once (read_states).
local raws, corrupt = read_states(state_what, state_bytes)
if not raws then return corrupt end
seen = raws
local deduct = true
local first = 2
if not batch and n > 1 then first = 1 end
-- Arguments of bucket i > 1 are looked at only when they may differ from bucket 1's.
local varying = pstep ~= 0 or cstep ~= 0
local sc, sset
local cost = cost1
for pass = first, 2 do
  local write = pass == 2
  for i = 1, n do
    if varying or i == 1 then
      -- Arguments are unpacked only when their strings differ from the previous bucket's
      -- (Lua interns strings: these are pointer comparisons).
      local set = ARGV[2 + pstep * (i - 1)]
      if set ~= sset then
        sset = set
        --@@ params
      end
      if cstep ~= 0 then
        local a0 = ARGV[cbase + i - 1]
        if a0 ~= sc then sc = a0; cost = a0 + 0 end
      end
    end
    local key = KEYS[i]
    local raw = raws[i]
    --@@ state
    if raw then
      -- (read_state, inlined: an error reply is a table, whose # is 0)
      local len = #raw
      if len ~= state_bytes and len ~= state_long then
        @corrupt_len()
      end
      --@@ read
    else
      --@@ fresh
    end
    --@@ step
    if ok == 0 then out[4] = 0 end
    if write then
      --@@ write
      nwritten = i
      --@@ reply
    end
  end
  deduct = out[4] == 1
end
--@@ epilogue
)lua";

inline constexpr const char* kLuaTail = R"lua(
if attempt_ttl > 0 then
  local parts = {}
  for i = 2, #out do parts[#parts + 1] = string.format('%.0f', out[i]) end
  redis.call('SET', KEYS[n + 1], ARGV[fpi] .. '\n' .. table.concat(parts, ' '), 'PX', attempt_ttl)
end
return out
)lua";

// State format versions. Every twin's state carries a format version in bits that no
// valid field value uses (each twin names them at its state): this release's format is
// version 0, those bits zero, so the range checks every reader already makes reject any
// other version as QUOTA_CORRUPT at no cost. The rule for each later format: a reader of
// version k reads k and k-1 (rewriting k-1 as k on its next write) and rejects anything
// else as QUOTA_CORRUPT (kDataLoss naming the key, nothing charged). A format whose
// version no longer fits its bits changes the state's length, which every earlier reader
// rejects (the length is checked before anything else).

// 2^53: Lua numbers (doubles) hold every integer below it exactly.
inline constexpr std::int64_t kLuaExact = std::int64_t{1} << 53;
// The longest time to fill a bucket the Lua twin handles: 9·10^6 s (~104 days).
inline constexpr std::int64_t kMaxFillNs = 9'000'000'000'000'000;

// The range a twin decides exactly in, beyond its policy's own checks: the largest
// capacity (burst or limit, units), the longest span (a token bucket's time to fill, a
// window), and, for errors, the store it is and what its capacity bound keeps exact.
// kRedisStoreRange is RedisStore's; GatewayStore's is narrower (kGatewayRange,
// twin/gateway_codec.hpp: headroom for debt).
struct TwinRange {
  std::int64_t max_capacity;
  std::int64_t max_span_ns;
  std::string_view store;
  std::string_view keeps;
};
inline constexpr TwinRange kRedisStoreRange{
    .max_capacity = (kLuaExact - 1) / kMicrosPerUnit,
    .max_span_ns = kMaxFillNs,
    .store = "the Redis store",
    .keeps = "keeps micro-units in Lua doubles, exact below 2^53"};

// kInvalidArgument naming `field` and the bound when `capacity` exceeds range's.
inline absl::Status check_capacity(std::string_view field, std::int64_t capacity,
                                   const TwinRange& range) {
  if (capacity <= range.max_capacity) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrFormat("%s=%d: %s %s, so %s must be at most %d units",
                                                    field, capacity, range.store, range.keeps,
                                                    field, range.max_capacity));
}

// "~N days" for a span of ns, rounded down (a bound's size in errors).
inline std::string span_days(std::int64_t ns) {
  return absl::StrFormat("~%d days", ns / 86'400'000'000'000);
}

// The window grid of the windowed twins (twin/fixed_window.hpp): mode 1, the window
// divides 1 s (w = the window, ns); mode 2, it is a whole number of seconds, at most
// max_ns (w = the window, s); any other window is kInvalidArgument naming the bound
// (`bound` says how far max_ns reaches and why).
struct WindowGrid {
  std::int64_t mode = 1, w = 1;
};
inline absl::StatusOr<WindowGrid> window_grid(Nanos window, std::int64_t max_ns,
                                              std::string_view bound) {
  const std::int64_t w = window.count();
  constexpr std::int64_t kSecond = 1'000'000'000;
  if (w > 0 && kSecond % w == 0) return WindowGrid{.mode = 1, .w = w};
  if (w > 0 && w % kSecond == 0 && w <= max_ns) return WindowGrid{.mode = 2, .w = w / kSecond};
  return absl::InvalidArgumentError(absl::StrFormat(
      "window=%d ns: the Redis store needs a window that divides 1 s or is a whole number "
      "of seconds up to %d s %s",
      w, max_ns / kSecond, bound));
}

// The cost a windowed twin is sent for a capacity `limit`: clamped to [0, limit + 1],
// as every cost beyond decides the same (and stays exact in Lua).
inline std::int64_t window_cost(std::int64_t limit, std::int64_t cost) {
  return std::clamp<std::int64_t>(cost, 0, limit + 1);
}

// The Lua twin of a policy: its script, its parameters as script arguments, and the
// range in which the script is exact. Specialized per policy.
template <Policy P>
struct LuaTwin;

namespace detail {

// The Lua text every twin shares, spliced where it is used (a function call per bucket
// costs measurable server instructions; spliced text costs none). `@name(a, b, ...)` in a
// twin's text stands for macro `name` with $1, $2, ... replaced by the arguments; an
// argument written `local x` declares x at its first use and names x after it. Every
// macro's text is a statement or statements; its lines take the indentation of the line
// it stands in. Snippets use fixed local names (stated with each) and may use macros.
struct LuaMacro {
  std::string_view name;
  std::string_view text;
};
inline constexpr LuaMacro kLuaMacros[] = {
    // $1 = $2 mod $3, for exact integers and $3 > 0: Lua's % is a - floor(a / b) * b,
    // off by at most b (a rounded quotient), corrected in one step.
    {"mod",
     "$1 = ($2) % ($3)\nif $1 < 0 then $1 = $1 + ($3) elseif $1 >= ($3) then $1 = $1 - ($3) end"},
    // $1 = ceil($2 / 10^6): nanoseconds to whole milliseconds (locals cx, cr).
    {"ceil_ms", "local cx = ($2) + 999999\n@mod(local cr, cx, 1000000)\n$1 = (cx - cr) / 1000000"},
    // A twin's decision from its capacity $1 and whether the cost fits ($2): ok (1/0),
    // reason (0 allowed, 1 over limit, 2 cost exceeds the capacity, 3 invalid cost), retry
    // (-1 for reasons 2 and 3, else 0: an over-limit retry is the twin's to set). Reads cost.
    {"decide",
     "local ok, reason, retry = 0, 1, 0\nif cost < 1 then\n  reason = 3; retry = -1\nelseif "
     "cost > $1 then\n  reason = 2; retry = -1\nelseif $2 then\n  ok = 1; reason = 0\nend"},
    // The key's value is not a state of this twin's length (state_what, state_bytes): the
    // call fails, charging nothing (reads key).
    {"corrupt_len",
     "local _, corrupt = read_state(key, state_what, state_bytes)\nreturn fail(corrupt or "
     "redis.error_reply('QUOTA_CORRUPT key ' .. key .. ' changed'))"},
    {"out_of_range",
     "return fail(redis.error_reply('QUOTA_CORRUPT key ' .. key .. ': field out of range'))"},
    // The window grid of twin/fixed_window.hpp (mode 1: W = w ns divides 1 s; mode 2: w
    // whole seconds): $1 = the start of the current window (sec, ns) in its unit (mode 1:
    // ns within second sec; mode 2: seconds); locals wx, wr.
    {"window_start",
     "local wx = ns\nif mode ~= 1 then wx = sec end\n@mod(local wr, wx, w)\n$1 = wx - wr"},
    // $1 = the offset of the last time (lsec, lns) in its window, ns (local er).
    {"offset",
     "if mode == 1 then\n  @mod(local er, lns, w)\n  $1 = er\nelse\n  @mod(local er, lsec, w)\n  "
     "$1 = er * 1000000000 + lns\nend"},
    // Token bucket refill: $2 micro-units carrying $3 (over p) brought on by $1 ns at
    // m/p micro-units per ns, capped at $4 (the carry then 0): floor((m·x + c)/p) split
    // as x = q·p + r: m·q + floor((m·r + c)/p), so that no product reaches 2^53 (each
    // twin keeps x below its time to fill, or twice that from debt). Locals rx, rr, ry,
    // rc, rw. $1 and $4 must be names.
    {"refill",
     "local rw, rc\nif p == 1 then\n  rw, rc = m * $1, 0\nelse\n  @mod(local rr, $1, p)\n  local "
     "ry "
     "= m * rr + $3\n  @mod(rc, ry, p)\n  rw = m * (($1 - rr) / p) + (ry - rc) / p\nend\nif rw >= "
     "$4 - $2 then $2 = $4; $3 = 0 else $2 = $2 + rw; $3 = rc end"},
};

inline void lua_fail(std::string_view what) {
  // A twin's text is a constant: this fails at static initialization, in every test.
  throw std::logic_error(std::string("quota Lua twin: ") + std::string(what));
}

// `text` with every macro expanded (repeatedly: a macro's text may use others).
inline std::string expand_lua(std::string_view text) {
  std::string out;
  std::size_t pos = 0;
  while (true) {
    const std::size_t at = text.find('@', pos);
    if (at == std::string_view::npos) break;
    std::size_t open = text.find('(', at);
    if (open == std::string_view::npos) lua_fail("a macro without arguments");
    const std::string_view name = text.substr(at + 1, open - at - 1);
    const LuaMacro* macro = nullptr;
    for (const LuaMacro& m : kLuaMacros) {
      if (m.name == name) macro = &m;
    }
    if (macro == nullptr) lua_fail(std::string("no macro ") + std::string(name));
    std::vector<std::string> args;
    std::string arg;
    int depth = 0;
    std::size_t close = open + 1;
    for (; close < text.size(); ++close) {
      const char ch = text[close];
      if (depth == 0 && (ch == ',' || ch == ')')) {
        const std::size_t b = arg.find_first_not_of(' '), e = arg.find_last_not_of(' ');
        args.push_back(b == std::string::npos ? std::string() : arg.substr(b, e - b + 1));
        arg.clear();
        if (ch == ')') break;
        continue;
      }
      if (ch == '(') ++depth;
      if (ch == ')') --depth;
      arg.push_back(ch);
    }
    if (close >= text.size()) lua_fail("an unclosed macro");
    const std::size_t line = text.rfind('\n', at);
    const std::size_t lb = line == std::string_view::npos ? 0 : line + 1;
    const std::string_view lead = text.substr(lb, text.find_first_not_of(' ', lb) - lb);
    out.append(text.substr(pos, at - pos));
    std::vector<bool> used(args.size(), false);
    for (std::size_t k = 0; k < macro->text.size(); ++k) {
      const char ch = macro->text[k];
      if (ch == '$' && k + 1 < macro->text.size() && macro->text[k + 1] >= '1' &&
          macro->text[k + 1] <= '9') {
        const std::size_t i = static_cast<std::size_t>(macro->text[++k] - '1');
        if (i >= args.size()) lua_fail(std::string("too few arguments to ") + std::string(name));
        const std::string& a = args[i];
        if (used[i] && a.rfind("local ", 0) == 0) {
          out.append(a.substr(6));
        } else {
          out.append(a);
        }
        used[i] = true;
      } else {
        out.push_back(ch);
        if (ch == '\n') out.append(lead);
      }
    }
    pos = close + 1;
  }
  out.append(text.substr(pos));
  if (out.find('@') != std::string::npos) return expand_lua(out);
  return out;
}

// A twin's script body: `skeleton` with each line `--@@ name` replaced by section `name`
// of `body` (the lines after `--@@ name` in it, up to the next such line), indented as
// that line; then its macros expanded. The text before body's first section is section
// "prologue". A section the body lacks is empty; every section of body is used exactly
// once.
inline std::string splice_lua(std::string_view skeleton, std::string_view body) {
  std::vector<std::pair<std::string, std::string>> sections{{"prologue", ""}};
  std::size_t pos = 0;
  while (pos < body.size()) {
    std::size_t end = body.find('\n', pos);
    if (end == std::string_view::npos) end = body.size();
    const std::string_view line = body.substr(pos, end - pos);
    if (line.rfind("--@@ ", 0) == 0) {
      sections.emplace_back(std::string(line.substr(5)), "");
    } else {
      sections.back().second.append(line).push_back('\n');
    }
    pos = end + 1;
  }
  std::vector<bool> used(sections.size(), false);
  std::string out;
  pos = 0;
  while (pos < skeleton.size()) {
    std::size_t end = skeleton.find('\n', pos);
    if (end == std::string_view::npos) end = skeleton.size();
    const std::string_view line = skeleton.substr(pos, end - pos);
    const std::size_t ind = line.find_first_not_of(' ');
    if (ind != std::string_view::npos && line.substr(ind).rfind("--@@ ", 0) == 0) {
      const std::string_view name = line.substr(ind + 5);
      for (std::size_t s = 0; s < sections.size(); ++s) {
        if (sections[s].first != name) continue;
        if (used[s]) lua_fail(std::string("section used twice: ") + std::string(name));
        used[s] = true;
        const std::string& t = sections[s].second;
        for (std::size_t b = 0; b < t.size();) {
          const std::size_t e = t.find('\n', b);
          if (e > b) out.append(line.substr(0, ind));
          out.append(t, b, e - b + 1);
          b = e + 1;
        }
      }
    } else {
      out.append(line).push_back('\n');
    }
    pos = end + 1;
  }
  for (std::size_t s = 0; s < sections.size(); ++s) {
    if (!used[s]) lua_fail("a section the skeleton has no place for: " + sections[s].first);
  }
  return expand_lua(out);
}

// The whole script of a twin on kLuaLoop: kLuaMath, the `helpers` it calls (kLuaReach,
// kLuaPut), kLuaHead, the loop with `body`'s sections, kLuaTail.
inline std::string loop_script(std::string_view helpers, std::string_view body) {
  return std::string(kLuaMath) + std::string(helpers) + kLuaHead + splice_lua(kLuaLoop, body) +
         kLuaTail;
}

// Appends the low `bytes` bytes of v, little-endian: the script reads them with
// struct.unpack ('i8', 'I4', 'B': two's complement, so a negative value reads back as
// itself in a signed field).
inline void pack_le(std::string& out, std::int64_t v, int bytes) {
  const auto u = static_cast<std::uint64_t>(v);
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((u >> (8 * i)) & 0xff));
}

}  // namespace detail

}  // namespace quota::redis
