// quota/redis/twin/gateway_write.hpp — how the gateway twin writes a level's state.
//
// The Lua that ends each level of kGatewayLua (twin/gateway.hpp)'s loop: the time until
// the state equals a fresh one (reset_after in a decision's reply, and the TTL), the TTL
// to keep or set, the 80-byte state packed, and its write. In 'd' with several levels, a
// level allowed before the last is kept in the flat table P (4 values: the packed state,
// its TTL, the units it deducted, the expiry it had) and written once the last level is
// decided — without its deduction when that level denied (what the in-process give-back
// leaves): such a state, or a sliding log's (its list is written with it), is unpacked
// from P and its TTL worked out again. 'r' and 'c' write their one level at once.
// The text stands where twin/gateway.hpp's loop has `--@@ write` (detail::gateway_body),
// on the loop's locals (the state's fields, `put`, `expiry`, `denied`, `took`, `lg`, `res`,
// `att`). Immutable text: thread-safe.
//
// Guarantees (twin/gateway.hpp states the format): a key's TTL is its idle time plus the
// margin — none while it holds debt, or for a rate-0 bucket that is not full (a one-off
// budget must not come back); it is kept (SETRANGE, the expiry as last set read from the
// state) while that expiry covers it with 10 ms to spare, else set, one margin more for a
// busy key; with the caller's time it is set on every write.
//
//   -- the last level decided: each level's state written, last to first, then
//   -- return res  (the levels decided, 6 values each)
#pragma once

namespace quota::redis {

// The writes of one level (and, 'd', of the levels kept before it); see above.
inline constexpr const char* kGatewayWriteLua =
    R"lua(  -- Time from the last time until the state equals a fresh one, rs s + rn ns (rs -1:
  -- never): reset_after, and the TTL.
  local rs, rn = 0, 0
  if kind == 1 then
    @reach(rs, rn, tu, tl, c, cap)
  elseif kind >= 3 then  -- windows
    rs, rn = win_reset(kind, m, p, tu, c, lsec, lns, lg)
  elseif tu ~= 0 then
    local w, mode = m, p
    @to_next(rs, rn, lsec, lns)
  end
  if decide then
    @dur(res[6 * i + 2], rs, rn)
  end
  -- 'd': a level allowed before the last one is written once the last is decided (P).
  local pend = decide and i < n and not denied
  -- Writes this level (or keeps it in P), then ('d', the last level decided) the ones
  -- before it: each as kept in P, or, when it was given back or is a log (its list is
  -- written with it), its state unpacked from P and its TTL worked out again.
  local j, v, put = i
  while true do
    if not v then
      -- The TTL (see above): none with debt or when never fresh (rs -1); else keep the one
      -- set earlier (put true), or set one (put: its ms). `o`: the expiry as stored.
      if lg then expiry = 0 end  -- windows: a log's TTL is set anew, with its list's
      local o = 0
      put = false
      if du == 0 and dl == 0 and rs >= 0 then
        @ceil_ms2(local ttl, lsec - sec + rs, lns - ns + rn)
        ttl = ttl + margin
        if now_ms then
          local base = lsec * 1000 + (lns - lns % M6) / M6
          if expiry >= now_ms + ttl + 10 then
            o = expiry - base
            put = o >= 1 and o <= MAXOFF
          end
          if not put then
            put = ttl
            if expiry >= now_ms + ttl - margin then put = ttl + margin end
            o = now_ms + put - base
            if o < 1 or o > MAXOFF then o = 0 end
          end
        else
          put = ttl
        end
      end
      v = spack('<I7i6I3I7i6I4I5I3I4c35', ver, tu, tl, c, lsec, lns + 1073741824, du, dl, o, id)
    end
    if pend then
      if lg then LG = LG or {}; LG[i] = lg end  -- windows
      if i == 1 then
        -- (sized for three levels: a table that grows is rehashed)
        P = {v, put, took, expiry, 0, 0, 0, 0}
      else
        local b = 4 * i
        P[b - 3], P[b - 2], P[b - 1], P[b] = v, put, took, expiry
      end
      break
    end
    local key = KEYS[j]
    if lg then
      local px = nil
      if put ~= true and put then px = put end
      log_write(key, lg, kind, tu, lsec, lns, px)  -- windows
    end
    if put == true then
      -- (an 80-byte state, its expiry read from it) overwritten in place, TTL kept
      redis.call('SETRANGE', key, '0', v)
    elseif put then
      redis.call('SET', key, v, 'PX', put)
    else
      redis.call('SET', key, v)
    end
    if not decide then break end
    j = j - 1
    if j < 1 then
      for k = 6 * i + 4, 6 * n + 3 do res[k] = nil end
      -- the record is final when this call decides the request's last levels or denied
      if att then attempt_close(att, res, att.last == 1 or denied, now_ms) end
      return res
    end
    local b = 4 * j
    v, put, took, expiry = P[b - 3], P[b - 2], P[b - 1], P[b]
    lg = LG and LG[j]  -- windows
    if lg or (denied and took > 0) then
      ver, tu, tl, c, lsec, lns, du, dl, off, id = sunpack('<I7i6I3I7i6I4I5I3I4c35', v)
      lns = lns - 1073741824
      kind, cap, m, p, g, fs, fn = sunpack('<BI5I7I7I7I4I4', id)
      wide = cap > 2000000000 or fs > 4000000 or (fs == 4000000 and fn > 0)
      if denied and took > 0 then
        -- given back: the state as before the deduction
        if kind == 1 then tu = tu + took else tu = tu - took end
      end
      rs, rn = 0, 0
      if kind == 1 then
        @reach(rs, rn, tu, tl, c, cap)
      elseif kind >= 3 then  -- windows
        rs, rn = win_reset(kind, m, p, tu, c, lsec, lns, lg)
      elseif tu ~= 0 then
        local w, mode = m, p
        @to_next(rs, rn, lsec, lns)
      end
      v = nil
    end
  end
)lua";

}  // namespace quota::redis
