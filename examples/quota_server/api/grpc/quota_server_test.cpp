// quota_server_test — quota-server as a process on free loopback ports, called with the
// generated gRPC C++ client (Envoy's RLS v3).
//
// The server is the binary in $QUOTA_SERVER with the rules in $QUOTA_SERVER_RULES
// (testdata/rules.yaml: per-tenant token buckets refilled 1 unit per 100 s, so remaining
// counts are exact while a test runs). One server serves every test case; each case uses
// its own tenants.
#include <catch2/catch.hpp>
#include <cstdlib>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include "envoy/service/ratelimit/v3/rls.grpc.pb.h"
#include "testing/scratch.hpp"
#include "testing/server_process.hpp"

namespace {

namespace rls = envoy::service::ratelimit::v3;
using Code = rls::RateLimitResponse;

using quota::testing::env;

// The one server of this test binary (started on first use, stopped at exit).
quota::testing::ServerProcess& server() {
  static quota::testing::ServerProcess s;
  if (!s.running()) {
    REQUIRE(!env("QUOTA_SERVER").empty());
    REQUIRE(s.start({env("QUOTA_SERVER"), "--rules", env("QUOTA_SERVER_RULES"), "--domain", "api",
                     "--default-plan", "free", "--grpc-port", "0", "--http-port", "0", "--max-cost",
                     "1000", "--fresh-budgets-at-start"},
                    {"grpc"}));
  }
  return s;
}

struct Descriptor {
  std::vector<std::pair<std::string, std::string>> entries;
  long long hits = -1;  // -1: no descriptor hits_addend
};

rls::RateLimitRequest request(const std::vector<Descriptor>& ds, unsigned hits = 0,
                              const std::string& domain = "api") {
  rls::RateLimitRequest r;
  r.set_domain(domain);
  r.set_hits_addend(hits);
  for (const Descriptor& d : ds) {
    auto* p = r.add_descriptors();
    for (const auto& [k, v] : d.entries) {
      auto* e = p->add_entries();
      e->set_key(k);
      e->set_value(v);
    }
    if (d.hits >= 0) p->mutable_hits_addend()->set_value(static_cast<std::uint64_t>(d.hits));
  }
  return r;
}

Descriptor read(const std::string& tenant, long long hits = -1) {
  return {{{"tenant", tenant}, {"route", "read"}}, hits};
}

struct Call {
  grpc::Status status;
  rls::RateLimitResponse response;
};

Call call(const rls::RateLimitRequest& req) {
  static auto stub = rls::RateLimitService::NewStub(grpc::CreateChannel(
      "127.0.0.1:" + std::to_string(server().port("grpc")), grpc::InsecureChannelCredentials()));
  Call c;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  c.status = stub->ShouldRateLimit(&ctx, req, &c.response);
  return c;
}

std::string header(const rls::RateLimitResponse& r, const std::string& key) {
  for (const auto& h : r.response_headers_to_add()) {
    if (h.key() == key) return h.value();
  }
  return "(absent)";
}

// The remaining budget of `tenant`'s read route, spending 1 unit to learn it.
long long read_remaining_after_one(const std::string& tenant) {
  const Call c = call(request({read(tenant)}));
  REQUIRE(c.status.ok());
  REQUIRE(c.response.statuses_size() == 1);
  return c.response.statuses(0).limit_remaining();
}

}  // namespace

TEST_CASE("a check within budget is OK with the limit, remaining and RateLimit headers") {
  const Call c = call(request({read("grpc-ok")}));
  REQUIRE(c.status.ok());
  CHECK(c.response.overall_code() == Code::OK);
  REQUIRE(c.response.statuses_size() == 1);
  const auto& s = c.response.statuses(0);
  CHECK(s.code() == Code::OK);
  CHECK(s.limit_remaining() == 9);
  CHECK(s.current_limit().name() == "free-read");
  // 1 unit per 100 s: 36 per HOUR.
  CHECK(s.current_limit().requests_per_unit() == 36);
  CHECK(s.current_limit().unit() == rls::RateLimitResponse::RateLimit::HOUR);
  // One unit refills in 100 s (truncated to whole seconds by the time it is read).
  CHECK(s.duration_until_reset().seconds() >= 99);
  CHECK(s.duration_until_reset().seconds() <= 100);
  CHECK(header(c.response, "RateLimit-Policy") == "\"free-read\";q=10;w=1000");
  CHECK(header(c.response, "RateLimit") == "\"free-read\";r=9;t=100");
  CHECK(header(c.response, "Retry-After") == "(absent)");
}

