/* tests/c/c_api_non_blocking_test.c — QUOTA_MODE_NON_BLOCKING on a real redis-server of
 * its own (the "c_pause" fixture: port and pid in $QUOTA_REDIS_DIR), which this test
 * pauses with SIGSTOP: a rule without a lease is refused; a key's first request is denied
 * at once while its grant is taken by the library's thread, then the budget is spent
 * from grants to exactly its size; with Redis stopped, units held are still spent and
 * an empty key is denied, each call returning long before the 5 s deadline; after
 * SIGCONT the grant in flight lands and nothing beyond the budget was admitted. */
#define _POSIX_C_SOURCE 200809L

#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#include "check.h"

static char address[64];
static pid_t redis_pid;
static char tenant[64];

/* A budget of 20 that does not refill while the test runs, leased 5 units at a time. */
static const char* kLeased =
    "version: 1\n"
    "routes:\n"
    "  - name: read\n"
    "rules:\n"
    "  - name: leased-read\n"
    "    level: tenant\n"
    "    plan: free\n"
    "    route: read\n"
    "    token_bucket: {rate: 1/1000s, burst: 20}\n"
    "    lease: {mode: on, units: 5, expiry: 60s, low_water: 1}\n";

static const char* kUnleased =
    "version: 1\n"
    "routes:\n"
    "  - name: read\n"
    "rules:\n"
    "  - name: plain-read\n"
    "    level: tenant\n"
    "    plan: free\n"
    "    route: read\n"
    "    token_bucket: {rate: 1/1000s, burst: 20}\n";

static int read_number(const char* dir, const char* file) {
  char path[512];
  FILE* f = NULL;
  int n = 0;
  CHECK(snprintf(path, sizeof path, "%s/%s", dir, file) < (int)sizeof path);
  f = fopen(path, "r");
  CHECK(f != NULL);
  CHECK(fscanf(f, "%d", &n) == 1);
  fclose(f);
  return n;
}

static void sleep_ms(long ms) {
  struct timespec t;
  t.tv_sec = ms / 1000;
  t.tv_nsec = (ms % 1000) * 1000000L;
  nanosleep(&t, NULL);
}

static quota_handle open_non_blocking(const char* rules, int32_t expect) {
  quota_error err = new_error();
  quota_config c = new_config();
  quota_handle h = 0;
  c.rules_text = quota_s(rules);
  c.store = QUOTA_STORE_REDIS;
  c.redis_addresses = quota_s(address);
  c.redis_deadline_ms = 5000;
  c.mode = QUOTA_MODE_NON_BLOCKING;
  CHECK_CODE(quota_open(&c, &h, &err), expect);
  if (expect != QUOTA_OK) {
    CHECK(strstr(err.message, "plain-read") != NULL && strstr(err.message, "lease") != NULL);
  }
  return h;
}

/* One decision for `who`, with the call's own duration in *took_ns. */
static quota_decision decide(quota_handle h, const char* who, int64_t* took_ns) {
  quota_error err = new_error();
  quota_request r = new_request(who, "free", "read", 0);
  quota_decision d = new_decision();
  const int64_t start = quota_now_ns();
  r.flags = 0;
  CHECK_CODE(quota_decide(h, &r, &d, &err), QUOTA_OK);
  *took_ns = quota_now_ns() - start;
  return d;
}

static int is_renewing(const quota_decision* d) {
  return !d->allowed && d->reason == QUOTA_REASON_OVER_LIMIT && d->retry_after_ns == 1000000;
}

/* Decides `who` until the budget is spent (a denial that is not "renewing"); returns the
 * units admitted. Bounded: at most 2,000 calls, 1 ms apart while renewing. */
static int spend_all(quota_handle h, const char* who) {
  int admitted = 0;
  int i;
  int64_t took = 0;
  for (i = 0; i < 2000; ++i) {
    const quota_decision d = decide(h, who, &took);
    if (d.allowed) {
      ++admitted;
    } else if (is_renewing(&d)) {
      sleep_ms(1);
    } else {
      CHECK(d.reason == QUOTA_REASON_OVER_LIMIT && d.retry_after_ns > 1000000);
      return admitted;
    }
  }
  CHECK(!"the budget was not spent in 2,000 calls");
  return admitted;
}

