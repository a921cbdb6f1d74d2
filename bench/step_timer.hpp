// bench/step_timer.hpp: how the training-step benches (bench_gpu_train, bench_gpu_block) time a
// step, as PyTorch's side of them does: CUDA events around one step on this thread's stream,
// `warm` steps first, the median of `iters`.
#pragma once

#include <ccgraph/cuda.hpp>

#include <cuda_runtime.h>

#include <algorithm>
#include <vector>

namespace bench {

/// Median milliseconds of `iters` calls of `step` after `warm`, CUDA events on this thread's stream.
template <class F>
double step_ms(F&& step, int warm = 4, int iters = 10) {
  for (int i = 0; i < warm; ++i) step();
  cudaStream_t s = ccgraph::cuda::current_stream();
  CCGRAPH_CHECK_CUDA(cudaStreamSynchronize(s));
  std::vector<double> ts;
  cudaEvent_t a, b;
  CCGRAPH_CHECK_CUDA(cudaEventCreate(&a));
  CCGRAPH_CHECK_CUDA(cudaEventCreate(&b));
  for (int i = 0; i < iters; ++i) {
    CCGRAPH_CHECK_CUDA(cudaEventRecord(a, s));
    step();
    CCGRAPH_CHECK_CUDA(cudaEventRecord(b, s));
    CCGRAPH_CHECK_CUDA(cudaEventSynchronize(b));
    float ms = 0;
    CCGRAPH_CHECK_CUDA(cudaEventElapsedTime(&ms, a, b));
    ts.push_back(ms);
  }
  CCGRAPH_CHECK_CUDA(cudaEventDestroy(a));
  CCGRAPH_CHECK_CUDA(cudaEventDestroy(b));
  std::sort(ts.begin(), ts.end());
  return ts[ts.size() / 2];
}

}  // namespace bench
