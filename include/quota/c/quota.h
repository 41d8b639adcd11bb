/* quota/c/quota.h — quota's C interface: the gateway layer for hosts that are not C++.
 *
 * A host (an nginx worker through LuaJIT's FFI, Python's ctypes, Go's cgo, a C program)
 * opens a limiter from a rule file (or its text) and a store description, then decides
 * one request per call: the same Gateway, rules and stores as the C++ library
 * (docs/c_interface.md). Link quota::c (shared) or quota::c_static.
 *
 * Contract:
 *   - Plain C99: no C++ in this header; every string is a pointer and a length (need not
 *     end in NUL); every struct the library reads or fills starts with its `size`, set by
 *     the caller to sizeof(the struct) as it was compiled. Versions only add fields at a
 *     struct's end: the library reads and fills the fields the size covers (a field past
 *     it reads as 0, its default), refuses a size below the struct's first version, and
 *     refuses an input struct with a nonzero field it does not know (a host built with a
 *     newer header asking for what this library lacks). A host checks
 *     quota_abi_version() >= the QUOTA_ABI_VERSION it was built with.
 *   - Errors are codes (quota_code) with a message in an optional quota_error; nothing is
 *     thrown across the boundary, no call crashes on bad input (null pointers, a length
 *     that covers a NUL or passes a bound, an unknown route, a cost below 1, a closed
 *     handle), and the library never calls back into the host.
 *   - A denial is a decision, not an error: quota_decide returns QUOTA_OK with
 *     allowed = 0 and the reason (QUOTA_REASON_UNAVAILABLE when the store cannot decide
 *     and the route fails closed).
 *   - Thread safety: every call may be made from any thread at once on one handle.
 *     quota_close waits for the calls in flight on its handle; later calls on it return
 *     QUOTA_BAD_HANDLE (handles are never reused: a generation counter).
 *   - Memory: the caller owns every struct and buffer; the library copies what it keeps.
 *   - Safe by default: a zeroed quota_config keeps every safety of the C++ library on;
 *     QUOTA_OPT_OUT_* bits turn one off by name.
 *
 *   quota_config c = {sizeof c};
 *   c.rules_path = quota_s("/etc/gateway/rules.yaml");
 *   quota_handle h;
 *   quota_error e = {sizeof e};
 *   if (quota_open(&c, &h, &e) != QUOTA_OK) fprintf(stderr, "%s\n", e.message);
 *   quota_request r = {sizeof r};
 *   r.tenant = quota_s("acme"); r.plan = quota_s("free"); r.route = quota_s("read");
 *   quota_decision d = {sizeof d};
 *   if (quota_decide(h, &r, &d, &e) == QUOTA_OK && !d.allowed) answer(d.http_status);
 *   quota_close(h); */
#ifndef QUOTA_C_QUOTA_H
#define QUOTA_C_QUOTA_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define QUOTA_C_API __attribute__((visibility("default")))
#else
#define QUOTA_C_API
#endif

/* The interface this header describes; quota_abi_version() is the library's. Each
 * version only adds (2: quota_config's redis_replicas ... redis_coalesce_calls); the
 * shared library's soname stays libquota_c.so.1. */
#define QUOTA_ABI_VERSION 2u

/* Bounds (the C++ library's): tenant and user ids, plan, route and rule names. Ids and
 * names are bytes of [A-Za-z0-9._@-]; an attempt id, printable ASCII but space. */
#define QUOTA_MAX_ID_BYTES 128u
#define QUOTA_MAX_NAME_BYTES 64u
#define QUOTA_MAX_ATTEMPT_ID_BYTES 128u
#define QUOTA_MAX_RULES_BYTES (4u << 20) /* a rule file or its text */
#define QUOTA_HEADER_BYTES 256u          /* an HTTP header value, with its NUL */
#define QUOTA_MESSAGE_BYTES 512u         /* an error message, with its NUL */

/* A string: `len` bytes at `data` (no NUL needed; none may be inside). data may be
 * NULL only when len is 0 (the empty string, "not given" for optional fields). */
typedef struct quota_str {
  const char* data;
  size_t len;
} quota_str;

