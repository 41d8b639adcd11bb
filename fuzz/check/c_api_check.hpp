// fuzz/check/c_api_check.hpp — one fuzz input run through the C interface
// (quota/c/quota.h) as a hostile host calls it, every answer checked against the
// header's contract.
//
// Input layout (input.hpp decoders): the main limiter's max_keys, then up to kMaxOps
// operations, each a byte choosing one of: quota_decide (most), quota_settle,
// quota_reload, quota_metrics, quota_open of another limiter, quota_close, the names,
// the version and the clock. The main limiter is in process with the fixed rules of
// c_api_input.hpp
// and QUOTA_OPT_OUT_RESTART_SAFETY; at most kMaxHandles are open at once, and every
// handle opened is closed at the end. What they send: c_api_input.hpp.
//
// Checks, on every call:
//   - the return code is a quota_code; a quota_error of this version's size says the
//     same code and, on an error, a message of message_len == strlen(message) bytes,
//     1 to QUOTA_MESSAGE_BYTES - 1; a struct smaller than its first version's is never
//     written, nor is an input; a larger output's bytes past this version's are zeroed
//     by a call that succeeds (input structs come at any size: c_api_input.hpp's Sized);
//   - a closed or unknown handle is QUOTA_BAD_HANDLE; a null or too small struct, a larger
//     input with a byte set past this version's, a string
//     that is null with a length, past its bound or with a NUL inside, an empty tenant,
//     plan or route, an unknown flag bit, a cost or estimate below 1, both of them:
//     QUOTA_INVALID_ARGUMENT (a cost below 1 is never decided);
// quota_decide on QUOTA_OK: reason in 0..10, allowed == 1 exactly for reasons 0, 5 and 6,
// retry_after_ns 0 when allowed and >= -1, reset_after_ns >= 0, rule_len == strlen(rule)
// <= QUOTA_MAX_NAME_BYTES, the rule version not above the version in force, a ticket only
// for an admitted estimate and never twice; the HTTP answer only with QUOTA_REQUEST_HTTP,
// a status of the table (200 exactly when allowed), header lengths that are their strlen;
// quota_settle on QUOTA_OK: a ticket issued by that limiter to that tenant and not
// settled before, its estimate, surplus and deficit; quota_reload: the version the text names (or
// the next), increasing, never from a path that cannot be read; quota_metrics:
// QUOTA_BUFFER_TOO_SMALL exactly when capacity <= *length (the buffer untouched, and a
// second call with *length + 1 bytes succeeds), else the text and a NUL; quota_open:
// *out is 0 on an error, a handle never seen before on success, and only what can open
// in process; quota_code_name and quota_reason_name name exactly the known values;
// quota_now_ns does not go back.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <new>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "check/c_api_input.hpp"
#include "check/input.hpp"
#include "quota/c/quota.h"

namespace quota::fuzz {
namespace detail_c_api {
struct Ticket {
  std::int64_t estimate = 0;
  std::string tenant;  // only it settles the ticket
  bool settled = false;
};

// One limiter this input opened.
struct Limiter {
  quota_handle h = 0;
  bool open = true;
  std::uint64_t version = kUnknown;  // the rule version in force, when known
  std::map<std::uint64_t, Ticket> tickets;
};

class Session {
 public:
  explicit Session(const std::uint8_t* data, std::size_t size) : in_(data, size) {}

  void run() {
    open_main();
    for (int op = 0; op < kMaxOps && !in_.empty(); ++op) {
      where_ = absl::StrFormat("op %d: ", op);
      const std::uint8_t kind = in_.byte() % 16;
      if (kind < 7) {
        decide();
      } else if (kind < 9) {
        settle();
      } else if (kind < 11) {
        reload();
      } else if (kind < 12) {
        metrics();
      } else if (kind < 13) {
        open_other();
      } else if (kind < 15) {
        close();
      } else {
        names();
      }
    }
    where_ = "the end: ";
    for (Limiter& l : limiters_) {
      if (!l.open) continue;
      quota_error e{};
      e.size = sizeof e;
      const std::int32_t rc = quota_close(l.h, &e);
      check(rc == QUOTA_OK,
            absl::StrCat(where_, "closing an open handle: ", quota_code_name(rc), " ", e.message));
      l.open = false;
    }
  }

