// quota-replay — a request trace through a rule file in virtual time, in process: every
// decision, each rule's envelope checked on what it admitted, and two rule sets compared.
//
//   quota_replay --rules rules.yaml [--expect RULE=ENVELOPE,...] [--decisions FILE] TRACE
//   quota_replay --rules new.yaml --compare old.yaml TRACE
//
// TRACE (or `-` for stdin) is CSV, `time_ns,tenant,plan,user,route[,cost]`
// (quota/testing/trace.hpp), or JSON lines, one flat object per line with the same names
// (`{"time_ns":0,"tenant":"acme","plan":"free","route":"read"}`; user and cost optional),
// the two mixed freely. The rules are quota's YAML (quota/rules/rule_file.hpp), or
// envoyproxy/ratelimit's (quota-server's envoy_rules.hpp; told apart by a top-level
// `domain` or `descriptors`), where each request is one descriptor whose entries are the
// trace fields --descriptor names (`tenant=tenant,path=route`: key `tenant` with the
// request's tenant, then key `path` with its route), decided as quota-server decides it.
// Each request is decided at its own time on an in-process store, budgets full at time 0
// (quota/testing/replay.hpp: by one Gateway for quota's rules); --decisions writes them as CSV
// (`line,time_ns,tenant,route,allowed,reason,rule,remaining`) or, with
// --decisions-format=json, as JSON lines with those names. Then one line per rule:
// admitted requests and units, keys, denied requests, and the envelope its keys were held
// to — the rule's own (a token bucket's r·T + B; N per window of a sliding log; 2N for the
// fixed and estimated windows), or the one --expect asserts for it
// (`free-read=token-bucket:10/1s:5`, `free-read=window:100:1min`) — with the worst key's
// interval, as line numbers of the trace, when it breaks it.
//
// --compare OTHER decides the trace under OTHER too, each rule set on budgets of its own,
// and prints, per tenant and rule, the requests one set denies that the other admits:
// "newly denied" by --rules (attributed to its deciding rule) and "newly admitted" (to
// OTHER's deciding rule) — what a rule change would have done to this traffic.
//
// Exit status: 0 every envelope holds; 1 one does not; 2 bad usage, a bad rule file or a
// malformed trace line (its number on stderr).
#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "common/cli.hpp"
#include "quota/gateway/gateway.hpp"
#include "quota/rules/rule_file.hpp"
#include "quota/rules/scalars.hpp"
#include "quota/store/local_store.hpp"
#include "quota/testing/replay.hpp"
#include "quota/testing/trace.hpp"
#include "quota_server/api/http/json.hpp"
#include "quota_server/rules/envoy_rules.hpp"

ABSL_FLAG(std::string, rules, "", "the rule file the trace is decided with");
ABSL_FLAG(std::string, compare, "", "another rule file: what it decides differently");
ABSL_FLAG(std::string, decisions, "", "write every decision to this file ('-': stdout)");
ABSL_FLAG(std::string, decisions_format, "csv", "csv or json (JSON lines) for --decisions");
ABSL_FLAG(std::string, descriptor, "tenant=tenant",
          "with envoyproxy/ratelimit rules: a request's descriptor, KEY=FIELD,... (FIELD: "
          "tenant, plan, user or route)");
ABSL_FLAG(std::vector<std::string>, expect, {},
          "RULE=token-bucket:RATE:BURST or RULE=window:LIMIT:WINDOW, comma-separated");

