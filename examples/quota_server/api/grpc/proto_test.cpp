// proto_test — the generated RLS v3 messages have Envoy's exact package, message and field
// names and numbers (examples/quota_server/proto, from docs/service.md): a change to any
// of them would make Envoy unable to talk to quota-server. Checked through protobuf's
// descriptors, plus a wire round trip of a request and a response.
#include <catch2/catch.hpp>
#include <string>

#include "envoy/service/ratelimit/v3/rls.grpc.pb.h"
#include "envoy/service/ratelimit/v3/rls.pb.h"

namespace {

namespace rls = envoy::service::ratelimit::v3;
namespace common = envoy::extensions::common::ratelimit::v3;
using google::protobuf::Descriptor;
using google::protobuf::FieldDescriptor;

// The field `name` of `d`: its number and its type's full name (message or enum), or
// its scalar type name.
std::string field(const Descriptor* d, const std::string& name) {
  const FieldDescriptor* f = d->FindFieldByName(name);
  if (f == nullptr) return "(missing)";
  std::string type = f->type_name();
  if (f->message_type() != nullptr) type = f->message_type()->full_name();
  if (f->enum_type() != nullptr) type = f->enum_type()->full_name();
  return std::to_string(f->number()) + " " + (f->is_repeated() ? "repeated " : "") + type;
}

}  // namespace

TEST_CASE("the service and method are Envoy's") {
  const auto* service =
      rls::RateLimitRequest::descriptor()->file()->FindServiceByName("RateLimitService");
  REQUIRE(service != nullptr);
  CHECK(service->full_name() == "envoy.service.ratelimit.v3.RateLimitService");
  const auto* method = service->FindMethodByName("ShouldRateLimit");
  REQUIRE(method != nullptr);
  CHECK(method->input_type()->full_name() == "envoy.service.ratelimit.v3.RateLimitRequest");
  CHECK(method->output_type()->full_name() == "envoy.service.ratelimit.v3.RateLimitResponse");
  CHECK(!method->client_streaming());
  CHECK(!method->server_streaming());
}

TEST_CASE("RateLimitRequest and RateLimitDescriptor fields") {
  const Descriptor* req = rls::RateLimitRequest::descriptor();
  CHECK(field(req, "domain") == "1 string");
  CHECK(field(req, "descriptors") ==
        "2 repeated envoy.extensions.common.ratelimit.v3.RateLimitDescriptor");
  CHECK(field(req, "hits_addend") == "3 uint32");
  const Descriptor* d = common::RateLimitDescriptor::descriptor();
  CHECK(field(d, "entries") ==
        "1 repeated envoy.extensions.common.ratelimit.v3.RateLimitDescriptor.Entry");
  CHECK(field(d, "limit") ==
        "2 envoy.extensions.common.ratelimit.v3.RateLimitDescriptor.RateLimitOverride");
  CHECK(field(d, "hits_addend") == "3 google.protobuf.UInt64Value");
  const Descriptor* entry = common::RateLimitDescriptor::Entry::descriptor();
  CHECK(field(entry, "key") == "1 string");
  CHECK(field(entry, "value") == "2 string");
  const Descriptor* over = common::RateLimitDescriptor::RateLimitOverride::descriptor();
  CHECK(field(over, "requests_per_unit") == "1 uint32");
  CHECK(field(over, "unit") == "2 envoy.type.v3.RateLimitUnit");
  const auto* unit = over->FindFieldByName("unit")->enum_type();
  CHECK(unit->FindValueByName("YEAR")->number() == 6);
  CHECK(unit->FindValueByName("SECOND")->number() == 1);
}

TEST_CASE("RateLimitResponse fields") {
  const Descriptor* r = rls::RateLimitResponse::descriptor();
  const std::string p = "envoy.service.ratelimit.v3.RateLimitResponse.";
  CHECK(field(r, "overall_code") == "1 " + p + "Code");
  CHECK(field(r, "statuses") == "2 repeated " + p + "DescriptorStatus");
  CHECK(field(r, "response_headers_to_add") == "3 repeated envoy.config.core.v3.HeaderValue");
  CHECK(field(r, "request_headers_to_add") == "4 repeated envoy.config.core.v3.HeaderValue");
  CHECK(field(r, "raw_body") == "5 bytes");
  CHECK(field(r, "dynamic_metadata") == "6 google.protobuf.Struct");
  CHECK(field(r, "quota") == "7 " + p + "Quota");
  CHECK(rls::RateLimitResponse::OVER_LIMIT == 2);
  CHECK(rls::RateLimitResponse::OK == 1);

  const Descriptor* s = rls::RateLimitResponse::DescriptorStatus::descriptor();
  CHECK(field(s, "code") == "1 " + p + "Code");
  CHECK(field(s, "current_limit") == "2 " + p + "RateLimit");
  CHECK(field(s, "limit_remaining") == "3 uint32");
  CHECK(field(s, "duration_until_reset") == "4 google.protobuf.Duration");
  CHECK(field(s, "quota") == "5 " + p + "Quota");

  const Descriptor* limit = rls::RateLimitResponse::RateLimit::descriptor();
  CHECK(field(limit, "requests_per_unit") == "1 uint32");
  CHECK(field(limit, "unit") == "2 " + p + "RateLimit.Unit");
  CHECK(field(limit, "name") == "3 string");
  CHECK(rls::RateLimitResponse::RateLimit::WEEK == 7);
  CHECK(rls::RateLimitResponse::RateLimit::YEAR == 6);

  const Descriptor* q = rls::RateLimitResponse::Quota::descriptor();
  CHECK(field(q, "requests") == "1 uint32");
  CHECK(field(q, "valid_until") == "2 google.protobuf.Timestamp");
  CHECK(q->FindFieldByName("valid_until")->containing_oneof()->name() == "expiration_specifier");
  CHECK(field(q, "id") == "3 string");

  const Descriptor* h = envoy::config::core::v3::HeaderValue::descriptor();
  CHECK(field(h, "key") == "1 string");
  CHECK(field(h, "value") == "2 string");
  CHECK(field(h, "raw_value") == "3 bytes");
}

TEST_CASE("a request survives the wire") {
  rls::RateLimitRequest req;
  req.set_domain("api");
  req.set_hits_addend(3);
  auto* d = req.add_descriptors();
  auto* e = d->add_entries();
  e->set_key("tenant");
  e->set_value("acme");
  d->mutable_hits_addend()->set_value(7);
  const std::string wire = req.SerializeAsString();
  // domain = 1, length-delimited: tag byte 0x0a, then length 3, then "api".
  CHECK(wire.substr(0, 5) == std::string("\x0a\x03"
                                         "api",
                                         5));
  rls::RateLimitRequest back;
  REQUIRE(back.ParseFromString(wire));
  CHECK(back.domain() == "api");
  CHECK(back.hits_addend() == 3);
  REQUIRE(back.descriptors_size() == 1);
  CHECK(back.descriptors(0).entries(0).value() == "acme");
  CHECK(back.descriptors(0).has_hits_addend());
  CHECK(back.descriptors(0).hits_addend().value() == 7);
}
