package quota_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"quota.example/quota"
)

// rules are tests/c/rules.yaml ($QUOTA_C_TEST_RULES): the rules of every test of the C
// interface.
var rules = func() string {
	path := os.Getenv("QUOTA_C_TEST_RULES")
	if path == "" {
		path = "../../../tests/c/rules.yaml"
	}
	text, err := os.ReadFile(path)
	if err != nil {
		panic(err)
	}
	return string(text)
}()

// open opens the rules above in process, budgets full at time 0 (exact counts).
func open(t *testing.T) *quota.Limiter {
	t.Helper()
	l, err := quota.Open(quota.Config{RulesText: rules, OptOut: quota.OptOutRestartSafety})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { _ = l.Close() })
	return l
}

func req(tenant, plan, route string) quota.Request {
	return quota.Request{Tenant: tenant, Plan: plan, Route: route, Now: quota.At(0)}
}

func decide(t *testing.T, l *quota.Limiter, r quota.Request) quota.Decision {
	t.Helper()
	d, err := l.Decide(r)
	if err != nil {
		t.Fatalf("Decide(%+v): %v", r, err)
	}
	return d
}

// wantError checks that err is an *quota.Error of code `code` whose message holds each of `parts`.
func wantError(t *testing.T, err error, code int, parts ...string) {
	t.Helper()
	var e *quota.Error
	if !errors.As(err, &e) {
		t.Fatalf("got %v, want an *quota.Error with code %d", err, code)
	}
	if e.Code != code {
		t.Fatalf("got %v (code %d), want code %d", e, e.Code, code)
	}
	if !strings.HasPrefix(e.Name, "QUOTA_") || !strings.Contains(e.Error(), e.Name) {
		t.Errorf("name %q, Error() %q", e.Name, e.Error())
	}
	for _, p := range parts {
		if !strings.Contains(e.Message, p) {
			t.Errorf("message %q does not contain %q", e.Message, p)
		}
	}
}

func TestDecideUntilDenied(t *testing.T) {
	l := open(t)
	r := req("acme", "free", "read")
	r.HTTP = true
	var d quota.Decision
	for i := int64(0); i < 3; i++ {
		d = decide(t, l, r)
		if !d.Allowed || d.Reason != "allowed" || d.Remaining != 2-i || d.HTTPStatus != 200 ||
			d.RetryAfterSeconds != -1 {
			t.Fatalf("call %d: %+v", i, d)
		}
	}
	if d.Rule != "free-read" || d.RuleVersion != 1 {
		t.Errorf("rule %q version %d", d.Rule, d.RuleVersion)
	}
	if d.RateLimitPolicy != `"free-read";q=3;w=300` {
		t.Errorf("RateLimit-Policy %q", d.RateLimitPolicy)
	}
	if !strings.HasPrefix(d.RateLimit, `"free-read";r=0`) {
		t.Errorf("RateLimit %q", d.RateLimit)
	}

	d = decide(t, l, r)
	if d.Allowed || d.Reason != "over_limit" || d.Remaining != 0 || d.RetryAfter != 100*time.Second ||
		d.HTTPStatus != 429 || d.RetryAfterSeconds != 100 {
		t.Fatalf("4th call: %+v", d)
	}
	// One unit back after 100 s.
	r.Now = quota.At(100 * time.Second)
	if d = decide(t, l, r); !d.Allowed || d.Remaining != 0 {
		t.Fatalf("at 100 s: %+v", d)
	}
	if d = decide(t, l, r); d.Allowed || d.RetryAfter != 100*time.Second {
		t.Fatalf("at 100 s, again: %+v", d)
	}

	// Another tenant has its own budget; without HTTP no answer is made.
	d = decide(t, l, req("other", "free", "read"))
	if !d.Allowed || d.Remaining != 2 || d.HTTPStatus != 0 || d.RateLimit != "" || d.RateLimitPolicy != "" {
		t.Fatalf("other tenant: %+v", d)
	}
}

