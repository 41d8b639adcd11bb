/* tests/c/c_api_test.c — the C interface (quota/c/quota.h) called from C, in process:
 * every function, the decisions and their HTTP answers, estimates settled once,
 * attempts replayed, reloads whole or not at all, Prometheus text, and bad input (null
 * pointers, sizes, lengths that lie, an unknown route, costs below 1, a closed handle)
 * answered with an error code. Threads decide one budget at once (exactly its burst
 * admitted) and one handle is closed while others decide on it. */
#define _POSIX_C_SOURCE 200809L

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"

/* tests/c/rules.yaml (QUOTA_C_TEST_RULES), read by main(). */
static char kRules[4096];

static void read_rules(void) {
  const char* path = getenv("QUOTA_C_TEST_RULES");
  FILE* f = NULL;
  size_t n = 0;
  CHECK(path != NULL);
  f = fopen(path, "r");
  CHECK(f != NULL);
  n = fread(kRules, 1, sizeof kRules - 1, f);
  CHECK(n > 0 && n < sizeof kRules - 1 && !ferror(f));
  kRules[n] = '\0';
  fclose(f);
}

static quota_handle open_rules(const char* text) {
  quota_error err = new_error();
  quota_config c = new_config();
  quota_handle h = 0;
  c.rules_text = quota_s(text);
  c.opt_out = QUOTA_OPT_OUT_RESTART_SAFETY; /* exact counts from time 0 */
  CHECK_CODE(quota_open(&c, &h, &err), QUOTA_OK);
  CHECK(h != 0);
  return h;
}

static void test_version_and_names(void) {
  CHECK(quota_abi_version() == QUOTA_ABI_VERSION);
  CHECK(strcmp(quota_code_name(QUOTA_OK), "QUOTA_OK") == 0);
  CHECK(strcmp(quota_code_name(QUOTA_BAD_HANDLE), "QUOTA_BAD_HANDLE") == 0);
  CHECK(strcmp(quota_code_name(999), "QUOTA_UNKNOWN_CODE") == 0);
  CHECK(strcmp(quota_reason_name(QUOTA_REASON_OVER_LIMIT), "over_limit") == 0);
  CHECK(strcmp(quota_reason_name(QUOTA_REASON_PAUSED), "paused") == 0);
  CHECK(strcmp(quota_reason_name(-1), "unknown") == 0 &&
        strcmp(quota_reason_name(11), "unknown") == 0);
  CHECK(quota_now_ns() > 0 && quota_now_ns() <= quota_now_ns());
}

static void test_decide_until_denied(void) {
  quota_error err = new_error();
  quota_handle h = open_rules(kRules);
  quota_request r = new_request("acme", "free", "read", 0);
  quota_decision d = new_decision();
  int i;
  r.flags |= QUOTA_REQUEST_HTTP;
  for (i = 0; i < 3; ++i) {
    CHECK_CODE(quota_decide(h, &r, &d, &err), QUOTA_OK);
    CHECK(d.allowed == 1);
    CHECK(d.reason == QUOTA_REASON_ALLOWED);
    CHECK(d.remaining == 2 - i);
    CHECK(d.http_status == 200);
    CHECK(d.retry_after_s == -1);
  }
  CHECK(strcmp(d.rule, "free-read") == 0 && d.rule_len == strlen("free-read"));
  CHECK(d.rule_version == 1);
  CHECK(strcmp(d.ratelimit_policy, "\"free-read\";q=3;w=300") == 0);
  CHECK(d.ratelimit_len > 0 && strstr(d.ratelimit, "\"free-read\";r=0") == d.ratelimit);

  CHECK_CODE(quota_decide(h, &r, &d, &err), QUOTA_OK);
  CHECK(d.allowed == 0);
  CHECK(d.reason == QUOTA_REASON_OVER_LIMIT);
  CHECK(d.retry_after_ns == 100000000000LL); /* one unit per 100 s */
  CHECK(d.http_status == 429);
  CHECK(d.retry_after_s == 100);

  /* Another tenant has its own budget; without QUOTA_REQUEST_HTTP no answer is made. */
  r = new_request("other", "free", "read", 0);
  CHECK_CODE(quota_decide(h, &r, &d, &err), QUOTA_OK);
  CHECK(d.allowed == 1 && d.http_status == 0 && d.ratelimit_len == 0);

  /* A cost: paid by the budgets of a route without fixed costs. */
  r = new_request("acme", "free", "chat", 0);
  r.flags |= QUOTA_REQUEST_COST;
  r.cost = 40;
  CHECK_CODE(quota_decide(h, &r, &d, &err), QUOTA_OK);
  CHECK(d.allowed == 1 && d.remaining == 60);
  r.cost = 61;
  CHECK_CODE(quota_decide(h, &r, &d, &err), QUOTA_OK);
  CHECK(d.allowed == 0 && d.remaining == 60);
  CHECK_CODE(quota_close(h, &err), QUOTA_OK);
}

