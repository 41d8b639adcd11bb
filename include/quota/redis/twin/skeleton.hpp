// quota/redis/twin/skeleton.hpp — one script skeleton for the twins, and the Lua text
// they share spliced into it.
//
// The token bucket, fixed window and window estimate keep one fixed-size state per key
// and share one body, kLuaLoop: each twin supplies only its sections (`--@@ name`: its
// parameters, state, transition, write and reply), and detail::loop_script builds the
// whole script from kLuaMath, the twin's helpers, kLuaHead (common.hpp), the spliced loop
// and kLuaTail. Every twin's Lua, the sliding log's and the gateway's too, writes the
// shared arithmetic as macros (`@mod(...)`, `@refill(...)`: twin/lua_macros.hpp),
// pasted in as text when the script is built: one source for each piece, no function
// call per bucket. A body with a section the skeleton has no place for, or a macro used wrongly,
// throws when the script is built (at static initialization: a programming error).
// Pure text and pure functions: thread-safe.
//
//   inline const std::string kMyLua = detail::loop_script(kLuaPut, kMyLuaBody);
#pragma once

#include <algorithm>
#include <cctype>
#include <cstddef>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/strings/str_format.h"
#include "quota/redis/twin/common.hpp"
#include "quota/redis/twin/lua_macros.hpp"

namespace quota::redis {

// The loop of the twins that keep one fixed-size state per key (token bucket, fixed
// window, window estimate), after kLuaHead: detail::splice_lua fills its sections from a
// twin's body. The prologue declares state_what and state_bytes (read_states' arguments),
// state_long (a second valid length, or state_bytes again), `out` and the parameter
// locals; `params` unpacks parameter set `set` (when it differs from the previous
// bucket's); `state` declares the state's locals, `read` decodes them from `raw` (key
// `key`, of length `len`), `fresh` sets those of a missing key, `spent` those of the
// policy's exhausted state at (fsec, fns) (failover safety: the state, named lsec, lns
// for its last time, is older or missing); `step` brings the state
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
    -- failover safety (kLuaNodeGuard): a state older than the failover, or none, is read
    -- as spent at the failover time (the policy's exhausted(at))
    @if_spent(raw, lsec, lns)
      --@@ spent
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

namespace detail {

inline void lua_fail(std::string_view what) {
  // A twin's text is a constant: this fails at static initialization, in every test.
  throw std::logic_error(std::string("quota Lua twin: ") + std::string(what));
}

// `text` with every macro (lua_macros.hpp) expanded, repeatedly: a macro's text may use
// others.
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
    for (const LuaMacro& m : lua_macros()) {
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
    std::vector<std::string_view> params;
    for (std::string_view ps = macro->params; !ps.empty();) {
      const std::size_t sp = ps.find(' ');
      params.push_back(ps.substr(0, sp));
      ps = sp == std::string_view::npos ? std::string_view() : ps.substr(sp + 1);
    }
    if (args.size() == 1 && args[0].empty() && params.empty()) args.clear();
    if (args.size() != params.size()) {
      lua_fail(absl::StrFormat("macro %s takes %d arguments, given %d", name, params.size(),
                               args.size()));
    }
    std::string_view body = macro->text;
    if (body.starts_with('\n')) body = body.substr(1, body.size() - 1 - body.ends_with('\n'));
    const std::size_t line = text.rfind('\n', at);
    const std::size_t lb = line == std::string_view::npos ? 0 : line + 1;
    const std::string_view lead = text.substr(lb, text.find_first_not_of(' ', lb) - lb);
    out.append(text.substr(pos, at - pos));
    std::vector<bool> used(args.size(), false);
    for (std::size_t k = 0; k < body.size(); ++k) {
      const char ch = body[k];
      if (ch != '$') {
        out.push_back(ch);
        if (ch == '\n') out.append(lead);
        continue;
      }
      std::size_t e = k + 1;
      while (e < body.size() &&
             (std::isalnum(static_cast<unsigned char>(body[e])) || body[e] == '_')) {
        ++e;
      }
      const std::string_view param = body.substr(k + 1, e - k - 1);
      const auto it = std::find(params.begin(), params.end(), param);
      if (it == params.end()) {
        lua_fail(absl::StrFormat("macro %s has no parameter $%s", name, param));
      }
      const std::size_t i = static_cast<std::size_t>(it - params.begin());
      const std::string& a = args[i];
      out.append(used[i] && a.rfind("local ", 0) == 0 ? a.substr(6) : a);
      used[i] = true;
      k = e - 1;
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

}  // namespace detail

}  // namespace quota::redis