func TestCost(t *testing.T) {
	l := open(t)
	r := req("acme", "free", "chat")
	r.Cost = 40
	if d := decide(t, l, r); !d.Allowed || d.Remaining != 60 {
		t.Fatalf("cost 40: %+v", d)
	}
	r.Cost = 61
	if d := decide(t, l, r); d.Allowed || d.Reason != "over_limit" || d.Remaining != 60 {
		t.Fatalf("cost 61: %+v", d)
	}
	r.Cost = 101
	if d := decide(t, l, r); d.Allowed || d.Reason != "cost_exceeds_burst" {
		t.Fatalf("cost 101: %+v", d)
	}
	r.Cost = -5
	_, err := l.Decide(r)
	wantError(t, err, quota.CodeInvalidArgument, "cost: -5")
	r.Cost, r.Estimate = 0, -1
	_, err = l.Decide(r)
	wantError(t, err, quota.CodeInvalidArgument, "estimate: -1")
	r.Cost, r.Estimate = 2, 2
	_, err = l.Decide(r)
	wantError(t, err, quota.CodeInvalidArgument, "at most one")
	// Nothing above was deducted by the errors.
	if d := decide(t, l, req("acme", "free", "chat")); d.Remaining != 59 {
		t.Fatalf("after the errors: %+v", d)
	}
}

func TestEstimateAndSettle(t *testing.T) {
	l := open(t)
	r := req("acme", "free", "chat")
	r.Estimate = 30
	d := decide(t, l, r)
	if !d.Allowed || d.Remaining != 70 || d.Ticket == 0 {
		t.Fatalf("estimate 30: %+v", d)
	}
	// Another tenant's ticket: refused, nothing settled.
	_, err := l.Settle("other", d.Ticket, 12, 0)
	wantError(t, err, quota.CodeNotFound, "no such ticket of tenant")
	s, err := l.Settle("acme", d.Ticket, 12, 0)
	if err != nil || s != (quota.Settlement{Estimate: 30, Actual: 12, Surplus: 18, Deficit: 0}) {
		t.Fatalf("Settle: %+v, %v", s, err)
	}
	// Settled once: again is an error, and nothing more comes back.
	_, err = l.Settle("acme", d.Ticket, 12, 0)
	wantError(t, err, quota.CodeFailedPrecondition, "already settled")
	if d = decide(t, l, req("acme", "free", "chat")); d.Remaining != 87 { // 100 - 12 - 1
		t.Fatalf("after settling: %+v", d)
	}
	// A deficit: charged.
	r.Estimate = 10
	d = decide(t, l, r)
	if s, err = l.Settle("acme", d.Ticket, 15, 0); err != nil || s.Deficit != 5 || s.Surplus != 0 {
		t.Fatalf("deficit: %+v, %v", s, err)
	}
	_, err = l.Settle("acme", 987654321, 1, 0)
	wantError(t, err, quota.CodeNotFound)
	_, err = l.Settle("acme", 987654321, -1, 0)
	wantError(t, err, quota.CodeInvalidArgument, "actual")
}

func TestAttemptReplayed(t *testing.T) {
	l := open(t)
	r := req("acme", "free", "read")
	r.AttemptID = "req-1"
	if d := decide(t, l, r); !d.Allowed || d.Remaining != 2 || d.Replayed {
		t.Fatalf("first: %+v", d)
	}
	if d := decide(t, l, r); !d.Allowed || d.Remaining != 2 || !d.Replayed {
		t.Fatalf("replayed: %+v", d)
	}
	r.AttemptID = "req-2"
	if d := decide(t, l, r); d.Remaining != 1 || d.Replayed {
		t.Fatalf("another attempt: %+v", d)
	}
}

