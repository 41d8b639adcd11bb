// quota/redis/twin/lua_macros.hpp — the Lua text the twins share, as macros.
//
// Every twin's Lua (the per-policy twins, the sliding log's, the gateway's) writes the
// arithmetic it shares with the others as macros: `@refill(dt, tu, tl, c, cap)` in a
// twin's text stands for macro `refill` with each parameter `$dt`, `$tu`, ... replaced by
// the argument in its place, pasted in as text when the script is built (expand_lua,
// twin/skeleton.hpp). One source for each piece of arithmetic, and no function call per
// bucket: a Lua call costs measurable server instructions, spliced text none.
//
// A macro is written as the Lua it expands to, one statement a line, after its parameter
// names; its lines take the indentation of the line it stands in. An argument written
// `local x` declares x at its first use and names x after it. A macro whose text is one
// line without a statement (`wide`, the layouts) is an expression and may stand inside a
// line. The bounds and layouts are spliced from the C++ that defines them (`wide`: the
// gateway's narrow range, twin/range.hpp; `@policy_format()` and the others:
// twin/gateway_layout.hpp), so that the C++ codec and the Lua agree by construction.
//
// Guarantees: the text of every macro is valid Lua 5.1 once expanded (every expanded
// script is parsed by `luac5.1 -p` in redis_lua_syntax_test); a macro used with the wrong
// number of arguments, or a parameter the macro does not name, throws when the script is
// built (at static initialization: a programming error). Thread safety: lua_macros() is
// built once (a function-local static) and read-only after.
//
//   // in a twin's Lua:   @mod(local r, carry, g)
//   // expands to:        local r = (carry) % (g)
//   //                    if r < 0 then r = r + (g) elseif r >= (g) then r = r - (g) end
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/strings/str_format.h"
#include "quota/redis/twin/common.hpp"
#include "quota/redis/twin/gateway_layout.hpp"
#include "quota/redis/twin/range.hpp"

