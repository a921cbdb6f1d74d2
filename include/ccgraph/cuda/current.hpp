// ccgraph/cuda/current.hpp: the calling thread's compute stream, on which every device op a
// rank issues (kernels, copies, GEMMs, allocations) is queued in issue order.
#pragma once

#include <cuda_runtime_api.h>

namespace ccgraph::cuda {

namespace detail {
inline cudaStream_t& current_stream_slot() {
  thread_local cudaStream_t s = cudaStreamPerThread;
  return s;
}
}  // namespace detail

/// The stream this thread's device work goes to: the rank's compute stream under run_gpus /
/// init_from_env, else CUDA's per-thread default stream.
inline cudaStream_t current_stream() { return detail::current_stream_slot(); }

/// Makes `s` this thread's current stream for the guard's lifetime (the executor uses this to
/// run a graph's compute on its own stream, and capture uses it to record into a CUDA Graph).
/// Inside a rank it runs the rank's work on `s`, eager or compiled: a caller's own stream.
/// Like torch.cuda.stream, it orders nothing between `s` and the previous stream at either
/// end (docs/cuda_graphs.md, "Just a stream, on an existing rank").
class stream_guard {
 public:
  explicit stream_guard(cudaStream_t s) : prev_(detail::current_stream_slot()) {
    detail::current_stream_slot() = s;
  }
  stream_guard(const stream_guard&) = delete;
  stream_guard& operator=(const stream_guard&) = delete;
  ~stream_guard() { detail::current_stream_slot() = prev_; }

 private:
  cudaStream_t prev_;
};

}  // namespace ccgraph::cuda
