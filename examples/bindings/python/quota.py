"""quota.py - Python's ctypes over quota's C interface (include/quota/c/quota.h).

A Limiter opens the shared library's limiter from a rule file (or its text) and a store,
then decides one request per call; a denial is a Decision, every error code a QuotaError
(code, name, message). The library is the file named by $QUOTA_C_LIBRARY, else
ctypes.util.find_library("quota_c"); its quota_abi_version() must be at least 2.

Thread safety: every call may be made from any thread at once on one Limiter (ctypes
releases the GIL; the library is thread-safe). close() closes the handle once: later
calls raise QuotaError BAD_HANDLE, a second close() does nothing.

    with quota.Limiter(rules_path="rules.yaml") as limiter:
        d = limiter.decide("acme", "free", "read", http=True)
        if not d.allowed:
            answer(d.http_status, retry_after=d.retry_after_s)
"""
import ctypes
import ctypes.util
import dataclasses
import os
import threading

ABI_VERSION = 2  # the header's QUOTA_ABI_VERSION these structs follow
(OK, INVALID_ARGUMENT, NOT_FOUND, UNAVAILABLE, FAILED_PRECONDITION, BAD_HANDLE,
 BUFFER_TOO_SMALL, RESOURCE_EXHAUSTED, INTERNAL) = range(9)
STORES = {"memory": 0, "redis": 1, "redis-cluster": 2, "redis-sentinel": 3}
OPT_OUTS = {"restart_safety": 1 << 0, "failover_safety": 1 << 1, "clock_guard": 1 << 2,
            "eviction_check": 1 << 3, "breaker": 1 << 4}
MODES = {"blocking": 0, "non-blocking": 1}
_COST, _ESTIMATE, _NOW, _HTTP = 1 << 0, 1 << 1, 1 << 2, 1 << 3  # QUOTA_REQUEST_*
_MAX_NAME_BYTES, _HEADER_BYTES, _MESSAGE_BYTES = 64, 256, 512
_METRICS_GUESS = 4096  # quota_metrics' first buffer; grown when too small

c_size_t, c_int32, c_uint32, c_int64, c_uint64 = (
    ctypes.c_size_t, ctypes.c_int32, ctypes.c_uint32, ctypes.c_int64, ctypes.c_uint64)


class QuotaStr(ctypes.Structure):
    _fields_ = [("data", ctypes.c_char_p), ("len", c_size_t)]


class QuotaConfig(ctypes.Structure):
    _fields_ = [("size", c_size_t), ("rules_path", QuotaStr), ("rules_text", QuotaStr),
                ("store", c_int32), ("opt_out", c_uint32), ("redis_addresses", QuotaStr),
                ("redis_sentinel_master", QuotaStr), ("redis_username", QuotaStr),
                ("redis_password", QuotaStr), ("redis_sentinel_password", QuotaStr),
                ("redis_deadline_ms", c_int64), ("redis_connections", c_int64),
                ("max_keys", c_int64), ("mode", c_int32),
                # ABI 2
                ("redis_replicas", c_int64), ("redis_replica_timeout_ms", c_int64),
                ("redis_coalesce", c_int64), ("redis_coalesce_calls", c_int64)]


class QuotaRequest(ctypes.Structure):
    _fields_ = [("size", c_size_t), ("tenant", QuotaStr), ("plan", QuotaStr),
                ("user", QuotaStr), ("route", QuotaStr), ("attempt_id", QuotaStr),
                ("flags", c_uint32), ("cost", c_int64), ("estimate", c_int64),
                ("now_ns", c_int64)]


class QuotaDecision(ctypes.Structure):
    _fields_ = [("size", c_size_t), ("allowed", c_int32), ("reason", c_int32),
                ("remaining", c_int64), ("retry_after_ns", c_int64),
                ("reset_after_ns", c_int64), ("rule_version", c_uint64), ("ticket", c_uint64),
                ("replayed", c_int32), ("rule", ctypes.c_char * (_MAX_NAME_BYTES + 1)),
                ("rule_len", c_size_t), ("http_status", c_int32), ("retry_after_s", c_int64),
                ("ratelimit", ctypes.c_char * _HEADER_BYTES), ("ratelimit_len", c_size_t),
                ("ratelimit_policy", ctypes.c_char * _HEADER_BYTES),
                ("ratelimit_policy_len", c_size_t)]


class QuotaSettleRequest(ctypes.Structure):
    _fields_ = [("size", c_size_t), ("tenant", QuotaStr), ("ticket", c_uint64),
                ("actual", c_int64), ("flags", c_uint32), ("now_ns", c_int64)]


class QuotaSettlement(ctypes.Structure):
    _fields_ = [("size", c_size_t), ("estimate", c_int64), ("actual", c_int64),
                ("surplus", c_int64), ("deficit", c_int64)]