/* A NUL-terminated string as a quota_str (NULL gives the empty string). */
static inline quota_str quota_s(const char* s) {
  quota_str out;
  out.data = s;
  out.len = s != NULL ? strlen(s) : 0;
  return out;
}

typedef enum quota_code {
  QUOTA_OK = 0,
  /* A null pointer, a struct size, an unknown flag bit, an id, a cost, a rule file. */
  QUOTA_INVALID_ARGUMENT = 1,
  /* A rule file that does not exist; a ticket the tenant does not have (unknown, long
   * expired, or another tenant's). */
  QUOTA_NOT_FOUND = 2,
  /* The store cannot answer (open; settle's charge); non-blocking: a level that would
   * need it (a decision is given instead where the route's fail mode decides). */
  QUOTA_UNAVAILABLE = 3,
  /* A reload whose version is not newer; a ticket already settled or expired. */
  QUOTA_FAILED_PRECONDITION = 4,
  /* A handle never opened, or closed. */
  QUOTA_BAD_HANDLE = 5,
  /* quota_metrics: *length says how much is needed. */
  QUOTA_BUFFER_TOO_SMALL = 6,
  /* A bound reached: handles open, tickets kept, memory. */
  QUOTA_RESOURCE_EXHAUSTED = 7,
  QUOTA_INTERNAL = 8
} quota_code;

/* Why a decision is what it is (quota::Reason, quota/decision.hpp); quota_reason_name()
 * gives each its name. */
typedef enum quota_reason {
  QUOTA_REASON_ALLOWED = 0,
  QUOTA_REASON_OVER_LIMIT = 1,         /* 429; retry_after */
  QUOTA_REASON_COST_EXCEEDS_BURST = 2, /* 400: can never pass */
  QUOTA_REASON_INVALID_COST = 3,       /* 400 */
  QUOTA_REASON_UNAVAILABLE = 4,        /* 503: the store cannot decide, fail closed */
  QUOTA_REASON_SHADOW = 5,             /* admitted: a shadow rule would have denied */
  QUOTA_REASON_FAIL_OPEN = 6,          /* admitted by the route's emergency bucket */
  QUOTA_REASON_REQUEST_TOO_LARGE = 7,  /* 413: over a per-request cap */
  QUOTA_REASON_ATTEMPT_EXPIRED = 8,    /* 504 */
  QUOTA_REASON_OVER_SHARE = 9,         /* 429: past its fair share of a global budget */
  QUOTA_REASON_PAUSED = 10             /* 429 */
} quota_reason;

typedef enum quota_store_kind {
  QUOTA_STORE_IN_PROCESS = 0,    /* this process's memory (one per handle) */
  QUOTA_STORE_REDIS = 1,         /* redis_addresses: "host:port" */
  QUOTA_STORE_REDIS_CLUSTER = 2, /* redis_addresses: seed nodes "host:port,host:port" */
  QUOTA_STORE_REDIS_SENTINEL = 3 /* redis_addresses: the sentinels; redis_sentinel_master */
} quota_store_kind;

typedef enum quota_mode {
  /* A decision on Redis waits for its round trip (thread-per-request hosts). */
  QUOTA_MODE_BLOCKING = 0,
  /* quota_decide does no network I/O (event-loop hosts): every rule must have
   * `lease: {mode: on}`; each level is decided from the grants this limiter holds, and a
   * thread of the library's (started only in this mode) takes and renews them. A request
   * that finds too little held while its key's grant is under way is denied at once
   * (over_limit, retry after 1 ms): docs/c_interface.md has the bound and its price. */
  QUOTA_MODE_NON_BLOCKING = 1
} quota_mode;

/* quota_config.opt_out: each bit turns one safety off, by name (another bit: an error).
 *   RESTART_SAFETY   in process: budgets start full at open, not spent (a restart of
 *                    the host hands out a fresh burst)
 *   FAILOVER_SAFETY  Redis: a promoted replica's or restarted server's missing buckets
 *                    are not read as spent
 *   CLOCK_GUARD      Redis: no refusal of a server whose clock runs ahead
 *   EVICTION_CHECK   Redis: decide on a server that may evict keys
 *   BREAKER          Redis: no circuit breaker per node */