static void test_unleased_rule_refused(void) {
  open_non_blocking(kUnleased, QUOTA_INVALID_ARGUMENT);
}

static void test_spent_from_grants(void) {
  quota_error err = new_error();
  const quota_handle h = open_non_blocking(kLeased, QUOTA_OK);
  char who[80];
  char metrics[16384];
  size_t length = 0;
  int64_t took = 0;
  quota_decision d;
  snprintf(who, sizeof who, "%s-spend", tenant);
  /* Nothing held yet: denied at once, the grant asked for by the library's thread. */
  d = decide(h, who, &took);
  CHECK(is_renewing(&d));
  CHECK(spend_all(h, who) == 20);
  CHECK_CODE(quota_metrics(h, metrics, sizeof metrics, &length, &err), QUOTA_OK);
  CHECK(strstr(metrics, "quota_lease_grants_total{level=\"tenant\"} 4") != NULL);
  CHECK(strstr(metrics, "quota_lease_denials_while_renewing_total{level=\"tenant\"} ") != NULL);
  CHECK(strstr(metrics, "quota_lease_denials_while_renewing_total{level=\"tenant\"} 0\n") == NULL);
  CHECK_CODE(quota_close(h, &err), QUOTA_OK);
}

static void test_redis_paused(void) {
  quota_error err = new_error();
  const quota_handle h = open_non_blocking(kLeased, QUOTA_OK);
  char held[80];
  char empty[80];
  int admitted = 0;
  int i;
  int64_t took = 0;
  int64_t slowest = 0;
  quota_decision d;
  snprintf(held, sizeof held, "%s-held", tenant);
  snprintf(empty, sizeof empty, "%s-empty", tenant);
  /* A grant of 5 for `held`: its first admission, then 4 units held. */
  for (i = 0; i < 2000 && admitted == 0; ++i) {
    d = decide(h, held, &took);
    if (d.allowed) ++admitted;
    if (!d.allowed) sleep_ms(1);
  }
  CHECK(admitted == 1);

  CHECK(kill(redis_pid, SIGSTOP) == 0);
  /* Units held are spent without Redis; the one that crosses the low-water mark posts a
   * renewal, which hangs in the stopped server; after that `held` and the never-granted
   * `empty` are denied "renewing". No call waits for Redis (its deadline is 5 s). */
  for (i = 0; i < 20; ++i) {
    d = decide(h, held, &took);
    admitted += d.allowed;
    CHECK(d.allowed || is_renewing(&d));
    if (took > slowest) slowest = took;
    d = decide(h, empty, &took);
    CHECK(is_renewing(&d));
    if (took > slowest) slowest = took;
  }
  CHECK(admitted == 5);
  CHECK(slowest < 1000000000LL);
  CHECK(kill(redis_pid, SIGCONT) == 0);

  /* Back: the grant in flight lands; the budget is spent to exactly 20 over the whole
   * test, never beyond, whatever was held while Redis was away. */
  admitted += spend_all(h, held);
  CHECK(admitted == 20);
  CHECK(spend_all(h, empty) == 20);
  CHECK_CODE(quota_close(h, &err), QUOTA_OK);
}

int main(void) {
  const char* dir = getenv("QUOTA_REDIS_DIR");
  CHECK(dir != NULL);
  snprintf(address, sizeof address, "127.0.0.1:%d", read_number(dir, "port"));
  redis_pid = (pid_t)read_number(dir, "redis.pid");
  snprintf(tenant, sizeof tenant, "c-nb-%ld", (long)getpid());
  test_unleased_rule_refused();
  test_spent_from_grants();
  test_redis_paused();
  printf("c_api_non_blocking_test: %d checks passed, Redis paused and resumed\n", checks_passed);
  return 0;
}
