/* tests/c/c_api_versions_test.c — structs passed at another version's size: a host built
 * against ABI 1 (its quota_config ends at `mode`) opens and decides on this library, the
 * fields its size does not cover reading as their defaults; a host built against a newer
 * header passes larger structs: accepted while the fields this library does not know are
 * 0, refused naming the byte when one is set, and an output struct's unknown tail comes
 * back zeroed; a size below a struct's first version is refused. And ABI 2's fields
 * (WAIT and coalescing) are refused on an in-process store and outside their bounds. */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"

/* tests/c/rules.yaml (QUOTA_C_TEST_RULES): free-read, a burst of 3. */
static const char* rules_path;

/* quota_config as ABI 1's header declared it. */
typedef struct config_abi1 {
  size_t size;
  quota_str rules_path;
  quota_str rules_text;
  int32_t store;
  uint32_t opt_out;
  quota_str redis_addresses;
  quota_str redis_sentinel_master;
  quota_str redis_username;
  quota_str redis_password;
  quota_str redis_sentinel_password;
  int64_t redis_deadline_ms;
  int64_t redis_connections;
  int64_t max_keys;
  int32_t mode;
} config_abi1;

/* Structs as a later header might declare them: one more field at the end. */
typedef struct config_next {
  quota_config c;
  int64_t later;
} config_next;
typedef struct decision_next {
  quota_decision d;
  int64_t later;
} decision_next;

static void test_abi1_config_opens(void) {
  quota_error err = new_error();
  quota_handle h = 0;
  config_abi1 old;
  quota_request r = new_request("acme", "free", "read", 0);
  quota_decision d = new_decision();
  int allowed = 0;
  int i;
  /* ABI 1's struct ends where ABI 2's fields begin. */
  CHECK(sizeof old == offsetof(quota_config, redis_replicas));
  memset(&old, 0, sizeof old);
  old.size = sizeof old;
  old.rules_path = quota_s(rules_path);
  old.opt_out = QUOTA_OPT_OUT_RESTART_SAFETY;
  CHECK_CODE(quota_open((const quota_config*)&old, &h, &err), QUOTA_OK);
  for (i = 0; i < 5; ++i) {
    CHECK_CODE(quota_decide(h, &r, &d, &err), QUOTA_OK);
    allowed += d.allowed;
  }
  CHECK(allowed == 3); /* the burst, as with this version's struct */
  CHECK_CODE(quota_close(h, &err), QUOTA_OK);
  /* One byte short of ABI 1's struct: below the first version. */
  old.size = sizeof old - 1;
  CHECK_CODE(quota_open((const quota_config*)&old, &h, &err), QUOTA_INVALID_ARGUMENT);
  CHECK(strstr(err.message, "config: size") != NULL &&
        strstr(err.message, "first version") != NULL);
}

static void test_newer_structs(void) {
  quota_error err = new_error();
  quota_handle h = 0;
  config_next next;
  decision_next out;
  quota_request r = new_request("acme", "free", "read", 0);
  memset(&next, 0, sizeof next);
  next.c.size = sizeof next;
  next.c.rules_path = quota_s(rules_path);
  next.c.opt_out = QUOTA_OPT_OUT_RESTART_SAFETY;
  /* A field this library does not have, set: refused, naming where. */
  next.later = 1;
  CHECK_CODE(quota_open(&next.c, &h, &err), QUOTA_INVALID_ARGUMENT);
  CHECK(strstr(err.message, "a field it does not have") != NULL);
  /* Left 0: what a field this library does not know must be. */
  next.later = 0;
  CHECK_CODE(quota_open(&next.c, &h, &err), QUOTA_OK);
  memset(&out, 0x5a, sizeof out);
  out.d.size = sizeof out;
  CHECK_CODE(quota_decide(h, &r, &out.d, &err), QUOTA_OK);
  CHECK(out.d.size == sizeof out); /* the caller's size, kept */
  CHECK(out.d.allowed == 1 && out.d.remaining == 2 && strcmp(out.d.rule, "free-read") == 0);
  CHECK(out.later == 0); /* the tail this library does not know, zeroed */
  CHECK_CODE(quota_close(h, &err), QUOTA_OK);
}

static void test_abi2_fields_checked(void) {
  quota_error err = new_error();
  quota_handle h = 0;
  quota_config c = new_config();
  c.rules_path = quota_s(rules_path);
  c.redis_replicas = 1;
  CHECK_CODE(quota_open(&c, &h, &err), QUOTA_INVALID_ARGUMENT);
  CHECK(strstr(err.message, "redis_replicas: 1, but the store is in process") != NULL);
  c.redis_replicas = 0;
  c.redis_coalesce = 8;
  CHECK_CODE(quota_open(&c, &h, &err), QUOTA_INVALID_ARGUMENT);
  CHECK(strstr(err.message, "redis_coalesce") != NULL);
  /* On a Redis store each is checked before anything is reached (port 1: nothing). */
  c = new_config();
  c.rules_path = quota_s(rules_path);
  c.store = QUOTA_STORE_REDIS;
  c.redis_addresses = quota_s("127.0.0.1:1");
  c.redis_replicas = 65;
  CHECK_CODE(quota_open(&c, &h, &err), QUOTA_INVALID_ARGUMENT);
  CHECK(strstr(err.message, "redis_replicas: 65, outside [0, 64]") != NULL);
  c.redis_replicas = 0;
  c.redis_replica_timeout_ms = 5;
  CHECK_CODE(quota_open(&c, &h, &err), QUOTA_INVALID_ARGUMENT);
  CHECK(strstr(err.message, "set without redis_replicas") != NULL);
  c.redis_replicas = 1;
  c.redis_replica_timeout_ms = 50; /* the default deadline: WAIT would outlast the call */
  CHECK_CODE(quota_open(&c, &h, &err), QUOTA_INVALID_ARGUMENT);
  /* Refused by the store's own check of its options, before anything is reached. */
  CHECK(strstr(err.message, "redis options: ") != NULL &&
        strstr(err.message, "below the call's deadline (50000 us)") != NULL);
  c.redis_replicas = 0;
  c.redis_replica_timeout_ms = 0;
  c.redis_coalesce = 4097;
  CHECK_CODE(quota_open(&c, &h, &err), QUOTA_INVALID_ARGUMENT);
  CHECK(strstr(err.message, "coalesce=4097, must be in [0, 4096]") != NULL);
  c.redis_coalesce = 0;
  c.redis_coalesce_calls = 3;
  CHECK_CODE(quota_open(&c, &h, &err), QUOTA_INVALID_ARGUMENT);
  CHECK(strstr(err.message, "redis_coalesce_calls: set without redis_coalesce >= 2") != NULL);
}

int main(void) {
  rules_path = getenv("QUOTA_C_TEST_RULES");
  CHECK(rules_path != NULL);
  CHECK(quota_abi_version() >= QUOTA_ABI_VERSION);
  test_abi1_config_opens();
  test_newer_structs();
  test_abi2_fields_checked();
  printf("c_api_versions_test: %d checks passed\n", checks_passed);
  return 0;
}
