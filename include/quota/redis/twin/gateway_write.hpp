// quota/redis/twin/gateway_write.hpp — how the gateway twin reads its scope keys, ends a
// level and writes the keys.
//
// The Lua that twin/gateway.hpp's general path splices into its text
// (detail::gateway_body): kGatewayReadLua reads each scope key (checked, and parsed by
// name when its entries are not the call's layout); kGatewayWriteLua ends each level
// (its time until fresh — reset_after in a decision's reply — the TTL it needs, its record
// packed into the table P); kGatewayScopesLua runs once the loop is done: the give-back
// of a denial (the levels allowed before it, their deduction undone: what the in-process
// give-back leaves), then each key's TTL and value, then every write. kGatewayResetLua
// (the time until a state equals a fresh one) and the two range checks of a stored
// record are shared by the level, the give-back and the records a call does not decide.
// Immutable text: thread-safe.
//
// Guarantees (twin/gateway.hpp states the format): a scope key's TTL is the longest idle
// time plus the margin its records need — none while one holds debt, or for a rate-0
// bucket that is not full (a one-off budget must not come back); it is kept (SETRANGE of
// the header and the records, or SET KEEPTTL) while the expiry as last set covers it with
// 10 ms to spare, else set, one margin more for a busy key, never below what it was;
// with the caller's time it is set on every write. Nothing is written before every key
// of the call is decided and checked (a record found out of range writes nothing), but
// for a sliding log's refund, which rewrites its list at once (log_take_back). A
// sliding log's list follows its key's TTL (its own plus 1 ms), also when another record
// of the key sets it.
#pragma once

namespace quota::redis {

// The scope keys read: each key's stored value checked (format, length) and, when its
// stored entries do not start with the call's own (its layout argument), parsed by name
// (the general path); S[k] holds what the loop and the writes need of key k.
inline constexpr const char* kGatewayReadLua = R"lua(
-- A scope's stored entries (name, rule-set version, policy per record), parsed: the
-- general path, when they do not start with the call's own.
local function scope_parse(s)
  local raw, at, stop = s.raw, s.toff, #s.raw + 1
  local ents, map = {}, {}
  for r = 1, s.cnt do
    local nl = string.byte(raw, at)
    if not nl or nl > 64 or at + 43 + nl > stop then
      return corrupt(s.key, 'entry ' .. r .. ' out of range')
    end
    local name = string.sub(raw, at + 1, at + nl)
    if map[name] then return corrupt(s.key, 'entry ' .. r .. ' repeats a name') end
    local ver, id = sunpack('<I7c35', raw, at + 1 + nl)
    ents[r] = {name, ver, id, at, 43 + nl}
    map[name] = r
    at = at + 43 + nl
  end
  if at ~= stop then return corrupt(s.key, 'bytes after the entries') end
  s.ents, s.map = ents, map
end
-- The names of the call's own entries of a scope (its layout argument).
local function lay_names(s)
  local lay, at, cn = s.lay, 1, {}
  while at <= #lay do
    local nl = string.byte(lay, at)
    cn[#cn + 1] = string.sub(lay, at + 1, at + nl)
    at = at + 43 + nl
  end
  s.cn = cn
  return cn
end
-- S[k]: key k's scope: its stored value (raw), records (cnt), the expiry as last set (exp:
-- server ms; 0 none or unknown), where its entries start (toff); ents and map when the
-- general path reads it; j the levels of it met so far, lv[r] the level of record r.
local S = {}
for k = 1, nk do
  local key = KEYS[k]
  local raw = raws[k]
  if not raw and nk > 1 then raw = redis.pcall('GET', key) end
  -- (every field in the constructor: a table that grows is rehashed)
  local s = {key = key, lay = ARGV[2 + n + k], j = 0, cnt = 0, exp = 0, lv = {false, false, false},
    raw = false, toff = 11, ncnt = 0, ents = false, map = false, cn = false, v = false,
    put = false, fast = false, lists = false}
  if raw then
    if type(raw) ~= 'string' then return corrupt(key, 'wrong type') end
    local len, fmt, cnt, tlen, exp = #raw, 0, 0, 0, 0
    if len >= 10 then fmt, cnt, tlen, exp = sunpack(@header_format(), raw) end
    if fmt ~= @scope_format() or len ~= 10 + 34 * cnt + tlen then
      return corrupt(key, len .. ' bytes, not a scope of ' .. cnt .. ' records')
    end
    s.raw, s.cnt, s.exp, s.toff = raw, cnt, exp, 11 + 34 * cnt
    if string.find(raw, s.lay, s.toff, true) ~= s.toff then
      local err = scope_parse(s)
      if err then return err end
    end
  else
    s.ents, s.map, s.toff = {}, {}, 11
  end
  s.ncnt = s.cnt
  S[k] = s
end
)lua";

