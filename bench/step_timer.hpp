// bench/step_timer.hpp: how the training-step benches (bench_gpu_train, bench_gpu_block) time a
// step, as PyTorch's side of them does: CUDA events around one step on this thread's stream,
// `warm` steps first, the median of `iters`.
#pragma once

#include <ccgraph/cuda.hpp>

#include <cuda_runtime.h>

#include <algorithm>
#include <barrier>
#include <chrono>
#include <vector>

namespace bench {

/// Median milliseconds of `iters` calls of `step` after `warm`, CUDA events on this thread's stream.
/// `host_us`, when given, gets the median microseconds the call itself takes on the host: with a
/// synchronised step the GPU waits for whatever of it comes before the first launch. `align`,
/// when given (a barrier of every rank's thread), starts each timed step on every rank at once:
/// what remains of the step is then without the ranks' skew (a diagnostic; PyTorch's side is
/// timed without it).
template <class F>
double step_ms(F&& step, int warm = 4, int iters = 10, double* host_us = nullptr, std::barrier<>* align = nullptr) {
  for (int i = 0; i < warm; ++i) step();
  cudaStream_t s = ccgraph::cuda::current_stream();
  CCGRAPH_CHECK_CUDA(cudaStreamSynchronize(s));
  std::vector<double> ts, hs;
  cudaEvent_t a, b;
  CCGRAPH_CHECK_CUDA(cudaEventCreate(&a));
  CCGRAPH_CHECK_CUDA(cudaEventCreate(&b));
  for (int i = 0; i < iters; ++i) {
    if (align) align->arrive_and_wait();
    CCGRAPH_CHECK_CUDA(cudaEventRecord(a, s));
    const auto h0 = std::chrono::steady_clock::now();
    step();
    hs.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - h0).count());
    CCGRAPH_CHECK_CUDA(cudaEventRecord(b, s));
    CCGRAPH_CHECK_CUDA(cudaEventSynchronize(b));
    float ms = 0;
    CCGRAPH_CHECK_CUDA(cudaEventElapsedTime(&ms, a, b));
    ts.push_back(ms);
  }
  CCGRAPH_CHECK_CUDA(cudaEventDestroy(a));
  CCGRAPH_CHECK_CUDA(cudaEventDestroy(b));
  std::sort(ts.begin(), ts.end());
  std::sort(hs.begin(), hs.end());
  if (host_us) *host_us = hs[hs.size() / 2];
  return ts[ts.size() / 2];
}

}  // namespace bench