namespace {

constexpr int kBroken = 1;
constexpr int kBadInput = 2;

constexpr const char* kUsage =
    "usage: quota_replay --rules FILE [--compare FILE] [--expect RULE=ENVELOPE,...]\n"
    "                    [--decisions FILE [--decisions-format csv|json]] TRACE\n"
    "  TRACE            CSV time_ns,tenant,plan,user,route[,cost], or JSON lines with\n"
    "                   those names (user and cost optional); - for stdin\n"
    "  --rules FILE     the rule file the trace is decided with: quota's YAML, or\n"
    "                   envoyproxy/ratelimit's (by its shape: a top-level domain)\n"
    "  --descriptor D   with envoyproxy/ratelimit rules, a request's descriptor:\n"
    "                   KEY=FIELD,... (FIELD tenant, plan, user, route); tenant=tenant\n"
    "  --compare FILE   also decide it with FILE: the requests each set denies alone\n"
    "  --expect LIST    hold a rule's keys to another envelope than its own:\n"
    "                   free-read=token-bucket:10/1s:5 or free-read=window:100:1min\n"
    "  --decisions FILE every decision (- for stdout), as CSV or, with\n"
    "                   --decisions-format=json, as JSON lines\n"
    "exit: 0 every envelope holds, 1 one does not, 2 bad usage or input\n";

[[noreturn]] void die(int code, const std::string& what) {
  std::fprintf(stderr, "quota_replay: %s\n", what.c_str());
  std::exit(code);
}

// RULE=token-bucket:RATE:BURST or RULE=window:LIMIT:WINDOW; nullopt when it is not.
std::optional<std::pair<std::string, quota::testing::Envelope>> parse_expect(
    std::string_view text) {
  const std::vector<std::string> eq =
      absl::StrSplit(absl::string_view(text.data(), text.size()), absl::MaxSplits('=', 1));
  if (eq.size() != 2 || eq[0].empty()) return std::nullopt;
  const std::vector<std::string> f = absl::StrSplit(eq[1], ':');
  if (f.size() != 3) return std::nullopt;
  if (f[0] == "token-bucket") {
    auto rate = quota::rules::parse_rate(f[1]);
    std::int64_t burst = 0;
    if (!rate.ok() || !absl::SimpleAtoi(f[2], &burst) ||
        !quota::verify::TokenBucketVerifier::check_params(*rate, burst, 0).ok()) {
      return std::nullopt;
    }
    return std::pair{eq[0], quota::testing::Envelope{
                                quota::testing::Envelope::Bucket{.rate = *rate, .burst = burst}}};
  }
  if (f[0] == "window") {
    std::int64_t limit = 0;
    auto window = quota::rules::parse_duration(f[2]);
    if (!absl::SimpleAtoi(f[1], &limit) || !window.ok() ||
        !quota::verify::WindowVerifier::check_params(limit, *window).ok()) {
      return std::nullopt;
    }
    return std::pair{eq[0], quota::testing::Envelope{quota::testing::Envelope::Window{
                                .limit = limit, .window = *window}}};
  }
  return std::nullopt;
}

// A JSON line of the trace: a flat object with the CSV's names; an error names the line
// and the member.
absl::Status parse_json_line(std::string_view line, std::string_view file, std::int64_t number,
                             quota::testing::TraceRequest& r) {
  const auto fail = [&](const std::string& what) {
    return absl::InvalidArgumentError(absl::StrFormat("%s:%d: %s", file, number, what));
  };
  auto object = quota::server::parse_flat_object(line);
  if (!object.ok()) return fail(std::string(object.status().message()));
  r.plan.clear();  // the optional members; the required ones are checked below
  r.user.clear();
  r.cost = 0;
  bool has_time = false, has_tenant = false, has_route = false;
  for (const auto& [name, v] : *object) {
    using K = quota::server::JsonValue;
    const bool is_string = v.kind == K::kString;
    if (name == "time_ns" && v.kind == K::kInteger && v.integer >= 0) {
      r.time = quota::Nanos(v.integer);
      has_time = true;
    } else if (name == "cost" && v.kind == K::kInteger && v.integer >= 1) {
      r.cost = v.integer;
    } else if (name == "tenant" && is_string) {
      r.tenant = v.string;
      has_tenant = true;
    } else if (name == "plan" && is_string) {
      r.plan = v.string;
    } else if (name == "user" && is_string) {
      r.user = v.string;
    } else if (name == "route" && is_string) {
      r.route = v.string;
      has_route = true;
    } else if (name == "time_ns" || name == "cost") {
      return fail(absl::StrFormat("\"%s\" must be a whole number %s", name,
                                  name == "cost" ? ">= 1 (units)" : ">= 0 (ns)"));
    } else if (name == "tenant" || name == "plan" || name == "user" || name == "route") {
      return fail(absl::StrFormat("\"%s\" must be a string", name));
    } else {
      return fail(absl::StrFormat(
          "unknown member \"%s\" (expected time_ns, tenant, plan, user, route, cost)", name));
    }
  }
  if (!has_time || !has_tenant || !has_route) {
    return fail(absl::StrFormat("\"%s\" is missing", !has_time     ? "time_ns"
                                                     : !has_tenant ? "tenant"
                                                                   : "route"));
  }
  return absl::OkStatus();
}

// A trace line in either format: a JSON object when it starts with '{', else CSV.
absl::Status parse_any_line(std::string_view line, std::string_view file, std::int64_t number,
                            quota::testing::TraceRequest& r) {
  const std::size_t first = line.find_first_not_of(" \t");
  if (first != std::string_view::npos && line[first] == '{') {
    return parse_json_line(line, file, number, r);
  }
  return quota::testing::parse_trace_line(line, file, number, r);
}

// A rule set deciding the trace on its own in-process store, budgets full at time 0,
// every decision recorded in its book.
class Decider {
 public:
  virtual ~Decider() = default;
  // Decides `r`, line `line` of the trace, and records the decision.
  virtual absl::StatusOr<quota::gateway::Result> decide(const quota::testing::TraceRequest& r,
                                                        std::uint64_t line) = 0;
  quota::testing::EnvelopeBook book;

