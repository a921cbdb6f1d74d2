// ccgraph/tensor/async.hpp: the completion a pending (async) tensor carries until it is waited.
#pragma once

#include <chrono>
#include <condition_variable>
#include <exception>
#include <memory>
#include <mutex>
#include <utility>

namespace ccgraph::detail {

/// Completion of one launched collective. The backend that runs the collective calls
/// `complete()` or `fail()` exactly once; any number of tensors (an output and its views, the
/// outputs of a coalesced launch) share it and `wait()` on it. Waiting on a failed work rethrows
/// the backend's error in the waiting thread. Device backends derive from it: there, waiting
/// orders the waiter's stream after the collective instead of blocking the host.
class work {
 public:
  work() = default;
  work(const work&) = delete;
  work& operator=(const work&) = delete;
  virtual ~work() = default;

  /// Blocks until the work completed (a device backend: makes the calling thread's stream wait
  /// for it); rethrows its error if it failed.
  virtual void wait() const {
    std::unique_lock lk(mu_);
    cv_.wait(lk, [&] { return done_; });
    if (error_) std::rethrow_exception(error_);
  }
  /// True once completed or failed.
  virtual bool ready() const {
    std::lock_guard lk(mu_);
    return done_;
  }
  void complete() { finish(nullptr); }
  void fail(std::exception_ptr e) { finish(std::move(e)); }

  // Profiling (a collective_request with `timed`, which a profiled executor call sets). Host
  // backends stamp when they take the work up and when it completes; untimed work reads no clock.
  using clock = std::chrono::steady_clock;
  /// Asks for the stamps. The backend calls it before anything else can see the work.
  void enable_timing() { timed_ = true; }
  /// True when enable_timing was called.
  bool timed() const { return timed_; }
  /// Stamps the time the backend started the work (timed work only; the first call counts).
  void mark_started() {
    if (!timed_) return;
    std::lock_guard lk(mu_);
    if (!started_) started_at_ = clock::now(), started_ = true;
  }
  /// When the backend started the work and when it completed or failed: set for timed work
  /// once ready(), else `false`.
  bool host_interval(clock::time_point& start, clock::time_point& end) const {
    std::lock_guard lk(mu_);
    if (!timed_ || !done_ || !started_) return false;
    start = started_at_;
    end = done_at_;
    return true;
  }
  /// A device backend's timing events around the collective, recorded on the stream it ran on
  /// (opaque cudaEvent_t handles, owned by the work): null for host backends and untimed work.
  virtual std::pair<void*, void*> device_events() const { return {nullptr, nullptr}; }

 private:
  void finish(std::exception_ptr e) {
    {
      std::lock_guard lk(mu_);
      if (done_) return;
      error_ = std::move(e);
      done_ = true;
      if (timed_) {
        done_at_ = clock::now();
        if (!started_) started_at_ = done_at_, started_ = true;  // failed before it started
      }
    }
    cv_.notify_all();
  }
  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  bool done_ = false;
  bool timed_ = false;
  bool started_ = false;
  clock::time_point started_at_{}, done_at_{};
  std::exception_ptr error_;
};

using work_ptr = std::shared_ptr<work>;

}  // namespace ccgraph::detail
