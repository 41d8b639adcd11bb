// quota/attempts.hpp — idempotent attempts, in process.
//
// A gateway that retries a decision (a timeout between it and its caller, a replayed
// request) passes the same attempt id; the first decision for that id is kept for `ttl`
// and replayed, so the retry spends nothing. The semantics match the Redis store's
// attempts: ids are 1..128 bytes without control characters or braces, and belong to a
// scope (the Gateway's is the tenant id; over Redis the record lives in the tenant's
// slot), so two tenants may use the same id; the same scope and id with another request
// (key or cost) is InvalidArgument and changes nothing; a replay is marked `replayed`.
// The decision is kept with the attempt's deadline (Request::deadline of the call that
// decided it): the Gateway answers a replay past it as Reason::kAttemptExpired, the
// units it spent staying spent. A record lives `ttl` from its begin whatever its
// deadline: a retry that carries a later deadline (or none) must still find it and be
// told kAttemptExpired, not decide and spend again.
//
// In process only: two gateway processes do not share this cache (use the Redis store's
// attempts for that). While the first decision for an id is still being made, a
// concurrent duplicate gets Aborted ("in progress; retry") rather than a second
// decision. Only a decision the store made is kept: a store error, and the route's
// fail-mode answer to one (Gateway: kUnavailable, kFailOpen), are forgotten (abandon())
// so that the retry decides.
//
// Bounded, without scans: at most `max_entries` records, kept in the order they began
// (every record expires `ttl` after its begin, so that is the order they expire in).
// Each begin() of a new id forgets at most two expired records from the front, so a
// begin costs O(1) whatever the cache holds (amortized over the hash index's own growth
// and clean-up of erased slots, as any absl::flat_hash_set); a full cache whose oldest
// record expired admits a new id, and one full of live records answers
// ResourceExhausted (nothing decided). A record abandoned or found expired by its own id
// leaves at once. Times that go backwards across threads can put a record behind a
// younger one in that order; it then leaves with the older one's expiry, up to that
// skew late. A record and its text are one allocation (about 180 bytes with a 24-byte
// id, benchmarks/gateway_attempts_bench.cpp).
//
// Thread-safe (one mutex around the records and their index; held for lookups, never
// during a decision).
//
//   AttemptCache cache(/*ttl=*/60s, /*max_entries=*/1'000'000);
//   auto b = cache.begin({.scope = "acme", .id = "req-7f3a"}, fingerprint, now);
//   if (b.ok() && !b->replay) {
//     /* decide d */ cache.finish({.scope = "acme", .id = "req-7f3a"}, d, deadline);
//   }
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <new>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/hash/hash.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_format.h"
#include "quota/decision.hpp"
#include "quota/detail/keyed_states.hpp"
#include "quota/detail/mutex.hpp"
#include "quota/policy/policy.hpp"
#include "quota/units.hpp"

namespace quota {

inline constexpr std::size_t kMaxAttemptIdBytes = 128;

// OK for an attempt id quota accepts: 1..kMaxAttemptIdBytes bytes, none of them '{', '}'
// or a control character (so that it fits in a Redis key beside a hash tag); else
// InvalidArgument naming the rule. The one check of an id, in process and over Redis.
inline absl::Status check_attempt_id(std::string_view id) {
  if (id.empty() || id.size() > kMaxAttemptIdBytes) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "attempt id is %d bytes; it must be 1..%d bytes", id.size(), kMaxAttemptIdBytes));
  }
  return detail::check_key_chars(id, "attempt id");
}

// An attempt id and the scope it belongs to. The same id in two scopes is two attempts.
struct AttemptKey {
  std::string_view scope{};
  std::string_view id{};
};

class AttemptCache {
 public:
  AttemptCache(Nanos ttl, std::size_t max_entries) : ttl_(ttl), max_entries_(max_entries) {}
  AttemptCache(const AttemptCache&) = delete;
  AttemptCache& operator=(const AttemptCache&) = delete;
  ~AttemptCache() {
    quota::detail::MutexLock lock(mu_);
    while (oldest_ != nullptr) unlink_and_free(oldest_);
  }

  // The outcome of begin(): either a stored decision to replay, or a fresh attempt the
  // caller must decide and then finish() or abandon().
  struct Begin {
    std::optional<Decision> replay;
    std::optional<Nanos> deadline;  // with a replay: the deadline kept with it
  };