 protected:
  explicit Decider(std::shared_ptr<const quota::gateway::RuleSet> rules) : book(std::move(rules)) {}
};

// quota's rule file, through a Gateway.
class QuotaDecider final : public Decider {
 public:
  explicit QuotaDecider(std::shared_ptr<const quota::gateway::RuleSet> set)
      : Decider(set), registry_(set), gateway_(store_, registry_) {}

  absl::StatusOr<quota::gateway::Result> decide(const quota::testing::TraceRequest& r,
                                                std::uint64_t line) override {
    auto d = gateway_.decide(quota::testing::to_request(r), r.time);
    if (!d.ok()) return d;
    if (auto s = book.record(r, d, line); !s.ok()) return s;
    return d;
  }

 private:
  quota::LocalStore<quota::gateway::KeyPolicy> store_;
  quota::gateway::RuleRegistry registry_;
  quota::gateway::Gateway gateway_;
};

// The trace fields a request's envoyproxy/ratelimit descriptor is made of (--descriptor).
enum class Field { kTenant, kPlan, kUser, kRoute };
using Descriptor = std::vector<std::pair<std::string, Field>>;

std::optional<Descriptor> parse_descriptor(std::string_view text) {
  Descriptor out;
  for (absl::string_view entry : absl::StrSplit(absl::string_view(text.data(), text.size()), ',')) {
    const std::vector<std::string> kv = absl::StrSplit(entry, absl::MaxSplits('=', 1));
    if (kv.size() != 2 || kv[0].empty()) return std::nullopt;
    const std::optional<Field> f = kv[1] == "tenant"  ? std::optional(Field::kTenant)
                                   : kv[1] == "plan"  ? std::optional(Field::kPlan)
                                   : kv[1] == "user"  ? std::optional(Field::kUser)
                                   : kv[1] == "route" ? std::optional(Field::kRoute)
                                                      : std::nullopt;
    if (!f) return std::nullopt;
    out.emplace_back(kv[0], *f);
  }
  return out;
}

// envoyproxy/ratelimit's rules (quota-server's envoy_rules.hpp): each request is one
// descriptor, its entries the fields --descriptor names, matched as envoyproxy/ratelimit
// matches and decided on the limit's budget as quota-server decides it (a denied request
// spends nothing; shadow_mode admits; requests_per_unit 0 denies). A request with an empty
// field, or whose descriptor matches no limit or an unlimited one, is admitted under no
// rule, as envoyproxy/ratelimit answers OK to a descriptor without a limit.
class EnvoyDecider final : public Decider {
 public:
  EnvoyDecider(std::shared_ptr<const quota::server::EnvoyRules> rules, Descriptor descriptor)
      : Decider(nullptr), rules_(std::move(rules)), descriptor_(std::move(descriptor)) {}

