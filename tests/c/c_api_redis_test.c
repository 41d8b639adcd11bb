/* tests/c/c_api_redis_test.c — the C interface on a real redis-server (tests/redis's
 * "main" server, its port in $QUOTA_REDIS_DIR/port), with the safe defaults (failover
 * safety, the clock-step guard, the eviction check, the breaker): two limiters share
 * one budget exactly, an attempt decided through one is replayed through the other,
 * the HTTP answer and metrics come as in process, a rule the store cannot take
 * safely (sliding_log under failover safety) is refused at open and at reload, WAIT for
 * a replica this server does not have refuses to decide, and coalescing decides
 * exactly. */
#define _POSIX_C_SOURCE 200809L

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"

static char address[64];
static char tenant[64];

static const char* kRules =
    "version: 1\n"
    "routes:\n"
    "  - name: read\n"
    "rules:\n"
    "  - name: free-read\n"
    "    level: tenant\n"
    "    plan: free\n"
    "    route: read\n"
    "    token_bucket: {rate: 1/100s, burst: 10}\n";

static void read_address(void) {
  const char* dir = getenv("QUOTA_REDIS_DIR");
  char path[512];
  FILE* f = NULL;
  int port = 0;
  CHECK(dir != NULL);
  CHECK(snprintf(path, sizeof path, "%s/port", dir) < (int)sizeof path);
  f = fopen(path, "r");
  CHECK(f != NULL);
  CHECK(fscanf(f, "%d", &port) == 1);
  fclose(f);
  snprintf(address, sizeof address, "127.0.0.1:%d", port);
  /* Keys of this run only: the server is shared with other tests. */
  snprintf(tenant, sizeof tenant, "c-api-%ld", (long)getpid());
}

static int32_t open_redis(const char* rules, quota_handle* h, quota_error* err) {
  quota_config c = new_config();
  c.rules_text = quota_s(rules);
  c.store = QUOTA_STORE_REDIS;
  c.redis_addresses = quota_s(address);
  c.redis_deadline_ms = 1000; /* a loaded CI machine */
  return quota_open(&c, h, err);
}

static void test_two_limiters_share_one_budget(void) {
  quota_error err = new_error();
  quota_handle a = 0;
  quota_handle b = 0;
  quota_request r = new_request(tenant, "free", "read", 0);
  quota_decision d = new_decision();
  int allowed_a = 0;
  int allowed_b = 0;
  int i;
  char metrics[8192];
  size_t length = 0;
  r.flags = QUOTA_REQUEST_HTTP; /* the library's clock */
  CHECK_CODE(open_redis(kRules, &a, &err), QUOTA_OK);
  CHECK_CODE(open_redis(kRules, &b, &err), QUOTA_OK);
  for (i = 0; i < 8; ++i) {
    CHECK_CODE(quota_decide(a, &r, &d, &err), QUOTA_OK);
    allowed_a += d.allowed;
  }
  for (i = 0; i < 8; ++i) {
    CHECK_CODE(quota_decide(b, &r, &d, &err), QUOTA_OK);
    allowed_b += d.allowed;
  }
  /* 16 asks of one budget of 10, 8 through each limiter: 10 admitted, 8 and 2. */
  CHECK(allowed_a == 8 && allowed_b == 2);
  CHECK(d.allowed == 0 && d.reason == QUOTA_REASON_OVER_LIMIT && d.http_status == 429);
  CHECK(d.retry_after_s >= 1 && d.retry_after_s <= 100);
  CHECK(strcmp(d.ratelimit_policy, "\"free-read\";q=10;w=1000") == 0);
  CHECK_CODE(quota_metrics(b, metrics, sizeof metrics, &length, &err), QUOTA_OK);
  CHECK(strstr(metrics,
               "rule=\"free-read\",route=\"read\",level=\"tenant\",outcome=\"denied\"} 6") != NULL);
  CHECK_CODE(quota_close(a, &err), QUOTA_OK);
  CHECK_CODE(quota_close(b, &err), QUOTA_OK);
}