static void test_shared_rule_name(void) {
  /* Two rules of one name, different policies: each plan's answer describes its own. */
  static const char* kShared =
      "version: 1\n"
      "routes:\n"
      "  - name: read\n"
      "rules:\n"
      "  - name: read-budget\n"
      "    level: tenant\n"
      "    plan: free\n"
      "    route: read\n"
      "    token_bucket: {rate: 1/100s, burst: 3}\n"
      "  - name: read-budget\n"
      "    level: tenant\n"
      "    plan: pro\n"
      "    route: read\n"
      "    token_bucket: {rate: 1/100s, burst: 7}\n";
  quota_error err = new_error();
  quota_handle h = open_rules(kShared);
  quota_request r = new_request("acme", "free", "read", 0);
  quota_decision d = new_decision();
  r.flags |= QUOTA_REQUEST_HTTP;
  CHECK_CODE(quota_decide(h, &r, &d, &err), QUOTA_OK);
  CHECK(strcmp(d.ratelimit_policy, "\"read-budget\";q=3;w=300") == 0);
  r.plan = quota_s("pro");
  CHECK_CODE(quota_decide(h, &r, &d, &err), QUOTA_OK);
  CHECK(strcmp(d.ratelimit_policy, "\"read-budget\";q=7;w=700") == 0);
  CHECK_CODE(quota_close(h, &err), QUOTA_OK);
}