  // `fingerprint` identifies the request (keys and cost). InvalidArgument for a malformed
  // id, or for a kept id whose fingerprint differs; Aborted while the id's first decision
  // is being made; ResourceExhausted when the cache is full of live records.
  absl::StatusOr<Begin> begin(AttemptKey key, std::string_view fingerprint, Nanos now) {
    if (auto bad = check_attempt_id(key.id); !bad.ok()) return bad;
    const Hashed hashed{.key = key, .hash = hash_of(key)};
    quota::detail::MutexLock lock(mu_);
    index_.prefetch(hashed);
    auto found = index_.find(hashed);
    if (found != index_.end() && (*found)->expires_at <= now) {
      erase(found);
      found = index_.end();
    }
    if (found != index_.end()) {
      const Record& r = **found;
      if (r.fingerprint() != fingerprint) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "attempt id \"%s\" was first used for another request (key or cost differ)",
            quota::detail::to_absl(key.id)));
      }
      if (!r.done) {
        return absl::AbortedError(
            absl::StrFormat("attempt \"%s\" is being decided by another call; retry",
                            quota::detail::to_absl(key.id)));
      }
      return Begin{.replay = r.decision, .deadline = r.deadline};
    }
    forget_expired(now);
    if (index_.size() >= max_entries_) {
      return absl::ResourceExhaustedError(
          absl::StrFormat("attempt cache full: %d attempts kept, none expired", index_.size()));
    }
    index_.insert(
        append(make_record(hashed, fingerprint, quota::detail::saturating_add(now, ttl_))));
    prefetch_ahead();
    return Begin{.replay = std::nullopt, .deadline = std::nullopt};
  }

  // Stores the decision made for a fresh attempt, and the attempt's deadline.
  void finish(AttemptKey key, const Decision& d, std::optional<Nanos> deadline) {
    quota::detail::MutexLock lock(mu_);
    if (auto it = index_.find(key); it != index_.end()) {
      (*it)->decision = d;
      (*it)->deadline = deadline;
      (*it)->done = true;
    }
  }

  // Forgets a fresh attempt whose decision failed, so that a retry decides.
  void abandon(AttemptKey key) {
    quota::detail::MutexLock lock(mu_);
    if (auto it = index_.find(key); it != index_.end()) erase(it);
  }

  // The same for a cache whose ids share one scope (the lease authority's grant ids).
  absl::StatusOr<Begin> begin(std::string_view id, std::string_view fingerprint, Nanos now) {
    return begin(AttemptKey{.id = id}, fingerprint, now);
  }
  void finish(std::string_view id, const Decision& d,
              std::optional<Nanos> deadline = std::nullopt) {
    finish(AttemptKey{.id = id}, d, deadline);
  }
  void abandon(std::string_view id) { abandon(AttemptKey{.id = id}); }

  // Records kept, live or expired but not yet forgotten.
  std::size_t size() const {
    quota::detail::MutexLock lock(mu_);
    return index_.size();
  }

 private:
  // Forgotten per begin() of a new id: more than the one record it adds, so expired
  // records left behind by a quiet spell drain while ids arrive, and few enough that a
  // begin stays O(1).
  static constexpr int kExpiredPerBegin = 2;
  // How many of the records next to expire have their index slots asked for ahead.
  static constexpr int kAhead = 8;

  // One attempt: its place in the age list, its decision, and in the same allocation,
  // just after it, its text: scope, id and fingerprint, one after the other.
  struct Record {
    Record* older = nullptr;
    Record* newer = nullptr;
    Decision decision{};
    std::optional<Nanos> deadline{};
    Nanos expires_at{0};
    // hash_of(key()), kept so that forgetting the oldest record reads only its first bytes.
    std::size_t hash = 0;
    std::uint32_t scope_bytes = 0;  // the Gateway's scope is a tenant id: at most 128 bytes
    std::uint32_t fingerprint_bytes = 0;
    std::uint8_t id_bytes = 0;  // at most kMaxAttemptIdBytes
    bool done = false;

    const char* text() const { return reinterpret_cast<const char*>(this + 1); }
    std::size_t text_bytes() const { return scope_bytes + id_bytes + fingerprint_bytes; }
    AttemptKey key() const {
      return {.scope = {text(), scope_bytes}, .id = {text() + scope_bytes, id_bytes}};
    }
    std::string_view fingerprint() const {
      return {text() + scope_bytes + id_bytes, fingerprint_bytes};
    }
  };

  static std::size_t hash_of(AttemptKey k) {
    return absl::HashOf(quota::detail::to_absl(k.scope), quota::detail::to_absl(k.id));
  }

  // A key with its hash, so that begin() hashes it once for its prefetch, lookup and insert.
  struct Hashed {
    AttemptKey key;
    std::size_t hash;
  };

  // The index holds each record's address and finds it by its AttemptKey. Two addresses
  // are equal when they are the same record: the index never holds two records of one
  // key (begin() looks the key up before it adds one), so that is equality of keys,
  // found without reading either key.
  struct KeyHash {
    using is_transparent = void;
    std::size_t operator()(const AttemptKey& k) const { return hash_of(k); }
    std::size_t operator()(const Hashed& k) const { return k.hash; }
    std::size_t operator()(const Record* r) const { return r->hash; }
  };
  struct KeyEq {
    using is_transparent = void;
    bool operator()(const Record* a, const Record* b) const { return a == b; }
    bool operator()(const AttemptKey& a, const Record* b) const { return same(a, b->key()); }
    bool operator()(const Record* a, const AttemptKey& b) const { return same(a->key(), b); }
    bool operator()(const Hashed& a, const Record* b) const { return same(a.key, b->key()); }
    bool operator()(const Record* a, const Hashed& b) const { return same(a->key(), b.key); }
    static bool same(AttemptKey a, AttemptKey b) { return a.scope == b.scope && a.id == b.id; }
  };
  using Index = absl::flat_hash_set<Record*, KeyHash, KeyEq>;

  // A record and its text in one allocation (Record's size is a multiple of its
  // alignment, so the text starts right after it).
  static Record* make_record(const Hashed& k, std::string_view fingerprint, Nanos expires) {
    const std::size_t text = k.key.scope.size() + k.key.id.size() + fingerprint.size();
    auto* r = new (::operator new(sizeof(Record) + text))
        Record{.older = nullptr,
               .newer = nullptr,
               .decision = {},
               .deadline = std::nullopt,
               .expires_at = expires,
               .hash = k.hash,
               .scope_bytes = static_cast<std::uint32_t>(k.key.scope.size()),
               .fingerprint_bytes = static_cast<std::uint32_t>(fingerprint.size()),
               .id_bytes = static_cast<std::uint8_t>(k.key.id.size()),
               .done = false};
    char* out = reinterpret_cast<char*>(r + 1);
    for (std::string_view part : {k.key.scope, k.key.id, fingerprint}) {
      if (!part.empty()) std::memcpy(out, part.data(), part.size());  // data() may be null
      out += part.size();
    }
    return r;
  }

  // Puts `r` at the newest end of the age list.
  Record* append(Record* r) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (ahead_ == nullptr) ahead_ = r;
    r->older = newest_;
    (newest_ != nullptr ? newest_->newer : oldest_) = r;
    newest_ = r;
    return r;
  }

  // Takes `r` out of the age list and frees it (the index no longer holds it).
  void unlink_and_free(Record* r) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (r != oldest_) {
      ahead_ = oldest_;  // one left from the middle: ask again from the front
      ahead_count_ = 0;
    } else if (r == ahead_) {
      ahead_ = r->newer;
    } else if (ahead_count_ > 0) {
      --ahead_count_;
    }
    (r->older != nullptr ? r->older->newer : oldest_) = r->newer;
    (r->newer != nullptr ? r->newer->older : newest_) = r->older;
    r->~Record();
    ::operator delete(static_cast<void*>(r));
  }

  void erase(Index::iterator it) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    Record* r = *it;
    index_.erase(it);
    unlink_and_free(r);
  }

  // In a large cache the index slot of the record that expires next is a cache miss
  // (and a TLB miss) when forget_expired() erases it. The slots of the next kAhead
  // records to expire are asked for ahead, one more per begin(), so that each arrives
  // several decisions before it is erased (benchmarks/gateway_attempts_bench.cpp
  // measures a decision with 10^6 records against one with none).
  void prefetch_ahead() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (; ahead_ != nullptr && ahead_count_ < kAhead; ahead_ = ahead_->newer, ++ahead_count_) {
      index_.prefetch(ahead_);
      if (ahead_->newer != nullptr) __builtin_prefetch(ahead_->newer);
    }
  }

  void forget_expired(Nanos now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (int i = 0; i < kExpiredPerBegin && oldest_ != nullptr; ++i) {
      Record* r = oldest_;
      if (r->expires_at > now) return;
      index_.erase(r);
      unlink_and_free(r);
    }
  }

  Nanos ttl_;
  std::size_t max_entries_;
  mutable quota::detail::Mutex mu_;
  // The records in the order they began: oldest_ first, each one's `newer` the next.
  Record* oldest_ ABSL_GUARDED_BY(mu_) = nullptr;
  Record* newest_ ABSL_GUARDED_BY(mu_) = nullptr;
  Index index_ ABSL_GUARDED_BY(mu_);
  // prefetch_ahead(): the next record whose slot to ask for (nullptr: none yet), and how
  // many records from oldest_ up to it had theirs asked for.
  Record* ahead_ ABSL_GUARDED_BY(mu_) = nullptr;
  int ahead_count_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace quota
