// Tests of RedisStore's batches: apply_pipelined (one script call per item, pipelined) and
// apply_batch (one script call, 10,000 buckets too) decide as the same requests one by one.
#include <cstddef>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "quota/policy/token_bucket.hpp"
#include "quota/redis/redis_store.hpp"
#include "support/printers.hpp"
#include "support/store_fixtures.hpp"

using namespace std::chrono_literals;
using quota::Decision;
using quota::Nanos;
using quota::Reason;
using quota::RedisStore;
using quota::RedisStoreOptions;
using quota::TokenBucket;
using quota::redis::TimeSource;
using quota::testing::kTen;
using quota::testing::options;
using quota::testing::run;

TEST_CASE("apply_pipelined pipelines a batch with the same decisions as one by one") {
  RedisStore<TokenBucket> store(options("many"));
  using Item = RedisStore<TokenBucket>::BatchItem;
  std::vector<Item> items;
  for (int i = 0; i < 64; ++i) items.push_back({i % 2 == 0 ? "{acme}hot" : "{acme}cold", 1});
  items.push_back({"{bad", 1});
  auto result = store.apply_pipelined(kTen, items, Nanos{0});
  REQUIRE(result.ok());
  REQUIRE(result->size() == 65);
  int hot_allowed = 0;
  for (int i = 0; i < 64; i += 2) {
    REQUIRE((*result)[i].ok());
    // in request order: the first 10 pass, then every one is denied
    CHECK((*result)[i]->allowed == (i / 2 < 10));
    hot_allowed += (*result)[i]->allowed;
  }
  CHECK(hot_allowed == 10);
  CHECK(absl::IsInvalidArgument((*result)[64].status()));
  // After SCRIPT FLUSH the batch still decides (NOSCRIPT → retried once with EVAL).
  run(store, {"SCRIPT", "FLUSH"});
  auto more =
      store.apply_pipelined(kTen, std::vector<Item>{{"{acme}new", 3}, {"{acme}new", 3}}, Nanos{0});
  REQUIRE(more.ok());
  REQUIRE((*more)[1].ok());
  CHECK((*more)[1]->remaining == 4);
}

TEST_CASE("apply_batch decides a batch of 10,000 buckets in one script call") {
  // More keys than Lua can unpack onto its stack at once (about 8,000): the script reads
  // the states in slices.
  RedisStore<TokenBucket> store(options("big-batch"));
  using Item = RedisStore<TokenBucket>::BatchItem;
  std::vector<std::string> keys;
  for (int i = 0; i < 10'000; ++i) keys.push_back("{big}k" + std::to_string(i));
  std::vector<Item> items;
  for (int round = 0; round < 2; ++round) {
    items.clear();
    for (const auto& k : keys) items.push_back({k, 6});
    auto got = store.apply_batch(kTen, items, Nanos{0});
    REQUIRE(got.ok());
    REQUIRE(got->size() == items.size());
    int allowed = 0;
    for (const auto& d : *got) {
      REQUIRE(d.ok());
      allowed += d->allowed;
      CHECK(d->remaining == 4);
    }
    CHECK(allowed == (round == 0 ? 10'000 : 0));  // 10 − 6 = 4 left: the second is denied
  }
}

TEST_CASE("apply_batch decides a batch in one script call exactly as one by one") {
  RedisStore<TokenBucket> batched(options("batch"));
  RedisStore<TokenBucket> single(options("batch-ref"));
  using Item = RedisStore<TokenBucket>::BatchItem;
  const std::vector<std::string> keys = {"{a}x", "{b}y", "c", "{a}z"};
  std::vector<Item> mixed;  // a cost per bucket
  std::vector<Item> same;   // one cost, sent once per call
  for (int i = 0; i < 64; ++i) {
    mixed.push_back({keys[i % keys.size()], 1 + i % 4});
    same.push_back({keys[i % keys.size()], 3});
  }
  for (int round = 0; round < 6; ++round) {
    const Nanos now{round * 700'000'000LL};
    const std::vector<Item>& items = round % 2 == 0 ? mixed : same;
    auto got = batched.apply_batch(kTen, items, now);
    REQUIRE(got.ok());
    REQUIRE(got->size() == items.size());
    for (std::size_t i = 0; i < items.size(); ++i) {
      auto expected = single.apply(kTen, items[i].key, now, items[i].cost);
      REQUIRE(expected.ok());
      INFO("round " << round << " item " << i);
      REQUIRE((*got)[i].ok());
      CHECK((*got)[i].value() == *expected);
    }
  }
  CHECK(absl::IsInvalidArgument(
      batched.apply_batch(kTen, std::vector<Item>{{"{bad", 1}}, Nanos{0}).status()));
}
