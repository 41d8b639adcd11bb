// quota/testing/replay.hpp — a trace replayed through a Gateway (or a Limiter) in virtual
// time, and the envelope of every rule checked on what it admitted.
//
// replay() decides each TraceRequest at its own time (a virtual clock: a day of traffic
// replays in seconds) and hands the decision to a callback: through a Gateway, or through
// a Limiter on a ManualClock, on the key a function of the caller's makes of each
// request. EnvelopeBook watches the admissions: for each admitted request it asks the
// rule set which budgets the request
// paid (RuleSet::plan, as the Gateway does) and feeds each budget's key a streaming
// verifier (quota/verify/envelope.hpp) of its rule's envelope — a token bucket's
// A(T) <= r·T + B; a sliding log's N per window; a fixed window's and a two-window
// estimate's 2N per window (their true bound across a boundary) — or of the envelope the
// caller asserts for a rule instead (`expect`), e.g. a tighter one than the rule file's,
// which is how a test says "this rule must keep the budget to X". Memory grows with the
// keys, not with the trace (a window verifier keeps one window's events per key; the
// budgets each caller pays are planned once and kept, up to 2^20 callers).
//
// Thread safety: one replay per Gateway and EnvelopeBook at a time.
//
//   quota::testing::EnvelopeBook book(rules);
//   quota::testing::replay(gateway, trace, [&](const auto& req, const auto& result) {
//     book.record(req, result);
//   });
//   for (const auto& v : book.verdicts()) std::puts(v.text.c_str());  // "...: holds; closest: ..."
#pragma once

#include <concepts>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/inlined_vector.h"
#include "absl/numeric/int128.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_format.h"
#include "quota/clock.hpp"
#include "quota/gateway/gateway.hpp"
#include "quota/limiter.hpp"
#include "quota/testing/trace.hpp"
#include "quota/verify/envelope.hpp"

namespace quota::testing {

// The request a trace line asks the Gateway (its strings stay owned by `r`).
inline gateway::Request to_request(const TraceRequest& r) {
  return {.who = {.tenant = r.tenant, .plan = r.plan, .user = r.user},
          .route = r.route,
          .cost = r.cost > 0 ? std::optional<std::int64_t>(r.cost) : std::nullopt};
}

// Decides every request of `trace` at its time; `on` sees each decision (or the error a
// bad request gets: an unknown route, a cost out of range). Stops at nothing.
template <class OnDecision>
void replay(gateway::Gateway& g, std::span<const TraceRequest> trace, OnDecision&& on) {
  for (const TraceRequest& r : trace) on(r, g.decide(to_request(r), r.time));
}

// Decides every request of `trace` with `limiter`, on the key `key_of(request)` returns,
// at the request's time: the limiter's ManualClock is set to it. `on` sees the request,
// its key and the decision (or the error a bad key gets). A request's cost is 1 when the
// trace gives none.
template <class L, class KeyOf, class OnDecision>
requires std::same_as<typename L::clock_type, ManualClock>  // a Limiter<P, Store, ManualClock>
void replay(L& limiter, std::span<const TraceRequest> trace, KeyOf&& key_of, OnDecision&& on) {
  ManualClock clock = limiter.clock();  // a copy shares the limiter's time
  for (const TraceRequest& r : trace) {
    clock.set(r.time);
    const std::string key = key_of(r);
    on(r, key, limiter.acquire(key, r.cost > 0 ? r.cost : 1));
  }
}

// An envelope to hold a rule's keys to: a token bucket's r·T + B, or N per window of W.
struct Envelope {
  struct Bucket {
    Rate rate;
    std::int64_t burst = 0;
  };
  struct Window {
    std::int64_t limit = 0;
    Nanos window{0};
  };
  std::variant<Bucket, Window> bound;

  // The envelope a policy keeps every key within (see the top of this file).
  static Envelope of(const gateway::RulePolicy& p) {
    return std::visit(
        [](const auto& x) -> Envelope {
          using P = std::decay_t<decltype(x)>;
          if constexpr (std::is_same_v<P, TokenBucket>) {
            return {Bucket{.rate = x.rate, .burst = x.burst}};
          } else if constexpr (std::is_same_v<P, SlidingLog>) {
            return {Window{.limit = x.limit, .window = x.window}};
          } else {
            return {Window{.limit = 2 * x.limit, .window = x.window}};
          }
        },
        p);
  }
  std::string text() const {
    if (const auto* b = std::get_if<Bucket>(&bound)) {
      return absl::StrFormat("token-bucket %d/%dns burst %d", b->rate.units, b->rate.per.count(),
                             b->burst);
    }
    const auto& w = std::get<Window>(bound);
    return absl::StrFormat("window %d per %dns", w.limit, w.window.count());
  }
};

// One rule's verdict over every key it decided.
struct RuleVerdict {
  std::string rule;
  std::string envelope;  // Envelope::text()
  std::int64_t keys = 0, admitted = 0, admitted_units = 0, denied = 0;
  bool holds = true;
  // The worst key — the one whose admissions came nearest the envelope, or went furthest
  // past it — and the verifier's report of its worst interval, whose witness tags are the
  // trace's request numbers (1-based), or line numbers when given.
  std::string worst{};
  std::string text{};  // one line: rule, counts, envelope, verdict
};

class EnvelopeBook {
 public:
  // Watches admissions decided under `rules` (the set the Gateway decides with); without
  // a set, only decisions of one budget are recorded (the second record()).
  explicit EnvelopeBook(std::shared_ptr<const gateway::RuleSet> rules = nullptr)
      : rules_(std::move(rules)) {}

