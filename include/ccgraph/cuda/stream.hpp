// ccgraph/cuda/stream.hpp: move-only owners of cudaStream_t and cudaEvent_t.
#pragma once

#include <ccgraph/cuda/error.hpp>

#include <cuda_runtime_api.h>

#include <memory>
#include <type_traits>

namespace ccgraph::cuda {

namespace detail {

/// unique_ptr deleter calling a CUDA destroy function. Errors are dropped: a destructor cannot
/// throw, and at process exit the context (and so the handle) may already be gone.
template <class Handle, cudaError_t (*Destroy)(Handle)>
struct handle_deleter {
  void operator()(Handle h) const noexcept { (void)Destroy(h); }
};

/// Owning pointer to the struct behind a CUDA handle (cudaStream_t is `CUstream_st*`, ...).
template <class Handle, cudaError_t (*Destroy)(Handle)>
using unique_handle = std::unique_ptr<std::remove_pointer_t<Handle>, handle_deleter<Handle, Destroy>>;

}  // namespace detail

class event;

/// A CUDA stream owned for its lifetime, created on the device current at construction.
/// Move-only; a moved-from stream holds nullptr, which CUDA reads as the default stream.
class stream {
 public:
  /// Creates a stream. Non-blocking by default: ccgraph's compute and communication streams
  /// must not serialize against the legacy default stream that other libraries may use.
  explicit stream(unsigned flags = cudaStreamNonBlocking) {
    cudaStream_t s = nullptr;
    CCGRAPH_CHECK_CUDA(cudaStreamCreateWithFlags(&s, flags));
    handle_.reset(s);
  }

  /// Creates a stream with a priority (lower numbers run first; see
  /// cudaDeviceGetStreamPriorityRange), e.g. to favour communication kernels.
  stream(unsigned flags, int priority) {
    cudaStream_t s = nullptr;
    CCGRAPH_CHECK_CUDA(cudaStreamCreateWithPriority(&s, flags, priority));
    handle_.reset(s);
  }

  /// The raw handle, still owned by this object.
  [[nodiscard]] cudaStream_t get() const noexcept { return handle_.get(); }

  /// Gives up ownership and returns the raw handle; the caller destroys it.
  [[nodiscard]] cudaStream_t release() noexcept { return handle_.release(); }

  /// Blocks the calling thread until all work queued on the stream has finished.
  void synchronize() const { CCGRAPH_CHECK_CUDA(cudaStreamSynchronize(get())); }

  /// True when all work queued on the stream has finished; never blocks.
  [[nodiscard]] bool query() const {
    const cudaError_t status = cudaStreamQuery(get());
    if (status == cudaErrorNotReady) return false;
    CCGRAPH_CHECK_CUDA(status);
    return true;
  }

  /// Makes later work on this stream wait for `e` (a device-side join; the host does not block).
  inline void wait(const event& e) const;

 private:
  detail::unique_handle<cudaStream_t, cudaStreamDestroy> handle_;
};

/// A CUDA event owned for its lifetime. Move-only.
class event {
 public:
  /// Creates an event. Timing is disabled by default: such events are cheaper to record and
  /// wait on, and joins between streams are what ccgraph uses them for. Use timed() to measure.
  explicit event(unsigned flags = cudaEventDisableTiming) {
    cudaEvent_t e = nullptr;
    CCGRAPH_CHECK_CUDA(cudaEventCreateWithFlags(&e, flags));
    handle_.reset(e);
  }

  /// An event that can be passed to elapsed_ms().
  [[nodiscard]] static event timed() { return event(cudaEventDefault); }

  /// The raw handle, still owned by this object.
  [[nodiscard]] cudaEvent_t get() const noexcept { return handle_.get(); }

  /// Gives up ownership and returns the raw handle; the caller destroys it.
  [[nodiscard]] cudaEvent_t release() noexcept { return handle_.release(); }

  /// Captures the work queued on `s` so far; waiting on the event waits for that work.
  void record(cudaStream_t s) { CCGRAPH_CHECK_CUDA(cudaEventRecord(get(), s)); }
  void record(const stream& s) { record(s.get()); }

  /// Blocks the calling thread until the recorded work has finished.
  void synchronize() const { CCGRAPH_CHECK_CUDA(cudaEventSynchronize(get())); }

  /// True when the recorded work has finished (or nothing was recorded); never blocks.
  [[nodiscard]] bool query() const {
    const cudaError_t status = cudaEventQuery(get());
    if (status == cudaErrorNotReady) return false;
    CCGRAPH_CHECK_CUDA(status);
    return true;
  }

 private:
  detail::unique_handle<cudaEvent_t, cudaEventDestroy> handle_;
};

inline void stream::wait(const event& e) const {
  CCGRAPH_CHECK_CUDA(cudaStreamWaitEvent(get(), e.get(), 0));
}

/// Milliseconds between two completed records of timed() events.
[[nodiscard]] inline float elapsed_ms(const event& start, const event& stop) {
  float ms = 0.f;
  CCGRAPH_CHECK_CUDA(cudaEventElapsedTime(&ms, start.get(), stop.get()));
  return ms;
}

}  // namespace ccgraph::cuda