 private:
  void expect(bool ok, const std::string& what) const {
    if (!ok) fail(absl::StrCat(where_, what));
  }

  std::string got(std::int32_t rc) const {
    return absl::StrCat(" (got ", quota_code_name(rc), ")");
  }

  Limiter* find(quota_handle h) {
    for (Limiter& l : limiters_) {
      if (l.h == h && l.open) return &l;
    }
    return nullptr;
  }

  std::size_t open_count() const {
    return static_cast<std::size_t>(
        std::count_if(limiters_.begin(), limiters_.end(), [](const Limiter& l) { return l.open; }));
  }

  // A handle to call with: mostly one this input opened (open or closed since), else 0,
  // any value, or a neighbour of one: its slot's next generation, another slot.
  quota_handle pick_handle() {
    const quota_handle known = limiters_[in_.byte() % limiters_.size()].h;
    switch (in_.byte() % 12) {
      case 0:
        return in_.u64();
      case 1:
        return 0;
      case 2:
        return known + (quota_handle{1} << 16);
      case 3:
        return known ^ (1 + in_.byte() % 3);
      default:
        return known;
    }
  }

  // The error struct's answer to a call that returned `rc`.
  void check_error(const Sized<quota_error>& e, std::int32_t rc, const char* call) const {
    expect(is_code(rc), absl::StrFormat("%s returned %d, not a quota_code", call, rc));
    expect(e.untouched(), absl::StrCat(call, ": wrote into a quota_error of ", e.str()));
    if (e.null() || !e.full() || rc == QUOTA_OK) return;
    const quota_error& x = e.value();
    expect(x.code == rc,
           absl::StrFormat("%s returned %s, the error says %d", call, quota_code_name(rc), x.code));
    const std::size_t n = strnlen(x.message, sizeof x.message);
    expect(n < QUOTA_MESSAGE_BYTES, absl::StrCat(call, ": the message has no NUL"));
    expect(x.message_len == n,
           absl::StrFormat("%s: message_len %d, strlen %d", call, x.message_len, n));
    expect(n > 0, absl::StrCat(call, ": an error without a message", got(rc)));
  }

  // A request's own time outside [0, 2^62] (the library refuses it).
  static bool bad_time(std::uint32_t flags, std::int64_t now_ns) {
    return (flags & QUOTA_REQUEST_NOW) != 0 && (now_ns < 0 || now_ns > (std::int64_t{1} << 62));
  }

  // The code of a call that takes a handle and structs: a bad struct (or pointer) is
  // INVALID_ARGUMENT, a handle not open BAD_HANDLE (either with both); `invalid`
  // (arguments the library must refuse) INVALID_ARGUMENT on an open handle.
  void check_code(std::int32_t rc, const char* call, bool structs, bool open, bool invalid) const {
    if (!structs && open) {
      expect(rc == QUOTA_INVALID_ARGUMENT, absl::StrCat(call, ": a bad struct", got(rc)));
    } else if (!structs) {
      expect(rc == QUOTA_INVALID_ARGUMENT || rc == QUOTA_BAD_HANDLE,
             absl::StrCat(call, ": a bad struct and handle", got(rc)));
    } else if (!open) {
      expect(rc == QUOTA_BAD_HANDLE, absl::StrCat(call, ": a handle not open", got(rc)));
    } else if (invalid) {
      expect(rc == QUOTA_INVALID_ARGUMENT, absl::StrCat(call, ": invalid arguments", got(rc)));
    }
  }

  void open_main() {
    where_ = "open: ";
    const std::int64_t max_keys[] = {0, 1, 2, 64};
    quota_config c{};
    c.size = sizeof c;
    const std::string text = rules_text(1);
    c.rules_text = {text.data(), text.size()};
    c.store = QUOTA_STORE_IN_PROCESS;
    c.opt_out = QUOTA_OPT_OUT_RESTART_SAFETY;
    c.max_keys = max_keys[in_.byte() % 4];
    quota_error e{};
    e.size = sizeof e;
    quota_handle h = 0;
    const std::int32_t rc = quota_open(&c, &h, &e);
    expect(rc == QUOTA_OK && h != 0,
           absl::StrCat("the fixed rules did not open: ", quota_code_name(rc), " ", e.message));
    limiters_.push_back({.h = h, .open = true, .version = 1, .tickets = {}});
  }

