// quota/lease/renewal_thread.hpp — one thread that takes grants for holders that must not
// wait: the non-blocking mode of the lease engine.
//
// An event-loop host (an nginx worker, an Envoy worker thread) may not wait on a network
// round trip inside a request. A LeasedBackend given a RenewalThread
// (LeasedBackendOptions::renewals) never asks the authority on the deciding thread: it
// posts the grant request here and decides from what it holds; the thread makes the
// round trip and hands the grant to the holding. This is the only thread the library
// starts on its own, and only when a caller builds one.
//
// Guarantees: tasks run one at a time, in the order posted. post() never blocks: a full
// queue (max_queued) refuses the task (false) and the caller keeps its request for a
// later post. stop() (and the destructor) runs no further task, drops those queued (each
// dropped task's `dropped` callback runs, on the stopping thread) and joins the thread;
// a task running finishes first.
//
// Thread safety: post() from any thread; stop() from one thread, not from a task.
//
//   quota::detail::RenewalThread renewals;
//   quota::gateway::LeasedBackend leased(redis_store, ledger, {.renewals = &renewals});
//   ...
//   renewals.stop();  // before `leased` is destroyed
#pragma once

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <utility>

namespace quota::detail {

// Where a non-blocking holder posts its grant requests: RenewalThread, or a simulation's
// queue on simulated time (examples/gateway_sim).
class Renewals {
 public:
  struct Task {
    std::function<void()> run;
    std::function<void()> dropped;  // when it is dropped unrun (may be empty)
  };
  virtual ~Renewals() = default;
  // Queues `task` to run later, on another thread or time; false: not queued.
  virtual bool post(Task task) = 0;
};

class RenewalThread final : public Renewals {
 public:
  explicit RenewalThread(std::size_t max_queued = 100'000)
      : max_queued_(max_queued), thread_([this] { loop(); }) {}
  RenewalThread(const RenewalThread&) = delete;
  RenewalThread& operator=(const RenewalThread&) = delete;
  ~RenewalThread() { stop(); }

  // Queues `task`; false when stopped or max_queued tasks wait (nothing queued).
  bool post(Task task) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopping_ || queue_.size() >= max_queued_) return false;
      queue_.push_back(std::move(task));
    }
    ready_.notify_one();
    return true;
  }

  void stop() {
    std::deque<Task> dropped;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopping_ && !thread_.joinable()) return;
      stopping_ = true;
      dropped.swap(queue_);
    }
    ready_.notify_one();
    if (thread_.joinable()) thread_.join();
    for (Task& t : dropped) {
      if (t.dropped) t.dropped();
    }
  }

 private:
  void loop() {
    for (;;) {
      Task task;
      {
        std::unique_lock<std::mutex> lock(mu_);
        ready_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
        if (stopping_) return;
        task = std::move(queue_.front());
        queue_.pop_front();
      }
      task.run();
    }
  }

  const std::size_t max_queued_;
  mutable std::mutex mu_;
  std::condition_variable ready_;
  std::deque<Task> queue_;
  bool stopping_ = false;
  std::thread thread_;  // last: starts once the members above exist
};

}  // namespace quota::detail