static void test_bad_requests(void) {
  quota_error err = new_error();
  quota_handle h = open_rules(kRules);
  quota_request r = new_request("acme", "free", "read", 0);
  quota_decision d = new_decision();
  quota_decision small = new_decision();
  /* "acme" followed by a NUL inside the length the caller claims. */
  static const char lying[] = {'a', 'c', 'm', 'e', '\0', 'x', 'y'};
  char too_long[QUOTA_MAX_ID_BYTES + 2];

  CHECK_CODE(quota_decide(h, NULL, &d, &err), QUOTA_INVALID_ARGUMENT);
  CHECK(strstr(err.message, "request") != NULL);
  CHECK_CODE(quota_decide(h, &r, NULL, &err), QUOTA_INVALID_ARGUMENT);
  small.size = sizeof small - 1;
  CHECK_CODE(quota_decide(h, &r, &small, &err), QUOTA_INVALID_ARGUMENT);
  CHECK(strstr(err.message, "size") != NULL);

  r.route = quota_s("write");
  CHECK_CODE(quota_decide(h, &r, &d, &err), QUOTA_INVALID_ARGUMENT);
  CHECK(strstr(err.message, "write") != NULL);

  r = new_request("acme", "free", "read", 0);
  r.tenant.data = NULL;
  r.tenant.len = 5;
  CHECK_CODE(quota_decide(h, &r, &d, &err), QUOTA_INVALID_ARGUMENT);
  CHECK(strstr(err.message, "tenant: a null pointer") != NULL);
  r.tenant.data = lying;
  r.tenant.len = sizeof lying;
  CHECK_CODE(quota_decide(h, &r, &d, &err), QUOTA_INVALID_ARGUMENT);
  CHECK(strstr(err.message, "NUL byte at offset 4") != NULL);
  memset(too_long, 'a', sizeof too_long);
  r.tenant.data = too_long;
  r.tenant.len = sizeof too_long;
  CHECK_CODE(quota_decide(h, &r, &d, &err), QUOTA_INVALID_ARGUMENT);
  r.tenant = quota_s("");
  CHECK_CODE(quota_decide(h, &r, &d, &err), QUOTA_INVALID_ARGUMENT);
  CHECK(strstr(err.message, "tenant: empty") != NULL);

  r = new_request("acme", "free", "chat", 0);
  r.flags |= QUOTA_REQUEST_COST;
  r.cost = 0;
  CHECK_CODE(quota_decide(h, &r, &d, &err), QUOTA_INVALID_ARGUMENT);
  CHECK(strstr(err.message, "cost: 0") != NULL);
  r.cost = -5;
  CHECK_CODE(quota_decide(h, &r, &d, &err), QUOTA_INVALID_ARGUMENT);
  r.flags = QUOTA_REQUEST_NOW | QUOTA_REQUEST_ESTIMATE;
  r.estimate = 0;
  CHECK_CODE(quota_decide(h, &r, &d, &err), QUOTA_INVALID_ARGUMENT);

  /* Unknown flag bits, a cost with an estimate. */
  r = new_request("acme", "free", "chat", 0);
  r.flags |= 1u << 9;
  CHECK_CODE(quota_decide(h, &r, &d, &err), QUOTA_INVALID_ARGUMENT);
  CHECK(strstr(err.message, "flags: unknown bits 0x200") != NULL);
  r.flags = QUOTA_REQUEST_NOW | QUOTA_REQUEST_COST | QUOTA_REQUEST_ESTIMATE;
  r.cost = r.estimate = 2;
  CHECK_CODE(quota_decide(h, &r, &d, &err), QUOTA_INVALID_ARGUMENT);

  /* A time outside [0, 2^62]. */
  r = new_request("acme", "free", "read", -1);
  CHECK_CODE(quota_decide(h, &r, &d, &err), QUOTA_INVALID_ARGUMENT);
  CHECK(strstr(err.message, "now_ns: -1") != NULL);
  r.now_ns = INT64_MAX;
  CHECK_CODE(quota_decide(h, &r, &d, &err), QUOTA_INVALID_ARGUMENT);

  /* Nothing above was deducted: the whole burst is still there. */
  r = new_request("acme", "free", "read", 0);
  CHECK_CODE(quota_decide(h, &r, &d, &err), QUOTA_OK);
  CHECK(d.allowed == 1 && d.remaining == 2);

  /* The error struct is optional. */
  CHECK(quota_decide(h, NULL, &d, NULL) == QUOTA_INVALID_ARGUMENT);
  CHECK_CODE(quota_close(h, &err), QUOTA_OK);
}