namespace quota::redis::detail {

struct LuaMacro {
  std::string name;
  std::string params;  // the parameter names, separated by spaces
  std::string text;    // one leading and one trailing newline are not part of it
};

// The gateway's narrow range (twin/range.hpp's kGatewayRange) as a test of a token
// bucket's capacity and time to fill (s, ns): past it the bucket is `wide`.
static_assert(kGatewayRange.narrow_span_ns % 1'000'000'000 == 0);
inline std::string gateway_wide_text() {
  const std::int64_t seconds = kGatewayRange.narrow_span_ns / 1'000'000'000;
  return absl::StrFormat("($cap > %d or $fs > %d or ($fs == %d and $fn > 0))",
                         kGatewayRange.narrow_capacity, seconds, seconds);
}

// Every macro (see the top of this file).
inline const std::vector<LuaMacro>& lua_macros() {
  static const std::vector<LuaMacro> macros = {
      // $r = $a mod $b, for exact integers and $b > 0: Lua's % is a - floor(a / b) * b,
      // off by at most b (a rounded quotient), corrected in one step.
      {"mod", "r a b", R"lua(
$r = ($a) % ($b)
if $r < 0 then $r = $r + ($b) elseif $r >= ($b) then $r = $r - ($b) end
)lua"},
      // common.hpp's kLuaNodeGuard, for a twin with a head of its own (the gateway's).
      {"node_guard", "", kLuaNodeGuard},
      // Opens `if ... then` (closed by the twin's `end`): failover safety is on (fsec, from
      // kLuaNodeGuard) and the state ($raw: its raw value, false when missing) has no last
      // time ($lsec s, $lns ns) at or after the failover time (fsec, fns).
      {"if_spent", "raw lsec lns", R"lua(
if fsec and (not $raw or $lsec < fsec or ($lsec == fsec and $lns < fns)) then
)lua"},
      // $ms = ceil($ns / 10^6): nanoseconds to whole milliseconds (locals cx, cr).
      {"ceil_ms", "ms ns", R"lua(
local cx = ($ns) + 999999
@mod(local cr, cx, 1000000)
$ms = (cx - cr) / 1000000
)lua"},
      // A twin's decision from its capacity $cap and whether the cost fits ($fits): ok (1/0),
      // reason (0 allowed, 1 over limit, 2 cost exceeds the capacity, 3 invalid cost), retry
      // (-1 for reasons 2 and 3, else 0: an over-limit retry is the twin's to set). Reads cost.
      {"decide", "cap fits", R"lua(
local ok, reason, retry = 0, 1, 0
if cost < 1 then
  reason = 3; retry = -1
elseif cost > $cap then
  reason = 2; retry = -1
elseif $fits then
  ok = 1; reason = 0
end
)lua"},
      // The key's value is not a state of this twin's length (state_what, state_bytes): the
      // call fails, charging nothing (reads key).
      {"corrupt_len", "", R"lua(
local _, corrupt = read_state(key, state_what, state_bytes)
return fail(corrupt or redis.error_reply('QUOTA_CORRUPT key ' .. key .. ' changed'))
)lua"},
      {"out_of_range", "", R"lua(
return fail(redis.error_reply('QUOTA_CORRUPT key ' .. key .. ': field out of range'))
)lua"},
      // The window grid of twin/fixed_window.hpp (locals mode and w; mode 1: W = w ns
      // divides 1 s; mode 2: w whole seconds), on times of two limbs (seconds, ns in [0,
      // 10^9)). window_start: $start = the start of the window of time ($sec, $ns) in its unit
      // (mode 1: ns within second $sec; mode 2: seconds); locals wx, wr.
      {"window_start", "start sec ns", R"lua(
local wx = $ns
if mode ~= 1 then wx = $sec end
@mod(local wr, wx, w)
$start = wx - wr
)lua"},
      // $inw = whether time ($tsec, $tns) lies in the window that starts at $start (window_start's
      // unit) of a time in second $sec (local r).
      {"in_window", "inw start sec tsec tns", R"lua(
$inw = false
if mode ~= 1 then
  @mod(local r, $tsec, w)
  $inw = $tsec - r == $start
elseif $sec == $tsec then
  @mod(local r, $tns, w)
  $inw = $tns - r == $start
end
)lua"},
      // $off = the offset of time ($sec, $ns) in its window, ns (local er).
      {"offset", "off sec ns", R"lua(
if mode == 1 then
  @mod(local er, $ns, w)
  $off = er
else
  @mod(local er, $sec, w)
  $off = er * 1000000000 + $ns
end
)lua"},
      // The time from ($sec, $ns) to the next window start as two limbs, $ts s + $tn ns ($tn in
      // [0, 10^9]; exact for windows past 2^53 ns); local el. $ts, $tn must be names.
      {"to_next", "ts tn sec ns", R"lua(
if mode == 1 then
  @mod(local el, $ns, w)
  $ts, $tn = 0, w - el
else
  @mod(local el, $sec, w)
  if $ns == 0 then $ts, $tn = w - el, 0 else $ts, $tn = w - el - 1, 1000000000 - $ns end
end
)lua"},
      // Token bucket refill by $dt ns ($dt < 2^53): tokens $tu units + $tl micro-units ($tl in
      // [0, 10^6): two limbs, so that a capacity beyond 2^53 micro-units stays exact)
      // carrying $c (over p), at m/p micro-units per ns, capped at $cap units (then $tl and $c
      // are 0). The micro-units added, floor((m·x + c)/p), are m·q + floor((m·r + c)/p) for
      // x = q·p + r; m·q is formed whole while the sum stays below 2^53, else as
      // m·(q − ql) + m·ql with ql = q mod 10^6 (the wide range keeps m·(10^6 + 1) < 2^53).
      // Locals rq, rr, ry, rc, rt, rw, rh, rl, ql. $tu..$cap must be names.
      {"refill", "dt tu tl c cap", R"lua(
local rq, rc, rt = $dt, 0, 0
if p ~= 1 then
  @mod(local rr, $dt, p)
  rq = ($dt - rr) / p
  local ry = m * rr + $c
  @mod(rc, ry, p)
  rt = (ry - rc) / p
end
local rw, rh, rl = m * rq, 0, 0
if rw < 9007199254740992 - rt then
  rw = rw + rt
  @mod(rl, rw, 1000000)
  rh = (rw - rl) / 1000000
else
  @mod(local ql, rq, 1000000)
  rw = m * ql + rt
  @mod(rl, rw, 1000000)
  rh = m * ((rq - ql) / 1000000) + (rw - rl) / 1000000
end
rl = $tl + rl
if rl >= 1000000 then rl = rl - 1000000; rh = rh + 1 end
if $tu + rh >= $cap then $tu = $cap; $tl = 0; $c = 0 else $tu = $tu + rh; $tl = rl; $c = rc end
)lua"},
      // The narrow range's refill, on tokens as one number: $tok micro-units (below 2^53, of
      // any sign) carrying $c (over p) refilled by $dt ns, below twice the time to fill (so
      // m·floor($dt / p) is at most twice the capacity's micro-units), at m/p micro-units per
      // ns, capped at $cap micro-units (then $c is 0): what @refill gives in limbs. Locals rr,
      // ry, rc. $tok, $c must be names.
      {"refill_narrow", "dt tok c cap", R"lua(
@mod(local rr, $dt, p)
local ry = m * rr + $c
@mod(local rc, ry, p)
$tok = $tok + m * (($dt - rr) / p) + (ry - rc) / p
if $tok >= $cap then $tok = $cap; $c = 0 else $c = rc end
)lua"},
      // The gateway quick path's TTL need, ms from now, of a narrow token bucket whose last
      // time is (lsec, lns) holding $tok micro-units carrying $c (over p), capacity $cap
      // micro-units, at m/p per ns: its time to full bounded from above with one floating
      // division (its error a few ns; at most 2 ms past the exact ceil) plus the time from
      // now (sec, ns) to its last time; false (no TTL) when it never fills (m 0). Local x.
      {"ttl_bound", "need tok c cap", R"lua(
$need = false
if $tok >= $cap then
  $need = 0
elseif m > 0 then
  local x = (lsec - sec) * 1000000000 + lns - ns + ((($cap) - ($tok)) * p - $c) / m
  $need = (x - x % 1000000) / 1000000 + 2
end
)lua"},
      // The gateway's TTL to put on a scope key whose records need $need ms from now (false:
      // none) and whose expiry as last set is $expiry (server ms; 0 none or unknown): $put true to
      // keep it (it covers the need plus the margin with 10 ms to spare, and $keepable), else the
      // ms to set (one margin more for a busy key; never below what it was: it covers the
      // records not decided now), false for none; with the caller's time (no now_ms) the
      // need plus the margin. Reads margin, now_ms; adds the margin to $need.
      {"ttl_put", "put need expiry keepable", R"lua(
$put = false
if $need then
  $need = $need + margin
  if now_ms then
    if $expiry >= now_ms + $need + 10 and $keepable then
      $put = true
    else
      $put = $need
      if $expiry >= now_ms + $need - margin then $put = $need + margin end
      if $expiry - now_ms > $put then $put = $expiry - now_ms end
    end
  else
    $put = $need
  end
end
)lua"},
      // Token bucket refill over an elapsed time of two limbs ($ds s + $dn ns, $dn in (−10^9,
      // 10^9), the sum above 0): tokens $tu units + $tl micro-units carrying $c, capped at $cap
      // units; full at once when the time reaches $fs s + $fn ns (a time from which any state
      // fills: the time to fill, or twice it from the deepest debt). Else @refill in steps of
      // at most 9·10^15 ns (each below 2^53; refilling in steps gives exactly what one step
      // gives). Locals re, rs, rx and @refill's. $tu..$cap must be names.
      {"refill_span", "ds dn tu tl c cap fs fn", R"lua(
local re = $ds - $fs
if re > 1 or (re > -2 and re * 1000000000 + $dn >= $fn) then
  $tu = $cap; $tl = 0; $c = 0
else
  local rs = $ds
  while rs > 9000000 do
    @refill(9000000000000000, $tu, $tl, $c, $cap)
    rs = rs - 9000000
  end
  local rx = rs * 1000000000 + $dn
  @refill(rx, $tu, $tl, $c, $cap)
end
)lua"},
      // The time for tokens $tu units + $tl micro-units carrying $c (over p) to reach $target
      // units, at m/p micro-units per ns, as two limbs: $rs s + $rn ns; 0 when already there,
      // $rs = -1 (never) at rate 0. ceil((D·p − c)/m) for D = $target·10^6 − tokens: kLuaReach
      // while `wide` is false (D and the result below 2^53: $rs = 0, $rn the whole time, not
      // split, as every consumer takes it); else ($rn in [0, 10^9)) D = a·m
      // + b formed from its limbs (D_units = a1·m + b1, b1·10^6 − $tl = a2·m + b) and the time
      // a1·p·10^6 + a2·p + ceil((b·p − c)/m) summed in limbs (the wide range keeps m and p
      // at most 9·10^9). Locals ka, kb, kv, kc, kz, kx, km, kt. $rs, $rn must be names.
      {"reach", "rs rn tu tl c target", R"lua(
$rs, $rn = 0, 0
if $tu < $target then
  if m == 0 then
    $rs = -1
  elseif not wide then
    $rn = reach($tu * 1000000 + $tl, $c, $target * 1000000, m, p)
  else
    local kv = $target - $tu
    @mod(local kb, kv, m)
    local ka = (kv - kb) / m
    kv = kb * 1000000 - $tl
    @mod(kb, kv, m)
    local kc = (kv - kb) / m
    kv = kb * p - $c
    @mod(local kz, kv, m)
    if kz > 0 then kz = (kv - kz) / m + 1 else kz = kv / m end
    local kx = ka * p
    @mod(local km, kx, 1000)
    local kt = km * 1000000 + kc * p + kz
    @mod($rn, kt, 1000000000)
    $rs = (kx - km) / 1000 + (kt - $rn) / 1000000000
  end
end
)lua"},
      // $out = a duration of two limbs ($s s + $n ns: $n in [0, 10^9), or $s = 0 and $n below
      // 2^53; $s = -1: never) as a reply value: a number below 2^53 ns (-1 for never), else
      // its decimal string (exact past 2^53).
      {"dur", "out s n", R"lua(
if $s < 0 then $out = -1 elseif $s < 9000000 then $out = $s * 1000000000 + $n else $out = $s .. string.format('%09d', $n) end
)lua"},
      // $out = micro-units of two limbs ($u units + $l micro-units, >= 0) as a reply value: a
      // number below 2^53, else its decimal string.
      {"micros", "out u l", R"lua(
if $u < 9007199254 then $out = $u * 1000000 + $l else $out = $u .. string.format('%06d', $l) end
)lua"},
      // Two-limb micro-units ($xu units + $xl micro-units in [0, 10^6)): $xu, $xl minus, or
      // plus, $yu units + $yl micro-units. $xu, $xl must be names.
      {"lsub", "xu xl yu yl", R"lua(
$xu = $xu - $yu; $xl = $xl - $yl
if $xl < 0 then $xl = $xl + 1000000; $xu = $xu - 1 end
)lua"},
      {"ladd", "xu xl yu yl", R"lua(
$xu = $xu + $yu; $xl = $xl + $yl
if $xl >= 1000000 then $xl = $xl - 1000000; $xu = $xu + 1 end
)lua"},
      // A window's count $count (of capacity $cap) pays its debt ($du units + $dl micro-units) in
      // whole units, as far as the window has room (key_state.hpp's pay_debt); local wp, wo.
      {"window_pay", "count du dl cap", R"lua(
local wp, wo = $cap - $count, $du
if $dl > 0 then wo = $du + 1 end
if wo < wp then wp = wo end
$du = $du - wp
if $du < 0 then $du = 0; $dl = 0 end
$count = $count + wp
)lua"},
      // $ms = ceil(($s s + $ns ns) / 10^6): a duration of two limbs in whole milliseconds
      // ($ns of any sign and size below 2^53; local dm).
      {"ceil_ms2", "ms s ns", R"lua(
@ceil_ms(local dm, $ns)
$ms = ($s) * 1000 + dm
)lua"},
      // The window estimate's arithmetic (twin/sliding_window_estimate.hpp and the gateway's
      // twin/gateway_windows.hpp; SlidingWindowEstimate's), on the grid locals mode, w, per
      // and kLuaEstimateMath's mul, le, muldiv. window_gap: $gap = the windows from the one
      // of time ($tsec, $tns) to the one of index $idx (window_start / w) of a time in second $sec,
      // mode 1 counting 2 for 2 or more (local gr). est_roll: counters $idx (cur), $sec (prev)
      // rolled by $gap windows.
      {"window_gap", "gap idx sec tsec tns", R"lua(
if mode ~= 1 then
  @mod(local gr, $tsec, w)
  $gap = $idx - ($tsec - gr) / w
elseif $sec - $tsec >= 2 then
  $gap = 2
else
  @mod(local gr, $tns, w)
  $gap = ($sec - $tsec) * per + $idx - ($tns - gr) / w
end
)lua"},
      {"est_roll", "n cur prev", R"lua(
if $n == 1 then
  $prev = $cur; $cur = 0
elseif $n ~= 0 then
  $prev = 0; $cur = 0
end
)lua"},
      // $fits = whether cost $cost fits: ($cur + $cost)·$win + $prev·($win − $off) <= $limit·$win
      // for counters cur $cur,
      // prev $prev, limit $limit, window $win ns, offset $off (locals fx, fy).
      {"est_fits", "fits cur prev cost limit win off", R"lua(
$fits = $cost >= 1 and $cur + $cost <= $limit
if $fits and $prev > 0 then
  local fx, fy = $prev * ($win - $off), ($limit - $cur - $cost) * $win
  if fx < T53 then
    $fits = fy >= T53 or fx <= fy
  elseif fy < T53 then
    $fits = false
  else
    $fits = le($prev, $win - $off, $limit - $cur - $cost, $win)
  end
end
)lua"},
      // $retry = a denied cost $cost's retry_after, ns (same arguments as est_fits; locals xs, xm).
      {"est_retry", "retry cur prev cost limit win off", R"lua(
$retry = nil
local xs = $limit - $cur - $cost
if xs >= 0 and $prev > 0 then
  local xm = muldiv(xs, $win, $prev)
  if xm >= 1 then $retry = $win - xm - $off end
end
if $retry == nil then
  if $cur == 0 or $limit - $cost >= $cur then
    $retry = $win - $off
  else
    local xm = muldiv($limit - $cost, $win, $cur)
    if xm >= 1 then $retry = $win - $off + ($win - xm) else $retry = $win - $off + $win end
  end
end
)lua"},
      // $rem = remaining: $limit − $cur − $prev + floor($prev·$off / $win), at least 0 (cur $cur,
      // prev $prev,
      // limit $limit, window $win ns, offset $off; locals fx, ff, fr).
      {"est_remaining", "rem cur prev limit win off", R"lua(
$rem = $limit - $cur
if $prev > 0 then
  local fx, ff = $prev * $off, 0
  if fx < T52 then
    ff = floor(fx / $win)
    local fr = fx - ff * $win
    if fr < 0 then ff = ff - 1 elseif fr >= $win then ff = ff + 1 end
  else
    ff = muldiv($prev, $off, $win)
  end
  $rem = $rem - $prev + ff
end
if $rem < 0 then $rem = 0 end
)lua"},
      // $reset = reset_after, ns: until both counters are 0 (cur $cur, prev $prev, window $win,
      // offset $off).
      {"est_reset", "reset cur prev win off", R"lua(
$reset = 0
if $cur > 0 then $reset = $win - $off + $win elseif $prev > 0 then $reset = $win - $off end
)lua"},
      // Whether a token bucket of capacity $cap units and time to fill $fs s + $fn ns is
      // past the gateway's narrow range (an expression).
      {"wide", "cap fs fn", gateway_wide_text()},
      // The gateway quick paths' steps (twin/gateway_quick.hpp), one source for the
      // one-level path and the general quick path. scope_ok: the scope key's value $raw
      // (its format byte $fmt, records' end $toff, entries' bytes $tlen) is whole and its
      // entries start with the call's layout $layout (an expression).
      {"scope_ok", "raw fmt toff tlen layout", R"lua(
($fmt == @scope_format() and #$raw == $toff - 1 + $tlen and string.find($raw, $layout, $toff, true) == $toff)
)lua"},
      // A policy the quick paths decide: a token bucket in the narrow range (an
      // expression).
      {"quick_policy", "kind cap fs fn", "($kind == 1 and not @wide($cap, $fs, $fn))"},
      // A record the quick paths decide (an expression): its fields in range, no debt,
      // tokens within [-$cap, $cap] units, the carry below $p, and (failover safety) not
      // older than the node's failover time (the general path reads such a one as spent).
      {"quick_record", "tu tl c lsec lns du dl cap p", R"lua(
($du == 0 and $dl == 0 and $lns <= 999999999 and $tl <= 999999 and $tu >= -$cap and $tu <= $cap and ($tu < $cap or $tl == 0) and $c < $p and not (fsec and ($lsec < fsec or ($lsec == fsec and $lns < fns))))
)lua"},
      // A narrow token bucket's transition: tokens $t micro-units (one number) carrying $c,
      // last time ($lsec, $lns), brought to the call's time (sec, ns) — full past $f2 ns,
      // twice the time to fill, else @refill_narrow up to $capm — then `units` deducted
      // when they fit: $ok 1, else 0 (reads m, p, units; local el).
      {"quick_step", "t c lsec lns capm f2 ok", R"lua(
if sec > $lsec or (sec == $lsec and ns > $lns) then
  if $t < $capm and m > 0 then
    local el = (sec - $lsec) * 1000000000 + ns - $lns
    if el >= $f2 then
      $t, $c = $capm, 0
    else
      @refill_narrow(el, $t, $c, $capm)
    end
  end
  $lsec, $lns = sec, ns
end
$ok = 0
if units >= 1 and units * M6 <= $t then $t = $t - units * M6; $ok = 1 end
)lua"},
      // Writes scope key KEYS[$k] (its value $raw, $cnt records) with its first $j
      // records $v: in place (SETRANGE after the header) when its TTL is kept ($put
      // true), else the whole value with a new header, the TTL set ($put ms) or none
      // (reads now_ms; local e).
      {"quick_write", "k raw cnt j put v", R"lua(
if $put == true then
  redis.call('SETRANGE', KEYS[$k], '10', $v)
else
  local e = 0
  if $put and now_ms then e = now_ms + $put end
  $v = spack(@header_format(), @scope_format(), $cnt, #$raw - 10 - 34 * $cnt, e) .. $v .. string.sub($raw, 11 + 34 * $j)
  if $put then redis.call('SET', KEYS[$k], $v, 'PX', $put) else redis.call('SET', KEYS[$k], $v) end
end
)lua"},
      // The gateway's packed layouts as Lua string literals, and a scope key's format byte
      // (twin/gateway_layout.hpp; expressions).
      {"head_format", "", kGatewayHead.lua()},
      {"policy_format", "", kGatewayPolicy.lua()},
      {"header_format", "", kGatewayScopeHeader.lua()},
      {"record_format", "", kGatewayRecord.lua()},
      {"header_record_format", "",
       kGatewayScopeHeader.lua().substr(0, kGatewayScopeHeader.format.size() + 1) +
           kGatewayRecord.lua().substr(2)},
      {"attempt_format", "", kGatewayAttemptArgs.lua()},
      {"scope_format", "", std::to_string(kGatewayScopeFormat)},
  };
  return macros;
}

}  // namespace quota::redis::detail