  // Holds the keys of the rule named `rule` to `e` instead of its own envelope.
  void expect(const std::string& rule, Envelope e) {
    expected_.insert_or_assign(rule, std::move(e));
  }

  // One decision of `r`; `tag` labels it in a witness (a line number; 0: its count).
  absl::Status record(const TraceRequest& r, const absl::StatusOr<gateway::Result>& d,
                      std::uint64_t tag = 0) {
    ++requests_;
    if (tag == 0) tag = requests_;
    if (!d.ok()) return absl::OkStatus();
    if (!d->decision.allowed) {
      stats_[d->rule].denied += 1;
      return absl::OkStatus();
    }
    if (rules_ == nullptr) return absl::FailedPreconditionError("the book has no rule set");
    auto paid = budgets_paid(r);
    if (!paid.ok()) return paid.status();
    for (const Paid& p : **paid) {
      p.stats->admitted += 1;
      p.stats->admitted_units += p.cost;
      const verify::AdmittedEvent e{.time_ns = r.time.count(), .cost = p.cost};
      auto status = std::visit([&](auto& v) { return v.add(e, tag); }, verifiers_[p.verifier]);
      if (!status.ok()) return status;
    }
    return absl::OkStatus();
  }

  // A decision of one budget outside a RuleSet — a Limiter's (replay() above), or a tool's
  // own rules (quota_replay's envoyproxy/ratelimit files): `cost` units of `key` for `r`
  // under the rule named `rule`, whose keys are held to `policy`'s envelope unless
  // expect() named another. An error decision records nothing.
  absl::Status record(const std::string& rule, const gateway::RulePolicy& policy,
                      std::string_view key, std::int64_t cost, const TraceRequest& r,
                      const absl::StatusOr<Decision>& d, std::uint64_t tag = 0) {
    ++requests_;
    if (tag == 0) tag = requests_;
    if (!d.ok()) return absl::OkStatus();
    Stats& s = stats_[rule];
    if (!d->allowed) {
      s.denied += 1;
      return absl::OkStatus();
    }
    s.admitted += 1;
    s.admitted_units += cost;
    const verify::AdmittedEvent e{.time_ns = r.time.count(), .cost = cost};
    return std::visit([&](auto& v) { return v.add(e, tag); },
                      verifiers_[verifier_of(s, rule, policy, key)]);
  }

  // Every rule seen, by name.
  std::vector<RuleVerdict> verdicts() const {
    std::vector<RuleVerdict> out;
    for (const auto& [name, s] : stats_) {
      RuleVerdict v{.rule = name,
                    .envelope = s.envelope,
                    .keys = static_cast<std::int64_t>(s.keys.size()),
                    .admitted = s.admitted,
                    .admitted_units = s.admitted_units,
                    .denied = s.denied};
      // Every key of a rule has the rule's envelope, so their excesses compare.
      std::optional<absl::int128> worst_excess;
      for (const auto& [key, index] : s.keys) {
        std::visit(
            [&](const auto& x) {
              const auto report = x.report();
              const absl::int128 excess = excess_of(report);
              if (worst_excess.has_value() && excess <= *worst_excess) return;
              worst_excess = excess;
              v.holds = report.holds();  // the worst key holds only if every key does
              v.worst = absl::StrFormat("key %s: %s; lines %d..%d", key, verify::to_string(report),
                                        report.witness.first_tag, report.witness.last_tag);
            },
            verifiers_[index]);
      }
      // A rule that admitted nothing has no key, and no envelope was set up for it.
      v.text = absl::StrFormat("rule %s: %d admitted (%d units) over %d keys, %d denied; %s: %s%s",
                               name, v.admitted, v.admitted_units, v.keys, v.denied,
                               v.envelope.empty() ? "nothing admitted" : v.envelope,
                               v.holds ? "holds" : "VIOLATED",
                               v.worst.empty() ? "" : (v.holds ? "; closest: " : "; ") + v.worst);
      out.push_back(std::move(v));
    }
    return out;
  }