static void test_estimate_and_settle(void) {
  quota_error err = new_error();
  quota_handle h = open_rules(kRules);
  quota_request r = new_request("acme", "free", "chat", 0);
  quota_decision d = new_decision();
  quota_settle_request s;
  quota_settlement out;
  memset(&s, 0, sizeof s);
  memset(&out, 0, sizeof out);
  s.size = sizeof s;
  s.tenant = quota_s("acme");
  out.size = sizeof out;

  r.flags |= QUOTA_REQUEST_ESTIMATE;
  r.estimate = 30;
  CHECK_CODE(quota_decide(h, &r, &d, &err), QUOTA_OK);
  CHECK(d.allowed == 1 && d.remaining == 70 && d.ticket != 0);

  s.ticket = d.ticket;
  s.actual = 12;
  s.flags = QUOTA_REQUEST_NOW;
  CHECK_CODE(quota_settle(h, &s, &out, &err), QUOTA_OK);
  CHECK(out.estimate == 30 && out.actual == 12 && out.surplus == 18 && out.deficit == 0);
  /* Settled once: again is an error, and nothing more comes back. */
  CHECK_CODE(quota_settle(h, &s, &out, &err), QUOTA_FAILED_PRECONDITION);
  CHECK(strstr(err.message, "already settled") != NULL);
  r = new_request("acme", "free", "chat", 0);
  CHECK_CODE(quota_decide(h, &r, &d, &err), QUOTA_OK);
  CHECK(d.remaining == 87); /* 100 - 12 - 1 */

  /* Another tenant's ticket: refused, nothing settled; its own tenant settles it. */
  r = new_request("acme", "free", "chat", 0);
  r.flags |= QUOTA_REQUEST_ESTIMATE;
  r.estimate = 4;
  CHECK_CODE(quota_decide(h, &r, &d, &err), QUOTA_OK);
  s.ticket = d.ticket;
  s.tenant = quota_s("other");
  CHECK_CODE(quota_settle(h, &s, &out, &err), QUOTA_NOT_FOUND);
  CHECK(strstr(err.message, "no such ticket of tenant \"other\"") != NULL);
  s.tenant = quota_s("acme");
  s.actual = 1;
  CHECK_CODE(quota_settle(h, &s, &out, &err), QUOTA_OK);
  CHECK(out.estimate == 4 && out.surplus == 3);

  /* A ticket past its life (10 minutes): expired, its estimate stays spent. */
  r = new_request("acme", "free", "chat", 0);
  r.flags |= QUOTA_REQUEST_ESTIMATE;
  r.estimate = 5;
  CHECK_CODE(quota_decide(h, &r, &d, &err), QUOTA_OK);
  s.ticket = d.ticket;
  s.now_ns = 601LL * 1000000000LL;
  CHECK_CODE(quota_settle(h, &s, &out, &err), QUOTA_FAILED_PRECONDITION);
  CHECK(strstr(err.message, "expired") != NULL);
  s.now_ns = 0;
  s.flags = QUOTA_REQUEST_HTTP;
  CHECK_CODE(quota_settle(h, &s, &out, &err), QUOTA_INVALID_ARGUMENT);
  s.flags = QUOTA_REQUEST_NOW;

  s.ticket = 987654321;
  CHECK_CODE(quota_settle(h, &s, &out, &err), QUOTA_NOT_FOUND);
  s.actual = -1;
  CHECK_CODE(quota_settle(h, &s, &out, &err), QUOTA_INVALID_ARGUMENT);
  CHECK_CODE(quota_settle(h, NULL, &out, &err), QUOTA_INVALID_ARGUMENT);
  CHECK_CODE(quota_close(h, &err), QUOTA_OK);
}

static void test_attempt_replayed(void) {
  quota_error err = new_error();
  quota_handle h = open_rules(kRules);
  quota_request r = new_request("acme", "free", "read", 0);
  quota_decision d = new_decision();
  r.attempt_id = quota_s("req-1");
  CHECK_CODE(quota_decide(h, &r, &d, &err), QUOTA_OK);
  CHECK(d.allowed == 1 && d.remaining == 2 && d.replayed == 0);
  CHECK_CODE(quota_decide(h, &r, &d, &err), QUOTA_OK);
  CHECK(d.allowed == 1 && d.remaining == 2 && d.replayed == 1);
  r.attempt_id = quota_s("req-2");
  CHECK_CODE(quota_decide(h, &r, &d, &err), QUOTA_OK);
  CHECK(d.remaining == 1 && d.replayed == 0);
  CHECK_CODE(quota_close(h, &err), QUOTA_OK);
}

