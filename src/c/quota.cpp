// src/c/quota.cpp — the C interface's functions (quota/c/quota.h): each checks its
// pointers and reads its structs at the caller's size (struct_size.hpp), enters its handle
// (handle_table.hpp), calls the Limiter (limiter.hpp) and turns an absl::Status into a quota_code
// and message. Nothing throws out of a function: what the standard library may still throw
// (std::bad_alloc) is caught at the boundary and returned as QUOTA_RESOURCE_EXHAUSTED or
// QUOTA_INTERNAL.
#include "quota/c/quota.h"

#include <algorithm>
#include <cstring>
#include <exception>
#include <new>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "handle_table.hpp"
#include "limiter.hpp"
#include "struct_size.hpp"

namespace {

using quota::c_api::kFirstSize;
using quota::c_api::Limiter;
using quota::c_api::OutStruct;
using quota::c_api::read_struct;
using quota::c_api::size_ok;

quota::c_api::HandleTable<Limiter>& handles() {
  static auto* table = new quota::c_api::HandleTable<Limiter>();  // never destroyed: a
  return *table;  // host's thread may still call while the process exits
}

static_assert(QUOTA_REASON_PAUSED == static_cast<int>(quota::Reason::kPaused));
static_assert(QUOTA_REASON_OVER_SHARE == static_cast<int>(quota::Reason::kOverShare));
static_assert(QUOTA_MAX_ID_BYTES == quota::gateway::kMaxIdBytes);
static_assert(QUOTA_MAX_NAME_BYTES == quota::gateway::kMaxNameBytes);

// Fills `e` (if given and large enough) and returns `code`. A message past the bound is
// cut where a UTF-8 character starts.
int32_t fail(quota_error* e, int32_t code, std::string_view message) {
  if (e != nullptr && e->size >= kFirstSize<quota_error>) {
    e->code = code;
    std::size_t n = std::min(message.size(), std::size_t{QUOTA_MESSAGE_BYTES - 1});
    if (n < message.size()) {
      while (n > 0 && (static_cast<unsigned char>(message[n]) & 0xC0) == 0x80) --n;
    }
    std::memcpy(e->message, message.data(), n);
    e->message[n] = '\0';
    e->message_len = n;
  }
  return code;
}

int32_t code_of(const absl::Status& s) {
  switch (s.code()) {
    case absl::StatusCode::kOk:
      return QUOTA_OK;
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kOutOfRange:
      return QUOTA_INVALID_ARGUMENT;
    case absl::StatusCode::kNotFound:
      return QUOTA_NOT_FOUND;
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kDeadlineExceeded:
    case absl::StatusCode::kUnauthenticated:
      return QUOTA_UNAVAILABLE;
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kAlreadyExists:
      return QUOTA_FAILED_PRECONDITION;
    case absl::StatusCode::kResourceExhausted:
      return QUOTA_RESOURCE_EXHAUSTED;
    default:
      return QUOTA_INTERNAL;
  }
}

int32_t fail(quota_error* e, const absl::Status& s) {
  if (s.ok()) {
    if (e != nullptr && e->size >= kFirstSize<quota_error>) fail(e, QUOTA_OK, "");
    return QUOTA_OK;
  }
  return fail(e, code_of(s), std::string_view(s.message().data(), s.message().size()));
}

int32_t bad_handle(quota_error* e, quota_handle h) {
  return fail(e, QUOTA_BAD_HANDLE,
              absl::StrFormat("handle %d: not open (closed, or never opened)", h));
}

// Runs `body` (returning an int32_t code) with exceptions turned into codes.
template <class Body>
int32_t guarded(quota_error* e, Body&& body) {
  try {
    return body();
  } catch (const std::bad_alloc&) {
    return fail(e, QUOTA_RESOURCE_EXHAUSTED, "out of memory");
  } catch (const std::exception& x) {
    return fail(e, QUOTA_INTERNAL, x.what());
  } catch (...) {
    return fail(e, QUOTA_INTERNAL, "unknown exception");
  }
}

}  // namespace

