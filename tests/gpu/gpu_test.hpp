// tests/gpu/gpu_test.hpp: what every GPU test file shares: how many GPUs there are, and test
// cases that are skipped (not failed) on machines without enough of them.
#pragma once

#include <cuda_runtime_api.h>

#include <doctest/doctest.h>

namespace ccgraph_test {

/// Number of CUDA devices (0 without a GPU or a driver), read once.
inline int gpu_count() {
  static const int n = [] {
    int c = 0;
    if (cudaGetDeviceCount(&c) != cudaSuccess) c = 0;
    (void)cudaGetLastError();  // "no device" must not leak into the first test's checks
    return c;
  }();
  return n;
}

/// True when at least one GPU is visible.
inline bool gpu_available() { return gpu_count() > 0; }

}  // namespace ccgraph_test

// doctest::skip is evaluated when the cases register (before main); gpu_count() caches.
/// A test case that needs one GPU.
#define GPU_TEST_CASE(name) TEST_CASE(name * doctest::skip(!::ccgraph_test::gpu_available()))
/// A test case that needs `n` GPUs.
#define GPUS_TEST_CASE(name, n) TEST_CASE(name * doctest::skip(::ccgraph_test::gpu_count() < (n)))