TEST_CASE("hits_addend is the cost; OVER_LIMIT with Retry-After once the budget is spent") {
  Call c = call(request({read("grpc-over")}, 4));  // the request's hits_addend
  REQUIRE(c.status.ok());
  CHECK(c.response.statuses(0).limit_remaining() == 6);
  c = call(request({read("grpc-over", 5)}, 4));  // the descriptor's own wins
  REQUIRE(c.status.ok());
  CHECK(c.response.statuses(0).limit_remaining() == 1);
  c = call(request({read("grpc-over", 2)}));
  REQUIRE(c.status.ok());
  CHECK(c.response.overall_code() == Code::OVER_LIMIT);
  CHECK(c.response.statuses(0).code() == Code::OVER_LIMIT);
  CHECK(c.response.statuses(0).limit_remaining() == 1);
  CHECK(c.response.statuses(0).current_limit().name() == "free-read");
  // 1 more unit: 100 s; whole seconds rounded up, so exact unless a second has passed.
  CHECK_THAT(header(c.response, "Retry-After"), Catch::Matchers::Matches("100|99"));
  CHECK_THAT(header(c.response, "RateLimit"),
             Catch::Matchers::Matches("\"free-read\";r=1;t=(900|899)"));
  // The denial deducted nothing: the last unit is still there.
  CHECK(read_remaining_after_one("grpc-over") == 0);
}

TEST_CASE("statuses come in request order, each descriptor decided on its own") {
  // Without hits_addend a create pays the rule file's cost, 5.
  const Descriptor create{{{"tenant", "grpc-order-b"}, {"route", "create"}}};
  Call c = call(request({read("grpc-order-a"), create}));
  REQUIRE(c.status.ok());
  REQUIRE(c.response.statuses_size() == 2);
  CHECK(c.response.statuses(0).current_limit().name() == "free-read");
  CHECK(c.response.statuses(0).limit_remaining() == 9);
  CHECK(c.response.statuses(1).current_limit().name() == "free-create");
  CHECK(c.response.statuses(1).limit_remaining() == 15);
  // The headers are those of the descriptor with the least remaining.
  CHECK(header(c.response, "RateLimit") == "\"free-read\";r=9;t=100");

  c = call(request({{{{"tenant", "grpc-order-b"}, {"route", "create"}}, 15}}));
  REQUIRE(c.status.ok());
  CHECK(c.response.statuses(0).limit_remaining() == 0);
  c = call(request({read("grpc-order-a"), create, read("grpc-order-c")}));
  REQUIRE(c.status.ok());
  CHECK(c.response.overall_code() == Code::OVER_LIMIT);
  REQUIRE(c.response.statuses_size() == 3);
  CHECK(c.response.statuses(0).code() == Code::OK);
  CHECK(c.response.statuses(0).limit_remaining() == 8);
  CHECK(c.response.statuses(1).code() == Code::OVER_LIMIT);
  CHECK(c.response.statuses(2).code() == Code::OK);
  CHECK(c.response.statuses(2).limit_remaining() == 9);
  // The denied descriptor's headers.
  CHECK(header(c.response, "RateLimit-Policy") == "\"free-create\";q=20;w=2000");
  CHECK_THAT(header(c.response, "Retry-After"), Catch::Matchers::Matches("500|499"));
}

TEST_CASE("a per-request cap of the rule file is OVER_LIMIT, nothing deducted") {
  const Descriptor batch{{{"tenant", "grpc-cap"}, {"route", "batch"}}, 11};
  Call c = call(request({batch}));
  REQUIRE(c.status.ok());
  CHECK(c.response.overall_code() == Code::OVER_LIMIT);
  c = call(request({{batch.entries, 10}}));
  REQUIRE(c.status.ok());
  CHECK(c.response.overall_code() == Code::OK);
  CHECK(c.response.statuses(0).limit_remaining() == 90);
}