  absl::StatusOr<quota::gateway::Result> decide(const quota::testing::TraceRequest& r,
                                                std::uint64_t line) override {
    using quota::Decision;
    using quota::Reason;
    entries_.clear();
    for (const auto& [key, field] : descriptor_) {
      const std::string& value = field == Field::kTenant ? r.tenant
                                 : field == Field::kPlan ? r.plan
                                 : field == Field::kUser ? r.user
                                                         : r.route;
      if (value.empty()) return quota::gateway::Result{.decision = Decision{.allowed = true}};
      entries_.emplace_back(key, value);
    }
    const quota::server::EnvoyRateLimit* l = rules_->match(entries_);
    if (l == nullptr || l->unlimited) {
      return quota::gateway::Result{.decision = Decision{.allowed = true}};
    }
    const std::string key = rules_->budget_key(entries_);
    const std::int64_t cost = r.cost > 0 ? r.cost : 1;  // hits_addend
    absl::StatusOr<Decision> d = quota::server::EnvoyRateLimit::blocked(rules_->version);
    if (!l->blocks()) {
      d = store_.apply(quota::gateway::KeyPolicy{.policy = &l->policy, .version = rules_->version},
                       key, r.time, cost);
      if (!d.ok()) return d.status();
    }
    const quota::gateway::Result out{.decision = l->answer(*d), .rule = l->name};
    // A shadow limit's denial deducted nothing and denied nothing: not in the book.
    if (out.decision.reason == Reason::kShadow) return out;
    if (auto s = book.record(l->name, l->policy, key, cost, r, d, line); !s.ok()) return s;
    return out;
  }

 private:
  std::shared_ptr<const quota::server::EnvoyRules> rules_;
  Descriptor descriptor_;
  quota::LocalStore<quota::gateway::KeyPolicy> store_;
  std::vector<std::pair<std::string, std::string>> entries_;  // the request's, reused
};

// One decision of --decisions: a CSV row, or a JSON line with the CSV header's names.
void write_decision(std::FILE* out, bool json, std::uint64_t line,
                    const quota::testing::TraceRequest& r, const quota::gateway::Result& d) {
  const std::string reason(to_string(d.decision.reason));
  if (json) {
    using quota::server::json_quote;
    std::fprintf(out,
                 "{\"line\":%llu,\"time_ns\":%lld,\"tenant\":%s,\"route\":%s,\"allowed\":%s,"
                 "\"reason\":\"%s\",\"rule\":%s,\"remaining\":%lld}\n",
                 static_cast<unsigned long long>(line), static_cast<long long>(r.time.count()),
                 json_quote(r.tenant).c_str(), json_quote(r.route).c_str(),
                 d.decision.allowed ? "true" : "false", reason.c_str(), json_quote(d.rule).c_str(),
                 static_cast<long long>(d.decision.remaining));
    return;
  }
  std::fprintf(out, "%llu,%lld,%s,%s,%d,%s,%s,%lld\n", static_cast<unsigned long long>(line),
               static_cast<long long>(r.time.count()), r.tenant.c_str(), r.route.c_str(),
               d.decision.allowed ? 1 : 0, reason.c_str(), d.rule.c_str(),
               static_cast<long long>(d.decision.remaining));
}

// The rule file at `path`, in quota's format or, by its shape (a top-level `domain` or
// `descriptors`), in envoyproxy/ratelimit's.
std::unique_ptr<Decider> load(const std::string& path) {
  auto text = quota::rules::detail::read_file(path);
  if (!text.ok()) die(kBadInput, std::string(text.status().message()));
  if (quota::server::looks_like_envoy_rules(*text)) {
    auto rules = quota::server::parse_envoy_rules(*text, path, 1);
    if (!rules.ok()) die(kBadInput, std::string(rules.status().message()));
    return std::make_unique<EnvoyDecider>(*std::move(rules),
                                          *parse_descriptor(absl::GetFlag(FLAGS_descriptor)));
  }
  auto set = quota::rules::load_rules(*text, path);
  if (!set.ok()) die(kBadInput, std::string(set.status().message()));
  return std::make_unique<QuotaDecider>(*std::move(set));
}

}  // namespace

