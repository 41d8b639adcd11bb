// Package quota decides requests against the quota rate limiter through its C
// interface (include/quota/c/quota.h, the shared library quota_c): a Limiter is opened
// from a rule file or its text and a store (in process, or Redis), then each request is
// decided, all or nothing, against every budget level its route pays.
//
// Thread safety: every method of a Limiter is safe from any goroutine at once. Close
// waits for the calls in flight; later calls return an *Error with code CodeBadHandle.
//
// Build with cgo, the include dir and the library given by the environment:
//
//	CGO_CFLAGS=-I<quota>/include CGO_LDFLAGS="-L<dir> -lquota_c -Wl,-rpath,<dir>" go test
//
// Example (an HTTP handler):
//
//	l, err := quota.Open(quota.Config{RulesPath: "/etc/gateway/rules.yaml"})
//	if err != nil {
//		log.Fatal(err) // an *quota.Error naming file, line and column
//	}
//	defer l.Close()
//	d, err := l.Decide(quota.Request{Tenant: "acme", Plan: "free", Route: "read", HTTP: true})
//	if err == nil && !d.Allowed {
//		w.Header().Set("Retry-After", strconv.FormatInt(d.RetryAfterSeconds, 10))
//		w.WriteHeader(d.HTTPStatus)
//	}
package quota

/*
#include <stdlib.h>
#include "quota/c/quota.h"
*/
import "C"

import (
	"fmt"
	"time"
	"unsafe"
)

const abiVersion = 2 // the QUOTA_ABI_VERSION this package is written for (or later)

// StoreKind is where the budgets are kept (quota_store_kind).
type StoreKind int32

const (
	InProcess     StoreKind = C.QUOTA_STORE_IN_PROCESS    // this process's memory
	Redis         StoreKind = C.QUOTA_STORE_REDIS         // RedisAddresses: "host:port"
	RedisCluster  StoreKind = C.QUOTA_STORE_REDIS_CLUSTER // seed nodes "host:port,host:port"
	RedisSentinel StoreKind = C.QUOTA_STORE_REDIS_SENTINEL
)

// OptOut bits each turn one safety off, by name (QUOTA_OPT_OUT_*); zero keeps them all.
type OptOut uint32

const (
	OptOutRestartSafety  OptOut = C.QUOTA_OPT_OUT_RESTART_SAFETY // budgets start full at Open
	OptOutFailoverSafety OptOut = C.QUOTA_OPT_OUT_FAILOVER_SAFETY
	OptOutClockGuard     OptOut = C.QUOTA_OPT_OUT_CLOCK_GUARD
	OptOutEvictionCheck  OptOut = C.QUOTA_OPT_OUT_EVICTION_CHECK
	OptOutBreaker        OptOut = C.QUOTA_OPT_OUT_BREAKER
)

// Error codes (quota_code) of an *Error.
const (
	CodeInvalidArgument    = int(C.QUOTA_INVALID_ARGUMENT)
	CodeNotFound           = int(C.QUOTA_NOT_FOUND)
	CodeUnavailable        = int(C.QUOTA_UNAVAILABLE)
	CodeFailedPrecondition = int(C.QUOTA_FAILED_PRECONDITION)
	CodeBadHandle          = int(C.QUOTA_BAD_HANDLE)
	CodeResourceExhausted  = int(C.QUOTA_RESOURCE_EXHAUSTED)
	CodeInternal           = int(C.QUOTA_INTERNAL)
)

// Error is a call that failed: its quota_code, the code's name and the library's message.
type Error struct {
	Code    int
	Name    string // "QUOTA_INVALID_ARGUMENT", ...
	Message string
}

func (e *Error) Error() string { return "quota: " + e.Name + ": " + e.Message }

// Config says what Open loads: exactly one of RulesPath and RulesText, and a store.
type Config struct {
	RulesPath, RulesText  string
	Store                 StoreKind
	RedisAddresses        string // "host:port[,host:port...]"
	RedisSentinelMaster   string
	RedisUsername         string
	RedisPassword         string
	RedisSentinelPassword string
	RedisDeadline         time.Duration // each call's deadline, rounded up to ms; 0: 50 ms
	RedisConnections      int64         // per node; 0: 4
	MaxKeys               int64         // in process: keys kept; 0: 1,000,000
	OptOut                OptOut
	NonBlocking           bool // Decide does no network I/O (a Redis store, leased rules)

	// Durability: every write waits (WAIT) for this many replicas, else the route's fail
	// mode; 0: no WAIT. RedisReplicaTimeout: WAIT's timeout, below the deadline; 0: 2 ms.
	RedisReplicas       int64
	RedisReplicaTimeout time.Duration
	// Coalescing: up to RedisCoalesce calls per round trip while RedisCoalesceCalls
	// round trips are in flight; 0: off (calls 0: 2).
	RedisCoalesce      int64
	RedisCoalesceCalls int64
}