// The time from the last time until the state equals a fresh one: rs s + rn ns (rs -1:
// never). On the state's locals; `lg` a log's events (twin/gateway_windows.hpp).
inline constexpr const char* kGatewayResetLua = R"lua(
if kind == 1 then
  @reach(rs, rn, tu, tl, c, cap)
elseif kind >= 3 then  -- windows
  rs, rn = win_reset(kind, m, p, tu, c, lsec, lns, lg)
elseif tu ~= 0 then
  local w, mode = m, p
  @to_next(rs, rn, lsec, lns)
end
)lua";

// A stored policy other than the caller's (kind, cap, m, p, g, fs, fn) is well formed.
inline constexpr const char* kGatewayPolicyCheckLua = R"lua(
local pok = cap >= 1 and cap <= 1000000000000 and m <= 9007199254740991 and
  fs <= 100000000 and fn <= 999999999
if kind == 1 then
  pok = pok and p >= 1 and p <= 9007199254740991 and g >= 1 and g <= 9007199254740991
elseif kind >= 3 then  -- windows
  pok = pok and windows() and win_policy_ok(kind, m, p, g, fs, fn)
else
  pok = pok and kind == 2 and m >= 1 and ((p == 1 and fs * 1000000000 + fn == m) or
    (p == 2 and fs == m and fn == 0))
end
if not pok then return corrupt(key, 'field out of range') end
)lua";

// A stored record (ver, tu, tl, c, lns, du, dl) is in range for its policy.
inline constexpr const char* kGatewayStateCheckLua = R"lua(
local sok = ver <= 9007199254740991 and lns <= 999999999 and tl <= 999999 and
  dl <= 999999 and (du < cap or (du == cap and dl == 0)) and
  ((kind == 1 and tu >= -cap and (tu < cap or (tu == cap and tl == 0)) and c < p) or
    (kind == 2 and tu >= 0 and tu <= cap and tl == 0 and c == 0) or
    (kind >= 3 and windows() and win_state_ok(kind, cap, tu, tl, c)))  -- windows
if not sok then return corrupt(key, 'field out of range') end
)lua";

// The end of a level: its time until fresh, the TTL it needs, its record kept in P.
inline constexpr const char* kGatewayWriteLua = R"lua(
  local rs, rn = 0, 0
  --@@ reset
  if decide then
    @dur(res[6 * i + 2], rs, rn)
  end
  -- the TTL it needs, ms from now (false: none: debt, or never fresh)
  local need = false
  if du == 0 and dl == 0 and rs >= 0 then
    @ceil_ms2(need, lsec - sec + rs, lns - ns + rn)
  end
  local b = 9 * i
  P[b - 8], P[b - 7], P[b - 6], P[b - 5], P[b - 4] = s, spack(RF, tu, tl, c, lsec, lns, du, dl),
    need, took, lg or false
  P[b - 3], P[b - 2], P[b - 1], P[b] = ver, id, name, key
  last = i
)lua";

// After the loop: the give-back, each scope's TTL and value (checked, nothing written
// yet), then the writes.
inline constexpr const char* kGatewayScopesLua = R"lua(
-- A denial that is not shadow: the levels allowed before it get their deduction back.
if denied then
  for i = 1, last - 1 do
    local b = 9 * i
    local took = P[b - 5]
    if took > 0 then
      local tu, tl, c, lsec, lns, du, dl = sunpack(RF, P[b - 7])
      local kind, cap, m, p, g, fs, fn = sunpack(@policy_format(), P[b - 2])
      local wide = @wide(cap, fs, fn)
      local lg = P[b - 4] or nil
      if kind == 1 then tu = tu + took else tu = tu - took end
      local rs, rn = 0, 0
      --@@ reset
      local need = false
      if du == 0 and dl == 0 and rs >= 0 then
        @ceil_ms2(need, lsec - sec + rs, lns - ns + rn)
      end
      P[b - 7], P[b - 6] = spack(RF, tu, tl, c, lsec, lns, du, dl), need
    end
  end
end
if decide then
  for k = 6 * last + 4, 6 * n + 3 do res[k] = nil end