TEST_CASE("bad input is INVALID_ARGUMENT naming it, and nothing is deducted") {
  const std::string t = "grpc-bad";
  struct Case {
    std::string what;
    rls::RateLimitRequest req;
    std::string message;
  };
  rls::RateLimitRequest with_limit = request({read(t)});
  const rls::RateLimitRequest too_many = request(std::vector<Descriptor>(65, read(t)));
  with_limit.mutable_descriptors(0)->mutable_limit()->set_requests_per_unit(1000);
  const std::vector<Case> cases = {
      {"empty domain", request({read(t)}, 0, ""), "domain is empty"},
      {"unknown domain", request({read(t)}, 0, "other"), "unknown domain \"other\""},
      {"no descriptors", request({}), "no descriptors"},
      {"missing tenant", request({{{{"route", "read"}}}}),
       "descriptors[0]: entry \"tenant\" is missing"},
      {"unknown route", request({{{{"tenant", t}, {"route", "nope"}}}}),
       "descriptors[0]: unknown route class \"nope\""},
      {"unknown key", request({{{{"tenant", t}, {"remote_address", "10.0.0.1"}}}}),
       "unknown entry key \"remote_address\""},
      {"empty value", request({{{{"tenant", t}, {"route", ""}}}}),
       "entry \"route\" has an empty value"},
      {"huge request hits_addend", request({read(t)}, 4'000'000'000u),
       "cost 4000000000 is outside [1, 1000]"},
      {"huge descriptor hits_addend", request({read(t, 1'000'000'000'000'000'000)}),
       "cost 1000000000000000000 is outside [1, 1000]"},
      {"zero descriptor hits_addend", request({read(t, 0)}), "cost 0 is outside [1, 1000]"},
      {"limit override", with_limit, "per-request limit override is not supported"},
      {"65 descriptors", too_many, "65 descriptors; one call carries at most 64"},
      // The first descriptor is valid: it must not be charged either.
      {"second descriptor bad",
       request({read(t), {{{"tenant", "bad tenant!"}, {"route", "read"}}}}), "descriptors[1]: "},
  };
  for (const Case& k : cases) {
    INFO(k.what);
    const Call c = call(k.req);
    CHECK(c.status.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
    CHECK_THAT(c.status.error_message(), Catch::Matchers::Contains(k.message));
  }
  CHECK(read_remaining_after_one(t) == 9);
}

TEST_CASE("a tenant without any tenant rule is NOT_FOUND, nothing deducted") {
  const Call c = call(request({{{{"tenant", "grpc-pro"}, {"plan", "pro"}, {"route", "read"}}}}));
  CHECK(c.status.error_code() == grpc::StatusCode::NOT_FOUND);
  CHECK_THAT(c.status.error_message(), Catch::Matchers::Contains("no tenant rule"));
}

TEST_CASE("bytes that are not a RateLimitRequest are refused, nothing deducted") {
  // Sent through the generic stub: the length-delimited field 2 claims 100 bytes that
  // never come.
  grpc::GenericStub stub(grpc::CreateChannel("127.0.0.1:" + std::to_string(server().port("grpc")),
                                             grpc::InsecureChannelCredentials()));
  const std::string garbage = std::string(
                                  "\x0a\x03"
                                  "api"
                                  "\x12\x64",
                                  7) +
                              "tenant";
  grpc::Slice slice(garbage);
  const grpc::ByteBuffer request(&slice, 1);
  grpc::ByteBuffer response;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  std::promise<grpc::Status> done;
  stub.UnaryCall(&ctx, "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit",
                 grpc::StubOptions(), &request, &response,
                 [&done](grpc::Status s) { done.set_value(std::move(s)); });
  auto finished = done.get_future();
  REQUIRE(finished.wait_for(std::chrono::seconds(60)) == std::future_status::ready);
  const grpc::Status status = finished.get();
  INFO("status " << status.error_code() << ": " << status.error_message());
  // gRPC's own decoder refuses it before the service runs.
  CHECK(status.error_code() == grpc::StatusCode::INTERNAL);
  // The bytes name tenant "tenant" (as far as they go): its budget is untouched.
  CHECK(read_remaining_after_one("tenant") == 9);
}
