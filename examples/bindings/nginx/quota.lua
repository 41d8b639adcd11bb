-- examples/bindings/nginx/quota.lua — quota's C interface (include/quota/c/quota.h) in
-- nginx through LuaJIT's FFI (Debian's libnginx-mod-http-lua): each worker process opens
-- its own limiter in init_worker_by_lua and decides every request in access_by_lua,
-- answering 429 (with Retry-After, RateLimit and RateLimit-Policy) or 503 itself.
--
-- Trust boundary: the identity decided on is what nginx derived (an API key mapped to a
-- tenant and plan in the config), never a header the client sets; the route class is
-- fixed per location.
--
-- Workers: an in-process store is per worker process, so N workers would each hold the
-- whole budget (N times the limit). quota.check_workers() (init_by_lua) refuses to start
-- nginx with more than one worker on an in-process store; budgets shared by several
-- workers (or hosts) live in Redis.
--
-- Thread safety: nginx workers are single-threaded; each holds its own handle.
--
--   init_by_lua_block { require("quota").check_workers({ store = "memory" }) }
--   init_worker_by_lua_block {
--     limiter = assert(require("quota").open({ rules_path = "/etc/quota/rules.yaml" }))
--   }
--   access_by_lua_block {
--     require("quota").access_vars(limiter, "read", "quota_tenant", "quota_plan")
--   }
local bit = require("bit")
local ffi = require("ffi")

ffi.cdef [[
typedef struct quota_str { const char* data; size_t len; } quota_str;
typedef struct quota_config {
  size_t size; quota_str rules_path; quota_str rules_text; int32_t store; uint32_t opt_out;
  quota_str redis_addresses; quota_str redis_sentinel_master; quota_str redis_username;
  quota_str redis_password; quota_str redis_sentinel_password;
  int64_t redis_deadline_ms; int64_t redis_connections; int64_t max_keys; int32_t mode;
  int64_t redis_replicas; int64_t redis_replica_timeout_ms; int64_t redis_coalesce;
  int64_t redis_coalesce_calls;
} quota_config;
typedef struct quota_request {
  size_t size; quota_str tenant; quota_str plan; quota_str user; quota_str route;
  quota_str attempt_id; uint32_t flags; int64_t cost; int64_t estimate; int64_t now_ns;
} quota_request;
typedef struct quota_decision {
  size_t size; int32_t allowed; int32_t reason; int64_t remaining; int64_t retry_after_ns;
  int64_t reset_after_ns; uint64_t rule_version; uint64_t ticket; int32_t replayed;
  char rule[65]; size_t rule_len; int32_t http_status; int64_t retry_after_s;
  char ratelimit[256]; size_t ratelimit_len; char ratelimit_policy[256];
  size_t ratelimit_policy_len;
} quota_decision;
typedef struct quota_error {
  size_t size; int32_t code; char message[512]; size_t message_len;
} quota_error;
typedef uint64_t quota_handle;
uint32_t quota_abi_version(void);
const char* quota_code_name(int32_t code);
int32_t quota_open(const quota_config* config, quota_handle* out, quota_error* error);
int32_t quota_decide(quota_handle h, const quota_request* request, quota_decision* out,
                     quota_error* error);
int32_t quota_metrics(quota_handle h, char* buffer, size_t capacity, size_t* length,
                      quota_error* error);
int32_t quota_close(quota_handle h, quota_error* error);
]]

local M = {}

local kAbi = 2  -- the QUOTA_ABI_VERSION of the structs above (a later library serves it)
local kRequestCost = 1
local kRequestHttp = 8
local kBufferTooSmall = 6
local kStores = { memory = 0, redis = 1, ["redis-cluster"] = 2, ["redis-sentinel"] = 3 }
local kModes = { blocking = 0, ["non-blocking"] = 1 }
local kOptOut = { restart_safety = 1, failover_safety = 2, clock_guard = 4,
                  eviction_check = 8, breaker = 16 }