func TestReload(t *testing.T) {
	l := open(t)
	r := req("acme", "free", "read")
	if d := decide(t, l, r); d.Remaining != 2 || d.RuleVersion != 1 {
		t.Fatalf("v1: %+v", d)
	}
	next := strings.Replace(strings.Replace(rules, "version: 1", "version: 2", 1),
		"burst: 3}", "burst: 5}", 1)
	if v, err := l.Reload("", next); err != nil || v != 2 {
		t.Fatalf("Reload: %d, %v", v, err)
	}
	// Burst 5 from where v1 was: no burst handed out.
	if d := decide(t, l, r); !d.Allowed || d.RuleVersion != 2 || d.Remaining != 1 {
		t.Fatalf("v2: %+v", d)
	}
	bad := "version: 3\nroutes:\n  - name: read\nrules:\n  - name: x\n    level: tenant\n" +
		"    plan: free\n    route: read\n    token_bucket: {rate: 1/s, burst: -4}\n"
	_, err := l.Reload("", bad)
	wantError(t, err, quota.CodeInvalidArgument, "rules:9:", "burst")
	_, err = l.Reload("", rules)
	wantError(t, err, quota.CodeFailedPrecondition)
	_, err = l.Reload("", "")
	wantError(t, err, quota.CodeInvalidArgument, "exactly one")
	_, err = l.Reload("/x", next)
	wantError(t, err, quota.CodeInvalidArgument, "exactly one")
	if d := decide(t, l, r); d.RuleVersion != 2 {
		t.Fatalf("after refused reloads: %+v", d)
	}
}

func TestMetrics(t *testing.T) {
	l := open(t)
	decide(t, l, req("acme", "free", "read"))
	text, err := l.Metrics()
	if err != nil {
		t.Fatal(err)
	}
	want := `quota_decisions_total{rule="free-read",route="read",level="tenant",outcome="allowed"} 1`
	if !strings.Contains(text, want+"\n") {
		t.Fatalf("metrics lack %s:\n%s", want, text)
	}
	if strings.IndexByte(text, 0) >= 0 {
		t.Fatal("metrics hold a NUL")
	}
}