// Request is one request of an authenticated identity on a route.
type Request struct {
	Tenant, Plan, User, Route string         // User is optional
	AttemptID                 string         // optional: a retry with the same id is replayed
	Cost                      int64          // 0: not given (the route's cost)
	Estimate                  int64          // 0: not given; else deducted now, settled later
	Now                       *time.Duration // nil: the library's monotonic clock
	HTTP                      bool           // fill the Decision's HTTP answer
}

// Now is the library's monotonic clock: the clock of Request.Now and of a ticket's expiry.
func Now() time.Duration { return time.Duration(C.quota_now_ns()) }

// At is a request time for Request.Now (tests, replays).
func At(t time.Duration) *time.Duration { return &t }

// Decision is what Decide answers; a denial is a decision, not an error.
type Decision struct {
	Allowed           bool
	Reason            string // "allowed", "over_limit", ...
	Remaining         int64
	RetryAfter        time.Duration // denied: when a retry can pass; negative: never
	ResetAfter        time.Duration
	Rule              string
	RuleVersion       uint64
	Ticket            uint64 // an admitted estimate: what Settle takes
	Replayed          bool
	HTTPStatus        int    // with Request.HTTP; else 0
	RetryAfterSeconds int64  // -1: no Retry-After header
	RateLimit         string // header values; empty: no header
	RateLimitPolicy   string
}

// Settlement is what Settle gave back (surplus) or charged (deficit).
type Settlement struct{ Estimate, Actual, Surplus, Deficit int64 }

// Limiter is an open limiter (a quota_handle).
type Limiter struct{ h C.quota_handle }

func newError() C.quota_error { return C.quota_error{size: C.sizeof_quota_error} }

// check turns a code (and the message in e) into an error.
func check(code C.int32_t, e *C.quota_error) error {
	if code == C.QUOTA_OK {
		return nil
	}
	msg := ""
	if e.code == code && e.message_len > 0 {
		msg = C.GoStringN(&e.message[0], C.int(e.message_len))
	}
	return &Error{Code: int(code), Name: C.GoString(C.quota_code_name(code)), Message: msg}
}

// withStrings copies ss into one C allocation, freed after f: cgo forbids passing C a
// struct (in Go memory) that holds Go pointers, so the quota_str fields point to C memory.
func withStrings(ss []string, f func(s []C.quota_str)) {
	total := 0
	for _, s := range ss {
		total += len(s)
	}
	buf := C.malloc(C.size_t(total + 1))
	defer C.free(buf)
	b := unsafe.Slice((*byte)(buf), total+1)
	out := make([]C.quota_str, len(ss))
	off := 0
	for i, s := range ss {
		if len(s) > 0 {
			copy(b[off:], s)
			out[i] = C.quota_str{data: (*C.char)(unsafe.Pointer(&b[off])), len: C.size_t(len(s))}
			off += len(s)
		}
	}
	f(out)
}

// Open loads the rules and reaches the store.
func Open(c Config) (*Limiter, error) {
	if v := C.quota_abi_version(); v < abiVersion {
		return nil, &Error{Code: CodeFailedPrecondition, Name: "QUOTA_FAILED_PRECONDITION",
			Message: fmt.Sprintf("libquota_c's ABI is version %d, this package needs %d or later", v, abiVersion)}
	}
	cfg := C.quota_config{size: C.sizeof_quota_config, store: C.int32_t(c.Store),
		opt_out: C.uint32_t(c.OptOut), redis_connections: C.int64_t(c.RedisConnections),
		max_keys: C.int64_t(c.MaxKeys), redis_replicas: C.int64_t(c.RedisReplicas),
		redis_coalesce: C.int64_t(c.RedisCoalesce), redis_coalesce_calls: C.int64_t(c.RedisCoalesceCalls)}
	cfg.redis_replica_timeout_ms = C.int64_t(c.RedisReplicaTimeout / time.Millisecond)
	if c.RedisReplicaTimeout%time.Millisecond > 0 {
		cfg.redis_replica_timeout_ms++ // up, as the deadline
	}
	if c.NonBlocking {
		cfg.mode = C.QUOTA_MODE_NON_BLOCKING
	}
	cfg.redis_deadline_ms = C.int64_t(c.RedisDeadline / time.Millisecond)
	if c.RedisDeadline%time.Millisecond > 0 {
		cfg.redis_deadline_ms++ // up: 1 ns is 1 ms, not 0 (which means 50 ms)
	}
	var h C.quota_handle
	var code C.int32_t
	e := newError()
	withStrings([]string{c.RulesPath, c.RulesText, c.RedisAddresses, c.RedisSentinelMaster,
		c.RedisUsername, c.RedisPassword, c.RedisSentinelPassword}, func(s []C.quota_str) {
		cfg.rules_path, cfg.rules_text, cfg.redis_addresses, cfg.redis_sentinel_master = s[0], s[1], s[2], s[3]
		cfg.redis_username, cfg.redis_password, cfg.redis_sentinel_password = s[4], s[5], s[6]
		code = C.quota_open(&cfg, &h, &e)
	})
	if err := check(code, &e); err != nil {
		return nil, err
	}
	return &Limiter{h: h}, nil
}