-- The library: QUOTA_C_LIBRARY's path, else libquota_c from the loader's path.
local lib = ffi.load(os.getenv("QUOTA_C_LIBRARY") or "quota_c")
if lib.quota_abi_version() < kAbi then
  error("quota: libquota_c has ABI " .. lib.quota_abi_version() .. ", this module needs " .. kAbi
        .. " or later")
end

-- Per worker, reused by every call (a worker runs one request's Lua at a time).
local request = ffi.new("quota_request")
local decision = ffi.new("quota_decision")
local err = ffi.new("quota_error")
err.size = ffi.sizeof("quota_error")
local kRequestSize = ffi.sizeof("quota_request")
local kDecisionSize = ffi.sizeof("quota_decision")

local function set_str(field, s)
  s = s or ""
  field.data = s
  field.len = #s
end

local function failure(code)
  return ffi.string(lib.quota_code_name(code)) .. ": " .. ffi.string(err.message, err.message_len)
end

-- Refuses (raises, so nginx does not start) more than one worker on an in-process store.
function M.check_workers(opts)
  local store = (opts and opts.store) or "memory"
  local workers = ngx.worker.count()
  if store == "memory" and workers > 1 then
    error("quota: worker_processes " .. workers .. " with an in-process store would give each "
          .. "worker its own budgets (" .. workers .. " times every limit); use "
          .. "worker_processes 1, or store = \"redis\" to share them")
  end
end

-- Opens a limiter: opts.rules_path or opts.rules_text; opts.store ("memory", "redis",
-- "redis-cluster", "redis-sentinel"), opts.redis_addresses, opts.redis_sentinel_master,
-- opts.redis_password, opts.redis_deadline_ms, opts.redis_replicas and
-- opts.redis_replica_timeout_ms (WAIT), opts.redis_coalesce and opts.redis_coalesce_calls;
-- opts.mode ("blocking", or "non-blocking": decide never waits on Redis, every rule
-- leased); opts.opt_out, a list of names ("restart_safety", ...). Returns the limiter, or
-- nil and the error.
function M.open(opts)
  local store = kStores[opts.store or "memory"]
  if store == nil then return nil, "quota: unknown store " .. tostring(opts.store) end
  local c = ffi.new("quota_config")
  c.size = ffi.sizeof("quota_config")
  -- The strings stay referenced by `keep` until quota_open returns (it copies them).
  local keep = { opts.rules_path, opts.rules_text, opts.redis_addresses,
                 opts.redis_sentinel_master, opts.redis_password }
  set_str(c.rules_path, keep[1])
  set_str(c.rules_text, keep[2])
  set_str(c.redis_addresses, keep[3])
  set_str(c.redis_sentinel_master, keep[4])
  set_str(c.redis_password, keep[5])
  c.store = store
  c.mode = kModes[opts.mode or "blocking"] or -1  -- an unknown mode: the library's error
  c.redis_deadline_ms = opts.redis_deadline_ms or 0
  c.redis_replicas = opts.redis_replicas or 0
  c.redis_replica_timeout_ms = opts.redis_replica_timeout_ms or 0
  c.redis_coalesce = opts.redis_coalesce or 0
  c.redis_coalesce_calls = opts.redis_coalesce_calls or 0
  for _, name in ipairs(opts.opt_out or {}) do
    local flag = kOptOut[name]
    if flag == nil then return nil, "quota: unknown opt_out " .. tostring(name) end
    c.opt_out = bit.bor(c.opt_out, flag)
  end
  local h = ffi.new("quota_handle[1]")
  local code = lib.quota_open(c, h, err)
  if code ~= 0 then return nil, failure(code) end
  return { handle = h[0] }
end

-- Decides `r` into the worker's `decision` cdata; the code (0: decided), and the error.
local function decide_into(limiter, r)
  request.size = kRequestSize
  set_str(request.tenant, r.tenant)
  set_str(request.plan, r.plan)
  set_str(request.user, r.user)
  set_str(request.route, r.route)
  request.flags = kRequestHttp
  if r.cost then
    request.flags = bit.bor(kRequestHttp, kRequestCost)
    request.cost = r.cost
  end
  decision.size = kDecisionSize
  local code = lib.quota_decide(limiter.handle, request, decision, err)
  if code ~= 0 then return code, failure(code) end
  return 0
end

-- Decides one request: {tenant, plan, route, user, cost}. Returns the decision (a
-- table), or nil and the error.
function M.decide(limiter, r)
  local code, e = decide_into(limiter, r)
  if code ~= 0 then return nil, e end
  return {
    allowed = decision.allowed == 1,
    reason = decision.reason,
    remaining = tonumber(decision.remaining),
    rule = ffi.string(decision.rule, decision.rule_len),
    status = decision.http_status,
    retry_after = tonumber(decision.retry_after_s),
    ratelimit = ffi.string(decision.ratelimit, decision.ratelimit_len),
    policy = ffi.string(decision.ratelimit_policy, decision.ratelimit_policy_len),
  }
end

-- The access phase: 401 without an identity, else decides; an admitted request goes on
-- with its RateLimit headers, a refused one is answered here (429, 503, ...). Once per
-- client request: an internal redirect (an index file, error_page) is not decided again.
-- Reads the decision's fields in place (no table per request).
function M.access(limiter, identity)
  if ngx.req.is_internal() then return end
  if identity.tenant == nil or identity.tenant == "" then return ngx.exit(401) end
  local code, e = decide_into(limiter, identity)
  if code ~= 0 then
    ngx.log(ngx.ERR, e)
    return ngx.exit(500)
  end
  local d = decision
  if d.ratelimit_policy_len > 0 then
    ngx.header["RateLimit-Policy"] = ffi.string(d.ratelimit_policy, d.ratelimit_policy_len)
  end
  if d.ratelimit_len > 0 then ngx.header["RateLimit"] = ffi.string(d.ratelimit, d.ratelimit_len) end
  if d.allowed == 1 then return end
  local status = d.http_status
  if d.retry_after_s >= 0 then ngx.header["Retry-After"] = tonumber(d.retry_after_s) end
  ngx.status = status
  ngx.header["Content-Type"] = "text/plain"
  ngx.say(status == 503 and "rate limit store unavailable" or "over the rate limit")
  return ngx.exit(status)
end

-- The library's QUOTA_ABI_VERSION (one call through the FFI, nothing decided).
function M.abi_version()
  return lib.quota_abi_version()
end

-- access() with the identity in nginx variables, named (what nginx derived: an API key
-- mapped to a tenant and plan): `tenant_var`, `plan_var` and optionally `user_var`. Read
-- here rather than in the access_by_lua block, so that LuaJIT compiles the reads with the
-- decision: read in the block they stay interpreted (lua-resty-core's variable getter
-- aborts the trace it starts) and cost about 3 µs each, as much as the decision itself
-- (docs/benchmarks.md, "nginx with quota.lua").
function M.access_vars(limiter, route, tenant_var, plan_var, user_var)
  local var = ngx.var
  return M.access(limiter, { tenant = var[tenant_var], plan = var[plan_var],
                             user = user_var and var[user_var] or nil, route = route })
end

-- The limiter's counters as Prometheus text.
function M.metrics(limiter)
  local length = ffi.new("size_t[1]")
  local capacity = 4096
  for _ = 1, 8 do
    local buffer = ffi.new("char[?]", capacity)
    local code = lib.quota_metrics(limiter.handle, buffer, capacity, length, err)
    if code == 0 then return ffi.string(buffer, length[0]) end
    if code ~= kBufferTooSmall then return nil, failure(code) end
    capacity = tonumber(length[0]) + 1
  end
  return nil, "quota: metrics kept growing"
end

return M