func TestRuleFiles(t *testing.T) {
	path := filepath.Join(t.TempDir(), "rules.yaml")
	if err := os.WriteFile(path, []byte(rules), 0o600); err != nil {
		t.Fatal(err)
	}
	l, err := quota.Open(quota.Config{RulesPath: path})
	if err != nil {
		t.Fatalf("Open(%s): %v", path, err)
	}
	if err = l.Close(); err != nil {
		t.Fatal(err)
	}
	// A bad file: its name, line and column in the message.
	bad := "version: 1\nroutes:\n  - name: read\nrules:\n  - name: x\n    levle: tenant\n"
	if err = os.WriteFile(path, []byte(bad), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err = quota.Open(quota.Config{RulesPath: path})
	wantError(t, err, quota.CodeInvalidArgument, path, ":6:")
	if err = os.Remove(path); err != nil {
		t.Fatal(err)
	}
	_, err = quota.Open(quota.Config{RulesPath: path})
	wantError(t, err, quota.CodeNotFound)
	_, err = quota.Open(quota.Config{RulesPath: path, RulesText: rules})
	wantError(t, err, quota.CodeInvalidArgument, "exactly one")
	_, err = quota.Open(quota.Config{})
	wantError(t, err, quota.CodeInvalidArgument, "exactly one")
	_, err = quota.Open(quota.Config{RulesText: rules, Store: 42})
	wantError(t, err, quota.CodeInvalidArgument, "store")
}

func TestUnreachableStore(t *testing.T) {
	// Nothing listens on port 1.
	_, err := quota.Open(quota.Config{RulesText: rules, Store: quota.Redis, RedisAddresses: "127.0.0.1:1"})
	wantError(t, err, quota.CodeUnavailable, "cannot decide")
	_, err = quota.Open(quota.Config{RulesText: rules, Store: quota.Redis, RedisAddresses: "127.0.0.1"})
	wantError(t, err, quota.CodeInvalidArgument, "redis_addresses")
}

func TestDurabilityOptions(t *testing.T) {
	// ABI 2's fields reach the library: WAIT asked of an in-process store is refused by name.
	_, err := quota.Open(quota.Config{RulesText: rules, RedisReplicas: 1})
	wantError(t, err, quota.CodeInvalidArgument, "redis_replicas: 1, but the store is in process")
	_, err = quota.Open(quota.Config{RulesText: rules, Store: quota.Redis, RedisAddresses: "127.0.0.1:1",
		RedisReplicas: 1, RedisReplicaTimeout: 80 * time.Millisecond})
	wantError(t, err, quota.CodeInvalidArgument, "below the call's deadline")
}

func TestRestartSafetyByDefault(t *testing.T) {
	l, err := quota.Open(quota.Config{RulesText: rules})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	d := decide(t, l, quota.Request{Tenant: "acme", Plan: "free", Route: "read"}) // library's clock
	if d.Allowed || d.Reason != "over_limit" {
		t.Fatalf("a limiter opened now starts spent: %+v", d)
	}
}

func TestBadRequests(t *testing.T) {
	l := open(t)
	for _, c := range []struct {
		r    quota.Request
		want string
	}{
		{req("acme", "free", "write"), "write"},
		{req("", "free", "read"), "tenant: empty"},
		{req("acme\x00xy", "free", "read"), "NUL byte at offset 4"},
		{req(strings.Repeat("a", 129), "free", "read"), "tenant"},
		{req("acme", "", "read"), "plan: empty"},
	} {
		_, err := l.Decide(c.r)
		wantError(t, err, quota.CodeInvalidArgument, c.want)
	}
	// Nothing above was deducted.
	if d := decide(t, l, req("acme", "free", "read")); !d.Allowed || d.Remaining != 2 {
		t.Fatalf("after the errors: %+v", d)
	}
}

func TestClosed(t *testing.T) {
	l, err := quota.Open(quota.Config{RulesText: rules, OptOut: quota.OptOutRestartSafety})
	if err != nil {
		t.Fatal(err)
	}
	if err = l.Close(); err != nil {
		t.Fatal(err)
	}
	_, err = l.Decide(req("acme", "free", "read"))
	wantError(t, err, quota.CodeBadHandle, "not open")
	_, err = l.Settle("acme", 1, 1)
	wantError(t, err, quota.CodeBadHandle)
	_, err = l.Reload("", rules)
	wantError(t, err, quota.CodeBadHandle)
	_, err = l.Metrics()
	wantError(t, err, quota.CodeBadHandle)
	wantError(t, l.Close(), quota.CodeBadHandle)
	wantError(t, (&quota.Limiter{}).Close(), quota.CodeBadHandle)
}

// decideMany runs 8 goroutines of `calls` decisions each on one budget at time 0 and
// returns the admitted count and the errors that are not CodeBadHandle.
func decideMany(l *quota.Limiter, calls int, during func()) (allowed, badHandle int, others []error) {
	var mu sync.Mutex
	var wg sync.WaitGroup
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			n, bad := 0, 0
			var errs []error
			for i := 0; i < calls; i++ {
				d, err := l.Decide(req("acme", "pro", "read"))
				var e *quota.Error
				switch {
				case err == nil && d.Allowed:
					n++
				case err == nil:
				case errors.As(err, &e) && e.Code == quota.CodeBadHandle:
					bad++
				default:
					errs = append(errs, err)
				}
			}
			mu.Lock()
			allowed, badHandle, others = allowed+n, badHandle+bad, append(others, errs...)
			mu.Unlock()
		}()
	}
	during()
	wg.Wait()
	return allowed, badHandle, others
}

func TestGoroutinesShareOneBudget(t *testing.T) {
	l := open(t)
	// 6,000 calls on a burst of 4,000 at one time: exactly 4,000 admitted.
	allowed, bad, others := decideMany(l, 750, func() {})
	if allowed != 4000 || bad != 0 || len(others) != 0 {
		t.Fatalf("admitted %d of 6000 (want 4000), bad handles %d, errors %v", allowed, bad, others)
	}
}

func TestCloseWhileDeciding(t *testing.T) {
	l, err := quota.Open(quota.Config{RulesText: rules, OptOut: quota.OptOutRestartSafety})
	if err != nil {
		t.Fatal(err)
	}
	// Every call is a decision or CodeBadHandle.
	_, _, others := decideMany(l, 2000, func() {
		if err := l.Close(); err != nil {
			t.Error(err)
		}
	})
	if len(others) != 0 {
		t.Fatalf("errors besides BAD_HANDLE: %v", others)
	}
	wantError(t, l.Close(), quota.CodeBadHandle)
}
