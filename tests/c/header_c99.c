/* tests/c/header_c99.c — quota/c/quota.h compiled as C99 (-std=c99 -pedantic -Wall
 * -Wextra -Werror) and linked: the header is C, its functions are found in the library. */
#include "quota/c/quota.h"

#include <stdio.h>

int main(void) {
  quota_str s = quota_s("acme");
  if (s.len != 4 || quota_abi_version() != QUOTA_ABI_VERSION) return 1;
  printf("quota C interface, ABI %u\n", (unsigned)quota_abi_version());
  return 0;
}
