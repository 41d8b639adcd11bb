// 040 — the envelope verifier on an admission log.
//
// A contract of 10 units per second with bursts of 5 promises: over ANY interval of
// length T, at most 10·T + 5 units are admitted. We log what a limiter admitted and let
// quota::verify check that exactly (integers only, every interval, O(n)).
//
//   1. One shared bucket serves two gateways: the log keeps the envelope.
//   2. Each gateway has its own bucket with the whole contract ("local-full"): the log
//      breaks it, and the verifier says by how much and where (the witness interval).
//
// Both gateways send one request every 50 ms for 2 s (20 per second each: over budget).
//
// Build and run:  cmake --preset dev && cmake --build --preset dev &&
//                 ./build/dev/examples/quickstart/quickstart-040-verifier
#include <chrono>
#include <cstdio>
#include <vector>

#include "quota/quota.hpp"
#include "quota/verify/envelope.hpp"

using namespace std::chrono_literals;
using quota::verify::AdmittedEvent;

const quota::TokenBucket kContract{.rate = {.units = 10, .per = 1s}, .burst = 5};

// Replays the traffic through `stores` (gateway g uses stores[g % stores.size()]) and
// returns the admitted (time, cost) log.
std::vector<AdmittedEvent> run(std::vector<quota::LocalStore<quota::TokenBucket>>& stores) {
  std::vector<AdmittedEvent> log;
  for (quota::Nanos t{0}; t <= 2s; t += 50ms) {
    for (std::size_t gateway = 0; gateway < 2; ++gateway) {
      auto& store = stores[gateway % stores.size()];
      if (store.apply(kContract, "tenant-7", t, 1)->allowed) log.push_back({t.count(), 1});
    }
  }
  return log;
}

int main() {
  std::vector<quota::LocalStore<quota::TokenBucket>> shared(1), per_gateway(2);
  const auto shared_log = run(shared);
  const auto local_log = run(per_gateway);

  auto ok = quota::verify::verify_token_bucket(shared_log, kContract.rate, kContract.burst);
  auto bad = quota::verify::verify_token_bucket(local_log, kContract.rate, kContract.burst);
  if (!ok.ok() || !bad.ok()) return 1;
  std::printf("shared bucket: %zu admitted; %s\n", shared_log.size(),
              quota::verify::to_string(*ok).c_str());
  std::printf("bucket per gateway: %zu admitted; %s\n", local_log.size(),
              quota::verify::to_string(*bad).c_str());
  std::printf("the per-gateway pair behaved like a burst of %lld, not %lld\n",
              static_cast<long long>(bad->required_burst()),
              static_cast<long long>(kContract.burst));

  // The witness must account for the excess exactly: admitted − r·T − B over its
  // interval, in units·rate.per (ns), is the reported excess.
  const auto& w = bad->witness;
  const absl::int128 per = kContract.rate.per.count();
  const absl::int128 recomputed =
      w.admitted * per - absl::int128(kContract.rate.units) * (w.last_time_ns - w.first_time_ns) -
      absl::int128(kContract.burst) * per;
  // Over [0, 2 s] the shared bucket hands out exactly r·T + B = 25 units (no loss); each
  // of the two private buckets hands out as much, so the excess is one more r·T + B.
  const std::int64_t envelope = kContract.rate.units * 2 + kContract.burst;
  const bool as_expected =
      ok->holds() && !bad->holds() && static_cast<std::int64_t>(shared_log.size()) == envelope &&
      static_cast<std::int64_t>(local_log.size()) == 2 * envelope &&
      bad->excess_micro() == quota::to_micro(envelope) && recomputed == bad->excess_scaled;
  std::printf("%s\n",
              as_expected ? "as expected: shared holds, per-gateway breaks r*T + B" : "UNEXPECTED");
  return as_expected ? 0 : 1;
}