class QuotaRules(ctypes.Structure):
    _fields_ = [("size", c_size_t), ("path", QuotaStr), ("text", QuotaStr)]


class QuotaErrorStruct(ctypes.Structure):
    _fields_ = [("size", c_size_t), ("code", c_int32),
                ("message", ctypes.c_char * _MESSAGE_BYTES), ("message_len", c_size_t)]


def _new(struct_type):
    """A zeroed struct with its `size` set, as the header asks."""
    s = struct_type()
    s.size = ctypes.sizeof(struct_type)
    return s


def _load():
    path = os.environ.get("QUOTA_C_LIBRARY") or ctypes.util.find_library("quota_c")
    if not path:
        raise ImportError("quota: libquota_c not found; set QUOTA_C_LIBRARY to its path")
    try:
        lib = ctypes.CDLL(path)
        version = lib.quota_abi_version
    except (OSError, AttributeError) as e:
        raise ImportError(f"quota: cannot load the C interface from {path}: {e}") from e
    version.restype, version.argtypes = c_uint32, []
    if version() < ABI_VERSION:
        raise ImportError(f"quota: {path} has ABI version {version()}, this module needs "
                          f"{ABI_VERSION} or later")
    P, E = ctypes.POINTER, ctypes.POINTER(QuotaErrorStruct)
    for name, args in {
            "quota_open": [P(QuotaConfig), P(c_uint64), E],
            "quota_decide": [c_uint64, P(QuotaRequest), P(QuotaDecision), E],
            "quota_settle": [c_uint64, P(QuotaSettleRequest), P(QuotaSettlement), E],
            "quota_reload": [c_uint64, P(QuotaRules), P(c_uint64), E],
            "quota_metrics": [c_uint64, ctypes.c_char_p, c_size_t, P(c_size_t), E],
            "quota_close": [c_uint64, E]}.items():
        getattr(lib, name).restype, getattr(lib, name).argtypes = c_int32, args
    for name in ("quota_code_name", "quota_reason_name"):
        getattr(lib, name).restype, getattr(lib, name).argtypes = ctypes.c_char_p, [c_int32]
    lib.quota_now_ns.restype, lib.quota_now_ns.argtypes = c_int64, []
    return lib


_lib = _load()


def now_ns():
    """The library's monotonic clock: the clock of every now_ns given to it."""
    return _lib.quota_now_ns()


class QuotaError(Exception):
    """A call's code other than QUOTA_OK: code (an int), name ("QUOTA_..."), message."""

    def __init__(self, code, message):
        self.code, self.message = code, message
        self.name = _lib.quota_code_name(code).decode()
        super().__init__(f"{self.name}: {message}")


def _check(code, err):
    if code != OK:
        # The library cuts the message at a byte bound, maybe inside a UTF-8 sequence.
        raise QuotaError(code, err.message[:err.message_len].decode("utf-8", "replace"))


def _str(value, keep):
    """A quota_str over value's UTF-8 bytes; `keep` holds them until the call returns."""
    if value is None:
        return QuotaStr(None, 0)
    data = value if isinstance(value, bytes) else str(value).encode("utf-8")
    keep.append(data)
    return QuotaStr(data, len(data))


@dataclasses.dataclass(frozen=True)
class Decision:
    allowed: bool
    reason: str                  # quota_reason_name(): "over_limit", ...
    remaining: int
    retry_after_ns: int | None   # None: never
    reset_after_ns: int
    rule: str
    rule_version: int
    ticket: int                  # an admitted estimate's, for settle(); else 0
    replayed: bool
    http_status: int             # with http=True; else 0
    retry_after_s: int | None    # None: no Retry-After header
    ratelimit: str               # "": no header
    ratelimit_policy: str


@dataclasses.dataclass(frozen=True)
class Settlement:
    estimate: int
    actual: int
    surplus: int
    deficit: int


