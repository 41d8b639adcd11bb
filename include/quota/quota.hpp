// quota/quota.hpp — the umbrella header: every in-process part of quota.
//
// quota decides, for every API request, whether a tenant may spend `cost` units of its
// budget now, with exact integer arithmetic and the same answer from every thread.
// The Redis store lives in quota/redis/ and its own CMake target (quota::redis).
//
//   #include "quota/quota.hpp"
//   auto limiter = quota::Limiter<quota::TokenBucket>::create(
//       {.rate = {.units = 100, .per = std::chrono::seconds(1)}, .burst = 20});
//   auto d = limiter->acquire("tenant-7:read");
#pragma once

#include "quota/attempts.hpp"
#include "quota/clock.hpp"
#include "quota/decision.hpp"
#include "quota/fair/fair_share.hpp"
#include "quota/fair/fair_share_results.hpp"
#include "quota/fair/holder_split.hpp"
#include "quota/fair/weighted_max_min.hpp"
#include "quota/gateway/gateway.hpp"
#include "quota/gateway/key_state.hpp"
#include "quota/gateway/leases/leased_backend.hpp"
#include "quota/gateway/metrics.hpp"
#include "quota/gateway/request.hpp"
#include "quota/gateway/rules/rules.hpp"
#include "quota/gateway/settle.hpp"
#include "quota/gateway/store_key.hpp"
#include "quota/http.hpp"
#include "quota/lease/authority.hpp"
#include "quota/lease/leased_limiter.hpp"
#include "quota/limiter.hpp"
#include "quota/policy/fixed_window.hpp"
#include "quota/policy/policy.hpp"
#include "quota/policy/sliding_log.hpp"
#include "quota/policy/sliding_window_estimate.hpp"
#include "quota/policy/token_bucket.hpp"
#include "quota/store/local_store.hpp"
#include "quota/store/sharded_store.hpp"
#include "quota/store/store.hpp"
#include "quota/units.hpp"
#include "quota/verify/envelope.hpp"
#include "quota/verify/events.hpp"
#include "quota/verify/monitor.hpp"