static void test_reload(void) {
  quota_error err = new_error();
  quota_handle h = open_rules(kRules);
  quota_request r = new_request("acme", "free", "read", 0);
  quota_decision d = new_decision();
  quota_rules rules;
  uint64_t version = 0;
  char next[2048];

  /* Version 2: free-read's burst becomes 5 (no burst is handed out: it starts where v1 was). */
  CHECK(strlen(kRules) < sizeof next);
  strcpy(next, kRules);
  strstr(next, "version: 1")[strlen("version: ")] = '2';
  memcpy(strstr(next, "burst: 3}"), "burst: 5}", strlen("burst: 5}"));
  CHECK_CODE(quota_decide(h, &r, &d, &err), QUOTA_OK);
  CHECK(d.remaining == 2 && d.rule_version == 1);
  rules = new_rules(NULL, next);
  CHECK_CODE(quota_reload(h, &rules, &version, &err), QUOTA_OK);
  CHECK(version == 2);
  CHECK_CODE(quota_decide(h, &r, &d, &err), QUOTA_OK);
  CHECK(d.allowed == 1 && d.rule_version == 2 && d.remaining == 1);

  /* A bad set is refused whole, naming line, column and field; v2 stays in force. */
  rules = new_rules(NULL,
                    "version: 3\nroutes:\n  - name: read\nrules:\n"
                    "  - name: x\n    level: tenant\n    plan: free\n"
                    "    route: read\n"
                    "    token_bucket: {rate: 1/s, burst: -4}\n");
  CHECK_CODE(quota_reload(h, &rules, &version, &err), QUOTA_INVALID_ARGUMENT);
  CHECK(strstr(err.message, "rules:9:") != NULL);
  CHECK(strstr(err.message, "burst") != NULL);
  /* Not newer than the version in force. */
  rules = new_rules(NULL, kRules);
  CHECK_CODE(quota_reload(h, &rules, &version, &err), QUOTA_FAILED_PRECONDITION);
  /* Exactly one of path and text; the struct itself. */
  rules = new_rules(NULL, NULL);
  CHECK_CODE(quota_reload(h, &rules, &version, &err), QUOTA_INVALID_ARGUMENT);
  rules = new_rules("/x", kRules);
  CHECK_CODE(quota_reload(h, &rules, &version, &err), QUOTA_INVALID_ARGUMENT);
  CHECK_CODE(quota_reload(h, NULL, &version, &err), QUOTA_INVALID_ARGUMENT);
  rules.size = 0;
  CHECK_CODE(quota_reload(h, &rules, &version, &err), QUOTA_INVALID_ARGUMENT);
  CHECK_CODE(quota_decide(h, &r, &d, &err), QUOTA_OK);
  CHECK(d.rule_version == 2);
  CHECK_CODE(quota_close(h, &err), QUOTA_OK);
}

static void test_rule_files(void) {
  quota_error err = new_error();
  quota_config c = new_config();
  quota_handle h = 0;
  char path[] = "/tmp/quota_c_api_test_XXXXXX";
  const int fd = mkstemp(path);
  FILE* f = NULL;
  CHECK(fd >= 0);
  f = fdopen(fd, "w");
  CHECK(f != NULL);
  CHECK(fputs(kRules, f) >= 0);
  CHECK(fclose(f) == 0);

  c.rules_path = quota_s(path);
  CHECK_CODE(quota_open(&c, &h, &err), QUOTA_OK);
  CHECK_CODE(quota_close(h, &err), QUOTA_OK);

  /* A bad file: its name, line and column in the message. */
  f = fopen(path, "w");
  CHECK(f != NULL);
  CHECK(fputs("version: 1\nroutes:\n  - name: read\nrules:\n  - name: x\n    levle: tenant\n", f) >=
        0);
  CHECK(fclose(f) == 0);
  CHECK_CODE(quota_open(&c, &h, &err), QUOTA_INVALID_ARGUMENT);
  CHECK(h == 0);
  CHECK(strstr(err.message, path) != NULL && strstr(err.message, ":6:") != NULL);
  CHECK(unlink(path) == 0);
  CHECK_CODE(quota_open(&c, &h, &err), QUOTA_NOT_FOUND);

  /* Both, neither, a bad store kind, null pointers. */
  c.rules_text = quota_s(kRules);
  CHECK_CODE(quota_open(&c, &h, &err), QUOTA_INVALID_ARGUMENT);
  c = new_config();
  CHECK_CODE(quota_open(&c, &h, &err), QUOTA_INVALID_ARGUMENT);
  c.rules_text = quota_s(kRules);
  c.store = 42;
  CHECK_CODE(quota_open(&c, &h, &err), QUOTA_INVALID_ARGUMENT);
  c.store = QUOTA_STORE_IN_PROCESS;
  c.opt_out = 1u << 20;
  CHECK_CODE(quota_open(&c, &h, &err), QUOTA_INVALID_ARGUMENT);
  CHECK(strstr(err.message, "opt_out: unknown bits") != NULL);
  c.opt_out = 0;
  c.mode = 7;
  CHECK_CODE(quota_open(&c, &h, &err), QUOTA_INVALID_ARGUMENT);
  c.mode = QUOTA_MODE_NON_BLOCKING; /* nothing to block on in process */
  CHECK_CODE(quota_open(&c, &h, &err), QUOTA_INVALID_ARGUMENT);
  CHECK(strstr(err.message, "QUOTA_MODE_NON_BLOCKING is for a Redis store") != NULL);
  c.mode = QUOTA_MODE_BLOCKING;
  CHECK_CODE(quota_open(NULL, &h, &err), QUOTA_INVALID_ARGUMENT);
  c.store = QUOTA_STORE_IN_PROCESS;
  CHECK_CODE(quota_open(&c, NULL, &err), QUOTA_INVALID_ARGUMENT);
  c.size = 8;
  CHECK_CODE(quota_open(&c, &h, &err), QUOTA_INVALID_ARGUMENT);

  /* A store that cannot be reached: nothing listens on port 1. */
  c = new_config();
  c.rules_text = quota_s(kRules);
  c.store = QUOTA_STORE_REDIS;
  c.redis_addresses = quota_s("127.0.0.1:1");
  CHECK_CODE(quota_open(&c, &h, &err), QUOTA_UNAVAILABLE);
  CHECK(strstr(err.message, "cannot decide") != NULL);
  c.redis_addresses = quota_s("127.0.0.1");
  CHECK_CODE(quota_open(&c, &h, &err), QUOTA_INVALID_ARGUMENT);
  CHECK(strstr(err.message, "redis_addresses") != NULL);
}

