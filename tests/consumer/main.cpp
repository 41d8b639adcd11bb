// Built against the installed package by the consumer_installed_package test. Exits 0
// only if the limiter behaves: a burst of 3 admits 3 and denies the 4th.
#include <chrono>
#include <cstdio>

#include "quota/quota.hpp"

int main() {
  quota::ManualClock clock;
  auto limiter = quota::Limiter<quota::TokenBucket, quota::LocalStore, quota::ManualClock>::create(
      {.rate = {.units = 1, .per = std::chrono::seconds(1)}, .burst = 3}, {}, clock);
  if (!limiter.ok()) return 1;
  int admitted = 0;
  for (int i = 0; i < 4; ++i) admitted += limiter->acquire("tenant:read")->allowed ? 1 : 0;
  std::printf("admitted %d of 4 with burst 3\n", admitted);
  return admitted == 3 ? 0 : 1;
}
