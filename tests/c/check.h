/* tests/c/check.h — what the C interface's tests (written in C) share: CHECK, which
 * prints the failed expression with its file and line and exits 1, and helpers that
 * build the interface's structs. */
#ifndef QUOTA_TESTS_C_CHECK_H
#define QUOTA_TESTS_C_CHECK_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "quota/c/quota.h"

/* Each test uses some of the helpers below. */
#define HELPER static __attribute__((unused))

static int checks_passed = 0;

#define CHECK(cond)                                                            \
  do {                                                                         \
    if (!(cond)) {                                                             \
      fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
      exit(1);                                                                 \
    }                                                                          \
    ++checks_passed;                                                           \
  } while (0)

/* A call that must return `code`; on another, its message is printed. */
#define CHECK_CODE(call, code)                                                               \
  do {                                                                                       \
    int32_t got_ = (call);                                                                   \
    if (got_ != (code)) {                                                                    \
      fprintf(stderr, "%s:%d: %s returned %s, expected %s: %s\n", __FILE__, __LINE__, #call, \
              quota_code_name(got_), quota_code_name(code), err.message);                    \
      exit(1);                                                                               \
    }                                                                                        \
    ++checks_passed;                                                                         \
  } while (0)

HELPER quota_error new_error(void) {
  quota_error e;
  memset(&e, 0, sizeof e);
  e.size = sizeof e;
  return e;
}

HELPER quota_config new_config(void) {
  quota_config c;
  memset(&c, 0, sizeof c);
  c.size = sizeof c;
  return c;
}

/* A request of tenant `tenant` (plan `plan`) on route `route`, at `now_ns`. */
HELPER quota_request new_request(const char* tenant, const char* plan, const char* route,
                                 int64_t now_ns) {
  quota_request r;
  memset(&r, 0, sizeof r);
  r.size = sizeof r;
  r.tenant = quota_s(tenant);
  r.plan = quota_s(plan);
  r.route = quota_s(route);
  r.flags = QUOTA_REQUEST_NOW;
  r.now_ns = now_ns;
  return r;
}

/* quota_reload's rules: a path or a text (NULL: not given). */
HELPER quota_rules new_rules(const char* path, const char* text) {
  quota_rules r;
  memset(&r, 0, sizeof r);
  r.size = sizeof r;
  r.path = quota_s(path);
  r.text = quota_s(text);
  return r;
}

HELPER quota_decision new_decision(void) {
  quota_decision d;
  memset(&d, 0, sizeof d);
  d.size = sizeof d;
  return d;
}

#endif
