// ccgraph/tensor/async.hpp: the completion a pending (async) tensor carries until it is waited.
#pragma once

#include <condition_variable>
#include <exception>
#include <memory>
#include <mutex>

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

 private:
  void finish(std::exception_ptr e) {
    {
      std::lock_guard lk(mu_);
      if (done_) return;
      error_ = std::move(e);
      done_ = true;
    }
    cv_.notify_all();
  }
  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  bool done_ = false;
  std::exception_ptr error_;
};

using work_ptr = std::shared_ptr<work>;

}  // namespace ccgraph::detail
