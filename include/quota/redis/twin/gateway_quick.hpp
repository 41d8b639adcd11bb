// quota/redis/twin/gateway_quick.hpp — the gateway twin's quick path: a decision whose
// levels are all token buckets in the narrow range, in few instructions.
//
// Most decisions are that: every level a token bucket within kGatewayRange's narrow
// bounds, its record under the caller's policy and rule-set version, without debt, not
// older than the node's failover time (failover safety), no attempt. kGatewayQuickLua
// decides such a call before twin/gateway.hpp's
// general path, with that path's steps that apply (no conversion, no debt, one kind), on
// the tokens as one number of micro-units (below 2^53 in the narrow range: the refill is
// the shared @refill_narrow, the time to reach kLuaReach), and allocates little (every
// table and string a call makes is work for the server's Lua collector). It answers in a
// compact form — {time s, time ns, −levels decided, then per level: allowed, tokens in
// micro-units, carry over p} — from which GatewayTwin::parse_decide derives the reason,
// remaining, retry_after and reset_after with TokenBucket's own arithmetic, as the
// general path computes them. Each key is written in place (SETRANGE of its records
// after the header) while its TTL is kept; when the TTL must be set, with its whole
// value, which takes every record of the key decided now. Whenever any of this does not
// hold (a key that is not in the call's layout, a record out of range or with debt, a
// wide policy, another kind, a TTL to set over records not decided, a record older than
// the node's failover time under failover safety), nothing is written and the general
// path decides the call from the start: the same decision, more instructions.
// tests/redis/redis_gateway_differential_test.cpp and the rule-sets differential test run both
// paths against the in-process gateway. Spliced at
// `--@@ quick` (detail::gateway_body), after the keys are read (`raws`), on the head's
// locals. Immutable text: thread-safe.
//
// A key's TTL here is the longest time to full of its records, bounded from above with
// one floating division (at most 2 ms more than the general path's exact one), plus the
// margin: never below the idle time plus the margin.
#pragma once

namespace quota::redis {

// The quick path of the commonest call, one level in one key (n = 1, nk = 1): the steps
// of kGatewayQuickLua below (the same macros: @scope_ok, @quick_policy, @quick_record,
// @quick_step, @quick_write), on locals only — the header and the first record read in
// one struct.unpack, no table but the reply — so that a one-limit decision costs about
// what a single-policy script does. Spliced at `--@@ quick_one`, before the general
// path's functions and tables are made; a call it does not answer goes on to
// kGatewayQuickLua's checks and then the general path, nothing written.
inline constexpr const char* kGatewayQuickOneLua = R"lua(
if decide and not att and n == 1 and nk == 1 and raw1 and #raw1 >= 44 then
  local fmt, cnt, tlen, exp, tu, tl, c, lsec, lns, du, dl = sunpack(@header_record_format(), raw1)
  local toff = 11 + 34 * cnt
  if cpos then units = sunpack('<i8', head, cpos) end
  local kind, cap, m, p, g, fs, fn = sunpack(@policy_format(), ARGV[2])
  if @scope_ok(raw1, fmt, toff, tlen, ARGV[4]) and @quick_policy(kind, cap, fs, fn) and
      @quick_record(tu, tl, c, lsec, lns, du, dl, cap, p) then
    local capm, t = cap * M6, tu * M6 + tl
    @quick_step(t, c, lsec, lns, capm, 2 * (fs * 1000000000 + fn), local ok)
    @ttl_bound(local need, t, c, capm)
    @ttl_put(local put, need, exp, true)
    if put == true or cnt == 1 then
      @mod(tl, t, 1000000)
      tu = (t - tl) / M6
      local v = spack(RF, tu, tl, c, lsec, lns, 0, 0)
      @quick_write(1, raw1, cnt, 1, put, v)
      return {sec, ns, -1, ok, t, c}
    end
  end
end
)lua";