extern "C" {

uint32_t quota_abi_version(void) { return QUOTA_ABI_VERSION; }

int64_t quota_now_ns(void) { return quota::SteadyClock{}.now().count(); }

const char* quota_reason_name(int32_t reason) {
  if (reason < 0 || reason > QUOTA_REASON_PAUSED) return "unknown";
  // Literals: to_string's views end in a NUL.
  return quota::to_string(static_cast<quota::Reason>(reason)).data();
}

const char* quota_code_name(int32_t code) {
  switch (code) {
    case QUOTA_OK:
      return "QUOTA_OK";
    case QUOTA_INVALID_ARGUMENT:
      return "QUOTA_INVALID_ARGUMENT";
    case QUOTA_NOT_FOUND:
      return "QUOTA_NOT_FOUND";
    case QUOTA_UNAVAILABLE:
      return "QUOTA_UNAVAILABLE";
    case QUOTA_FAILED_PRECONDITION:
      return "QUOTA_FAILED_PRECONDITION";
    case QUOTA_BAD_HANDLE:
      return "QUOTA_BAD_HANDLE";
    case QUOTA_BUFFER_TOO_SMALL:
      return "QUOTA_BUFFER_TOO_SMALL";
    case QUOTA_RESOURCE_EXHAUSTED:
      return "QUOTA_RESOURCE_EXHAUSTED";
    case QUOTA_INTERNAL:
      return "QUOTA_INTERNAL";
    default:
      return "QUOTA_UNKNOWN_CODE";
  }
}

int32_t quota_open(const quota_config* config, quota_handle* out, quota_error* error) {
  return guarded(error, [&]() -> int32_t {
    if (out == nullptr) return fail(error, QUOTA_INVALID_ARGUMENT, "out: a null pointer");
    *out = 0;
    quota_config local;
    auto c = read_struct(config, local, "config");
    if (!c.ok()) return fail(error, c.status());
    auto limiter = Limiter::open(**c);
    if (!limiter.ok()) return fail(error, limiter.status());
    const quota_handle h = handles().open(*std::move(limiter));
    if (h == 0) {
      return fail(error, QUOTA_RESOURCE_EXHAUSTED,
                  absl::StrFormat("%d limiters open: close one first",
                                  quota::c_api::HandleTable<Limiter>::kSlots));
    }
    *out = h;
    return fail(error, absl::OkStatus());
  });
}

int32_t quota_decide(quota_handle h, const quota_request* request, quota_decision* out,
                     quota_error* error) {
  return guarded(error, [&]() -> int32_t {
    quota_request local;
    auto r = read_struct(request, local, "request");
    if (!r.ok()) return fail(error, r.status());
    if (auto s = size_ok(out, "out"); !s.ok()) return fail(error, s);
    auto limiter = handles().enter(h);
    if (!limiter) return bad_handle(error, h);
    OutStruct<quota_decision> decision(out);
    return fail(error, limiter->decide(**r, decision.get()));
  });
}

int32_t quota_settle(quota_handle h, const quota_settle_request* request, quota_settlement* out,
                     quota_error* error) {
  return guarded(error, [&]() -> int32_t {
    quota_settle_request local;
    auto r = read_struct(request, local, "request");
    if (!r.ok()) return fail(error, r.status());
    if (auto s = size_ok(out, "out"); !s.ok()) return fail(error, s);
    auto limiter = handles().enter(h);
    if (!limiter) return bad_handle(error, h);
    auto settled = limiter->settle(**r);
    if (!settled.ok()) return fail(error, settled.status());
    OutStruct<quota_settlement> settlement(out);
    quota_settlement& o = settlement.get();
    o.estimate = settled->estimate;
    o.actual = settled->actual;
    o.surplus = settled->surplus;
    o.deficit = settled->deficit;
    return fail(error, absl::OkStatus());
  });
}

int32_t quota_reload(quota_handle h, const quota_rules* rules, uint64_t* version,
                     quota_error* error) {
  return guarded(error, [&]() -> int32_t {
    quota_rules local;
    auto r = read_struct(rules, local, "rules");
    if (!r.ok()) return fail(error, r.status());
    auto limiter = handles().enter(h);
    if (!limiter) return bad_handle(error, h);
    auto v = limiter->reload((*r)->path, (*r)->text);
    if (!v.ok()) return fail(error, v.status());
    if (version != nullptr) *version = *v;
    return fail(error, absl::OkStatus());
  });
}

int32_t quota_metrics(quota_handle h, char* buffer, size_t capacity, size_t* length,
                      quota_error* error) {
  return guarded(error, [&]() -> int32_t {
    if (length == nullptr) return fail(error, QUOTA_INVALID_ARGUMENT, "length: a null pointer");
    if (buffer == nullptr && capacity != 0) {
      return fail(error, QUOTA_INVALID_ARGUMENT, "buffer: a null pointer with a capacity");
    }
    auto limiter = handles().enter(h);
    if (!limiter) return bad_handle(error, h);
    const std::string text = limiter->metrics();
    *length = text.size();
    if (capacity <= text.size()) {
      return fail(
          error, QUOTA_BUFFER_TOO_SMALL,
          absl::StrFormat("buffer: %d bytes, the text needs %d and a NUL", capacity, text.size()));
    }
    std::memcpy(buffer, text.data(), text.size());
    buffer[text.size()] = '\0';
    return fail(error, absl::OkStatus());
  });
}

int32_t quota_close(quota_handle h, quota_error* error) {
  return guarded(error, [&]() -> int32_t {
    if (!handles().close(h)) return bad_handle(error, h);
    return fail(error, absl::OkStatus());
  });
}

}  // extern "C"
