// quota/redis/twin/gateway_settle.hpp — the gateway twin's refund and charge.
//
// The Lua of ops 'r' (gateway::refund) and 'c' (gateway::charge) of kGatewayLua
// (twin/gateway.hpp), one level's state at a time, bit-identical to key_state.hpp's:
// a refund pays the debt first, then gives back to the tokens (capped at the burst) or
// takes units off what counted them (the fixed window's current window; the estimate's
// current or previous one, the log's newest events at or before the time they were
// spent: twin/gateway_windows.hpp); a charge pays from the budget present and keeps the
// rest as debt (negative tokens, or KeyState::debt for the window kinds), capped at the
// capacity. Each sets the reply's micro-units (res[i + 2]): given back, or left as debt.
// The text stands where twin/gateway.hpp's loop has `--@@ refund` and `--@@ charge`
// (detail::gateway_body), on the loop's locals (the state's fields, units, has_spent and
// the spent time ssec, sns). Immutable text: thread-safe.
//
//   // EVALSHA <kGatewayLua> 1 "quota:gw:{acme}read" <head: op 'r', units 3, spent at t,
//   //   1 level, 1 key> <policy> "\1" <layout> → {time s, time ns, micro-units given back}
#pragma once

namespace quota::redis {

// Refund: give `units` (at most 3·capacity + 2: more gives back nothing more).
inline constexpr const char* kGatewayRefundLua = R"lua(
    local gu, gl = units, 0
    if gu > 3 * cap + 2 then gu = 3 * cap + 2 end
    -- first to the debt (bu + bl), then to the tokens or the count (nu + nl)
    local bu, bl, nu, nl = du, dl, 0, 0
    if du > gu or (du == gu and dl > 0) then bu, bl = gu, 0 end
    @lsub(du, dl, bu, bl)
    @lsub(gu, gl, bu, bl)
    if kind == 1 then
      nu, nl = cap, 0
      @lsub(nu, nl, tu, tl)
      if nu > gu or (nu == gu and nl > gl) then nu, nl = gu, gl end
      @ladd(tu, tl, nu, nl)
      if tu == cap and tl == 0 then c = 0 end
    elseif kind == 4 then  -- windows
      tu, c, nu = est_refund(m, p, g, tu, c, gu, has_spent ~= 1, ssec, sns, lsec, lns)
    elseif kind == 3 then
      nu = log_take_back(key, lg, gu, has_spent ~= 1, ssec, sns)
      tu = tu - nu; lg.base = tu
    else
      -- only units spent in the current window come back
      local inw = has_spent ~= 1
      if not inw then
        local w, mode = m, p
        @window_start(local st, lsec, lns)
        @in_window(inw, st, lsec, ssec, sns)
      end
      if inw then
        -- (gu: floor(give / 10^6))
        nu = gu
        if nu > tu then nu = tu end
        tu = tu - nu
      end
    end
    @ladd(nu, nl, bu, bl)
    @micros(res[i + 2], nu, nl)
)lua";

// Charge: `units` now (at most 2·capacity + 1: more leaves no more debt).
inline constexpr const char* kGatewayChargeLua = R"lua(
    local u = units
    if u > 2 * cap + 1 then u = 2 * cap + 1 end
    local vu, vl = 0, 0
    if kind == 1 then
      -- owed before (bu + bl): max(-tokens, 0); after: max(tokens - u, -capacity)
      local bu, bl = 0, 0
      if tu < 0 then
        @lsub(bu, bl, tu, tl)
      end
      tu = tu - u
      if tu < -cap then tu, tl = -cap, 0 end
      if tu >= cap then c = 0 end
      -- (after >= 0 only when nothing was owed before)
      if tu < 0 then
        @lsub(vu, vl, tu, tl)
        @lsub(vu, vl, bu, bl)
      end
    else
      local bu, bl = du, dl
      du = du + u
      local wc = cap
      if kind == 4 then wc = tu + win_room(kind, cap, m, p, fs, fn, tu, c, lsec, lns) end
      @window_pay(tu, du, dl, wc)
      if du > cap or (du == cap and dl > 0) then du, dl = cap, 0 end
      if bu < du or (bu == du and bl < dl) then
        vu, vl = du, dl
        @lsub(vu, vl, bu, bl)
      end
    end
    @micros(res[i + 2], vu, vl)
)lua";

}  // namespace quota::redis