class Limiter:
    """One quota_handle: rules, a store and the gateway on it. Close it (or use `with`)."""

    def __init__(self, *, rules_path=None, rules_text=None, store="memory",
                 redis_addresses=None, redis_sentinel_master=None, redis_username=None,
                 redis_password=None, redis_sentinel_password=None, redis_deadline_ms=0,
                 redis_connections=0, redis_replicas=0, redis_replica_timeout_ms=0,
                 redis_coalesce=0, redis_coalesce_calls=0, max_keys=0, opt_out=frozenset(),
                 mode="blocking"):
        if store not in STORES:
            raise ValueError(f"store: {store!r}, one of {sorted(STORES)}")
        if mode not in MODES:
            raise ValueError(f"mode: {mode!r}, one of {sorted(MODES)}")
        if unknown := set(opt_out) - OPT_OUTS.keys():
            raise ValueError(f"opt_out: unknown {sorted(unknown)}, known {sorted(OPT_OUTS)}")
        keep, c, err = [], _new(QuotaConfig), _new(QuotaErrorStruct)
        c.rules_path, c.rules_text = _str(rules_path, keep), _str(rules_text, keep)
        c.store, c.opt_out = STORES[store], sum(OPT_OUTS[n] for n in set(opt_out))
        c.redis_addresses = _str(redis_addresses, keep)
        c.redis_sentinel_master = _str(redis_sentinel_master, keep)
        c.redis_username, c.redis_password = _str(redis_username, keep), _str(redis_password, keep)
        c.redis_sentinel_password = _str(redis_sentinel_password, keep)
        c.redis_deadline_ms, c.redis_connections = redis_deadline_ms, redis_connections
        c.redis_replicas, c.redis_replica_timeout_ms = redis_replicas, redis_replica_timeout_ms
        c.redis_coalesce, c.redis_coalesce_calls = redis_coalesce, redis_coalesce_calls
        c.max_keys, c.mode = max_keys, MODES[mode]
        handle = c_uint64(0)
        self._closed, self._lock = False, threading.Lock()
        _check(_lib.quota_open(ctypes.byref(c), ctypes.byref(handle), ctypes.byref(err)), err)
        self._handle = handle.value

    def decide(self, tenant, plan, route, *, user=None, cost=None, estimate=None,
               attempt_id=None, now_ns=None, http=False):
        keep, r = [], _new(QuotaRequest)
        r.tenant, r.plan, r.route = _str(tenant, keep), _str(plan, keep), _str(route, keep)
        r.user, r.attempt_id = _str(user, keep), _str(attempt_id, keep)
        r.flags = ((_COST if cost is not None else 0) | (_ESTIMATE if estimate is not None else 0)
                   | (_NOW if now_ns is not None else 0) | (_HTTP if http else 0))
        r.cost, r.estimate, r.now_ns = cost or 0, estimate or 0, now_ns or 0
        d, err = _new(QuotaDecision), _new(QuotaErrorStruct)
        _check(_lib.quota_decide(self._handle, ctypes.byref(r), ctypes.byref(d),
                                 ctypes.byref(err)), err)
        return Decision(
            allowed=bool(d.allowed),
            reason=_lib.quota_reason_name(d.reason).decode(),
            remaining=d.remaining,
            retry_after_ns=None if d.retry_after_ns == -1 else d.retry_after_ns,
            reset_after_ns=d.reset_after_ns, rule=d.rule[:d.rule_len].decode(),
            rule_version=d.rule_version, ticket=d.ticket, replayed=bool(d.replayed),
            http_status=d.http_status,
            retry_after_s=None if d.retry_after_s == -1 else d.retry_after_s,
            ratelimit=d.ratelimit[:d.ratelimit_len].decode(),
            ratelimit_policy=d.ratelimit_policy[:d.ratelimit_policy_len].decode())

    def settle(self, tenant, ticket, actual, *, now_ns=None):
        keep = []
        r, out, err = _new(QuotaSettleRequest), _new(QuotaSettlement), _new(QuotaErrorStruct)
        r.tenant, r.ticket, r.actual = _str(tenant, keep), ticket, actual
        r.flags, r.now_ns = (_NOW, now_ns) if now_ns is not None else (0, 0)
        _check(_lib.quota_settle(self._handle, ctypes.byref(r), ctypes.byref(out),
                                 ctypes.byref(err)), err)
        return Settlement(out.estimate, out.actual, out.surplus, out.deficit)

    def reload(self, path=None, text=None):
        """Replaces the rules from a file or text (exactly one); the version in force."""
        keep, rules, version, err = [], _new(QuotaRules), c_uint64(0), _new(QuotaErrorStruct)
        rules.path, rules.text = _str(path, keep), _str(text, keep)
        _check(_lib.quota_reload(self._handle, ctypes.byref(rules), ctypes.byref(version),
                                 ctypes.byref(err)), err)
        return version.value

    def metrics(self):
        """The counters as Prometheus text."""
        capacity, length, err = _METRICS_GUESS, c_size_t(0), _new(QuotaErrorStruct)
        while True:
            buffer = ctypes.create_string_buffer(capacity)
            code = _lib.quota_metrics(self._handle, buffer, capacity, ctypes.byref(length),
                                      ctypes.byref(err))
            if code != BUFFER_TOO_SMALL:
                _check(code, err)
                return buffer.raw[:length.value].decode("utf-8", "replace")
            capacity = length.value + 1 + length.value // 8  # the text may grow meanwhile

    def close(self):
        with self._lock:
            if self._closed:
                return
            self._closed = True
        err = _new(QuotaErrorStruct)
        _check(_lib.quota_close(self._handle, ctypes.byref(err)), err)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