int main(int argc, char** argv) {
  const auto args = quota::cli::parse(
      {.name = "quota_replay",
       .usage = kUsage,
       .checks = {quota::cli::custom(
                      "expect",
                      "RULE=token-bucket:RATE:BURST or RULE=window:LIMIT:WINDOW, comma-separated",
                      [](std::string_view v) {
                        for (absl::string_view e :
                             absl::StrSplit(absl::string_view(v.data(), v.size()), ',')) {
                          if (!parse_expect(std::string_view(e.data(), e.size()))) return false;
                        }
                        return true;
                      }),
                  quota::cli::custom(
                      "descriptor", "KEY=FIELD,... with FIELD tenant, plan, user or route",
                      [](std::string_view v) { return parse_descriptor(v).has_value(); }),
                  quota::cli::custom("decisions_format", "csv or json",
                                     [](std::string_view v) { return v == "csv" || v == "json"; })},
       .positional = true},
      argc, argv);
  if (args.positional.size() != 2) die(kBadInput, "expected one TRACE (see --help)");
  if (absl::GetFlag(FLAGS_rules).empty()) die(kBadInput, "missing --rules");
  const std::string trace_name = args.positional[1];
  auto main_rules = load(absl::GetFlag(FLAGS_rules));
  std::unique_ptr<Decider> other;
  if (!absl::GetFlag(FLAGS_compare).empty()) other = load(absl::GetFlag(FLAGS_compare));
  for (const std::string& e : absl::GetFlag(FLAGS_expect)) {
    auto [rule, envelope] = *parse_expect(e);  // checked by cli::parse
    main_rules->book.expect(rule, envelope);
  }
  std::FILE* in = trace_name == "-" ? stdin : std::fopen(trace_name.c_str(), "rb");
  if (in == nullptr) die(kBadInput, absl::StrFormat("cannot read %s", trace_name));
  std::FILE* out = nullptr;
  const std::string decisions = absl::GetFlag(FLAGS_decisions);
  const bool json = absl::GetFlag(FLAGS_decisions_format) == "json";
  if (!decisions.empty()) {
    out = decisions == "-" ? stdout : std::fopen(decisions.c_str(), "w");
    if (out == nullptr) die(kBadInput, absl::StrFormat("cannot write %s", decisions));
    if (!json) std::fputs("line,time_ns,tenant,route,allowed,reason,rule,remaining\n", out);
  }

  quota::testing::TraceReader reader(in, trace_name, &parse_any_line);
  std::int64_t requests = 0, admitted = 0, errors = 0;
  // --compare: (tenant, rule) -> {denied by --rules alone, admitted by --rules alone}.
  std::map<std::pair<std::string, std::string>, std::pair<std::int64_t, std::int64_t>> diff;
  for (;;) {
    auto next = reader.next();
    if (!next.ok()) die(kBadInput, std::string(next.status().message()));
    if (*next == nullptr) break;
    const quota::testing::TraceRequest& r = **next;
    const auto line = static_cast<std::uint64_t>(reader.line());
    ++requests;
    auto d = main_rules->decide(r, line);
    if (!d.ok()) {
      die(kBadInput, absl::StrFormat("%s:%d: %s", trace_name, line, d.status().message()));
    }
    admitted += d->decision.allowed;
    if (out != nullptr) write_decision(out, json, line, r, *d);
    if (other != nullptr) {
      auto o = other->decide(r, line);
      if (!o.ok()) {
        ++errors;  // a route or cost the other set does not know: counted, not compared
        continue;
      }
      if (d->decision.allowed && !o->decision.allowed) ++diff[{r.tenant, o->rule}].second;
      if (!d->decision.allowed && o->decision.allowed) ++diff[{r.tenant, d->rule}].first;
    }
  }
  if (out != nullptr && out != stdout) std::fclose(out);
  if (in != stdin) std::fclose(in);

  bool holds = true;
  for (const auto& v : main_rules->book.verdicts()) {
    std::printf("%s\n", v.text.c_str());
    holds = holds && v.holds;
  }
  std::printf("summary: %lld requests, %lld admitted, %lld denied; envelopes %s\n",
              static_cast<long long>(requests), static_cast<long long>(admitted),
              static_cast<long long>(requests - admitted), holds ? "hold" : "BROKEN");
  if (other != nullptr) {
    std::int64_t denied_alone = 0, admitted_alone = 0;
    for (const auto& [key, counts] : diff) {
      std::printf("compare: tenant %s rule %s: %lld newly denied, %lld newly admitted\n",
                  key.first.c_str(), key.second.c_str(), static_cast<long long>(counts.first),
                  static_cast<long long>(counts.second));
      denied_alone += counts.first;
      admitted_alone += counts.second;
    }
    std::printf(
        "compare: %s denies %lld requests %s admits and admits %lld it denies (%lld requests "
        "it could not decide)\n",
        absl::GetFlag(FLAGS_rules).c_str(), static_cast<long long>(denied_alone),
        absl::GetFlag(FLAGS_compare).c_str(), static_cast<long long>(admitted_alone),
        static_cast<long long>(errors));
  }
  return holds ? 0 : kBroken;
}
