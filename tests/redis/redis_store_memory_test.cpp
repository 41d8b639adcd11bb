// Tests of the window twins' bytes per key (MEMORY USAGE) against the same state written
// as struct-packed doubles.
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>

#include <catch2/catch.hpp>

#include "quota/policy/fixed_window.hpp"
#include "quota/policy/sliding_window_estimate.hpp"
#include "quota/redis/redis_store.hpp"
#include "support/printers.hpp"
#include "support/store_fixtures.hpp"

using namespace std::chrono_literals;
using quota::Nanos;
using quota::RedisStore;
using quota::redis::TimeSource;
using quota::testing::options;
using quota::testing::run_in;
using quota::testing::set_doubles;
using quota::testing::TenOf;

TEMPLATE_TEST_CASE("a window key takes fewer bytes than as doubles (MEMORY USAGE)", "",
                   quota::FixedWindow, quota::SlidingWindowEstimate) {
  using Ten = TenOf<TestType>;
  RedisStore<TestType> store(options(std::string("memory-") + Ten::name, TimeSource::kServer));
  const TestType p = Ten::policy();
  auto key = store.redis_key("{acme}mem-new");
  auto old_key = store.redis_key("{acme}mem-old");  // a key of the same length
  REQUIRE(key.ok());
  REQUIRE(old_key.ok());
  REQUIRE(key->size() == old_key->size());
  // A key left by an earlier run would be overwritten in place (SETRANGE: a raw string,
  // another size): start from none.
  run_in(store, {"DEL", *key, *old_key});
  auto d = store.apply(p, "{acme}mem-new", Nanos{0}, 3);
  REQUIRE(d.ok());
  REQUIRE(d->allowed);
  // The same decision's state as doubles (counted 3 at 10 s), with a TTL too.
  auto state = p.init(Nanos{10s});
  REQUIRE(p.apply(state, Nanos{10s}, 3).allowed);
  set_doubles(store, *old_key, state);
  const long long now_bytes = run_in(store, {"MEMORY", "USAGE", *key})->integer;
  const long long old_bytes = run_in(store, {"MEMORY", "USAGE", *old_key})->integer;
  std::printf("MEMORY USAGE of one %s key (key of %zu bytes): %lld bytes (as doubles: %lld)\n",
              Ten::name, key->size(), now_bytes, old_bytes);
  INFO(Ten::name << ": " << now_bytes << " bytes, as doubles " << old_bytes);
  CHECK(run_in(store, {"STRLEN", *key})->integer == static_cast<long long>(Ten::bytes));
  CHECK(now_bytes > 0);
  CHECK(now_bytes < old_bytes);
}