end
-- Each scope key decided: its TTL (put: true keep, ms set, false none) and value.
for k = 1, nk do
  local s = S[k]
  if s.j > 0 then
    local fast = not s.ents
    -- The longest TTL its records need from now (false: none); logs: a level decided has
    -- a log (its list is written with the key, so the TTL is set anew).
    local need, logs = 0, false
    for r = 1, s.ncnt do
      local i = s.lv[r]
      if i then
        local b = 9 * i
        local x = P[b - 6]
        if x == false then need = false elseif need and x > need then need = x end
        if P[b - 4] then logs = true end
      elseif need and (s.exp == 0 or not now_ms) then
        -- a record not decided now, its expiry unknown: what it needs, checked
        if not s.ents then
          local err = scope_parse(s)
          if err then return err end
        end
        local key, en = s.key, s.ents[r]
        local ver, id = en[2], en[3]
        local tu, tl, c, lsec, lns, du, dl = sunpack(RF, s.raw, 11 + 34 * (r - 1))
        local kind, cap, m, p, g, fs, fn = sunpack(@policy_format(), id)
        --@@ policy_check
        --@@ state_check
        local wide = @wide(cap, fs, fn)
        local rs, rn = 0, 0
        if kind == 3 then
          -- (its events not read: a window from its last time covers them)
          if tu > 0 then rn = m end
        else
          local lg
          --@@ reset
        end
        if du > 0 or dl > 0 or rs < 0 then
          need = false
        else
          @ceil_ms2(local x, lsec - sec + rs, lns - ns + rn)
          if x > need then need = x end
        end
      end
    end
    @ttl_put(local put, need, s.exp, not logs)
    local e = 0
    if put == true then e = s.exp elseif put and now_ms then e = now_ms + put end
    local recs, v = {}
    if fast then
      -- the call's records are the first s.j; the rest and the entries as stored
      v = spack(@header_format(), @scope_format(), s.cnt, #s.raw + 1 - s.toff, e)
      if s.j == 1 then
        v = v .. P[9 * s.lv[1] - 7]
      else
        for r = 1, s.j do recs[r] = P[9 * s.lv[r] - 7] end
        v = v .. table.concat(recs)
      end
      if put ~= true then v = v .. string.sub(s.raw, 11 + 34 * s.j) end
    else
      local ents = {}
      for r = 1, s.ncnt do
        local i = s.lv[r]
        if i then
          local b = 9 * i
          local nm = P[b - 1]
          recs[r] = P[b - 7]
          ents[r] = spack('<B', #nm) .. nm .. spack('<I7', P[b - 3]) .. P[b - 2]
        else
          recs[r] = string.sub(s.raw, 11 + 34 * (r - 1), 10 + 34 * r)
          local en = s.ents[r]
          ents[r] = string.sub(s.raw, en[4], en[4] + en[5] - 1)
        end
      end
      local tail = table.concat(ents)
      if s.ncnt > 255 or #tail > 65535 then
        return redis.error_reply('QUOTA_SCOPE_FULL key ' .. s.key .. ' would hold ' .. s.ncnt ..
          ' limits (' .. #tail .. ' bytes of entries); at most 255 (65535 bytes)')
      end
      v = spack(@header_format(), @scope_format(), s.ncnt, #tail, e) .. table.concat(recs) .. tail
    end
    s.v, s.put, s.fast = v, put, fast
    -- the lists of logs not decided now follow the key's TTL when it is set anew
    if put ~= true and s.raw then
      if not s.ents then
        local err = scope_parse(s)
        if err then return err end
      end
      for r = 1, s.cnt do
        local en = s.ents[r]
        if not s.lv[r] and string.byte(en[3], 1) == 3 then
          s.lists = s.lists or {}
          s.lists[#s.lists + 1] = s.key .. '#' .. en[1] .. '}l'
        end
      end
    end
  end
end
-- The writes: each scope key, then the logs' lists.
for k = 1, nk do
  local s = S[k]
  if s.v then
    local put = s.put
    if put == true then
      if s.fast then redis.call('SETRANGE', s.key, '0', s.v) else redis.call('SET', s.key, s.v, 'KEEPTTL') end
    elseif put then
      redis.call('SET', s.key, s.v, 'PX', put)
    else
      redis.call('SET', s.key, s.v)
    end
    local px = nil
    if put ~= true and put then px = put end
    for _, lkey in ipairs(s.lists or {}) do
      if px then redis.call('PEXPIRE', lkey, px + 1) else redis.call('PERSIST', lkey) end
    end
  end
end
for i = 1, last do
  local b = 9 * i
  local lg = P[b - 4]
  if lg then
    local s = P[b - 8]
    local tu, tl, c, lsec, lns = sunpack(RF, P[b - 7])
    local px = nil
    if s.put ~= true and s.put then px = s.put end
    log_write(P[b], lg, string.byte(P[b - 2], 1), tu, lsec, lns, px)  -- windows
  end
end
)lua";

}  // namespace quota::redis