// Decide decides r against every budget level its route pays, all or nothing.
func (l *Limiter) Decide(r Request) (Decision, error) {
	q := C.quota_request{size: C.sizeof_quota_request}
	if r.Cost != 0 {
		q.flags |= C.QUOTA_REQUEST_COST
		q.cost = C.int64_t(r.Cost)
	}
	if r.Estimate != 0 {
		q.flags |= C.QUOTA_REQUEST_ESTIMATE
		q.estimate = C.int64_t(r.Estimate)
	}
	if r.Now != nil {
		q.flags |= C.QUOTA_REQUEST_NOW
		q.now_ns = C.int64_t(*r.Now)
	}
	if r.HTTP {
		q.flags |= C.QUOTA_REQUEST_HTTP
	}
	d := C.quota_decision{size: C.sizeof_quota_decision}
	var code C.int32_t
	e := newError()
	withStrings([]string{r.Tenant, r.Plan, r.User, r.Route, r.AttemptID}, func(s []C.quota_str) {
		q.tenant, q.plan, q.user, q.route, q.attempt_id = s[0], s[1], s[2], s[3], s[4]
		code = C.quota_decide(l.h, &q, &d, &e)
	})
	if err := check(code, &e); err != nil {
		return Decision{}, err
	}
	return Decision{
		Allowed: d.allowed != 0, Reason: C.GoString(C.quota_reason_name(d.reason)), Remaining: int64(d.remaining),
		RetryAfter: time.Duration(d.retry_after_ns), ResetAfter: time.Duration(d.reset_after_ns),
		Rule: C.GoStringN(&d.rule[0], C.int(d.rule_len)), RuleVersion: uint64(d.rule_version),
		Ticket: uint64(d.ticket), Replayed: d.replayed != 0, HTTPStatus: int(d.http_status),
		RetryAfterSeconds: int64(d.retry_after_s),
		RateLimit:         C.GoStringN(&d.ratelimit[0], C.int(d.ratelimit_len)),
		RateLimitPolicy:   C.GoStringN(&d.ratelimit_policy[0], C.int(d.ratelimit_policy_len)),
	}, nil
}

// Settle settles tenant's admitted estimate once, at now[0] if given: the surplus given
// back, a deficit charged. Another tenant's ticket is refused.
func (l *Limiter) Settle(tenant string, ticket uint64, actual int64, now ...time.Duration) (Settlement, error) {
	q := C.quota_settle_request{size: C.sizeof_quota_settle_request,
		ticket: C.uint64_t(ticket), actual: C.int64_t(actual)}
	if len(now) > 0 {
		q.flags = C.QUOTA_REQUEST_NOW
		q.now_ns = C.int64_t(now[0])
	}
	out := C.quota_settlement{size: C.sizeof_quota_settlement}
	e := newError()
	var code C.int32_t
	withStrings([]string{tenant}, func(s []C.quota_str) {
		q.tenant = s[0]
		code = C.quota_settle(l.h, &q, &out, &e)
	})
	if err := check(code, &e); err != nil {
		return Settlement{}, err
	}
	return Settlement{Estimate: int64(out.estimate), Actual: int64(out.actual),
		Surplus: int64(out.surplus), Deficit: int64(out.deficit)}, nil
}

// Reload replaces the rules in force, whole or not at all, from a file (path) or text,
// exactly one; it returns the version now in force.
func (l *Limiter) Reload(path, text string) (uint64, error) {
	var v C.uint64_t
	var code C.int32_t
	e := newError()
	withStrings([]string{path, text}, func(s []C.quota_str) {
		rules := C.quota_rules{size: C.sizeof_quota_rules, path: s[0], text: s[1]}
		code = C.quota_reload(l.h, &rules, &v, &e)
	})
	if err := check(code, &e); err != nil {
		return 0, err
	}
	return uint64(v), nil
}

// Metrics returns the limiter's counters as Prometheus text.
func (l *Limiter) Metrics() (string, error) {
	var buf []byte
	for {
		var p *C.char
		if len(buf) > 0 {
			p = (*C.char)(unsafe.Pointer(&buf[0]))
		}
		var n C.size_t
		e := newError()
		code := C.quota_metrics(l.h, p, C.size_t(len(buf)), &n, &e)
		if code == C.QUOTA_BUFFER_TOO_SMALL {
			buf = make([]byte, int(n)+1+int(n)/8) // room for counters added meanwhile
			continue
		}
		if err := check(code, &e); err != nil {
			return "", err
		}
		return string(buf[:n]), nil
	}
}

// Close closes the limiter once the calls in flight on it have returned.
func (l *Limiter) Close() error {
	e := newError()
	return check(C.quota_close(l.h, &e), &e)
}
