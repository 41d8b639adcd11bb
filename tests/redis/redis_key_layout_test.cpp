// Typed level keys: the layout a key is built with (gateway::StoreKey::level) is the one
// redis::layout_of reads back from the key alone, so the Redis keys formatted from it are
// the ones a key given by hand gets; and the Gateway hands every backend its levels with
// their layouts, so no backend has to read one from a key.
#include <chrono>
#include <memory>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <catch2/catch.hpp>

#include "quota/gateway/gateway.hpp"
#include "quota/redis/keys.hpp"
#include "quota/store/local_store.hpp"
#include "support/seed.hpp"

namespace gw = quota::gateway;

namespace {

std::string draw(std::mt19937_64& rng, std::string_view alphabet, std::size_t min,
                 std::size_t max) {
  std::string out(std::uniform_int_distribution<std::size_t>(min, max)(rng), 'a');
  for (char& c : out) c = alphabet[rng() % alphabet.size()];
  return out;
}

// Records the layouts of the levels it is asked to decide; decides through a StoreBackend.
class RecordingBackend final : public gw::Backend {
 public:
  explicit RecordingBackend(gw::Backend& inner) : inner_(inner) {}
  absl::StatusOr<gw::LevelsResult> decide(std::span<const gw::LevelCheck> levels,
                                          std::uint64_t version, quota::Nanos now) override {
    for (const gw::LevelCheck& l : levels) seen.push_back({std::string(l.key), l.layout});
    return inner_.decide(levels, version, now);
  }
  absl::StatusOr<quota::MicroUnits> refund(const gw::RulePolicy& p, std::uint64_t v, gw::LevelKey k,
                                           std::int64_t u, quota::Nanos s,
                                           quota::Nanos n) override {
    given.push_back({std::string(k.key), k.layout});
    return inner_.refund(p, v, k, u, s, n);
  }
  absl::StatusOr<quota::MicroUnits> charge(const gw::RulePolicy& p, std::uint64_t v, gw::LevelKey k,
                                           std::int64_t u, quota::Nanos n) override {
    given.push_back({std::string(k.key), k.layout});
    return inner_.charge(p, v, k, u, n);
  }
  struct Seen {
    std::string key;
    std::optional<gw::KeyLayout> layout;
  };
  std::vector<Seen> seen;   // decide's levels
  std::vector<Seen> given;  // refund's and charge's keys

 private:
  gw::Backend& inner_;
};

}  // namespace

TEST_CASE("a level key's layout is the one read back from the key, and formats the same Redis keys",
          "[redis][keys]") {
  std::mt19937_64 rng(quota::testing::test_seed(20261207));
  const std::string ids = "ABCxyz019._@-";
  const std::string names = "abz09_.-";
  for (int i = 0; i < 2000; ++i) {
    const bool global = rng() % 4 == 0;
    const std::string tag = global ? "~global" : draw(rng, ids, 1, 128);
    const std::string route = draw(rng, names, 0, 64);
    const std::string limit = route.empty() ? draw(rng, names, 1, 64) : draw(rng, names, 0, 64);
    const std::string user = global ? "" : draw(rng, ids, 0, 128);
    const gw::StoreKey key = gw::StoreKey::level(tag, route, limit, user);
    INFO("key " << key.view());
    std::string expected = "{" + tag + "}" + route;
    if (!limit.empty()) expected += "#" + limit;
    if (!user.empty()) expected += "/" + user;
    REQUIRE(key.view() == expected);
    const gw::KeyLayout& built = key.layout();
    CHECK(built.scope(key) == "{" + tag + "}");
    CHECK(built.tag(key) == tag);
    CHECK(built.record(key) == limit);
    if (key.view().size() > quota::redis::kMaxStoreKeyBytes) continue;  // Redis refuses it
    auto read = quota::redis::layout_of(key);
    REQUIRE(read.ok());
    CHECK(read->scope_size == built.scope_size);
    CHECK(read->record_at == built.record_at);
    CHECK(read->record_size == built.record_size);
    const auto formatted = quota::redis::scope_key("q:", key, built);
    auto parsed = quota::redis::scope_key("q:", key);
    REQUIRE(parsed.ok());
    CHECK(formatted.first == parsed->first);
    CHECK(formatted.second == parsed->second);
    CHECK(formatted.first == "q:{" + tag + "}" + route + (user.empty() ? "" : "/" + user));
  }
}

