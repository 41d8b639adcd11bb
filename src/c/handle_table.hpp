// src/c/handle_table.hpp — the C interface's handles: a closed or unknown handle is an
// error code, never a use after free.
//
// A handle is `generation << 16 | slot`: the slot of a fixed table of kSlots and the
// slot's generation when it was opened (from 1, so no handle is 0). A closed handle is
// never valid again: the slot's next opening has the next generation (48 bits never wrap). A call
// enters a handle with enter(): it counts itself in the slot's `users`, then checks the slot still
// holds that generation, open. close() marks the slot closed, then waits until no call is inside
// before it deletes the object. Both sides use sequentially consistent operations in
// opposite orders (a Dekker pair): either the call sees the slot closed, or close sees
// the call and waits for it.
//
// Thread safety: every member from any thread. enter() takes no lock; open() and close()
// take the table's lock to pick or free a slot.
//
//   HandleTable<Limiter> table;
//   auto h = table.open(std::move(limiter));  // 0 when every slot is taken
//   if (auto in = table.enter(h)) in->decide(...);
//   table.close(h);                           // false: not open
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace quota::c_api {

template <class T>
class HandleTable {
 public:
  static constexpr std::size_t kSlotBits = 16;
  static constexpr std::size_t kSlots = std::size_t{1} << kSlotBits;  // open at once

  HandleTable() = default;
  HandleTable(const HandleTable&) = delete;
  HandleTable& operator=(const HandleTable&) = delete;
  ~HandleTable() {
    for (auto& chunk : chunks_) {
      Chunk* c = chunk.load(std::memory_order_acquire);
      if (c == nullptr) continue;
      for (Slot& s : *c) delete s.object;
      delete c;
    }
  }

  // A call inside a handle: the object stays alive until it is destroyed.
  class Entered {
   public:
    Entered() = default;
    explicit Entered(std::atomic<std::int64_t>* users, T* object)
        : users_(users), object_(object) {}
    Entered(Entered&& o) noexcept : users_(o.users_), object_(o.object_) { o.users_ = nullptr; }
    Entered(const Entered&) = delete;
    Entered& operator=(const Entered&) = delete;
    Entered& operator=(Entered&&) = delete;
    ~Entered() {
      if (users_ != nullptr) users_->fetch_sub(1, std::memory_order_seq_cst);
    }
    explicit operator bool() const { return users_ != nullptr; }
    T* operator->() const { return object_; }
    T& operator*() const { return *object_; }

   private:
    std::atomic<std::int64_t>* users_ = nullptr;
    T* object_ = nullptr;
  };

  // Keeps `object` under a new handle; 0 (and `object` destroyed) when kSlots are open.
  std::uint64_t open(std::unique_ptr<T> object) {
    std::lock_guard<std::mutex> lock(mu_);
    std::size_t index = 0;
    if (!free_.empty()) {
      index = free_.back();
      free_.pop_back();
    } else if (next_ < kSlots) {
      index = next_++;
    } else {
      return 0;
    }
    Slot& s = slot_for_open(index);
    const std::uint64_t generation = s.generation + 1;
    s.generation = generation;
    s.object = object.release();
    s.state.store(generation << 1 | 1, std::memory_order_seq_cst);
    return generation << kSlotBits | index;
  }

  // The object of handle `h` if it is open, counted as in use until the result is gone.
  Entered enter(std::uint64_t h) {
    Slot* s = find(h);
    if (s == nullptr) return {};
    s->users.fetch_add(1, std::memory_order_seq_cst);
    if (s->state.load(std::memory_order_seq_cst) != (generation_of(h) << 1 | 1)) {
      s->users.fetch_sub(1, std::memory_order_seq_cst);
      return {};
    }
    return Entered(&s->users, s->object);
  }

  // Closes `h`: no new call enters it; waits for the calls inside, then destroys its
  // object. False if `h` is not open. Must not be called from inside a call on `h`.
  bool close(std::uint64_t h) {
    Slot* s = find(h);
    if (s == nullptr) return false;
    T* object = nullptr;
    {
      std::lock_guard<std::mutex> lock(mu_);
      std::uint64_t open_state = generation_of(h) << 1 | 1;
      if (!s->state.compare_exchange_strong(open_state, generation_of(h) << 1,
                                            std::memory_order_seq_cst)) {
        return false;
      }
      object = s->object;
    }
    while (s->users.load(std::memory_order_seq_cst) != 0) std::this_thread::yield();
    delete object;
    std::lock_guard<std::mutex> lock(mu_);
    s->object = nullptr;
    free_.push_back(index_of(h));
    return true;
  }

 private:
  static constexpr std::size_t kChunkSlots = 256;
  struct Slot {
    std::atomic<std::uint64_t> state{0};  // generation << 1 | open
    std::atomic<std::int64_t> users{0};
    std::uint64_t generation = 0;  // guarded by mu_
    T* object = nullptr;           // set before state opens it, cleared after it closed
  };
  using Chunk = std::array<Slot, kChunkSlots>;

  static std::uint64_t generation_of(std::uint64_t h) { return h >> kSlotBits; }
  static std::size_t index_of(std::uint64_t h) { return h & (kSlots - 1); }

  Slot* find(std::uint64_t h) {
    if (generation_of(h) == 0) return nullptr;
    const std::size_t index = index_of(h);
    Chunk* c = chunks_[index / kChunkSlots].load(std::memory_order_acquire);
    return c == nullptr ? nullptr : &(*c)[index % kChunkSlots];
  }

  Slot& slot_for_open(std::size_t index) {  // under mu_
    auto& chunk = chunks_[index / kChunkSlots];
    Chunk* c = chunk.load(std::memory_order_acquire);
    if (c == nullptr) {
      c = new Chunk();
      chunk.store(c, std::memory_order_release);
    }
    return (*c)[index % kChunkSlots];
  }

  std::mutex mu_;
  std::array<std::atomic<Chunk*>, kSlots / kChunkSlots> chunks_{};
  std::vector<std::size_t> free_;  // guarded by mu_
  std::size_t next_ = 0;           // guarded by mu_
};

}  // namespace quota::c_api
