// quota/redis/twin/skeleton.hpp — one script skeleton for the twins, and the Lua text
// they share spliced into it.
//
// The token bucket, fixed window and window estimate keep one fixed-size state per key
// and share one body, kLuaLoop: each twin supplies only its sections (`--@@ name`: its
// parameters, state, transition, write and reply), and detail::loop_script builds the
// whole script from kLuaMath, the twin's helpers, kLuaHead (common.hpp), the spliced loop
// and kLuaTail. Every twin's Lua, the sliding log's and the gateway's too, writes the
// shared arithmetic as macros (`@mod(...)`, `@refill(...)`, detail::kLuaMacros), pasted
// in as text when the script is built: one source for each piece, no function call per
// bucket. A body with a section the skeleton has no place for, or a macro used wrongly,
// throws when the script is built (at static initialization: a programming error).
// Pure text and pure functions: thread-safe.
//
//   inline const std::string kMyLua = detail::loop_script(kLuaPut, kMyLuaBody);
#pragma once

#include <cstddef>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "quota/redis/twin/common.hpp"

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
    // common.hpp's kLuaNodeGuard, for a twin with a head of its own (the gateway's).
    {"node_guard", kLuaNodeGuard},
    // Opens `if ... then` (closed by the twin's `end`): failover safety is on (fsec, from
    // kLuaNodeGuard) and the state ($1: its raw value, false when missing) has no last
    // time ($2 s, $3 ns) at or after the failover time (fsec, fns).
    {"if_spent", "if fsec and (not $1 or $2 < fsec or ($2 == fsec and $3 < fns)) then"},
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
    // The window grid of twin/fixed_window.hpp (locals mode and w; mode 1: W = w ns
    // divides 1 s; mode 2: w whole seconds), on times of two limbs (seconds, ns in [0,
    // 10^9)). window_start: $1 = the start of the window of time ($2, $3) in its unit
    // (mode 1: ns within second $2; mode 2: seconds); locals wx, wr.
    {"window_start",
     "local wx = $3\nif mode ~= 1 then wx = $2 end\n@mod(local wr, wx, w)\n$1 = wx - wr"},
    // $1 = whether time ($4, $5) lies in the window that starts at $2 (window_start's
    // unit) of a time in second $3 (local r).
    {"in_window",
     "$1 = false\nif mode ~= 1 then\n  @mod(local r, $4, w)\n  $1 = $4 - r == $2\nelseif $3 == $4 "
     "then\n  @mod(local r, $5, w)\n  $1 = $5 - r == $2\nend"},
    // $1 = the offset of time ($2, $3) in its window, ns (local er).
    {"offset",
     "if mode == 1 then\n  @mod(local er, $3, w)\n  $1 = er\nelse\n  @mod(local er, $2, w)\n  "
     "$1 = er * 1000000000 + $3\nend"},
    // The time from ($3, $4) to the next window start as two limbs, $1 s + $2 ns ($2 in
    // [0, 10^9]; exact for windows past 2^53 ns); local el. $1, $2 must be names.
    {"to_next",
     "if mode == 1 then\n  @mod(local el, $4, w)\n  $1, $2 = 0, w - el\nelse\n  @mod(local el, $3, "
     "w)\n  if $4 == 0 then $1, $2 = w - el, 0 else $1, $2 = w - el - 1, 1000000000 - $4 end\nend"},
    // Token bucket refill by $1 ns ($1 < 2^53): tokens $2 units + $3 micro-units ($3 in
    // [0, 10^6): two limbs, so that a capacity beyond 2^53 micro-units stays exact)
    // carrying $4 (over p), at m/p micro-units per ns, capped at $5 units (then $3 and $4
    // are 0). The micro-units added, floor((m·x + c)/p), are m·q + floor((m·r + c)/p) for
    // x = q·p + r; m·q is formed whole while the sum stays below 2^53, else as
    // m·(q − ql) + m·ql with ql = q mod 10^6 (the wide range keeps m·(10^6 + 1) < 2^53).
    // Locals rq, rr, ry, rc, rt, rw, rh, rl, ql. $2..$5 must be names.
    {"refill",
     "local rq, rc, rt = $1, 0, 0\nif p ~= 1 then\n  @mod(local rr, $1, p)\n  rq = ($1 - rr) / "
     "p\n  local ry = m * rr + $4\n  @mod(rc, ry, p)\n  rt = (ry - rc) / p\nend\nlocal rw, rh, "
     "rl = m * rq, 0, 0\nif rw < 9007199254740992 - rt then\n  rw = rw + rt\n  @mod(rl, rw, "
     "1000000)\n  rh = (rw - rl) / 1000000\nelse\n  @mod(local ql, rq, 1000000)\n  rw = m * ql + "
     "rt\n  @mod(rl, rw, 1000000)\n  rh = m * ((rq - ql) / 1000000) + (rw - rl) / 1000000\nend\n"
     "rl = $3 + rl\nif rl >= 1000000 then rl = rl - 1000000; rh = rh + 1 end\nif $2 + rh >= $5 "
     "then $2 = $5; $3 = 0; $4 = 0 else $2 = $2 + rh; $3 = rl; $4 = rc end"},
    // The narrow range's refill, on tokens as one number: $2 micro-units (below 2^53, of
    // any sign) carrying $3 (over p) refilled by $1 ns, below twice the time to fill (so
    // m·floor($1 / p) is at most twice the capacity's micro-units), at m/p micro-units per
    // ns, capped at $4 micro-units (then $3 is 0): what @refill gives in limbs. Locals rr,
    // ry, rc. $2, $3 must be names.
    {"refill_narrow",
     "@mod(local rr, $1, p)\nlocal ry = m * rr + $3\n@mod(local rc, ry, p)\n$2 = $2 + m * (($1 - "
     "rr) "
     "/ p) + (ry - rc) / p\nif $2 >= $4 then $2 = $4; $3 = 0 else $3 = rc end"},
    // The gateway quick path's TTL need, ms from now, of a narrow token bucket whose last
    // time is (lsec, lns) holding $2 micro-units carrying $3 (over p), capacity $4
    // micro-units, at m/p per ns: its time to full bounded from above with one floating
    // division (its error a few ns; at most 2 ms past the exact ceil) plus the time from
    // now (sec, ns) to its last time; false (no TTL) when it never fills (m 0). Local x.
    {"ttl_bound",
     "$1 = false\nif $2 >= $4 then\n  $1 = 0\nelseif m > 0 then\n  local x = (lsec - sec) * "
     "1000000000 + lns - ns + ((($4) - ($2)) * p - $3) / m\n  $1 = (x - x % 1000000) / 1000000 + "
     "2\nend"},
    // The gateway's TTL to put on a scope key whose records need $2 ms from now (false:
    // none) and whose expiry as last set is $3 (server ms; 0 none or unknown): $1 true to
    // keep it (it covers the need plus the margin with 10 ms to spare, and $4), else the
    // ms to set (one margin more for a busy key; never below what it was: it covers the
    // records not decided now), false for none; with the caller's time (no now_ms) the
    // need plus the margin. Reads margin, now_ms; adds the margin to $2.
    {"ttl_put",
     "$1 = false\nif $2 then\n  $2 = $2 + margin\n  if now_ms then\n    if $3 >= now_ms + $2 + 10 "
     "and $4 then\n      $1 = true\n    else\n      $1 = $2\n      if $3 >= now_ms + $2 - margin "
     "then $1 = $2 + margin end\n      if $3 - now_ms > $1 then $1 = $3 - now_ms end\n    "
     "end\n  else\n    $1 = $2\n  end\nend"},
    // Token bucket refill over an elapsed time of two limbs ($1 s + $2 ns, $2 in (−10^9,
    // 10^9), the sum above 0): tokens $3 units + $4 micro-units carrying $5, capped at $6
    // units; full at once when the time reaches $7 s + $8 ns (a time from which any state
    // fills: the time to fill, or twice it from the deepest debt). Else @refill in steps of
    // at most 9·10^15 ns (each below 2^53; refilling in steps gives exactly what one step
    // gives). Locals re, rs, rx and @refill's. $3..$6 must be names.
    {"refill_span",
     "local re = $1 - $7\nif re > 1 or (re > -2 and re * 1000000000 + $2 >= $8) then\n  $3 = $6; "
     "$4 = 0; $5 = 0\nelse\n  local rs = $1\n  while rs > 9000000 do\n    "
     "@refill(9000000000000000, $3, $4, $5, $6)\n    rs = rs - 9000000\n  end\n  local rx = rs * "
     "1000000000 + $2\n  @refill(rx, $3, $4, $5, $6)\nend"},
    // The time for tokens $3 units + $4 micro-units carrying $5 (over p) to reach $6
    // units, at m/p micro-units per ns, as two limbs: $1 s + $2 ns; 0 when already there,
    // $1 = -1 (never) at rate 0. ceil((D·p − c)/m) for D = $6·10^6 − tokens: kLuaReach
    // while `wide` is false (D and the result below 2^53: $1 = 0, $2 the whole time, not
    // split, as every consumer takes it); else ($2 in [0, 10^9)) D = a·m
    // + b formed from its limbs (D_units = a1·m + b1, b1·10^6 − $4 = a2·m + b) and the time
    // a1·p·10^6 + a2·p + ceil((b·p − c)/m) summed in limbs (the wide range keeps m and p
    // at most 9·10^9). Locals ka, kb, kv, kc, kz, kx, km, kt. $1, $2 must be names.
    {"reach",
     "$1, $2 = 0, 0\nif $3 < $6 then\n  if m == 0 then\n    $1 = -1\n  elseif not wide then\n    "
     "$2 = reach($3 * 1000000 + $4, $5, $6 * 1000000, m, p)\n  else\n    local kv = $6 - $3\n    "
     "@mod(local kb, kv, m)\n "
     "   local ka = (kv - kb) / m\n    kv = kb * 1000000 - $4\n    @mod(kb, kv, m)\n    local kc = "
     "(kv - kb) / m\n    kv = kb * p - $5\n    @mod(local kz, kv, m)\n    if kz > 0 then kz = (kv "
     "- kz) / m + 1 else kz = kv / m end\n    local kx = ka * p\n    @mod(local km, kx, 1000)\n  "
     "  local kt = km * 1000000 + kc * p + kz\n    @mod($2, kt, 1000000000)\n    $1 = (kx - km) / "
     "1000 + (kt - $2) / 1000000000\n  end\nend"},
    // $1 = a duration of two limbs ($2 s + $3 ns: $3 in [0, 10^9), or $2 = 0 and $3 below
    // 2^53; $2 = -1: never) as a reply value: a number below 2^53 ns (-1 for never), else
    // its decimal string (exact past 2^53).
    {"dur",
     "if $2 < 0 then $1 = -1 elseif $2 < 9000000 then $1 = $2 * 1000000000 + $3 else $1 = $2 .. "
     "string.format('%09d', $3) end"},
    // $1 = micro-units of two limbs ($2 units + $3 micro-units, >= 0) as a reply value: a
    // number below 2^53, else its decimal string.
    {"micros",
     "if $2 < 9007199254 then $1 = $2 * 1000000 + $3 else $1 = $2 .. string.format('%06d', $3) "
     "end"},
    // Two-limb micro-units ($1 units + $2 micro-units in [0, 10^6)): $1, $2 minus, or
    // plus, $3 units + $4 micro-units. $1, $2 must be names.
    {"lsub", "$1 = $1 - $3; $2 = $2 - $4\nif $2 < 0 then $2 = $2 + 1000000; $1 = $1 - 1 end"},
    {"ladd",
     "$1 = $1 + $3; $2 = $2 + $4\nif $2 >= 1000000 then $2 = $2 - 1000000; $1 = $1 + 1 end"},
    // A window's count $1 (of capacity $4) pays its debt ($2 units + $3 micro-units) in
    // whole units, as far as the window has room (key_state.hpp's pay_debt); local wp, wo.
    {"window_pay",
     "local wp, wo = $4 - $1, $2\nif $3 > 0 then wo = $2 + 1 end\nif wo < wp then wp = wo end\n$2 "
     "= "
     "$2 - wp\nif $2 < 0 then $2 = 0; $3 = 0 end\n$1 = $1 + wp"},
    // $1 = ceil(($2 s + $3 ns) / 10^6): a duration of two limbs in whole milliseconds
    // ($3 of any sign and size below 2^53; local dm).
    {"ceil_ms2", "@ceil_ms(local dm, $3)\n$1 = ($2) * 1000 + dm"},
    // The window estimate's arithmetic (twin/sliding_window_estimate.hpp and the gateway's
    // twin/gateway_windows.hpp; SlidingWindowEstimate's), on the grid locals mode, w, per
    // and kLuaEstimateMath's mul, le, muldiv. window_gap: $1 = the windows from the one
    // of time ($4, $5) to the one of index $2 (window_start / w) of a time in second $3,
    // mode 1 counting 2 for 2 or more (local gr). est_roll: counters $2 (cur), $3 (prev)
    // rolled by $1 windows.
    {"window_gap",
     "if mode ~= 1 then\n  @mod(local gr, $4, w)\n  $1 = $2 - ($4 - gr) / w\nelseif $3 - $4 >= 2 "
     "then\n  $1 = 2\nelse\n  @mod(local gr, $5, w)\n  $1 = ($3 - $4) * per + $2 - ($5 - gr) / "
     "w\nend"},
    {"est_roll", "if $1 == 1 then\n  $3 = $2; $2 = 0\nelseif $1 ~= 0 then\n  $3 = 0; $2 = 0\nend"},
    // $1 = whether cost $4 fits: ($2 + $4)·$6 + $3·($6 − $7) <= $5·$6 for counters cur $2,
    // prev $3, limit $5, window $6 ns, offset $7 (locals fx, fy).
    {"est_fits",
     "$1 = $4 >= 1 and $2 + $4 <= $5\nif $1 and $3 > 0 then\n  local fx, fy = $3 * ($6 - $7), ($5 "
     "- $2 - $4) * $6\n  if fx < T53 then\n    $1 = fy >= T53 or fx <= fy\n  elseif fy < T53 "
     "then\n    $1 = false\n  else\n    $1 = le($3, $6 - $7, $5 - $2 - $4, $6)\n  end\nend"},
    // $1 = a denied cost $4's retry_after, ns (same arguments as est_fits; locals xs, xm).
    {"est_retry",
     "$1 = nil\nlocal xs = $5 - $2 - $4\nif xs >= 0 and $3 > 0 then\n  local xm = muldiv(xs, $6, "
     "$3)\n  if xm >= 1 then $1 = $6 - xm - $7 end\nend\nif $1 == nil then\n  if $2 == 0 or $5 - "
     "$4 >= $2 then\n    $1 = $6 - $7\n  else\n    local xm = muldiv($5 - $4, $6, $2)\n    if xm "
     ">= 1 then $1 = $6 - $7 + ($6 - xm) else $1 = $6 - $7 + $6 end\n  end\nend"},
    // $1 = remaining: $4 − $2 − $3 + floor($3·$6 / $5), at least 0 (cur $2, prev $3,
    // limit $4, window $5 ns, offset $6; locals fx, ff, fr).
    {"est_remaining",
     "$1 = $4 - $2\nif $3 > 0 then\n  local fx, ff = $3 * $6, 0\n  if fx < T52 then\n    ff = "
     "floor(fx / $5)\n    local fr = fx - ff * $5\n    if fr < 0 then ff = ff - 1 elseif fr >= $5 "
     "then ff = ff + 1 end\n  else\n    ff = muldiv($3, $6, $5)\n  end\n  $1 = $1 - $3 + "
     "ff\nend\nif $1 < 0 then $1 = 0 end"},
    // $1 = reset_after, ns: until both counters are 0 (cur $2, prev $3, window $4, offset $5).
    {"est_reset", "$1 = 0\nif $2 > 0 then $1 = $4 - $5 + $4 elseif $3 > 0 then $1 = $4 - $5 end"},
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

}  // namespace detail

}  // namespace quota::redis
