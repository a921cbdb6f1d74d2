// tests/interop/dlpack_capi.cpp: a small C API over interop/dlpack.hpp, built as a shared library
// that tests/interop/torch_dlpack.py loads with ctypes to hand tensors to and from PyTorch. Built
// by nvcc with <ccgraph/cuda.hpp> where CUDA is (CCGRAPH_CAPI_CUDA), so device tensors cross too.
#ifdef CCGRAPH_CAPI_CUDA
#define CCGRAPH_CUDA_NO_OP_KERNELS  // only copies and the device runtime: no op kernels
#include <ccgraph/cuda.hpp>
#else
#include <ccgraph/ccgraph.hpp>
#endif
#include <ccgraph/interop/dlpack.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <numeric>
#include <vector>

namespace {
namespace cg = ccgraph;
cg::tensor<float> last;  // the last export, which ccgraph keeps too: both sides see one memory

template <class F>
double guarded(const char* what, F&& f) {
  try {
    return f();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: %s\n", what, e.what());
    return NAN;
  }
}
}  // namespace

extern "C" {
/// arange(n) as float32 on the host (dev < 0) or on cuda:dev, exported through DLPack.
DLManagedTensor* capi_arange(std::int64_t n, int dev) {
  try {
    std::vector<float> v(static_cast<std::size_t>(n));
    std::iota(v.begin(), v.end(), 0.f);
    last = cg::tensor<float>::from(v, {n});
    if (dev >= 0) last = last.to(cg::device::cuda(dev));
    return cg::to_dlpack(last);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "capi_arange: %s\n", e.what());
    return nullptr;
  }
}
/// The sum of the last export as ccgraph reads it now.
double capi_last_sum() {
  return guarded("capi_last_sum", [] {
    const auto v = last.to_vector();
    return static_cast<double>(std::accumulate(v.begin(), v.end(), 0.f));
  });
}
/// Imports a float32 DLPack tensor (taking ownership on success) and sums it; NaN on an error,
/// after which the caller still owns it.
double capi_sum(DLManagedTensor* m) {
  return guarded("capi_sum", [&] {
    const auto v = cg::from_dlpack<float>(m).to_vector();
    return static_cast<double>(std::accumulate(v.begin(), v.end(), 0.f));
  });
}
/// Imports a bool DLPack tensor and counts its true elements; NaN on an error.
double capi_count_true(DLManagedTensor* m) {
  return guarded("capi_count_true", [&] {
    const auto v = cg::from_dlpack<bool>(m).to_vector();
    return static_cast<double>(std::count(v.begin(), v.end(), true));
  });
}
}