TEST_CASE("a key without braces is its own scope: \"<prefix>{key}\", no record", "[redis][keys]") {
  auto layout = quota::redis::layout_of("tenant-7:read#x");
  REQUIRE(layout.ok());
  CHECK(layout->scope_size == 0);
  CHECK(layout->record_size == 0);
  const auto k = quota::redis::scope_key("q:", "tenant-7:read#x", *layout);
  CHECK(k.first == "q:{tenant-7:read#x}");
  CHECK(k.second.empty());
  // A '#' with nothing after it is record "" of the scope, as a key without one.
  auto empty = quota::redis::layout_of("{acme}read#");
  REQUIRE(empty.ok());
  CHECK(empty->record_at == 11);
  CHECK(empty->record_size == 0);
  CHECK(quota::redis::scope_key("q:", "{acme}read#", *empty).first == "q:{acme}read");
  CHECK(quota::redis::scope_key("q:", "{acme}read#", *empty).second.empty());
  CHECK_FALSE(quota::redis::layout_of("{acme}read}x").ok());
  CHECK_FALSE(quota::redis::layout_of("{acme}#" + std::string(65, 'a')).ok());
}

namespace {

// User, tenant, a named tenant limit and global levels on route "read", 100 per second each.
std::shared_ptr<const gw::RuleSet> four_levels() {
  using quota::TokenBucket;
  using namespace std::chrono_literals;
  gw::RuleSetSpec spec;
  gw::RouteClass read;
  read.name = "read";
  spec.routes.push_back(read);
  const TokenBucket bucket{.rate = {100, 1s}, .burst = 100};
  spec.rules.push_back({.level = gw::Level::kUser,
                        .plan = "free",
                        .route = "read",
                        .name = "user",
                        .policy = bucket});
  spec.rules.push_back({.level = gw::Level::kTenant,
                        .plan = "free",
                        .route = "read",
                        .name = "tenant",
                        .policy = bucket});
  spec.rules.push_back({.level = gw::Level::kTenant,
                        .plan = "free",
                        .route = "read",
                        .name = "tpm",
                        .policy = bucket,
                        .limit = "tpm"});
  spec.rules.push_back(
      {.level = gw::Level::kGlobal, .route = "read", .name = "global", .policy = bucket});
  auto rules = gw::RuleSet::create(spec);
  REQUIRE(rules.ok());
  return *rules;
}

// Each of `seen` carries a layout, the one read back from its key.
void check_layouts(const std::vector<RecordingBackend::Seen>& seen) {
  for (const auto& [key, layout] : seen) {
    INFO("key " << key);
    REQUIRE(layout.has_value());
    auto read_back = quota::redis::layout_of(key);
    REQUIRE(read_back.ok());
    CHECK(layout->scope_size == read_back->scope_size);
    CHECK(layout->record_at == read_back->record_at);
    CHECK(layout->record_size == read_back->record_size);
  }
}

// four_levels() on an in-process store, every call through a RecordingBackend.
struct Recorded {
  gw::RuleRegistry registry{four_levels()};
  quota::LocalStore<gw::KeyPolicy> store;
  gw::StoreBackend<quota::LocalStore<gw::KeyPolicy>> inner{store};
  RecordingBackend recording{inner};
};

}  // namespace

TEST_CASE("the Gateway gives every backend its levels with the layouts they were built with",
          "[redis][keys]") {
  Recorded f;
  RecordingBackend& recording = f.recording;
  gw::Gateway gateway(recording, f.registry);
  auto r = gateway.decide(
      {.who = {.tenant = "acme", .plan = "free", .user = "u-1"}, .route = "read"}, quota::Nanos{0});
  REQUIRE(r.ok());
  REQUIRE(r->decision.allowed);
  REQUIRE(recording.seen.size() == 4);
  check_layouts(recording.seen);
  CHECK(recording.seen[0].layout->scope(recording.seen[0].key) == "{acme}");
  CHECK(recording.seen.back().layout->scope(recording.seen.back().key) == "{~global}");
}

TEST_CASE("a settle gives back and charges every level with the layout it was decided with",
          "[redis][keys]") {
  Recorded f;
  RecordingBackend& recording = f.recording;
  gw::Gateway gateway(recording, f.registry, {.charge_deficit = true});
  const gw::Request req{.who = {.tenant = "acme", .plan = "free", .user = "u-1"}, .route = "read"};
  auto over = gateway.acquire_estimate(req, 30, quota::Nanos{0});
  REQUIRE(over.ok());
  REQUIRE(over->ticket.has_value());
  REQUIRE(gateway.settle("acme", *over->ticket, 10, quota::Nanos{0}).ok());  // a surplus: refunds
  auto under = gateway.acquire_estimate(req, 5, quota::Nanos{0});
  REQUIRE(under.ok());
  REQUIRE(under->ticket.has_value());
  REQUIRE(gateway.settle("acme", *under->ticket, 8, quota::Nanos{0}).ok());  // a deficit: charges
  REQUIRE(recording.given.size() == 8);
  check_layouts(recording.given);
  CHECK(recording.given[0].key == recording.seen[0].key);
}