static void test_restart_safety_default(void) {
  /* Safe by default: a limiter opened now starts with its budgets spent. */
  quota_error err = new_error();
  quota_config c = new_config();
  quota_handle h = 0;
  quota_request r = new_request("acme", "free", "read", 0);
  quota_decision d = new_decision();
  c.rules_text = quota_s(kRules);
  CHECK_CODE(quota_open(&c, &h, &err), QUOTA_OK);
  r.flags = 0; /* the library's clock */
  CHECK_CODE(quota_decide(h, &r, &d, &err), QUOTA_OK);
  CHECK(d.allowed == 0 && d.reason == QUOTA_REASON_OVER_LIMIT);
  CHECK_CODE(quota_close(h, &err), QUOTA_OK);
}

static void test_metrics(void) {
  quota_error err = new_error();
  quota_handle h = open_rules(kRules);
  quota_request r = new_request("acme", "free", "read", 0);
  quota_decision d = new_decision();
  char small[8];
  char* text = NULL;
  size_t length = 0;
  CHECK_CODE(quota_decide(h, &r, &d, &err), QUOTA_OK);
  CHECK_CODE(quota_metrics(h, small, sizeof small, &length, &err), QUOTA_BUFFER_TOO_SMALL);
  CHECK(length > sizeof small);
  text = malloc(length + 1);
  CHECK(text != NULL);
  CHECK_CODE(quota_metrics(h, text, length + 1, &length, &err), QUOTA_OK);
  CHECK(strlen(text) == length);
  CHECK(strstr(text,
               "quota_decisions_total{rule=\"free-read\",route=\"read\",level=\"tenant\","
               "outcome=\"allowed\"} 1") != NULL);
  free(text);
  CHECK_CODE(quota_metrics(h, NULL, 0, &length, &err), QUOTA_BUFFER_TOO_SMALL);
  CHECK_CODE(quota_metrics(h, NULL, 10, &length, &err), QUOTA_INVALID_ARGUMENT);
  CHECK_CODE(quota_metrics(h, small, sizeof small, NULL, &err), QUOTA_INVALID_ARGUMENT);
  CHECK_CODE(quota_close(h, &err), QUOTA_OK);
}