 private:
  using Verifier = std::variant<verify::TokenBucketVerifier, verify::WindowVerifier>;

  // How far past its envelope a key went (<= 0: within it), on the rule's own scale.
  static absl::int128 excess_of(const verify::TokenBucketReport& r) { return r.excess_scaled; }
  static absl::int128 excess_of(const verify::WindowReport& r) { return r.excess; }
  struct Stats {
    std::string envelope;
    std::int64_t admitted = 0, admitted_units = 0, denied = 0;
    absl::flat_hash_map<std::string, std::size_t> keys;  // a key's verifier in verifiers_
  };
  // A budget an admitted request paid: its rule's stats, the units, its key's verifier.
  struct Paid {
    Stats* stats;
    std::int64_t cost;
    std::size_t verifier;
  };
  using PaidVector = absl::InlinedVector<Paid, 4>;

  // The budgets a request of r's identity, route and cost pays (shadow ones left out): the
  // rule set's plan, as the Gateway made it, kept per identity so that a trace's repeated
  // callers are planned once. The cache is dropped when it reaches kMaxPlans entries, so
  // its memory stays bounded when every request carries another cost.
  absl::StatusOr<const PaidVector*> budgets_paid(const TraceRequest& r) {
    // Each field after its length's bytes, then the cost's bytes: two callers never share
    // a key, and nothing is formatted.
    plan_key_.clear();
    const auto put = [this](const void* bytes, std::size_t n) {
      plan_key_.append(static_cast<const char*>(bytes), n);
    };
    for (const std::string* f : {&r.tenant, &r.plan, &r.user, &r.route}) {
      const std::size_t n = f->size();
      put(&n, sizeof n);
      put(f->data(), n);
    }
    put(&r.cost, sizeof r.cost);
    if (auto it = plans_.find(plan_key_); it != plans_.end()) return &it->second;
    auto planned = rules_->plan(to_request(r).who, r.route,
                                {.estimate = r.cost > 0 ? std::optional(r.cost) : std::nullopt});
    if (!planned.ok()) return planned.status();
    PaidVector paid;
    for (const gateway::Check& c : *planned) {
      if (c.shadow) continue;  // a shadow budget admits what it would deny
      Stats& s = rule_stats(*c.rule);
      paid.push_back({.stats = &s,
                      .cost = c.cost,
                      .verifier = verifier_of(s, c.rule->name, c.rule->policy, c.key.view())});
    }
    if (plans_.size() >= kMaxPlans) plans_.clear();
    return &plans_.emplace(plan_key_, std::move(paid)).first->second;
  }

  static constexpr std::size_t kMaxPlans = 1 << 20;

  // A rule's stats, found by its address after the first time (the rule set outlives the
  // book's use of it).
  Stats& rule_stats(const gateway::Rule& rule) {
    auto it = by_rule_.find(&rule);
    if (it == by_rule_.end()) it = by_rule_.emplace(&rule, &stats_[rule.name]).first;
    return *it->second;
  }

  // The index in verifiers_ of `key`'s verifier under the rule named `rule` (its stats
  // `s`), made for a new key from the envelope expect() gave the rule, else `policy`'s.
  std::size_t verifier_of(Stats& s, const std::string& rule, const gateway::RulePolicy& policy,
                          std::string_view key) {
    auto it = s.keys.find(quota::detail::to_absl(key));
    if (it == s.keys.end()) {
      verifiers_.push_back(verifier_for(rule, policy));
      it = s.keys.emplace(std::string(key), verifiers_.size() - 1).first;
    }
    return it->second;
  }

  Verifier verifier_for(const std::string& rule, const gateway::RulePolicy& policy) {
    auto it = expected_.find(rule);
    const Envelope e = it != expected_.end() ? it->second : Envelope::of(policy);
    stats_[rule].envelope = e.text();
    if (const auto* b = std::get_if<Envelope::Bucket>(&e.bound)) {
      return verify::TokenBucketVerifier(b->rate, b->burst);
    }
    const auto& w = std::get<Envelope::Window>(e.bound);
    return verify::WindowVerifier(w.limit, w.window);
  }

  std::shared_ptr<const gateway::RuleSet> rules_;
  std::map<std::string, Envelope> expected_;
  std::map<std::string, Stats> stats_;  // by rule name: verdicts in a stable order
  absl::flat_hash_map<const gateway::Rule*, Stats*> by_rule_;  // into stats_ (map: stable)
  std::deque<Verifier> verifiers_;                             // one per key
  absl::flat_hash_map<std::string, PaidVector> plans_;         // budgets_paid's cache
  std::string plan_key_;                                       // its lookup key, reused
  std::int64_t requests_ = 0;
};

}  // namespace quota::testing