  void decide() {
    Arena a;
    const quota_handle h = pick_handle();
    Sized<quota_request> req(Sized<quota_request>::pick(in_));
    Sized<quota_decision> out(Sized<quota_decision>::pick(in_));
    Sized<quota_error> err(Sized<quota_error>::pick(in_));
    const Field tenant = string_field(in_, a, kTenants, QUOTA_MAX_ID_BYTES);
    const Field plan = string_field(in_, a, kPlans, QUOTA_MAX_NAME_BYTES);
    const Field user =
        in_.byte() % 2 == 0 ? Field{} : string_field(in_, a, kUsers, QUOTA_MAX_ID_BYTES);
    const Field route = string_field(in_, a, kRoutes, QUOTA_MAX_NAME_BYTES);
    const Field attempt =
        in_.byte() % 3 != 0 ? Field{} : string_field(in_, a, kAttempts, QUOTA_MAX_ATTEMPT_ID_BYTES);
    const std::uint8_t b = in_.byte();
    std::uint32_t flags = b & 0x0F;
    if ((flags & QUOTA_REQUEST_COST) && (flags & QUOTA_REQUEST_ESTIMATE) && (b & 0x40) == 0) {
      flags &= ~QUOTA_REQUEST_ESTIMATE;
    }
    if ((b & 0x30) != 0) flags |= QUOTA_REQUEST_NOW;
    if ((b & 0xC0) == 0xC0) flags |= 0xFFFF0000u;  // bits no version defines
    quota_request r{};
    r.size = sizeof r;
    r.tenant = tenant.s;
    r.plan = plan.s;
    r.user = user.s;
    r.route = route.s;
    r.attempt_id = attempt.s;
    r.flags = flags;
    r.cost = value(in_);
    r.estimate = value(in_);
    now_ = in_.time(now_, hint_, 1'000'000'000);
    r.now_ns = now_;
    req.set(r);

    const bool with_cost = (flags & QUOTA_REQUEST_COST) != 0;
    const bool with_estimate = (flags & QUOTA_REQUEST_ESTIMATE) != 0;
    const bool invalid = !tenant.shaped || !plan.shaped || !user.shaped || !route.shaped ||
                         !attempt.shaped || tenant.s.len == 0 || plan.s.len == 0 ||
                         route.s.len == 0 || (flags & ~kRequestFlags) != 0 ||
                         (with_cost && with_estimate) || (with_cost && r.cost < 1) ||
                         (with_estimate && r.estimate < 1) || bad_time(flags, r.now_ns);
    Limiter* l = find(h);
    const std::int32_t rc = quota_decide(h, req.get(), out.get(), err.get());
    check_error(err, rc, "quota_decide");
    check_code(rc, "quota_decide", req.accepted_input() && out.taken(), l != nullptr, invalid);
    expect(req.untouched(), "quota_decide: wrote into the request");
    expect(rc == QUOTA_OK ? out.untouched(true) : out.untouched_or_zeroed(),
           absl::StrCat("quota_decide: wrote past a quota_decision of ", out.str()));
    expect(!(with_cost && r.cost < 1 && rc == QUOTA_OK), "quota_decide: a cost below 1 decided");
    if (rc != QUOTA_OK) return;
    check_decision(*l, out.value(), flags);
    const quota_decision& d = out.value();
    if (d.ticket != 0) {
      auto [it, fresh] = l->tickets.try_emplace(
          d.ticket, Ticket{.estimate = r.estimate,
                           .tenant = std::string(r.tenant.data, r.tenant.len),
                           .settled = false});
      expect(fresh, absl::StrFormat("quota_decide: ticket %d issued twice", d.ticket));
    }
    hint_ = d.retry_after_ns > 0 ? d.retry_after_ns : 0;
  }

  void check_decision(const Limiter& l, const quota_decision& d, std::uint32_t flags) const {
    const std::string s = absl::StrFormat(
        "quota_decide: {allowed=%d reason=%d remaining=%d retry_after_ns=%d reset_after_ns=%d "
        "v=%d ticket=%d replayed=%d rule_len=%d http=%d retry_after_s=%d} flags=%#x: ",
        d.allowed, d.reason, d.remaining, d.retry_after_ns, d.reset_after_ns, d.rule_version,
        d.ticket, d.replayed, d.rule_len, d.http_status, d.retry_after_s, flags);
    expect(d.reason >= QUOTA_REASON_ALLOWED && d.reason <= QUOTA_REASON_PAUSED,
           s + "reason outside 0..10");
    const bool admits = d.reason == QUOTA_REASON_ALLOWED || d.reason == QUOTA_REASON_SHADOW ||
                        d.reason == QUOTA_REASON_FAIL_OPEN;
    expect(d.allowed == (admits ? 1 : 0), s + "allowed is not 1 exactly for reasons 0, 5, 6");
    expect(d.retry_after_ns >= -1, s + "retry_after_ns below -1");
    expect(d.allowed == 0 || d.retry_after_ns == 0, s + "admitted with a retry_after");
    expect(d.reset_after_ns >= 0, s + "reset_after_ns below 0");
    expect(d.replayed == 0 || d.replayed == 1, s + "replayed not 0 or 1");
    expect(d.rule_len <= QUOTA_MAX_NAME_BYTES && d.rule_len == strnlen(d.rule, sizeof d.rule),
           s + "rule_len is not strlen(rule)");
    expect(l.version == kUnknown || d.rule_version <= l.version,
           absl::StrFormat("%sa rule version above the one in force (%d)", s, l.version));
    expect(d.ticket == 0 || ((flags & QUOTA_REQUEST_ESTIMATE) != 0 && d.allowed == 1),
           s + "a ticket for what is not an admitted estimate");
    const std::size_t rl = strnlen(d.ratelimit, sizeof d.ratelimit);
    const std::size_t rp = strnlen(d.ratelimit_policy, sizeof d.ratelimit_policy);
    expect(rl < QUOTA_HEADER_BYTES && d.ratelimit_len == rl, s + "ratelimit_len is not strlen");
    expect(rp < QUOTA_HEADER_BYTES && d.ratelimit_policy_len == rp,
           s + "ratelimit_policy_len is not strlen");
    if ((flags & QUOTA_REQUEST_HTTP) == 0) {
      expect(d.http_status == 0 && d.retry_after_s == -1 && rl == 0 && rp == 0,
             s + "an HTTP answer not asked for");
      return;
    }
    const int statuses[] = {200, 400, 413, 429, 503, 504};
    expect(std::find(std::begin(statuses), std::end(statuses), d.http_status) != std::end(statuses),
           s + "an HTTP status outside the table");
    expect(d.allowed == 0 || d.http_status == 200, s + "admitted, but not 200");
    expect(d.allowed == 1 || d.http_status != 200, s + "denied with 200");
    expect(d.retry_after_s == -1 || (d.http_status == 429 && d.retry_after_s >= 1),
           s + "a Retry-After outside a 429, or below 1 s");
  }

  void settle() {
    Arena a;
    const quota_handle h = pick_handle();
    Limiter* l = find(h);
    Sized<quota_settle_request> req(Sized<quota_settle_request>::pick(in_));
    Sized<quota_settlement> out(Sized<quota_settlement>::pick(in_));
    Sized<quota_error> err(Sized<quota_error>::pick(in_));
    quota_settle_request r{};
    r.size = sizeof r;
    std::uint64_t issued = 0;
    const Limiter& from = limiters_[in_.byte() % limiters_.size()];
    if (!from.tickets.empty()) {
      auto it = from.tickets.begin();
      std::advance(it, in_.byte() % from.tickets.size());
      issued = it->first;
    }
    switch (in_.byte() % 6) {
      case 0:
        r.ticket = 0;
        break;
      case 1:
        r.ticket = in_.u64();
        break;
      case 2:
        r.ticket = issued + 1;
        break;
      default:
        r.ticket = issued;
        break;
    }
    r.actual = value(in_);
    // Mostly the ticket's own tenant; else one from the input (another's, or malformed).
    const Field tenant = string_field(in_, a, kTenants, QUOTA_MAX_ID_BYTES);
    auto own = from.tickets.find(r.ticket);
    if (own != from.tickets.end() && in_.byte() % 4 != 0) {
      r.tenant = {own->second.tenant.data(), own->second.tenant.size()};
    } else {
      r.tenant = tenant.s;
    }
    const bool tenant_shaped = r.tenant.data != tenant.s.data || tenant.shaped;
    const std::uint8_t fb = in_.byte();
    r.flags = fb % 4 != 0 ? QUOTA_REQUEST_NOW : 0;
    if (fb % 16 == 0) r.flags |= 1u << (in_.byte() % 32);  // another bit: an error
    now_ = in_.time(now_, hint_, 1'000'000'000);
    r.now_ns = now_;
    req.set(r);
    const std::int32_t rc = quota_settle(h, req.get(), out.get(), err.get());
    check_error(err, rc, "quota_settle");
    check_code(rc, "quota_settle", req.accepted_input() && out.taken(), l != nullptr,
               r.actual < 0 || (r.flags & ~std::uint32_t{QUOTA_REQUEST_NOW}) != 0 ||
                   bad_time(r.flags, r.now_ns) || !tenant_shaped);
    expect(req.untouched(), "quota_settle: wrote into the request");
    expect(rc == QUOTA_OK ? out.untouched(true) : out.untouched_or_zeroed(),
           absl::StrCat("quota_settle: wrote past a quota_settlement of ", out.str()));
    if (rc != QUOTA_OK) return;
    auto it = l->tickets.find(r.ticket);
    expect(it != l->tickets.end(),
           absl::StrFormat("quota_settle: ticket %d settled, never issued here", r.ticket));
    expect(!it->second.settled, absl::StrFormat("quota_settle: ticket %d settled twice", r.ticket));
    expect(std::string_view(r.tenant.data, r.tenant.len) == it->second.tenant,
           absl::StrFormat("quota_settle: ticket %d of tenant \"%s\" settled for another", r.ticket,
                           it->second.tenant));
    it->second.settled = true;
    const quota_settlement& s = out.value();
    const std::int64_t e = it->second.estimate;
    expect(s.estimate == e && s.actual == r.actual &&
               s.surplus == (e > r.actual ? e - r.actual : 0) &&
               s.deficit == (r.actual > e ? r.actual - e : 0),
           absl::StrFormat("quota_settle: estimate %d actual %d: got {%d %d %d %d}", e, r.actual,
                           s.estimate, s.actual, s.surplus, s.deficit));
  }

  // Rule text for a reload or an open of limiter `l`: input bytes, the rules with another
  // version, without one, with input bytes spliced in, null with a length, or none.
  // `version`: the version it sets when it loads (kUnknown when the input decides).
  Field rule_text(Arena& a, const Limiter* l, std::uint64_t& version) {
    const std::uint64_t in_force = l != nullptr ? l->version : kUnknown;
    version = kUnknown;
    switch (in_.byte() % 8) {
      case 0: {
        const std::size_t len = in_.byte() | (std::size_t{in_.byte()} % 4) << 8;
        char* p = a.bytes(len);
        for (std::size_t i = 0; i < len; ++i) p[i] = static_cast<char>(in_.byte());
        return field({p, len}, QUOTA_MAX_RULES_BYTES);
      }
      case 1:
      case 2: {
        const std::uint64_t base = in_force == kUnknown ? 1 : in_force;
        const std::uint64_t versions[] = {base + 1, base,
                                          base - 1, 0,
                                          1,        std::uint64_t{1} << 63,
                                          kUnknown, static_cast<std::uint64_t>(kMax)};
        const std::uint8_t i = in_.byte() % 9;
        version = i < 8 ? versions[i] : in_.u64();
        return field(a.copy(rules_text(version)), QUOTA_MAX_RULES_BYTES);
      }
      case 3:
        if (in_force != kUnknown) version = in_force + 1;
        return field(a.copy(kRulesBody), QUOTA_MAX_RULES_BYTES);
      case 4: {
        std::string s = rules_text(in_force == kUnknown ? 2 : in_force + 1);
        const std::size_t at = static_cast<std::size_t>(in_.in_range(0, s.size()));
        const std::size_t cut = std::min<std::size_t>(in_.byte() % 8, s.size() - at);
        std::string spliced;
        for (std::size_t n = in_.byte() % 16; n > 0; --n) spliced += static_cast<char>(in_.byte());
        s.replace(at, cut, spliced);
        return field(a.copy(s), QUOTA_MAX_RULES_BYTES);
      }
      case 5:
        return field({nullptr, std::size_t{1} + in_.byte()}, QUOTA_MAX_RULES_BYTES);
      case 6:
        return field({nullptr, 0}, QUOTA_MAX_RULES_BYTES);
      default:
        version = 1;
        return field(a.copy(rules_text(1)), QUOTA_MAX_RULES_BYTES);
    }
  }

  // A rule file path: none mostly; one that does not exist, a directory, null with a
  // length, a NUL inside. Never a file that exists: nothing here may be read.
  Field rule_path(Arena& a) {
    switch (in_.byte() % 8) {
      case 0:
        return field(a.copy("/nonexistent/quota-fuzz/rules.yaml"), 4096);
      case 1:
        return field(a.copy("/"), 4096);
      case 2:
        return field({nullptr, std::size_t{1} + in_.byte()}, 4096);
      case 3:
        return field(a.copy(std::string_view("/nonexistent\0x", 14)), 4096);
      default:
        return field({nullptr, 0}, 4096);
    }
  }

  void reload() {
    Arena a;
    const quota_handle h = pick_handle();
    Limiter* l = find(h);
    Sized<quota_rules> rules(Sized<quota_rules>::pick(in_));
    Sized<quota_error> err(Sized<quota_error>::pick(in_));
    const Field path = rule_path(a);
    std::uint64_t version = kUnknown;
    const Field text = rule_text(a, l, version);
    quota_rules r{};
    r.size = sizeof r;
    r.path = path.s;
    r.text = text.s;
    rules.set(r);
    std::uint64_t got_version = 0xdeadbeef;
    const bool with_version = in_.byte() % 4 != 0;
    const std::int32_t rc =
        quota_reload(h, rules.get(), with_version ? &got_version : nullptr, err.get());
    check_error(err, rc, "quota_reload");
    expect(rules.untouched(), "quota_reload: wrote into the quota_rules");
    const bool invalid = !path.shaped || !text.shaped || (path.s.len == 0) == (text.s.len == 0);
    check_code(rc, "quota_reload", rules.accepted_input(), l != nullptr, invalid);
    expect(!(rc == QUOTA_OK && path.s.len != 0), "quota_reload: a path that cannot be read loaded");
    if (rc != QUOTA_OK) return;
    const std::uint64_t before = l->version;
    if (with_version) {
      expect(version == kUnknown || got_version == version,
             absl::StrFormat("quota_reload: version %d loaded as %d", version, got_version));
      version = got_version;
    }
    expect(before == kUnknown || version == kUnknown || version > before,
           absl::StrFormat("quota_reload: version %d after %d", version, before));
    l->version = version;
  }

  void metrics() {
    const quota_handle h = pick_handle();
    const Limiter* l = find(h);
    Sized<quota_error> err(Sized<quota_error>::pick(in_));
    std::size_t capacity = 0;
    switch (in_.byte() % 6) {
      case 0:
        capacity = 0;
        break;
      case 1:
        capacity = 1 + in_.byte() % 64;
        break;
      case 2:
        capacity = last_metrics_ + in_.byte() % 3;  // around what was last needed
        break;
      default:
        capacity = static_cast<std::size_t>(in_.in_range(0, 16384));
        break;
    }
    const std::uint8_t b = in_.byte();
    const bool null_buffer = b % 8 == 0;
    const bool null_length = b % 8 == 1;
    std::unique_ptr<char[]> buffer(null_buffer ? nullptr : new char[capacity]);
    if (buffer != nullptr && capacity > 0) std::memset(buffer.get(), kFill, capacity);
    std::size_t length = 0xdeadbeef;
    const std::int32_t rc =
        quota_metrics(h, buffer.get(), capacity, null_length ? nullptr : &length, err.get());
    check_error(err, rc, "quota_metrics");
    check_code(rc, "quota_metrics", !null_length && !(null_buffer && capacity != 0), l != nullptr,
               false);
    const std::string s =
        absl::StrFormat("quota_metrics: capacity %d, length %d: ", capacity, length);
    if (l == nullptr || null_length || (null_buffer && capacity != 0)) return;
    expect(rc == QUOTA_OK || rc == QUOTA_BUFFER_TOO_SMALL, s + "neither text nor a size" + got(rc));
    expect((rc == QUOTA_BUFFER_TOO_SMALL) == (capacity <= length),
           s + "QUOTA_BUFFER_TOO_SMALL not exactly when capacity <= length");
    last_metrics_ = length;
    if (rc == QUOTA_BUFFER_TOO_SMALL) {
      for (std::size_t i = 0; i < capacity; ++i) {
        expect(static_cast<unsigned char>(buffer[i]) == kFill, s + "wrote into a small buffer");
      }
      // Called again with what it asked for, it fits.
      std::unique_ptr<char[]> enough(new char[length + 1]);
      std::size_t again = 0;
      const std::int32_t rc2 = quota_metrics(h, enough.get(), length + 1, &again, nullptr);
      expect(rc2 == QUOTA_OK && again == length,
             absl::StrFormat("%sagain with %d bytes: %s, length %d", s, length + 1,
                             quota_code_name(rc2), again));
      expect(std::memchr(enough.get(), 0, length + 1) == enough.get() + length,
             s + "the text is not `length` bytes and a NUL");
      return;
    }
    expect(std::memchr(buffer.get(), 0, capacity) == buffer.get() + length,
           s + "the text is not `length` bytes and a NUL");
  }

  void open_other() {
    Arena a;
    Sized<quota_config> config(Sized<quota_config>::pick(in_));
    Sized<quota_error> err(Sized<quota_error>::pick(in_));
    quota_config c{};
    c.size = sizeof c;
    const Field path = rule_path(a);
    std::uint64_t version = kUnknown;
    const Field text = rule_text(a, nullptr, version);
    c.rules_path = path.s;
    c.rules_text = text.s;
    const std::uint8_t b = in_.byte();
    c.store = b % 4 != 0 ? QUOTA_STORE_IN_PROCESS : static_cast<std::int32_t>(in_.u64());
    if (b % 8 == 4) c.store = 1 + in_.byte() % 3;  // Redis, Cluster, Sentinel
    const std::uint8_t ob = in_.byte();
    c.opt_out = ob % 2 == 0   ? QUOTA_OPT_OUT_RESTART_SAFETY
                : ob % 4 == 1 ? ob & kOptOuts
                              : static_cast<std::uint32_t>(in_.u64());
    // Redis addresses that never parse as host:port (no ':'): nothing is connected to.
    const Field addresses = string_field(in_, a, kTenants, 4096);
    if (addresses.s.data != nullptr) {
      char* p = a.bytes(addresses.s.len);
      std::memcpy(p, addresses.s.data, addresses.s.len);
      std::replace(p, p + addresses.s.len, ':', '_');
      c.redis_addresses = {p, addresses.s.len};
    } else {
      c.redis_addresses = addresses.s;
    }
    c.redis_sentinel_master = string_field(in_, a, kPlans, 256).s;
    c.redis_password = string_field(in_, a, kUsers, 4096).s;
    c.redis_deadline_ms = in_.byte() % 2 == 0 ? 0 : value(in_);
    c.redis_connections = in_.byte() % 2 == 0 ? 0 : value(in_);
    c.max_keys = in_.byte() % 2 == 0 ? 0 : value(in_);
    const std::uint8_t mb = in_.byte();
    c.mode = mb % 4 != 0   ? QUOTA_MODE_BLOCKING
             : mb % 8 == 0 ? QUOTA_MODE_NON_BLOCKING
                           : static_cast<std::int32_t>(in_.u64());
    // ABI 2's fields, mostly not given (refused in process when they are).
    if (in_.byte() % 8 == 0) c.redis_replicas = value(in_);
    if (in_.byte() % 8 == 0) c.redis_replica_timeout_ms = value(in_);
    if (in_.byte() % 8 == 0) c.redis_coalesce = value(in_);
    if (in_.byte() % 8 == 0) c.redis_coalesce_calls = value(in_);
    config.set(c);
    const bool null_out = in_.byte() % 16 == 0;
    if (open_count() >= kMaxHandles) return;
    quota_handle h = 0x5eed;
    const std::int32_t rc = quota_open(config.get(), null_out ? nullptr : &h, err.get());
    check_error(err, rc, "quota_open");
    expect(config.untouched(), "quota_open: wrote into the config");
    // Refused before the rules are read: INVALID_ARGUMENT. After (a rule file that does
    // not exist is NOT_FOUND first): never opened.
    const bool invalid = config.null() || !config.accepted_input() || null_out || !path.shaped ||
                         !text.shaped || (path.s.len == 0) == (text.s.len == 0);
    expect(!invalid || rc == QUOTA_INVALID_ARGUMENT, "quota_open: invalid arguments" + got(rc));
    if (!null_out && rc != QUOTA_OK) expect(h == 0, "quota_open: an error, and *out not 0");
    if (rc != QUOTA_OK) return;
    // What the library read: the fields the size covers, later ones 0.
    const quota_config r = config.as_read();
    expect(r.store == QUOTA_STORE_IN_PROCESS && path.s.len == 0 && r.max_keys >= 0 &&
               (r.opt_out & ~kOptOuts) == 0 && r.mode == QUOTA_MODE_BLOCKING &&
               r.redis_replicas == 0 && r.redis_replica_timeout_ms == 0 && r.redis_coalesce == 0 &&
               r.redis_coalesce_calls == 0,
           absl::StrFormat("quota_open: opened store %d, max_keys %d, opt_out %#x, mode %d, "
                           "replicas %d, coalesce %d",
                           r.store, r.max_keys, r.opt_out, r.mode, r.redis_replicas,
                           r.redis_coalesce));
    expect(h != 0, "quota_open: handle 0");
    for (const Limiter& l : limiters_) {
      expect(l.h != h, absl::StrFormat("quota_open: handle %d given again", h));
    }
    limiters_.push_back({.h = h, .open = true, .version = version, .tickets = {}});
  }

  void close() {
    const quota_handle h = pick_handle();
    Limiter* l = find(h);
    Sized<quota_error> err(Sized<quota_error>::pick(in_));
    const std::int32_t rc = quota_close(h, err.get());
    check_error(err, rc, "quota_close");
    check_code(rc, "quota_close", true, l != nullptr, false);
    if (l != nullptr) {
      expect(rc == QUOTA_OK, "quota_close: an open handle" + got(rc));
      l->open = false;
    }
  }

  void names() {
    const std::int32_t code = static_cast<std::int32_t>(in_.u64());
    const char* name = quota_code_name(code);
    expect(name != nullptr, "quota_code_name: null");
    expect((std::string_view(name) == "QUOTA_UNKNOWN_CODE") == !is_code(code),
           absl::StrFormat("quota_code_name(%d) = %s", code, name));
    expect(quota_abi_version() == QUOTA_ABI_VERSION, "quota_abi_version");
    const std::int32_t reason =
        in_.byte() % 2 == 0 ? in_.byte() % 12 : static_cast<std::int32_t>(in_.u64());
    const char* rname = quota_reason_name(reason);
    expect(
        rname != nullptr && (std::string_view(rname) == "unknown") ==
                                (reason < QUOTA_REASON_ALLOWED || reason > QUOTA_REASON_PAUSED),
        absl::StrFormat("quota_reason_name(%d) = %s", reason, rname == nullptr ? "null" : rname));
    const std::int64_t t0 = quota_now_ns();
    const std::int64_t t1 = quota_now_ns();
    expect(t1 >= t0, absl::StrFormat("quota_now_ns went back: %d then %d", t0, t1));
  }

  Input in_;
  std::vector<Limiter> limiters_;
  std::int64_t now_ = 0;
  absl::int128 hint_ = 0;
  std::size_t last_metrics_ = 0;
  std::string where_;
};

}  // namespace detail_c_api

inline void check_c_api_input(const std::uint8_t* data, std::size_t size) {
  detail_c_api::Session(data, size).run();
}

}  // namespace quota::fuzz