#define QUOTA_OPT_OUT_RESTART_SAFETY (1u << 0)
#define QUOTA_OPT_OUT_FAILOVER_SAFETY (1u << 1)
#define QUOTA_OPT_OUT_CLOCK_GUARD (1u << 2)
#define QUOTA_OPT_OUT_EVICTION_CHECK (1u << 3)
#define QUOTA_OPT_OUT_BREAKER (1u << 4)

typedef struct quota_config {
  size_t size;          /* sizeof(quota_config) */
  quota_str rules_path; /* a rule file (docs/gateway/rules.md), or ... */
  quota_str rules_text; /* ... its text: exactly one of the two */
  int32_t store;        /* quota_store_kind */
  uint32_t opt_out;     /* QUOTA_OPT_OUT_* */
  quota_str redis_addresses;
  quota_str redis_sentinel_master;
  quota_str redis_username;
  quota_str redis_password;
  quota_str redis_sentinel_password;
  int64_t redis_deadline_ms; /* each call's deadline; 0: 50 ms */
  int64_t redis_connections; /* per node; 0: 4 */
  int64_t max_keys;          /* in process: keys kept; 0: 1,000,000 */
  int32_t mode;              /* quota_mode (non-blocking: a Redis store) */
  /* ABI 2. Durability: every write waits (WAIT) until this many replicas acknowledged
   * it, else the decision is the route's fail mode; 0: no WAIT. */
  int64_t redis_replicas;
  int64_t redis_replica_timeout_ms; /* WAIT's timeout, below the deadline; 0: 2 ms */
  /* Coalescing, for a host with many threads: while redis_coalesce_calls round trips
   * are in flight, further calls go together, up to redis_coalesce per round trip (each
   * still its own atomic script call); 0 or 1: off. */
  int64_t redis_coalesce;
  int64_t redis_coalesce_calls; /* 0: 2 */
} quota_config;

/* quota_request.flags (another bit: an error) */
#define QUOTA_REQUEST_COST (1u << 0)     /* `cost` is set: what this request costs */
#define QUOTA_REQUEST_ESTIMATE (1u << 1) /* `estimate` is set: deducted now, settled later */
#define QUOTA_REQUEST_NOW (1u << 2)      /* `now_ns` is set: decide at that time */
#define QUOTA_REQUEST_HTTP (1u << 3)     /* fill the decision's HTTP answer */

/* One request. The identity is what the host authenticated (an API key's tenant and
 * plan), never a value a client sent unchecked: budgets are keyed on it. */
typedef struct quota_request {
  size_t size; /* sizeof(quota_request) */
  quota_str tenant;
  quota_str plan;
  quota_str user;       /* optional: enables user-level rules */
  quota_str route;      /* a route class of the rule file */
  quota_str attempt_id; /* optional: a retry with the same id replays the decision */
  uint32_t flags;       /* QUOTA_REQUEST_* */
  int64_t cost;         /* whole units >= 1, with QUOTA_REQUEST_COST */
  int64_t estimate;     /* whole units >= 1, with QUOTA_REQUEST_ESTIMATE (not with a cost) */
  int64_t now_ns;       /* with QUOTA_REQUEST_NOW, on quota_now_ns()'s clock */
} quota_request;

typedef struct quota_decision {
  size_t size; /* sizeof(quota_decision) */
  int32_t allowed;
  int32_t reason;                      /* quota_reason */
  int64_t remaining;                   /* whole units left at the tightest level */
  int64_t retry_after_ns;              /* denied: when a retry can pass (-1: never); admitted: 0 */
  int64_t reset_after_ns;              /* until the budgets are full again */
  uint64_t rule_version;               /* the version of the rule set that decided */
  uint64_t ticket;                     /* an admitted estimate: what quota_settle takes; else 0 */
  int32_t replayed;                    /* an attempt's first decision, replayed */
  char rule[QUOTA_MAX_NAME_BYTES + 1]; /* the deciding rule's name, NUL-terminated */
  size_t rule_len;
  /* With QUOTA_REQUEST_HTTP (quota/http.hpp's table): the status to answer, the
   * Retry-After seconds (-1: no header), and the RateLimit and RateLimit-Policy header
   * values (NUL-terminated; empty: no header). Without it: 0, -1 and empty. */
  int32_t http_status;
  int64_t retry_after_s;
  char ratelimit[QUOTA_HEADER_BYTES];
  size_t ratelimit_len;
  char ratelimit_policy[QUOTA_HEADER_BYTES];
  size_t ratelimit_policy_len;
} quota_decision;