static void test_attempt_shared_through_redis(void) {
  quota_error err = new_error();
  quota_handle a = 0;
  quota_handle b = 0;
  char other[80];
  quota_request r;
  quota_decision d = new_decision();
  snprintf(other, sizeof other, "%s-attempts", tenant);
  r = new_request(other, "free", "read", 0);
  r.flags = 0;
  r.attempt_id = quota_s("order-17");
  CHECK_CODE(open_redis(kRules, &a, &err), QUOTA_OK);
  CHECK_CODE(open_redis(kRules, &b, &err), QUOTA_OK);
  CHECK_CODE(quota_decide(a, &r, &d, &err), QUOTA_OK);
  CHECK(d.allowed == 1 && d.remaining == 9 && d.replayed == 0);
  /* The retry reaches the other limiter: the first decision, nothing spent again. */
  CHECK_CODE(quota_decide(b, &r, &d, &err), QUOTA_OK);
  CHECK(d.allowed == 1 && d.remaining == 9 && d.replayed == 1);
  r.attempt_id = quota_s("order-18");
  CHECK_CODE(quota_decide(b, &r, &d, &err), QUOTA_OK);
  CHECK(d.remaining == 8 && d.replayed == 0);
  CHECK_CODE(quota_close(a, &err), QUOTA_OK);
  CHECK_CODE(quota_close(b, &err), QUOTA_OK);
}

static void test_sliding_log_refused_under_failover_safety(void) {
  static const char* kLog =
      "version: 1\n"
      "routes:\n"
      "  - name: read\n"
      "rules:\n"
      "  - name: log-read\n"
      "    level: tenant\n"
      "    plan: free\n"
      "    route: read\n"
      "    sliding_log: {limit: 5, window: 10s}\n";
  quota_error err = new_error();
  quota_handle h = 0;
  uint64_t version = 0;
  quota_rules rules;
  char next[1024];
  CHECK_CODE(open_redis(kLog, &h, &err), QUOTA_INVALID_ARGUMENT);
  CHECK(strstr(err.message, "log-read") != NULL &&
        strstr(err.message, "QUOTA_OPT_OUT_FAILOVER_SAFETY") != NULL);
  CHECK_CODE(open_redis(kRules, &h, &err), QUOTA_OK);
  strcpy(next, kLog);
  next[strlen("version: ")] = '2';
  rules = new_rules(NULL, next);
  CHECK_CODE(quota_reload(h, &rules, &version, &err), QUOTA_INVALID_ARGUMENT);
  CHECK_CODE(quota_close(h, &err), QUOTA_OK);
}

static void test_wait_and_coalesce(void) {
  quota_error err = new_error();
  quota_handle h = 0;
  quota_config c = new_config();
  char other[80];
  quota_request r;
  quota_decision d = new_decision();
  int allowed = 0;
  int i;
  c.rules_text = quota_s(kRules);
  c.store = QUOTA_STORE_REDIS;
  c.redis_addresses = quota_s(address);
  c.redis_deadline_ms = 1000;
  /* The tests' server has no replica: no write is acknowledged, so nothing is decided
   * (open's probe decision included). */
  c.redis_replicas = 1;
  c.redis_replica_timeout_ms = 20;
  CHECK_CODE(quota_open(&c, &h, &err), QUOTA_UNAVAILABLE);
  CHECK(strstr(err.message, "acknowledged by 0 of the 1 replicas") != NULL);
  c.redis_replicas = 0;
  c.redis_replica_timeout_ms = 0;
  c.redis_coalesce = 8;
  c.redis_coalesce_calls = 1;
  CHECK_CODE(quota_open(&c, &h, &err), QUOTA_OK);
  snprintf(other, sizeof other, "%s-coalesce", tenant);
  r = new_request(other, "free", "read", 0);
  r.flags = 0;
  for (i = 0; i < 12; ++i) {
    CHECK_CODE(quota_decide(h, &r, &d, &err), QUOTA_OK);
    allowed += d.allowed;
  }
  CHECK(allowed == 10);
  CHECK_CODE(quota_close(h, &err), QUOTA_OK);
}

int main(void) {
  read_address();
  test_two_limiters_share_one_budget();
  test_attempt_shared_through_redis();
  test_sliding_log_refused_under_failover_safety();
  test_wait_and_coalesce();
  printf("c_api_redis_test: %d checks passed\n", checks_passed);
  return 0;
}