inline constexpr const char* kGatewayQuickLua = R"lua(
if decide and not att and (n > 1 or nk > 1) then
  -- Q: per key, 7 values (one flat table; every table and string a call makes is work for
  -- the server's Lua collector): its value, records, expiry as last set, the levels of it
  -- met, the TTL its levels need (ms from now; false: none), its first level, its TTL to
  -- put (true: keep; ms: set; false: none).
  local Q, quick = {false, 0, 0, 0, 0, 0, false}, true
  for k = 1, nk do
    local raw = raws[k]
    if not raw or type(raw) ~= 'string' or #raw < 10 then quick = false; break end
    local fmt, cnt, tlen, exp = sunpack(@header_format(), raw)
    local toff = 11 + 34 * cnt
    if not @scope_ok(raw, fmt, toff, tlen, ARGV[2 + n + k]) then
      quick = false
      break
    end
    local b = 7 * k
    Q[b - 6], Q[b - 5], Q[b - 4], Q[b - 3], Q[b - 2], Q[b - 1], Q[b] = raw, cnt, exp, 0, 0, 0, false
  end
  -- R: per level, its packed record (R[i]), the units it deducted (R[n + i]) and the TTL it
  -- needs (R[2n + i]; ms from now, false: none)
  local R, last, denied
  if n == 1 then R = {false, false, false} else
    R = {false, false, false, false, false, false, false, false, false}
  end
  last, denied = 0, false
  local spol, m, p, cap, capm, f2
  for i = 1, n do
    if not quick then break end
    local pol = ARGV[1 + i]
    if cpos then units = sunpack('<i8', head, cpos + 8 * (i - 1)) end
    if pol ~= spol then
      spol = pol
      local kind, g, fs, fn
      kind, cap, m, p, g, fs, fn = sunpack(@policy_format(), pol)
      if not @quick_policy(kind, cap, fs, fn) then
        quick = false
        break
      end
      -- twice the time to fill, ns, and the capacity, micro-units (each below 2^53)
      f2, capm = 2 * (fs * 1000000000 + fn), cap * M6
    end
    local b = 7
    if nk > 1 then b = 7 * string.byte(kmap, i) end
    local j = Q[b - 3] + 1
    Q[b - 3] = j
    if j == 1 then Q[b - 1] = i end
    local tu, tl, c, lsec, lns, du, dl = sunpack(RF, Q[b - 6], 11 + 34 * (j - 1))
    -- (a record older than the failover time is read as spent: the general path's)
    if not @quick_record(tu, tl, c, lsec, lns, du, dl, cap, p) then
      quick = false
      break
    end
    local t = tu * M6 + tl
    @quick_step(t, c, lsec, lns, capm, f2, local ok)
    local took = ok * units
    local k = 3 * i
    res[3] = -i
    res[k + 1], res[k + 2], res[k + 3] = ok, t, c
    -- the TTL it needs (ms from now; false: none)
    @ttl_bound(local need, t, c, capm)
    @mod(tl, t, 1000000)
    tu = (t - tl) / M6
    R[i], R[n + i], R[2 * n + i] = spack(RF, tu, tl, c, lsec, lns, 0, 0), took, need
    last = i
    if ok == 0 and string.byte(head, 53 + i) ~= 49 then denied = true; break end
  end
  if quick and denied then
    -- the levels allowed before the denial get their deduction back
    for i = 1, last - 1 do
      local took = R[n + i]
      if took > 0 then
        local tu, tl, c, lsec, lns = sunpack(RF, R[i])
        local _, cap, m, p = sunpack('<BI5I7I7', ARGV[1 + i])
        tu = tu + took
        R[i] = spack(RF, tu, tl, c, lsec, lns, 0, 0)
        local t, capm = tu * M6 + tl, cap * M6
        @ttl_bound(R[2 * n + i], t, c, capm)
      end
    end
  end
  -- Each key's TTL: the longest its levels need; kept while the expiry as last set covers
  -- it, else set with the whole value, which takes every record decided now (else the
  -- general path).
  for i = 1, last do
    if not quick then break end
    local b = 7
    if nk > 1 then b = 7 * string.byte(kmap, i) end
    local need, x = Q[b - 2], R[2 * n + i]
    if not x then need = false elseif need and x > need then need = x end
    Q[b - 2] = need
  end
  for k = 1, nk do
    if not quick then break end
    local b = 7 * k
    local exp, j, need = Q[b - 4], Q[b - 3], Q[b - 2]
    if j > 0 then
      @ttl_put(local put, need, exp, true)
      if put ~= true and j < Q[b - 5] then quick = false; break end
      Q[b] = put
    end
  end
  if quick then
    for k = 1, nk do
      local b = 7 * k
      local j, put = Q[b - 3], Q[b]
      if j > 0 then
        -- the records of key k's levels, in order (its levels are its first j records)
        local v
        if nk == 1 then
          v = table.concat(R, '', 1, j)
        else
          local parts, r = {}, 0
          for i = Q[b - 1], last do
            if string.byte(kmap, i) == k then r = r + 1; parts[r] = R[i] end
          end
          v = table.concat(parts)
        end
        @quick_write(k, Q[b - 6], Q[b - 5], j, put, v)
      end
    end
    for k = 3 * last + 4, 6 * n + 3 do res[k] = nil end
    return res
  end
end
)lua";

}  // namespace quota::redis