static void test_closed_handles(void) {
  quota_error err = new_error();
  quota_handle h = open_rules(kRules);
  quota_handle again = 0;
  quota_request r = new_request("acme", "free", "read", 0);
  quota_decision d = new_decision();
  size_t length = 0;
  const quota_rules rules = new_rules(NULL, kRules);
  CHECK_CODE(quota_close(h, &err), QUOTA_OK);
  CHECK_CODE(quota_decide(h, &r, &d, &err), QUOTA_BAD_HANDLE);
  CHECK_CODE(quota_metrics(h, NULL, 0, &length, &err), QUOTA_BAD_HANDLE);
  CHECK_CODE(quota_reload(h, &rules, NULL, &err), QUOTA_BAD_HANDLE);
  CHECK_CODE(quota_close(h, &err), QUOTA_BAD_HANDLE);
  CHECK_CODE(quota_decide(0, &r, &d, &err), QUOTA_BAD_HANDLE);
  CHECK_CODE(quota_decide(0xdeadbeefcafeULL, &r, &d, &err), QUOTA_BAD_HANDLE);
  /* The slot is used again under another handle; the old one stays closed. */
  again = open_rules(kRules);
  CHECK(again != h);
  CHECK_CODE(quota_decide(h, &r, &d, &err), QUOTA_BAD_HANDLE);
  CHECK_CODE(quota_decide(again, &r, &d, &err), QUOTA_OK);
  CHECK_CODE(quota_close(again, &err), QUOTA_OK);
}

enum { kThreads = 4, kCallsPerThread = 1500 };

struct worker {
  quota_handle h;
  int allowed;
  int bad_handle;
  int other;
};

static void* decide_many(void* arg) {
  struct worker* w = (struct worker*)arg;
  quota_request r = new_request("acme", "pro", "read", 0);
  quota_decision d = new_decision();
  int i;
  for (i = 0; i < kCallsPerThread; ++i) {
    const int32_t code = quota_decide(w->h, &r, &d, NULL);
    if (code == QUOTA_OK) {
      w->allowed += d.allowed;
    } else if (code == QUOTA_BAD_HANDLE) {
      ++w->bad_handle;
    } else {
      ++w->other;
    }
  }
  return NULL;
}

static void run_workers(struct worker* w, quota_handle h, int close_midway) {
  pthread_t threads[kThreads];
  quota_error err = new_error();
  int i;
  for (i = 0; i < kThreads; ++i) {
    memset(&w[i], 0, sizeof w[i]);
    w[i].h = h;
    CHECK(pthread_create(&threads[i], NULL, decide_many, &w[i]) == 0);
  }
  if (close_midway) CHECK_CODE(quota_close(h, &err), QUOTA_OK);
  for (i = 0; i < kThreads; ++i) CHECK(pthread_join(threads[i], NULL) == 0);
}

static void test_threads(void) {
  struct worker w[kThreads];
  quota_handle h = open_rules(kRules);
  quota_error err = new_error();
  int allowed = 0;
  int i;
  /* 6,000 calls on a burst of 4,000 at one time: exactly 4,000 admitted. */
  run_workers(w, h, 0);
  for (i = 0; i < kThreads; ++i) {
    CHECK(w[i].bad_handle == 0 && w[i].other == 0);
    allowed += w[i].allowed;
  }
  CHECK(allowed == 4000);
  CHECK_CODE(quota_close(h, &err), QUOTA_OK);

  /* Closed while they decide: every call is a decision or QUOTA_BAD_HANDLE. */
  h = open_rules(kRules);
  run_workers(w, h, 1);
  for (i = 0; i < kThreads; ++i) CHECK(w[i].other == 0);
  CHECK_CODE(quota_close(h, &err), QUOTA_BAD_HANDLE);
}

int main(void) {
  read_rules();
  test_version_and_names();
  test_decide_until_denied();
  test_shared_rule_name();
  test_bad_requests();
  test_estimate_and_settle();
  test_attempt_replayed();
  test_reload();
  test_rule_files();
  test_restart_safety_default();
  test_metrics();
  test_closed_handles();
  test_threads();
  printf("c_api_test: %d checks passed\n", checks_passed);
  return 0;
}