/* quota_settle: the actual cost of an admitted estimate. */
typedef struct quota_settle_request {
  size_t size;      /* sizeof(quota_settle_request) */
  quota_str tenant; /* the tenant the estimate was decided for: another's ticket is refused */
  uint64_t ticket;
  int64_t actual; /* whole units >= 0 */
  uint32_t flags; /* QUOTA_REQUEST_NOW only */
  int64_t now_ns;
} quota_settle_request;

typedef struct quota_settlement {
  size_t size; /* sizeof(quota_settlement) */
  int64_t estimate;
  int64_t actual;
  int64_t surplus; /* given back: max(0, estimate - actual) */
  int64_t deficit; /* charged: max(0, actual - estimate) */
} quota_settlement;

/* quota_reload's new rules: a file or its text, exactly one. */
typedef struct quota_rules {
  size_t size; /* sizeof(quota_rules) */
  quota_str path;
  quota_str text;
} quota_rules;

/* Filled when given and its size covers this version's struct. */
typedef struct quota_error {
  size_t size;  /* sizeof(quota_error) */
  int32_t code; /* quota_code */
  /* NUL-terminated; a longer message is cut at a UTF-8 character's start. */
  char message[QUOTA_MESSAGE_BYTES];
  size_t message_len;
} quota_error;

/* A handle on an open limiter; 0 is never one. */
typedef uint64_t quota_handle;

/* The library's QUOTA_ABI_VERSION: a host built against a newer one refuses to run. */
QUOTA_C_API uint32_t quota_abi_version(void);

/* "QUOTA_OK", "QUOTA_INVALID_ARGUMENT", ...; "QUOTA_UNKNOWN_CODE" otherwise. */
QUOTA_C_API const char* quota_code_name(int32_t code);

/* "allowed", "over_limit", ... (quota/http.hpp's reason strings); "unknown" otherwise. */
QUOTA_C_API const char* quota_reason_name(int32_t reason);

/* The library's monotonic clock: the time of a request without QUOTA_REQUEST_NOW, and
 * the clock a host's own times (and a ticket's expiry) are on. */
QUOTA_C_API int64_t quota_now_ns(void);

/* Opens a limiter: the rules loaded and checked (an error names file, line, column and
 * field), the store reached (Redis: one probe decision, or QUOTA_UNAVAILABLE). */
QUOTA_C_API int32_t quota_open(const quota_config* config, quota_handle* out, quota_error* error);

/* Decides `request` against every budget level its route pays, all or nothing. An
 * error deducts nothing. */
QUOTA_C_API int32_t quota_decide(quota_handle h, const quota_request* request, quota_decision* out,
                                 quota_error* error);

/* Settles an admitted estimate once: the surplus given back, a deficit charged. */
QUOTA_C_API int32_t quota_settle(quota_handle h, const quota_settle_request* request,
                                 quota_settlement* out, quota_error* error);

/* Replaces the rules in force with a whole, valid new set, or not at all. Its version:
 * the file's `version:` (newer than the one in force, else QUOTA_FAILED_PRECONDITION)
 * or, without one, the next. *version (optional) is the version now in force. */
QUOTA_C_API int32_t quota_reload(quota_handle h, const quota_rules* rules, uint64_t* version,
                                 quota_error* error);

/* The limiter's counters as Prometheus text into buffer[0, capacity); *length is the
 * text's length (without the NUL written after it). QUOTA_BUFFER_TOO_SMALL when
 * capacity <= *length: nothing written; call again with more (the text may have grown
 * meanwhile: loop). */
QUOTA_C_API int32_t quota_metrics(quota_handle h, char* buffer, size_t capacity, size_t* length,
                                  quota_error* error);

/* Closes the limiter once the calls in flight on it have returned (non-blocking: its
 * thread stopped, grants in flight abandoned: they expire at the authority). */
QUOTA_C_API int32_t quota_close(quota_handle h, quota_error* error);

#ifdef __cplusplus
}
#endif

#endif /* QUOTA_C_QUOTA_H */
