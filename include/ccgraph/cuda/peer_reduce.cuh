// ccgraph/cuda/peer_reduce.cuh: the kernel of the copy-engine all_reduce (peer_channel.hpp),
// `out = a (op) b` element by element. It installs its launcher in pair_reduce_slot() when the
// program starts; <ccgraph/cuda.hpp> includes it under nvcc.
#pragma once

#if !defined(__CUDACC__)
#error "<ccgraph/cuda/peer_reduce.cuh> defines CUDA kernels: compile this translation unit with nvcc"
#endif

#include <ccgraph/cuda/error.hpp>
#include <ccgraph/cuda/peer_channel.hpp>
#include <ccgraph/cuda/pointwise.cuh>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <type_traits>

namespace ccgraph::cuda::detail {

/// One element of T as float, and back (rounded to nearest even).
template <class T>
__device__ inline float pair_load(T v) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) return __bfloat162float(v);
  else if constexpr (std::is_same_v<T, __half>) return __half2float(v);
  else return v;
}
template <class T>
__device__ inline T pair_store(float v) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) return __float2bfloat16_rn(v);
  else if constexpr (std::is_same_v<T, __half>) return __float2half_rn(v);
  else return v;
}

template <reduce_kind Op>
__device__ inline float pair_apply(float a, float b) {
  if constexpr (Op == reduce_kind::sum) return a + b;
  else if constexpr (Op == reduce_kind::avg) return (a + b) * 0.5f;
  else if constexpr (Op == reduce_kind::product) return a * b;
  else if constexpr (Op == reduce_kind::min) return fminf(a, b);
  else return fmaxf(a, b);
}

/// out = a (op) b over n elements; `vec` when all three are 16-byte aligned: then each thread
/// moves 16 bytes per operand at a time (the tail is done element by element).
template <class T, reduce_kind Op>
__global__ void pair_reduce_kernel(const T* a, const T* b, T* out, std::size_t n, bool vec) {
  constexpr std::size_t per = 16 / sizeof(T);
  const std::size_t stride = std::size_t{gridDim.x} * blockDim.x;
  const std::size_t tid = std::size_t{blockIdx.x} * blockDim.x + threadIdx.x;
  std::size_t done = 0;
  if (vec) {
    const std::size_t groups = n / per;
    for (std::size_t g = tid; g < groups; g += stride) {
      uint4 va = reinterpret_cast<const uint4*>(a)[g];
      const uint4 vb = reinterpret_cast<const uint4*>(b)[g];
      T* ea = reinterpret_cast<T*>(&va);
      const T* eb = reinterpret_cast<const T*>(&vb);
#pragma unroll
      for (std::size_t k = 0; k < per; ++k) ea[k] = pair_store<T>(pair_apply<Op>(pair_load(ea[k]), pair_load(eb[k])));
      reinterpret_cast<uint4*>(out)[g] = va;
    }
    done = groups * per;
  }
  for (std::size_t i = done + tid; i < n; i += stride) out[i] = pair_store<T>(pair_apply<Op>(pair_load(a[i]), pair_load(b[i])));
}

template <class T>
inline void launch_pair_reduce_typed(const void* a, const void* b, void* out, std::size_t n, reduce_op op,
                                     cudaStream_t s) {
  const auto aligned = [](const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; };
  const bool vec = aligned(a) && aligned(b) && aligned(out);
  // A few blocks per SM: it is memory-bound, and it should leave SMs free quickly.
  const int grid = pointwise_sm_count() * 4;
  const auto* x = static_cast<const T*>(a);
  const auto* y = static_cast<const T*>(b);
  auto* z = static_cast<T*>(out);
  // No premul_sum: pair_reduce_supports refuses it, so it goes to NCCL.
  switch (op.kind()) {
    case reduce_kind::sum: pair_reduce_kernel<T, reduce_kind::sum><<<grid, 256, 0, s>>>(x, y, z, n, vec); break;
    case reduce_kind::avg: pair_reduce_kernel<T, reduce_kind::avg><<<grid, 256, 0, s>>>(x, y, z, n, vec); break;
    case reduce_kind::product: pair_reduce_kernel<T, reduce_kind::product><<<grid, 256, 0, s>>>(x, y, z, n, vec); break;
    case reduce_kind::min: pair_reduce_kernel<T, reduce_kind::min><<<grid, 256, 0, s>>>(x, y, z, n, vec); break;
    case reduce_kind::max: pair_reduce_kernel<T, reduce_kind::max><<<grid, 256, 0, s>>>(x, y, z, n, vec); break;
    default: CCGRAPH_THROW(::ccgraph::error, "copy-engine all_reduce: reduce op ", op, " has no kernel");
  }
  CCGRAPH_CHECK_CUDA(cudaGetLastError());
}

/// The pair_reduce_fn this header installs.
inline void launch_pair_reduce(const void* a, const void* b, void* out, std::size_t n, dtype dt, reduce_op op,
                               cudaStream_t s) {
  switch (dt) {
    case dtype::f32: return launch_pair_reduce_typed<float>(a, b, out, n, op, s);
    case dtype::bf16: return launch_pair_reduce_typed<__nv_bfloat16>(a, b, out, n, op, s);
    case dtype::f16: return launch_pair_reduce_typed<__half>(a, b, out, n, op, s);
    default: CCGRAPH_THROW(::ccgraph::error, "copy-engine all_reduce: dtype ", dt, " has no kernel");
  }
}

/// Installs launch_pair_reduce when the program starts (once, whichever translation unit).
inline const bool pair_reduce_installed = (pair_reduce_slot() = &launch_pair_reduce, true);

}  // namespace ccgraph::cuda::detail
