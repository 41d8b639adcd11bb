// 010 — a token bucket in-process.
//
// A tenant may spend 5 units per second with bursts of up to 10. We spend from it on a
// manual clock (so the output is the same on every run) and print each decision.
//
// Build and run:  cmake --preset dev && cmake --build --preset dev &&
//                 ./build/dev/examples/quickstart/quickstart-010-token-bucket
#include <chrono>
#include <cstdio>

#include "quota/quota.hpp"

int main() {
  using namespace std::chrono_literals;
  quota::ManualClock clock;
  auto limiter = quota::Limiter<quota::TokenBucket, quota::LocalStore, quota::ManualClock>::create(
      {.rate = {.units = 5, .per = 1s}, .burst = 10}, {}, clock);
  if (!limiter.ok()) {
    std::fprintf(stderr, "bad policy: %s\n", limiter.status().ToString().c_str());
    return 1;
  }

  // "create" costs 4 units: two pass from the full bucket of 10, the third is denied.
  int admitted = 0;
  for (int i = 0; i < 3; ++i) {
    quota::Decision d = *limiter->acquire("tenant-7:create", 4);
    admitted += d.allowed;
    std::printf("t=%5.3fs create cost 4: %-10s remaining %lld, retry after %lld ms\n",
                clock.now().count() / 1e9, std::string(quota::to_string(d.reason)).c_str(),
                static_cast<long long>(d.remaining),
                static_cast<long long>(
                    std::chrono::duration_cast<std::chrono::milliseconds>(d.retry_after).count()));
  }
  // 2 units left; 4 needed; at 5 units/s the missing 2 take exactly 400 ms.
  clock.advance(400ms);
  quota::Decision d = *limiter->acquire("tenant-7:create", 4);
  admitted += d.allowed;
  std::printf("t=%5.3fs create cost 4: %-10s remaining %lld\n", clock.now().count() / 1e9,
              std::string(quota::to_string(d.reason)).c_str(), static_cast<long long>(d.remaining));

  // A cost above the burst is a configuration error, not "retry later".
  quota::Decision too_big = *limiter->acquire("tenant-7:create", 11);
  std::printf("cost 11 > burst 10: %s\n", std::string(quota::to_string(too_big.reason)).c_str());

  const bool ok = admitted == 3 && too_big.reason == quota::Reason::kCostExceedsBurst;
  std::printf("%s\n", ok ? "as expected: 3 admitted" : "UNEXPECTED");
  return ok ? 0 : 1;
}
